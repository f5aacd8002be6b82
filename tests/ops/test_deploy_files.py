"""The deployment files: docker-compose.yml, Prometheus rules, Grafana, the compose config.

``docker-compose.yml`` is checked twice:

- always, by :func:`compose_problems` below: a structural check written from the Compose
  specification (top-level keys, service keys, image-or-build, depends_on targets and
  conditions, healthcheck keys, durations, named volumes, interpolation syntax). It is ours,
  not the official JSON Schema: the schema is not vendored here (its text stays out of this
  repository), and no download is possible at test time.
- when Debian's ``docker-compose`` (1.29, ``apt-get install docker-compose``) is on PATH,
  also by ``docker-compose -f FILE config -q``, the reference validator (ENVIRONMENT.md).

Both must accept the real file and reject broken copies of it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from stream_dp.config import load_config
from stream_dp.ops.metrics import Metrics

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
ALERTS = REPO / "ops" / "prometheus" / "alerts.yml"
PROMETHEUS = REPO / "ops" / "prometheus" / "prometheus.yml"
DASHBOARD = REPO / "ops" / "grafana" / "dashboards" / "stream-dp.json"
DATASOURCE = REPO / "ops" / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
DASHBOARD_PROVIDER = REPO / "ops" / "grafana" / "provisioning" / "dashboards" / "dashboards.yml"
RUNBOOK = REPO / "ops" / "RUNBOOK.md"
COMPOSE_CONFIG = REPO / "ops" / "compose" / "stream-dp.yaml"

METRIC_NAME = re.compile(r"\bstream_dp_[a-z0-9_]+")

# --- a structural check of Compose files ------------------------------------------------------

TOP_LEVEL_KEYS = {
    "version",
    "name",
    "include",
    "services",
    "networks",
    "volumes",
    "configs",
    "secrets",
    "models",
}
SERVICE_KEYS = {
    "annotations", "attach", "build", "blkio_config", "cap_add", "cap_drop", "cgroup",
    "cgroup_parent", "command", "configs", "container_name", "cpu_count", "cpu_percent",
    "cpu_period", "cpu_quota", "cpu_rt_period", "cpu_rt_runtime", "cpu_shares", "cpus",
    "cpuset", "credential_spec", "depends_on", "deploy", "develop", "device_cgroup_rules",
    "devices", "dns", "dns_opt", "dns_search", "domainname", "entrypoint", "env_file",
    "environment", "expose", "extends", "external_links", "extra_hosts", "gpus", "group_add",
    "healthcheck", "hostname", "image", "init", "ipc", "isolation", "label_file", "labels",
    "links", "logging", "mac_address", "mem_limit", "mem_reservation", "mem_swappiness",
    "memswap_limit", "models", "network_mode", "networks", "oom_kill_disable",
    "oom_score_adj", "pid", "pids_limit", "platform", "ports", "post_start", "pre_stop",
    "privileged", "profiles", "provider", "pull_policy", "read_only", "restart", "runtime",
    "scale", "secrets", "security_opt", "shm_size", "stdin_open", "stop_grace_period",
    "stop_signal", "storage_opt", "sysctls", "tmpfs", "tty", "ulimits", "use_api_socket",
    "user", "userns_mode", "uts", "volumes", "volumes_from", "working_dir",
}  # fmt: skip
BUILD_KEYS = {"context", "dockerfile", "dockerfile_inline", "args", "ssh", "labels",
              "cache_from", "cache_to", "no_cache", "additional_contexts", "network", "pull",
              "target", "shm_size", "extra_hosts", "isolation", "privileged", "secrets",
              "tags", "ulimits", "platforms", "entitlements"}  # fmt: skip
HEALTHCHECK_KEYS = {
    "test",
    "interval",
    "timeout",
    "retries",
    "start_period",
    "start_interval",
    "disable",
}
DEPENDS_CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
RESTART = re.compile(r"^(no|always|unless-stopped|on-failure(:\d+)?)$")
DURATION = re.compile(r"^(\d+(\.\d+)?(ns|us|ms|s|m|h))+$")
SERVICE_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._-]*$")
# $$ (a literal $), $NAME, ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?err}, ...
INTERPOLATION = re.compile(
    r"\$(\$|[A-Za-z_][A-Za-z0-9_]*|\{[A-Za-z_][A-Za-z0-9_]*([:]?[-?+][^}]*)?\})"
)


def _strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from _strings(key)
            yield from _strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from _strings(item)


def _is_str_or_str_list(value: Any) -> bool:
    return isinstance(value, str) or (
        isinstance(value, list) and all(isinstance(v, str | int | float) for v in value)
    )


def _check_service(name: str, svc: Any, services: dict[str, Any], volumes: Any) -> list[str]:
    where = f"services.{name}"
    if not isinstance(svc, dict):
        return [f"{where} must be a mapping, got {type(svc).__name__}"]
    problems = [
        f"{where}.{k}: unknown service key"
        for k in svc
        if k not in SERVICE_KEYS and not str(k).startswith("x-")
    ]
    if "image" not in svc and "build" not in svc and "extends" not in svc:
        problems.append(f"{where}: needs image or build")
    if "image" in svc and not isinstance(svc["image"], str):
        problems.append(f"{where}.image must be a string")
    build = svc.get("build")
    if isinstance(build, dict):
        problems += [f"{where}.build.{k}: unknown key" for k in build if k not in BUILD_KEYS]
    elif build is not None and not isinstance(build, str):
        problems.append(f"{where}.build must be a path or a mapping")
    for key in ("command", "entrypoint"):
        if key in svc and not _is_str_or_str_list(svc[key]):
            problems.append(f"{where}.{key} must be a string or a list of strings")
    env = svc.get("environment")
    if env is not None and not (
        (
            isinstance(env, dict)
            and all(isinstance(v, str | int | float | bool) or v is None for v in env.values())
        )
        or (isinstance(env, list) and all(isinstance(v, str) for v in env))
    ):
        problems.append(f"{where}.environment must map names to scalars, or list NAME=value")
    ports = svc.get("ports", [])
    if not isinstance(ports, list) or not all(isinstance(p, str | int | dict) for p in ports):
        problems.append(f"{where}.ports must be a list")
    restart = svc.get("restart")
    if restart is not None and not (isinstance(restart, str) and RESTART.match(restart)):
        problems.append(
            f"{where}.restart = {restart!r}: use no, always, on-failure, unless-stopped"
        )
    health = svc.get("healthcheck")
    if health is not None:
        if not isinstance(health, dict):
            problems.append(f"{where}.healthcheck must be a mapping")
        else:
            problems += [
                f"{where}.healthcheck.{k}: unknown key" for k in health if k not in HEALTHCHECK_KEYS
            ]
            test = health.get("test")
            if test is not None and not (
                isinstance(test, str)
                or (isinstance(test, list) and test and test[0] in ("NONE", "CMD", "CMD-SHELL"))
            ):
                problems.append(f"{where}.healthcheck.test must start with CMD or CMD-SHELL")
            for key in ("interval", "timeout", "start_period", "start_interval"):
                value = health.get(key)
                if value is not None and not (isinstance(value, str) and DURATION.match(value)):
                    problems.append(f"{where}.healthcheck.{key} = {value!r}: not a duration")
    deps = svc.get("depends_on")
    if deps is not None:
        if isinstance(deps, list):
            targets = deps
        elif isinstance(deps, dict):
            targets = list(deps)
            for dep, spec in deps.items():
                condition = spec.get("condition") if isinstance(spec, dict) else None
                if not isinstance(spec, dict) or condition not in DEPENDS_CONDITIONS:
                    problems.append(f"{where}.depends_on.{dep}.condition = {condition!r}")
        else:
            targets = []
            problems.append(f"{where}.depends_on must be a list or a mapping")
        problems += [f"{where}.depends_on: no service {d!r}" for d in targets if d not in services]
    for entry in svc.get("volumes", []) or []:
        if isinstance(entry, str):
            source = entry.split(":", 1)[0] if ":" in entry else None
            if (
                source
                and not source.startswith((".", "/", "~", "$"))
                and source not in (volumes or {})
            ):
                problems.append(f"{where}.volumes: named volume {source!r} is not declared")
        elif not (isinstance(entry, dict) and "target" in entry):
            problems.append(f"{where}.volumes: an entry needs a target")
    return problems


def compose_problems(text: str) -> list[str]:
    """Structural problems of a Compose file (empty when it looks valid)."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        return [f"not valid YAML: {exc}"]
    if not isinstance(doc, dict):
        return ["the file must be a mapping of top-level keys"]
    problems = [
        f"{k}: unknown top-level key"
        for k in doc
        if k not in TOP_LEVEL_KEYS and not str(k).startswith("x-")
    ]
    for section in ("networks", "volumes", "configs", "secrets"):
        value = doc.get(section)
        if value is not None and not (
            isinstance(value, dict)
            and all(isinstance(v, dict) or v is None for v in value.values())
        ):
            problems.append(f"{section} must map names to mappings")
    services = doc.get("services")
    if not isinstance(services, dict) or not services:
        return [*problems, "services must be a non-empty mapping"]
    for name, svc in services.items():
        if not SERVICE_NAME.match(str(name)):
            problems.append(f"services.{name}: invalid service name")
        problems += _check_service(str(name), svc, services, doc.get("volumes"))
    for string in _strings(doc):
        rest = INTERPOLATION.sub("", string)
        if "$" in rest:
            problems.append(f"invalid interpolation in {string!r}")
    return problems


# --- broken copies of the real file: each must be rejected -------------------------------------

Mutation = Callable[[str], str]


def _replace(old: str, new: str) -> Mutation:
    def mutate(text: str) -> str:
        assert old in text, f"mutation target {old!r} is gone from docker-compose.yml"
        return text.replace(old, new, 1)

    return mutate


#: Rejected by both our check and docker-compose 1.29.
BROKEN: dict[str, Mutation] = {
    "service without image or build": _replace("    image: prom/prometheus:v2.55.1\n", ""),
    "bad indentation": _replace('    ports:\n      - "9090:9090"', '  ports:\n      - "9090:9090"'),
    "unknown top-level key": lambda t: t + "\nservics:\n  extra:\n    image: busybox:1.36\n",
    "depends_on an unknown service": _replace("      - stream-dp\n", "      - stream-dpp\n"),
    "misspelt service key": _replace("    hostname: kafka\n", "    hostnme: kafka\n"),
    "unclosed quote": _replace('      - "9094:9094"', '      - "9094:9094'),
    "unknown depends_on condition": _replace("condition: service_healthy", "condition: up"),
    "misspelt healthcheck key": _replace("      interval: 10s\n", "      intervall: 10s\n"),
    "broken interpolation": _replace("${GRAFANA_ADMIN_PASSWORD:-admin}", "${GRAFANA ADMIN}"),
    "services not a mapping": lambda t: re.sub(
        r"(?ms)^services:\n.*?(?=^volumes:)", "services: []\n", t
    ),
}
#: Rejected by our stricter check only (docker-compose 1.29 checks restart values at `up`).
BROKEN_STRUCTURE_ONLY: dict[str, Mutation] = {
    "invalid restart policy": _replace("restart: unless-stopped", "restart: sometimes"),
    "undeclared named volume": _replace(
        "      - prometheus-data:/prometheus", "      - promdata:/p"
    ),
}


def load_compose() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return doc


def test_compose_file_passes_the_structural_check() -> None:
    assert compose_problems(COMPOSE.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("name", sorted({**BROKEN, **BROKEN_STRUCTURE_ONLY}))
def test_structural_check_rejects_a_broken_copy(name: str) -> None:
    mutate = {**BROKEN, **BROKEN_STRUCTURE_ONLY}[name]
    broken = mutate(COMPOSE.read_text(encoding="utf-8"))
    assert compose_problems(broken), f"{name}: accepted"


DOCKER_COMPOSE = shutil.which("docker-compose")
needs_docker_compose = pytest.mark.skipif(
    DOCKER_COMPOSE is None,
    reason="docker-compose not on PATH (Debian: apt-get install -y docker-compose); "
    "the structural check above still ran",
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
@pytest.mark.parametrize("name", sorted(BROKEN))
def test_docker_compose_rejects_a_broken_copy(name: str, tmp_path: Path) -> None:
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(BROKEN[name](COMPOSE.read_text(encoding="utf-8")), encoding="utf-8")
    result = _docker_compose_config(broken)
    assert result.returncode != 0, f"{name}: docker-compose accepted it"


# --- what the stack must contain -------------------------------------------------------------


def test_stack_has_the_agreed_services_wired_in_order() -> None:
    services = load_compose()["services"]
    assert set(services) == {
        "kafka",
        "topics-init",
        "stream-dp",
        "producer",
        "prometheus",
        "grafana",
        "postgres",
        "sink",
    }
    kafka = services["kafka"]
    assert re.fullmatch(r"apache/kafka:\d+\.\d+\.\d+", kafka["image"])
    assert "controller" in kafka["environment"]["KAFKA_PROCESS_ROLES"]  # KRaft, no ZooKeeper
    assert "healthcheck" in kafka
    init = services["topics-init"]
    assert init["command"] == ["topics", "apply", "--config", "/etc/stream-dp/config.yaml"]
    assert init["depends_on"]["kafka"]["condition"] == "service_healthy"
    worker = services["stream-dp"]
    assert worker["command"] == ["run", "--config", "/etc/stream-dp/config.yaml"]
    assert worker["depends_on"]["topics-init"]["condition"] == "service_completed_successfully"
    assert worker["build"]["context"] == "."
    key = worker["environment"]["STREAM_DP_PSEUDONYM_KEY"]
    assert key.startswith("${STREAM_DP_PSEUDONYM_KEY:-INSECURE-DEV-KEY")
    sink = services["sink"]
    assert sink["command"] == ["sink", "--config", "/etc/stream-dp/config.yaml"]
    assert sink["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert sink["environment"]["STREAM_DP_POSTGRES_DSN"].startswith("postgresql://")
    assert "healthcheck" in services["postgres"]
    assert services["producer"]["command"] == [
        "produce", "--config", "/etc/stream-dp/config.yaml",
        "--synthetic", "browser-logs", "--rate", "200",
    ]  # fmt: skip


def test_images_are_pinned() -> None:
    for name, svc in load_compose()["services"].items():
        image = svc.get("image", "")
        if "build" not in svc:
            assert re.fullmatch(r"[a-z0-9./-]+:v?\d+(\.\d+)+", image), f"{name}: pin {image!r}"


def test_bind_mounted_files_exist() -> None:
    for name, svc in load_compose()["services"].items():
        for entry in svc.get("volumes", []):
            source = entry.split(":", 1)[0]
            if source.startswith("./"):
                assert (REPO / source).exists(), f"{name} mounts missing {source}"


def test_dockerfile_runs_as_non_root_with_the_cli_entrypoint() -> None:
    text = (REPO / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.M)
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users and not users[-1].startswith(("root", "0"))
    assert 'ENTRYPOINT ["stream-dp"]' in text
    # topics/ is not part of the wheel; `topics apply` finds the copy through this variable.
    assert "COPY topics ./topics" in text
    assert "ENV STREAM_DP_TOPICS_DIR=/opt/stream-dp/topics" in text


def test_compose_config_loads_and_matches_the_stack() -> None:
    config = load_config(COMPOSE_CONFIG)
    assert config.kafka.bootstrap_servers == "kafka:9092"
    assert config.metrics.enabled and config.metrics.host == "0.0.0.0"
    port = config.metrics.port
    assert f"{port}:{port}" in load_compose()["services"]["stream-dp"]["ports"]
    prometheus = yaml.safe_load(PROMETHEUS.read_text(encoding="utf-8"))
    targets = [
        t
        for job in prometheus["scrape_configs"]
        for sc in job["static_configs"]
        for t in sc["targets"]
    ]
    assert f"stream-dp:{port}" in targets


# --- alerts and dashboard --------------------------------------------------------------------


def _alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _balanced(expr: str) -> bool:
    depth = {"(": 0, "[": 0, "{": 0}
    closing = {")": "(", "]": "[", "}": "{"}
    for char in re.sub(r'"[^"]*"', "", expr):
        if char in depth:
            depth[char] += 1
        elif char in closing:
            depth[closing[char]] -= 1
            if depth[closing[char]] < 0:
                return False
    return not any(depth.values())


def test_alert_rules_parse_and_cover_the_agreed_alerts() -> None:
    rules = _alert_rules()
    names = {r["alert"] for r in rules}
    assert {
        "StreamDPConsumerLagGrowing",
        "StreamDPReleaseOverdue",
        "StreamDPBudgetExhausted",
        "StreamDPDeadLetterRateHigh",
        "StreamDPNotReady",
    } <= names
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations", "keep_firing_for"}
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"]
        assert _balanced(rule["expr"]), rule["alert"]
    overdue = next(r for r in rules if r["alert"] == "StreamDPReleaseOverdue")
    assert "stream_dp_oldest_open_window_end_timestamp_seconds" in overdue["expr"]
    assert "time()" in overdue["expr"]


def test_every_alert_has_a_runbook_section() -> None:
    headings = set(re.findall(r"^## (\S+)", RUNBOOK.read_text(encoding="utf-8"), re.M))
    for rule in _alert_rules():
        assert rule["alert"] in headings, f"RUNBOOK.md lacks '## {rule['alert']}'"
        assert rule["annotations"]["runbook"].endswith("#" + rule["alert"].lower())


def test_alerts_reference_only_existing_metrics() -> None:
    known = Metrics().names()
    for rule in _alert_rules():
        used = set(METRIC_NAME.findall(rule["expr"]))
        if rule["alert"] == "StreamDPDown":  # Prometheus' own `up` of the scrape job
            jobs = yaml.safe_load(PROMETHEUS.read_text(encoding="utf-8"))["scrape_configs"]
            assert 'job="stream-dp"' in rule["expr"]
            assert "stream-dp" in {job["job_name"] for job in jobs}
            continue
        assert used, f"{rule['alert']} uses no stream_dp metric"
        assert used <= known, f"{rule['alert']}: unknown {sorted(used - known)}"


def _dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def test_dashboard_parses_and_uses_the_provisioned_datasource() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert dashboard["uid"] == "stream-dp"
    datasource = yaml.safe_load(DATASOURCE.read_text(encoding="utf-8"))["datasources"][0]
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == datasource["uid"], panel["title"]
            assert panel["targets"], panel["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    provider = yaml.safe_load(DASHBOARD_PROVIDER.read_text(encoding="utf-8"))
    mounted = load_compose()["services"]["grafana"]["volumes"]
    assert f"./ops/grafana/dashboards:{provider['providers'][0]['options']['path']}:ro" in mounted


def test_dashboard_references_only_existing_metrics() -> None:
    known = Metrics().names()
    for expr in _dashboard_exprs():
        assert _balanced(expr), expr
        used = set(METRIC_NAME.findall(expr))
        assert used <= known, f"unknown {sorted(used - known)} in {expr}"


def test_dashboard_has_the_agreed_panels() -> None:
    used = {name for expr in _dashboard_exprs() for name in METRIC_NAME.findall(expr)}
    assert {
        "stream_dp_events_consumed_total",
        "stream_dp_bad_records_total",
        "stream_dp_late_events_total",
        "stream_dp_windows_open",
        "stream_dp_windows_released_total",
        "stream_dp_keys_released_total",
        "stream_dp_keys_suppressed_total",
        "stream_dp_window_epsilon_spent",
        "stream_dp_window_epsilon_remaining",
        "stream_dp_horizon_epsilon_spent",
        "stream_dp_horizon_epsilon_remaining",
        "stream_dp_release_delay_seconds_bucket",
        "stream_dp_batch_processing_seconds_bucket",
        "stream_dp_consumer_lag_records",
        "stream_dp_ready",
    } <= used
