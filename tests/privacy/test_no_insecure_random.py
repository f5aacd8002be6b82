"""Noise and selection draws must come from a CSPRNG (docs/privacy.md#invariant-6).

Scans every module under stream_dp/ for the non-cryptographic generators — calls into the
``random`` module, ``from random import …``, aliasing it, and anything from
``numpy.random`` — and fails unless the line carries ``# noqa: S311`` with a reason (the
reservoir sampler in privacy/bounding.py is the intended exception: which ≤ k of a user's
own events are kept bounds the sensitivity either way). ruff's S311 rule covers the same
ground at lint time; a test checks it stays enabled for stream_dp/.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "stream_dp"
MARKER = "noqa: S311"


def insecure_random_uses(source: str, filename: str = "<string>") -> list[tuple[int, str]]:
    """(line, description) of every unmarked use of random / numpy.random in ``source``."""
    tree = ast.parse(source, filename)
    lines = source.splitlines()
    random_names = {"random"}
    numpy_names = {"numpy", "np"}
    found: list[tuple[int, str]] = []

    def flag(node: ast.AST, what: str) -> None:
        line = getattr(node, "lineno", 0)
        text = lines[line - 1] if 0 < line <= len(lines) else ""
        if MARKER not in text:
            found.append((line, what))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "random" and alias.asname:
                    random_names.add(alias.asname)
                    flag(node, f"import random as {alias.asname}")
                elif alias.name == "numpy" and alias.asname:
                    numpy_names.add(alias.asname)
                elif alias.name.startswith("numpy.random"):
                    flag(node, f"import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            if node.module == "random":
                flag(node, "from random import …")
            elif node.module.startswith("numpy.random"):
                flag(node, f"from {node.module} import …")
            elif node.module == "numpy" and any(a.name == "random" for a in node.names):
                flag(node, "from numpy import random")

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            base = node.func.value
            if isinstance(base, ast.Name) and base.id in random_names:
                flag(node, f"{base.id}.{node.func.attr}(…)")
        if isinstance(node, ast.Attribute) and node.attr == "random":
            base = node.value
            if isinstance(base, ast.Name) and base.id in numpy_names:
                flag(node, f"{base.id}.random")
    return sorted(set(found))


def test_the_scanner_finds_what_it_should() -> None:
    bad = (
        "import random\nimport numpy as np\nfrom numpy.random import default_rng\n"
        "x = random.random()\ny = np.random.laplace(0, 1)\nimport random as r\n"
        "z = r.randint(0, 3)\nfrom random import choice\nfrom numpy import random as npr\n"
    )
    found = {line for line, _ in insecure_random_uses(bad)}
    assert found == {3, 4, 5, 6, 7, 8, 9}
    good = (
        "import random\nimport secrets\n"
        "rng = random.Random(1)  # noqa: S311 — not a privacy draw\n"
        "def f(r: random.Random) -> int:\n    return secrets.randbelow(3)\n"
    )
    assert insecure_random_uses(good) == []


def test_stream_dp_uses_no_insecure_random_outside_marked_lines() -> None:
    offenders: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        for line, what in insecure_random_uses(source, str(path)):
            offenders.append(f"{path.relative_to(ROOT)}:{line}: {what}")
    assert not offenders, "\n".join(offenders)


def test_the_privacy_core_never_uses_random_at_all() -> None:
    """Beyond the marked exception: noise, selection and planning import neither module."""
    core = [
        "mechanisms.py",
        "partition_selection.py",
        "planner.py",
        "release.py",
        "calibration.py",
        "choose_k.py",
        "risk.py",
    ]
    for name in core:
        tree = ast.parse((PACKAGE / "privacy" / name).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                assert all(a.name != "random" for a in node.names), name
            if isinstance(node, ast.ImportFrom):
                assert node.module != "random", name
            if isinstance(node, ast.Attribute) and node.attr == "random":
                pytest.fail(f"{name}: uses .random")


def test_ruff_s311_stays_enabled_for_stream_dp() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    lint = config["tool"]["ruff"]["lint"]
    assert "S" in lint["select"] or "S311" in lint["select"]
    assert "S311" not in lint.get("ignore", [])
    for pattern, ignored in lint.get("per-file-ignores", {}).items():
        if "S311" in ignored:
            assert not pattern.startswith("stream_dp"), pattern
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(ruff).exists():
        pytest.skip("ruff is not installed")
    result = subprocess.run(
        [ruff, "check", "--select", "S311", "--output-format", "concise", str(PACKAGE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
