"""The package's layers hold (issue 26): the privacy core imports nothing of stream-dp but
itself and ``stream_dp.errors``, and no layer imports one above it.

``make lint`` runs ``lint-imports`` on the contracts in pyproject.toml; this test runs it too
(so the layers hold under plain ``pytest``), and checks that the privacy contract forbids
every other part of the package — a package added later cannot slip past it by being absent
from the list.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "stream_dp"


def _contracts() -> dict[str, dict[str, object]]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {c["id"]: c for c in config["contracts"]}


def _parts_of_the_package() -> set[str]:
    """Every Python subpackage and top-level module of stream_dp."""
    parts = {f"stream_dp.{p.stem}" for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    parts |= {f"stream_dp.{p.parent.name}" for p in PACKAGE.glob("*/__init__.py")}
    return parts


def test_the_privacy_contract_forbids_every_other_part_of_the_package() -> None:
    contract = _contracts()["privacy-core"]
    assert contract["type"] == "forbidden"
    assert contract["source_modules"] == ["stream_dp.privacy"]
    allowed = {"stream_dp.privacy", "stream_dp.errors"}
    parts = _parts_of_the_package()
    assert {"stream_dp.config", "stream_dp.pipeline", "stream_dp.windows"} <= parts
    assert set(contract["forbidden_modules"]) == parts - allowed  # type: ignore[arg-type]


def test_every_part_of_the_package_has_a_layer() -> None:
    layers: list[str] = _contracts()["layers"]["layers"]  # type: ignore[assignment]
    named = {f"stream_dp.{name.strip()}" for layer in layers for name in layer.split("|")}
    assert named == _parts_of_the_package()


def test_lint_imports_keeps_every_contract() -> None:
    lint_imports = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run(
        [str(lint_imports), "--no-cache"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": str(lint_imports.parent), "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 3 kept, 0 broken." in done.stdout, done.stdout
