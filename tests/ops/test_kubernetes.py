"""The Kubernetes base (ops/kubernetes), offline.

- Every resource it renders validates strictly (unknown fields refused) against the
  Kubernetes OpenAPI schemas that kubernetes-validate ships (no cluster, no network), for an
  older and the newest Kubernetes it knows. Broken copies must be rejected.
- The wiring a schema cannot see: the probes hit /health/live and /health/ready on the port
  the config serves them on, the ConfigMap is mounted where the command reads it, the
  pseudonym key comes from a Secret under the variable the config names (and no Secret with
  a key is in the tree), resource requests are set, selectors match.
- When ``kubectl`` is on PATH, its own ``kubectl kustomize`` renders the same resources.
"""

from __future__ import annotations

import copy
import importlib.util
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from stream_dp.cli.main import build_parser
from stream_dp.config import load_config

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "ops" / "kubernetes"
VERSIONS = ("1.28.0", kubernetes_validate.latest_version())


def render() -> list[dict[str, Any]]:
    """What ``kubectl kustomize ops/kubernetes`` builds, for the features the base uses
    (resources, a configMapGenerator of files, images); the generated name's content hash
    is left out."""
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text(encoding="utf-8"))
    assert set(kustomization) <= {
        "apiVersion", "kind", "labels", "resources", "configMapGenerator", "images",
    }, "render() does not know a kustomize feature the base now uses"  # fmt: skip
    docs: list[dict[str, Any]] = []
    for resource in kustomization["resources"]:
        text = (BASE / resource).read_text(encoding="utf-8")
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    for generator in kustomization.get("configMapGenerator", []):
        data = {}
        for entry in generator["files"]:
            key, _, source = entry.partition("=")
            data[key] = (BASE / (source or key)).read_text(encoding="utf-8")
        metadata = {"name": generator["name"]}
        docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data})
    images = {i["name"]: f"{i['newName']}:{i['newTag']}" for i in kustomization.get("images", [])}
    for doc in docs:
        for container in _pod(doc).get("containers", []):
            container["image"] = images.get(container["image"], container["image"])
        for pair in kustomization.get("labels", []):
            doc["metadata"].setdefault("labels", {}).update(pair["pairs"])
    return docs


def _pod(doc: dict[str, Any]) -> dict[str, Any]:
    return dict(doc.get("spec", {}).get("template", {}).get("spec", {}))


def _one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind]
    return found


def _problems(doc: dict[str, Any], version: str) -> str | None:
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("version", VERSIONS)
def test_every_resource_validates(version: str) -> None:
    docs = render()
    assert sorted(d["kind"] for d in docs) == ["ConfigMap", "Deployment", "Job", "Service"]
    for doc in docs:
        assert _problems(doc, version) is None, doc["kind"]


def _break(path: list[str | int], value: Any) -> list[dict[str, Any]]:
    docs = copy.deepcopy(render())
    node: Any = _one(docs, "Deployment")
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    return docs


CONTAINER: list[str | int] = ["spec", "template", "spec", "containers", 0]
BROKEN = {
    "misspelt probe field": [*CONTAINER, "livenessProbe", "httpGett"],
    "probe port not a port": [*CONTAINER, "readinessProbe", "httpGet", "port"],
    "replicas not a number": ["spec", "replicas"],
}
BROKEN_VALUES = {
    "misspelt probe field": {"path": "/health/live", "port": "ops"},
    "probe port not a port": ["ops"],
    "replicas not a number": "three",
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_broken_copy_is_rejected(name: str) -> None:
    deployment = _one(_break(BROKEN[name], BROKEN_VALUES[name]), "Deployment")
    assert _problems(deployment, VERSIONS[-1]) is not None, name


def test_the_worker_is_wired_to_its_config() -> None:
    docs = render()
    deployment, service = _one(docs, "Deployment"), _one(docs, "Service")
    configmap = _one(docs, "ConfigMap")
    pod = _pod(deployment)
    (container,) = pod["containers"]
    # the command parses with the real CLI and reads the mounted ConfigMap
    args = build_parser().parse_args(container["args"])
    assert container["args"][0] == "run"
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "config"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "config"]
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    (key,) = configmap["data"]
    assert Path(args.config) == Path(mount["mountPath"]) / key
    config_file = BASE / "stream-dp.yaml"
    assert configmap["data"][key] == config_file.read_text(encoding="utf-8")
    config = load_config(config_file)
    # probes on the ops port the config serves /health on, on every interface
    assert config.metrics.enabled and config.metrics.host == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["ops"] == config.metrics.port
    for probe, path in (
        ("startupProbe", "/health/live"),
        ("livenessProbe", "/health/live"),
        ("readinessProbe", "/health/ready"),
    ):
        assert container[probe]["httpGet"] == {"path": path, "port": "ops"}, probe
    # the pseudonym key from a Secret, under the variable the config reads
    (env,) = [e for e in container["env"] if e["name"] == config.pseudonymization.key_env]
    assert env["valueFrom"]["secretKeyRef"]["name"] == "stream-dp-pseudonym-key"
    assert "value" not in env
    # requests, so the scheduler places it; the Service reaches the pods on the ops port
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    assert {p["targetPort"] for p in service["spec"]["ports"]} == {"ops"}


def test_the_topics_job_applies_the_workers_config() -> None:
    """The Job runs `stream-dp topics apply` (parsed by the real CLI) on the ConfigMap the
    workers read, as the image's non-root user, and removes itself once finished (a Job's
    pod template cannot change: a later apply with another config would be refused)."""
    docs = render()
    job, deployment = _one(docs, "Job"), _one(docs, "Deployment")
    pod = _pod(job)
    (container,) = pod["containers"]
    args = build_parser().parse_args(container["args"])
    assert container["args"][:2] == ["topics", "apply"] and not args.dry_run
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "config"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "config"]
    assert volume["configMap"]["name"] == _one(docs, "ConfigMap")["metadata"]["name"]
    (key,) = _one(docs, "ConfigMap")["data"]
    assert Path(args.config) == Path(mount["mountPath"]) / key
    assert container["image"] == _pod(deployment)["containers"][0]["image"]
    assert pod["securityContext"] == _pod(deployment)["securityContext"]
    assert pod["restartPolicy"] == "OnFailure"
    assert 0 < job["spec"]["ttlSecondsAfterFinished"] <= 3600
    assert "env" not in container  # no pseudonym key: topics apply needs none
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])


MONITORING = BASE / "monitoring"


def _rule_generator() -> Any:
    spec = importlib.util.spec_from_file_location(
        "prometheus_rule", MONITORING / "prometheus_rule.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_prometheus_rule_is_generated_from_the_alert_file() -> None:
    """One source for the alert rules: the PrometheusRule holds exactly alerts.yml's groups,
    written by its generator (run `make k8s-rules` after editing alerts.yml)."""
    generator = _rule_generator()
    alerts = (REPO / "ops" / "prometheus" / "alerts.yml").read_text(encoding="utf-8")
    shipped = (MONITORING / "prometheusrule.yaml").read_text(encoding="utf-8")
    assert shipped == generator.render(alerts), "stale: run `make k8s-rules`"
    rule = yaml.safe_load(shipped)
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load(alerts)["groups"]
    changed = alerts.replace("for: 2m", "for: 3m", 1)
    assert generator.render(changed) != shipped


def test_the_service_monitor_scrapes_the_worker_service() -> None:
    (monitor,) = [
        d for d in yaml.safe_load_all((MONITORING / "servicemonitor.yaml").read_text("utf-8")) if d
    ]
    assert (monitor["apiVersion"], monitor["kind"]) == (
        "monitoring.coreos.com/v1",
        "ServiceMonitor",
    )
    assert set(monitor["spec"]) == {"selector", "endpoints"}
    service = _one(render(), "Service")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    config = load_config(BASE / "stream-dp.yaml")
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    assert port["port"] == config.metrics.port and endpoint["path"] == "/metrics"
    # The alert rules' `up{job="stream-dp"}`: the operator names the job after the Service.
    assert service["metadata"]["name"] == "stream-dp" and "jobLabel" not in monitor["spec"]
    kustomization = yaml.safe_load((MONITORING / "kustomization.yaml").read_text("utf-8"))
    assert kustomization["resources"] == ["servicemonitor.yaml", "prometheusrule.yaml"]


def test_no_secret_value_is_in_the_tree() -> None:
    for path in [*BASE.iterdir(), *MONITORING.iterdir()]:
        if path.is_dir() or path.suffix != ".yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if isinstance(doc, dict):
                assert doc.get("kind") != "Secret", path.name
                assert "secretGenerator" not in doc, path.name


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not on PATH")
def test_kubectl_kustomize_renders_the_same_resources() -> None:
    built = subprocess.run(
        ["kubectl", "kustomize", str(BASE)], capture_output=True, text=True, timeout=120
    )
    assert built.returncode == 0, built.stderr
    theirs = [d for d in yaml.safe_load_all(built.stdout) if d]
    ours = render()
    assert sorted(d["kind"] for d in theirs) == sorted(d["kind"] for d in ours)
    for doc in theirs:
        assert _problems(doc, VERSIONS[-1]) is None, doc["kind"]
        mine = _one(ours, doc["kind"])
        assert doc["metadata"]["name"].startswith(mine["metadata"]["name"])  # + content hash
    for kind in ("Deployment", "Job"):
        (volume,) = [v for v in _pod(_one(theirs, kind))["volumes"] if v["name"] == "config"]
        assert volume["configMap"]["name"] == _one(theirs, "ConfigMap")["metadata"]["name"]
        volume["configMap"]["name"] = "stream-dp-config"  # kustomize's content hash suffix
    for kind in ("Deployment", "Service", "Job"):
        assert _one(theirs, kind)["spec"] == _one(ours, kind)["spec"], kind
    assert _one(theirs, "ConfigMap")["data"] == _one(ours, "ConfigMap")["data"]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not on PATH")
def test_kubectl_kustomize_renders_the_monitoring_resources() -> None:
    built = subprocess.run(
        ["kubectl", "kustomize", str(MONITORING)], capture_output=True, text=True, timeout=120
    )
    assert built.returncode == 0, built.stderr
    theirs = {d["kind"]: d for d in yaml.safe_load_all(built.stdout) if d}
    assert set(theirs) == {"ServiceMonitor", "PrometheusRule"}
    rule = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text(encoding="utf-8"))
    assert theirs["PrometheusRule"]["spec"] == rule["spec"]
