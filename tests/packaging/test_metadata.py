"""Packaging metadata a user or an index reads, and the image's pinned dependencies — read
from the files, no build: the project's URLs, classifiers PyPI knows, and ops/constraints.txt
pinning every dependency the Dockerfile installs."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from trove_classifiers import classifiers as known_classifiers

REPO = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
CONSTRAINTS = REPO / "ops" / "constraints.txt"


def _name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match is not None, requirement
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in CONSTRAINTS.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and version, f"ops/constraints.txt: {line!r} is not pinned with =="
            pins[_name(name)] = version
    return pins


def test_project_urls_and_classifiers() -> None:
    # No placeholder addresses in the metadata (pip show, package indexes): none is published
    # yet, and an address nobody owns could be claimed by anyone. Real ones may come back.
    assert "urls" not in PROJECT
    classifiers = PROJECT["classifiers"]
    assert set(classifiers) <= known_classifiers, set(classifiers) - known_classifiers
    assert "Programming Language :: Python :: 3.11" in classifiers
    assert "Typing :: Typed" in classifiers
    # the license is the SPDX expression; a License classifier beside it fails the build
    assert PROJECT["license"] == "Apache-2.0"
    assert not any(c.startswith("License ::") for c in classifiers)


def test_constraints_pin_every_image_dependency_and_nothing_of_dev() -> None:
    pins = _pins()
    extras = PROJECT["optional-dependencies"]
    wanted = PROJECT["dependencies"] + extras["gaussian"] + extras["sink"]
    missing = {_name(r) for r in wanted} - pins.keys()
    assert not missing, f"ops/constraints.txt does not pin {sorted(missing)}"
    for extra in ("embedded", "dev", "bench"):
        for requirement in PROJECT["optional-dependencies"][extra]:
            if requirement.startswith("stream-dp["):
                continue  # the project's own extras, checked above
            if _name(requirement) not in {_name(r) for r in wanted}:
                assert _name(requirement) not in pins, f"{requirement} ({extra}) in the image"
    assert "stream-dp" not in pins


def test_the_dockerfile_installs_with_the_constraints() -> None:
    text = (REPO / "Dockerfile").read_text(encoding="utf-8")
    install = re.search(r"^RUN pip install [^\n]*-r /tmp/requirements\.txt[^\n]*$", text, re.M)
    assert install is not None
    assert "-c /tmp/constraints.txt" in install.group(0)
    assert re.search(r"^COPY [^\n]*constraints\.txt", text, re.M)
