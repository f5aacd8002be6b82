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
    assert sorted(d["kind"] for d in docs) == ["ConfigMap", "Deployment", "Service"]
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


def test_no_secret_value_is_in_the_tree() -> None:
    for path in BASE.iterdir():
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
    deployment = _one(theirs, "Deployment")
    (volume,) = [v for v in _pod(deployment)["volumes"] if v["name"] == "config"]
    assert volume["configMap"]["name"] == _one(theirs, "ConfigMap")["metadata"]["name"]
    volume["configMap"]["name"] = "stream-dp-config"  # kustomize's content hash suffix
    for kind in ("Deployment", "Service"):
        assert _one(theirs, kind)["spec"] == _one(ours, kind)["spec"], kind
    assert _one(theirs, "ConfigMap")["data"] == _one(ours, "ConfigMap")["data"]
