"""The package's layers hold (issue 26): the privacy core imports nothing of stream-dp but
itself and ``stream_dp.errors``, and no layer imports one above it; and one package, the
client layer ``stream_dp.kafka_client``, imports the Kafka client library (issue 38).

``make lint`` runs ``lint-imports`` on the contracts in pyproject.toml; this test runs it too
(so the layers hold under plain ``pytest``), checks that the privacy contract forbids every
other part of the package and that the client-layer contract covers every part but the client
layer — a package added later cannot slip past either by being absent from the list — and
that an import of the client library outside the client layer breaks the contract.
"""

from __future__ import annotations

import shutil
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


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    lint_imports = Path(sys.executable).parent / "lint-imports"
    return subprocess.run(
        [str(lint_imports), "--no-cache"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": str(lint_imports.parent), "PYTHONPATH": str(root)},
    )


def test_lint_imports_keeps_every_contract() -> None:
    done = _lint_imports(REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 4 kept, 0 broken." in done.stdout, done.stdout


def test_the_client_layer_contract_covers_every_other_part_of_the_package() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    # without external packages in the graph, a contract cannot name aiokafka at all
    assert config["include_external_packages"] is True
    contract = _contracts()["one-client-layer"]
    assert contract["type"] == "forbidden"
    assert contract["forbidden_modules"] == ["aiokafka", "confluent_kafka"]
    parts = _parts_of_the_package()
    assert "stream_dp.kafka_client" in parts
    assert set(contract["source_modules"]) == parts - {"stream_dp.kafka_client"}  # type: ignore[arg-type]


def test_an_import_of_the_client_library_outside_the_client_layer_breaks_the_contract(
    tmp_path: Path,
) -> None:
    """The same check on a copy of the package whose worker imports aiokafka itself."""
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    shutil.copytree(PACKAGE, tmp_path / "stream_dp", ignore=shutil.ignore_patterns("__pycache__"))
    worker = tmp_path / "stream_dp" / "pipeline" / "kafka" / "worker.py"
    worker.write_text(worker.read_text() + "\nimport aiokafka  # noqa: E402\n")
    done = _lint_imports(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Contracts: 3 kept, 1 broken." in done.stdout, done.stdout
    assert "Only stream_dp.kafka_client imports the Kafka client library BROKEN" in done.stdout
    assert "-   stream_dp.pipeline.kafka.worker -> aiokafka" in done.stdout, done.stdout
