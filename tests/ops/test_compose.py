"""docker-compose.yml, without a container engine.

- It validates against the Compose Specification's JSON Schema (vendored in compose_spec/,
  see its README), after the interpolation Compose does, plus the cross-references a schema
  cannot express (depends_on targets, named volumes, image or build, restart policies).
  Broken copies of the real file must be rejected — by the schema alone where it can tell.
- Debian's ``docker-compose`` (1.29), when on PATH, must agree (docs/development.md#test-tools).
- Every stream-dp service's ``command`` parses with the CLI's real argument parser.
- The same commands, run as plain processes on the embedded broker (topics-init, then the
  worker and the live producer, with ``stream-dp tail`` reading), release live windows one
  after another.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from stream_dp.cli.main import build_parser
from stream_dp.config import load_config
from tests.cli.support import LineReader, cli_argv, run_cli

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
COMPOSE_CONFIG = REPO / "ops" / "compose" / "stream-dp.yaml"
PROMETHEUS = REPO / "ops" / "prometheus" / "prometheus.yml"
DOCKERFILE = REPO / "Dockerfile"
SCHEMA_DIR = Path(__file__).with_name("compose_spec")
SCHEMA = SCHEMA_DIR / "compose-spec.json"
IMAGE = "stream-dp:dev"

# --- Compose's interpolation ---------------------------------------------------------------

_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)|(?P<plain>[A-Za-z_][A-Za-z0-9_]*)"
    r"|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\})"
)


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """``$$``, ``$NAME``, ``${NAME}``, ``${NAME:-default}``, ``${NAME-default}``,
    ``${NAME:?error}``, ``${NAME:+other}`` as Compose resolves them; ValueError for any other
    use of ``$`` (Compose refuses the file then)."""

    def one(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        name = match["plain"] or match["name"]
        value, op, arg = env.get(name), match["op"], match["arg"] or ""
        unset = value is None or (op is not None and op.startswith(":") and value == "")
        if op in (":-", "-"):
            return arg if unset else str(value)
        if op in (":?", "?"):
            if unset:
                raise ValueError(f"required variable {name} is missing: {arg}")
            return str(value)
        if op in (":+", "+"):
            return "" if unset else arg
        return "" if value is None else value

    if "$" in _VARIABLE.sub("", text):
        raise ValueError(f"invalid interpolation format in {text!r}")
    return _VARIABLE.sub(one, text)


def _interpolated(node: Any, env: Mapping[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, dict):
        return {key: _interpolated(value, env) for key, value in node.items()}
    if isinstance(node, list):
        return [_interpolated(item, env) for item in node]
    return node


def load_compose(text: str | None = None, env: Mapping[str, str] | None = None) -> Any:
    """The compose file as Compose sees it: parsed, then interpolated (default: with no
    variables set, so every default applies)."""
    doc = yaml.safe_load(COMPOSE.read_text(encoding="utf-8") if text is None else text)
    return _interpolated(doc, env or {})


# --- validation ----------------------------------------------------------------------------

RESTART = re.compile(r"^(no|always|unless-stopped|on-failure(:\d+)?)$")


def schema_validator() -> Draft202012Validator:
    return Draft202012Validator(json.loads(SCHEMA.read_text(encoding="utf-8")))


def schema_problems(doc: Any) -> list[str]:
    return [
        f"{'.'.join(str(p) for p in error.absolute_path) or '(top level)'}: {error.message}"
        for error in schema_validator().iter_errors(doc)
    ]


def reference_problems(doc: dict[str, Any]) -> list[str]:
    """What the schema cannot check and Compose refuses (at `config` or at `up`)."""
    problems: list[str] = []
    services = doc.get("services") or {}
    volumes = doc.get("volumes") or {}
    for name, svc in services.items():
        if "image" not in svc and "build" not in svc:
            problems.append(f"services.{name}: needs image or build")
        deps = svc.get("depends_on") or []
        for dep in deps:
            if dep not in services:
                problems.append(f"services.{name}.depends_on: no service {dep!r}")
        restart = svc.get("restart")
        if restart is not None and not RESTART.match(str(restart)):
            problems.append(f"services.{name}.restart = {restart!r}")
        for entry in svc.get("volumes") or []:
            source = entry.split(":", 1)[0] if isinstance(entry, str) and ":" in entry else ""
            if source and not source.startswith((".", "/", "~")) and source not in volumes:
                problems.append(f"services.{name}.volumes: named volume {source!r} undeclared")
    return problems


def compose_problems(text: str) -> list[str]:
    """Why Compose would refuse this file (empty when it is valid)."""
    try:
        doc = load_compose(text)
    except yaml.YAMLError as exc:
        return [f"not valid YAML: {exc}"]
    except ValueError as exc:
        return [str(exc)]
    problems = schema_problems(doc)
    if not problems and isinstance(doc, dict):
        problems = reference_problems(doc)
    return problems


# --- broken copies of the real file: each must be rejected ---------------------------------

Mutation = Callable[[str], str]


def _replace(old: str, new: str) -> Mutation:
    def mutate(text: str) -> str:
        assert old in text, f"mutation target {old!r} is gone from docker-compose.yml"
        return text.replace(old, new, 1)

    return mutate


#: Rejected by the JSON Schema itself.
BROKEN_SCHEMA: dict[str, Mutation] = {
    "unknown top-level key": lambda t: t + "\nservics:\n  extra:\n    image: busybox:1.36\n",
    "misspelt service key": _replace("    hostname: kafka\n", "    hostnme: kafka\n"),
    "unknown depends_on condition": _replace("condition: service_healthy", "condition: up"),
    "misspelt healthcheck key": _replace("      interval: 10s\n", "      intervall: 10s\n"),
    "services not a mapping": lambda t: re.sub(
        r"(?ms)^services:\n.*?(?=^volumes:)", "services: []\n", t
    ),
    "command not a list of strings": _replace('"--rate", "200"]', '"--rate", {"n": 200}]'),
    "port not a string or mapping": _replace('      - "127.0.0.1:9090:9090"', "      - [9090]"),
}
#: Rejected before the schema (YAML, interpolation) or by the references it cannot check.
BROKEN_OTHERWISE: dict[str, Mutation] = {
    "bad indentation": _replace(
        '    ports:\n      - "127.0.0.1:9090:9090"', '  ports:\n      - "127.0.0.1:9090:9090"'
    ),
    "unclosed quote": _replace('      - "127.0.0.1:9094:9094"', '      - "127.0.0.1:9094:9094'),
    "broken interpolation": _replace("${GRAFANA_ADMIN_PASSWORD:-admin}", "${GRAFANA ADMIN}"),
    "service without image or build": _replace("    image: prom/prometheus:v2.55.1\n", ""),
    "depends_on an unknown service": _replace("      - stream-dp\n", "      - stream-dpp\n"),
    "invalid restart policy": _replace("restart: unless-stopped", "restart: sometimes"),
    "undeclared named volume": _replace(
        "      - prometheus-data:/prometheus", "      - promdata:/p"
    ),
}
#: Also rejected by docker-compose 1.29 (it checks restart policies and volumes only at `up`).
BROKEN_FOR_DOCKER_COMPOSE = {
    name: mutate
    for name, mutate in {**BROKEN_SCHEMA, **BROKEN_OTHERWISE}.items()
    if name not in ("invalid restart policy", "undeclared named volume")
}


def test_the_vendored_schema_is_the_upstream_copy() -> None:
    readme = (SCHEMA_DIR / "README.md").read_text(encoding="utf-8")
    (recorded,) = re.findall(r"sha256: `([0-9a-f]{64})`", readme)
    assert hashlib.sha256(SCHEMA.read_bytes()).hexdigest() == recorded
    assert "Apache License" in (SCHEMA_DIR / "LICENSE").read_text(encoding="utf-8")
    assert json.loads(SCHEMA.read_text(encoding="utf-8"))["title"] == "Compose Specification"


def test_the_compose_file_is_valid() -> None:
    assert compose_problems(COMPOSE.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("name", sorted(BROKEN_SCHEMA))
def test_the_schema_rejects_a_broken_copy(name: str) -> None:
    broken = BROKEN_SCHEMA[name](COMPOSE.read_text(encoding="utf-8"))
    assert schema_problems(load_compose(broken)), f"{name}: the schema accepted it"


@pytest.mark.parametrize("name", sorted({**BROKEN_SCHEMA, **BROKEN_OTHERWISE}))
def test_a_broken_copy_is_rejected(name: str) -> None:
    mutate = {**BROKEN_SCHEMA, **BROKEN_OTHERWISE}[name]
    assert compose_problems(mutate(COMPOSE.read_text(encoding="utf-8"))), f"{name}: accepted"


def test_interpolation_follows_compose() -> None:
    env = {"SET": "x", "EMPTY": ""}
    assert interpolate("${SET:-d} ${UNSET:-d} ${EMPTY:-d} ${EMPTY-d} $$SET $SET", env) == (
        "x d d  $SET x"
    )
    with pytest.raises(ValueError, match="required variable UNSET"):
        interpolate("${UNSET:?set it}", env)
    with pytest.raises(ValueError, match="invalid interpolation"):
        interpolate("${NOT VALID}", env)


DOCKER_COMPOSE = shutil.which("docker-compose")
needs_docker_compose = pytest.mark.skipif(
    DOCKER_COMPOSE is None,
    reason="docker-compose not on PATH (Debian: apt-get install -y docker-compose); "
    "the JSON Schema check above still ran",
)


def _docker_compose_config(path: Path) -> subprocess.CompletedProcess[str]:
    assert DOCKER_COMPOSE is not None
    return subprocess.run(
        [DOCKER_COMPOSE, "-f", str(path), "--project-directory", str(REPO), "config", "-q"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "HOME": str(path.parent)},
    )


@needs_docker_compose
def test_docker_compose_accepts_the_file() -> None:
    result = _docker_compose_config(COMPOSE)
    assert result.returncode == 0, result.stderr


@needs_docker_compose
@pytest.mark.parametrize("name", sorted(BROKEN_FOR_DOCKER_COMPOSE))
def test_docker_compose_rejects_a_broken_copy(name: str, tmp_path: Path) -> None:
    broken = tmp_path / "docker-compose.yml"
    text = BROKEN_FOR_DOCKER_COMPOSE[name](COMPOSE.read_text(encoding="utf-8"))
    broken.write_text(text, encoding="utf-8")
    result = _docker_compose_config(broken)
    assert result.returncode != 0, f"{name}: docker-compose accepted it"


# --- the stack -----------------------------------------------------------------------------


def stream_dp_services(doc: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The services that run the stream-dp image (its entrypoint is `stream-dp`)."""
    return {n: s for n, s in doc["services"].items() if s.get("image") == IMAGE}


def mounts(service: Mapping[str, Any]) -> dict[str, Path]:
    """Container path → host path of a service's bind mounts."""
    out: dict[str, Path] = {}
    for entry in service.get("volumes", []):
        source, target = entry.split(":")[:2]
        if source.startswith("./"):
            out[target] = REPO / source
    return out


def test_every_stream_dp_command_parses_with_the_real_cli() -> None:
    services = stream_dp_services(load_compose())
    assert set(services) == {"topics-init", "stream-dp", "producer", "sink"}
    parser = build_parser()
    for name, service in services.items():
        args = parser.parse_args(service["command"])  # SystemExit(2) on a bad command
        assert callable(args.func), name
        assert str(args.config) in mounts(service), f"{name}: --config is not mounted"
    assert parser.parse_args(services["stream-dp"]["command"]).command == "run"
    live = parser.parse_args(services["producer"]["command"])
    assert (live.command, live.synthetic, live.live, live.rate) == (
        "produce",
        "browser-logs",
        True,
        200.0,
    )
    assert live.windows is None and live.start is None and live.file is None


def test_a_misspelt_command_fails_the_parser() -> None:
    command = [*load_compose()["services"]["producer"]["command"], "--ratee", "5"]
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(command)
    assert info.value.code == 2


def test_stack_services_and_wiring() -> None:
    doc = load_compose()
    services = doc["services"]
    assert set(services) == {
        "kafka",
        "topics-init",
        "stream-dp",
        "producer",
        "prometheus",
        "alertmanager",
        "grafana",
        "postgres",
        "sink",
    }
    kafka = services["kafka"]
    assert re.fullmatch(r"apache/kafka:\d+\.\d+\.\d+", kafka["image"])
    assert "controller" in kafka["environment"]["KAFKA_PROCESS_ROLES"]  # KRaft, no ZooKeeper
    assert services["topics-init"]["depends_on"]["kafka"]["condition"] == "service_healthy"
    worker = services["stream-dp"]
    assert worker["depends_on"]["topics-init"]["condition"] == "service_completed_successfully"
    assert worker["build"]["context"] == "."
    # the default key is a well-formed 32-byte key (for trying it out only)
    assert re.fullmatch(r"[0-9a-f]{64}", worker["environment"]["STREAM_DP_PSEUDONYM_KEY"])
    raw = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert raw["services"]["stream-dp"]["environment"]["STREAM_DP_PSEUDONYM_KEY"].startswith(
        "${STREAM_DP_PSEUDONYM_KEY:-"
    )
    assert "FOR TRYING IT OUT ONLY" in COMPOSE.read_text(encoding="utf-8")
    sink = services["sink"]
    assert sink["command"] == ["sink", "--config", "/etc/stream-dp/config.yaml"]
    assert sink["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert sink["environment"]["STREAM_DP_POSTGRES_DSN"].startswith("postgresql://")
    assert "healthcheck" in services["postgres"]
    # the producer is live: no replayed file, and a restart never resends old events
    producer = services["producer"]
    assert "--live" in producer["command"] and "--file" not in producer["command"]
    assert producer["restart"] == "on-failure"
    # compose-level variables are not STREAM_DP_* (a local stream-dp would refuse them),
    # except the pseudonym key the worker reads under that name anyway
    variables = set(re.findall(r"\$\{([A-Za-z_]\w*)", COMPOSE.read_text(encoding="utf-8")))
    assert {v for v in variables if v.startswith("STREAM_DP_")} == {"STREAM_DP_PSEUDONYM_KEY"}


def test_every_port_is_published_on_the_loopback_only() -> None:
    for name, service in load_compose()["services"].items():
        for port in service.get("ports", []):
            assert isinstance(port, str) and port.startswith("127.0.0.1:"), (name, port)


def test_the_worker_scales() -> None:
    # `docker compose up --scale stream-dp=3` fails on a fixed host port (the second
    # container cannot bind it) or a container_name: the worker publishes its ops port on
    # an ephemeral loopback port instead.
    config = load_config(COMPOSE_CONFIG)
    worker = load_compose()["services"]["stream-dp"]
    assert "container_name" not in worker
    for port in worker.get("ports", []):
        ip, host_port, _container_port = port.split(":")
        assert (ip, host_port) == ("127.0.0.1", ""), f"fixed host port in {port!r}"
    assert worker["ports"] == [f"127.0.0.1::{config.metrics.port}"]


def test_images_are_pinned() -> None:
    for name, svc in load_compose()["services"].items():
        image = svc.get("image", "")
        if "build" not in svc:
            assert re.fullmatch(r"[a-z0-9./-]+:v?\d+(\.\d+)+", image), f"{name}: pin {image!r}"


def test_bind_mounted_files_exist() -> None:
    for name, svc in load_compose()["services"].items():
        for target, source in mounts(svc).items():
            assert source.exists(), f"{name} mounts missing {source} at {target}"


def test_your_own_config_file_replaces_the_mounted_one() -> None:
    doc = load_compose(env={"DP_CONFIG_FILE": "./my-stream-dp.yaml"})
    for service in stream_dp_services(doc).values():
        assert mounts(service)["/etc/stream-dp/config.yaml"] == REPO / "my-stream-dp.yaml"


def test_compose_config_loads_and_matches_the_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("STREAM_DP_"):
            monkeypatch.delenv(name)
    config = load_config(COMPOSE_CONFIG)
    assert config.kafka.bootstrap_servers == "kafka:9092"
    assert config.input.keyed_by_user  # the producer keys by user id
    assert config.metrics.enabled and config.metrics.host == "0.0.0.0"
    # Prometheus finds every worker of a scaled service by DNS, on the configured port; no
    # static target would follow `--scale`.
    prometheus = yaml.safe_load(PROMETHEUS.read_text(encoding="utf-8"))
    (job,) = [j for j in prometheus["scrape_configs"] if j["job_name"] == "stream-dp"]
    assert "static_configs" not in job
    (sd,) = job["dns_sd_configs"]
    assert sd["names"] == ["stream-dp"] and sd["type"] == "A"
    assert sd["port"] == config.metrics.port
    assert set(sd["names"]) <= set(load_compose()["services"])
    # alerts go to the stack's Alertmanager
    (manager,) = prometheus["alerting"]["alertmanagers"]
    (target,) = manager["static_configs"][0]["targets"]
    assert target.split(":")[0] in load_compose()["services"]


# --- the services' commands as processes on the embedded broker ----------------------------


def image_environment() -> dict[str, str]:
    """The ENV lines of the Dockerfile's final stage (what every container starts with)."""
    stages = DOCKERFILE.read_text(encoding="utf-8").split("\nFROM ")
    out: dict[str, str] = {}
    for line in re.findall(r"^ENV (\S+=\S+)$", stages[-1], re.M):
        name, value = line.split("=", 1)
        out[name] = value
    return out


def container_argv(service: Mapping[str, Any]) -> list[str]:
    """The service's command with container paths mapped to the files mounted there."""
    paths = mounts(service)
    return [str(paths.get(arg, arg)) for arg in service["command"]]


class Process:
    """A service's command as a process: stdout to a reader, stderr to a file."""

    def __init__(self, name: str, argv: list[str], env: Mapping[str, str], log: Path) -> None:
        self.name, self.log = name, log
        with log.open("wb") as handle:
            self.proc = subprocess.Popen(
                cli_argv(*argv), env=dict(env), stdout=subprocess.PIPE, stderr=handle, text=True
            )
        assert self.proc.stdout is not None
        self.stdout = LineReader(self.proc.stdout)

    def stop(self, sig: signal.Signals, timeout_s: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout_s)
        finally:
            self.stdout.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _window_records(tail: Process, deadline: float) -> Iterator[tuple[float, dict[str, Any]]]:
    """Window records ``tail --json`` prints, with the wall time each was read."""
    while (remaining := deadline - time.monotonic()) > 0:
        line = tail.stdout.next(timeout_s=remaining)
        if line is None:
            raise AssertionError(f"tail ended early: {tail.log.read_text()}")
        record = json.loads(line)
        if record["kind"] == "window":
            yield time.time(), record
    raise AssertionError("timed out waiting for live windows")


def _epoch(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


@pytest.mark.kafka
@pytest.mark.slow
def test_the_services_run_live_as_processes(kafka_bootstrap: str, tmp_path: Path) -> None:
    doc = load_compose()
    services = stream_dp_services(doc)
    suffix = uuid.uuid4().hex[:12]
    window_s = 2
    # The stack's own environment (image, then service), pointed at the embedded broker with
    # short windows and topics of this test's own; nothing else of the shell's STREAM_DP_*.
    base = {k: v for k, v in os.environ.items() if not k.upper().startswith("STREAM_DP_")}
    overrides = {
        "STREAM_DP_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap,
        "STREAM_DP_KAFKA__GROUP_ID": f"compose-{suffix}",
        "STREAM_DP_KAFKA__SESSION_TIMEOUT_MS": "2000",
        "STREAM_DP_KAFKA__HEARTBEAT_INTERVAL_MS": "500",
        "STREAM_DP_INPUT__TOPIC": f"events-{suffix}",
        "STREAM_DP_OUTPUT__TOPIC": f"releases-{suffix}",
        "STREAM_DP_WINDOW__SIZE_S": str(window_s),
        "STREAM_DP_WINDOW__GRACE_S": "0",
        "STREAM_DP_WINDOW__IDLE_CLOSE_S": "1",
        "STREAM_DP_METRICS__HOST": "127.0.0.1",
        "STREAM_DP_METRICS__PORT": "0",
        "STREAM_DP_LOGGING__FORMAT": "console",
    }

    def env_of(service: str) -> dict[str, str]:
        declared = {k: str(v) for k, v in services[service].get("environment", {}).items()}
        return {**base, **image_environment(), **declared, **overrides}

    def start(service: str, log: Path) -> Process:
        return Process(service, container_argv(services[service]), env_of(service), log)

    init = run_cli(*container_argv(services["topics-init"]), env=env_of("topics-init"))
    assert init.returncode == 0, init.stderr
    assert "8 created, 0 already present" in init.stdout

    started = time.time()
    running: list[Process] = []
    try:
        worker = start("stream-dp", tmp_path / "worker.log")
        running.append(worker)
        producer = start("producer", tmp_path / "producer.log")
        running.append(producer)
        tail_argv = ["tail", "--config", str(COMPOSE_CONFIG), "--json", "--from-beginning"]
        tail = Process("tail", tail_argv, {**base, **overrides}, tmp_path / "tail.log")
        running.append(tail)

        # Three consecutive windows of one query, each released soon after it ended: the
        # windows are "now", and they keep coming (not one batch).
        seen: list[tuple[float, float]] = []  # (window start, seconds from its end to reading)
        deadline = time.monotonic() + 180  # a hang guard, not a performance target
        for read_at, record in _window_records(tail, deadline):
            if record["query"] != "users_by_country":
                continue
            start = _epoch(record["window_start"])
            seen.append((start, read_at - _epoch(record["window_end"])))
            if len(seen) >= 3 and [s for s, _ in seen[-3:]] == [
                seen[-3][0] + i * window_s for i in range(3)
            ]:
                break
        for start, lag_s in seen:
            assert start >= started - 2 * window_s, "a window from before the stack started"
            assert lag_s < 60, f"window {start} read {lag_s:.1f} s after its end: not live"
        assert worker.proc.poll() is None and producer.proc.poll() is None

        assert tail.stop(signal.SIGINT) == 0, tail.log.read_text()
        assert producer.stop(signal.SIGTERM) == 128 + signal.SIGTERM, producer.log.read_text()
        assert worker.stop(signal.SIGTERM) == 0, worker.log.read_text()
    finally:
        for process in running:
            process.kill()
