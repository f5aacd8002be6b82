"""Write prometheusrule.yaml beside this file from ops/prometheus/alerts.yml: the same groups
in a PrometheusRule of the Prometheus Operator, so the alert rules have one source.

``python ops/kubernetes/monitoring/prometheus_rule.py`` (``make k8s-rules``);
tests/ops/test_kubernetes.py fails when the file differs from what this writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ALERTS = HERE.parents[1] / "prometheus" / "alerts.yml"
TARGET = HERE / "prometheusrule.yaml"

HEADER = (
    "# GENERATED from ops/prometheus/alerts.yml by ops/kubernetes/monitoring/prometheus_rule.py\n"
    "# (`make k8s-rules`): edit alerts.yml, not this file.\n"
)


def prometheus_rule(alerts_text: str) -> dict[str, Any]:
    """The PrometheusRule holding the groups of an alerts file."""
    groups = yaml.safe_load(alerts_text)["groups"]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "stream-dp", "labels": {"app.kubernetes.io/component": "worker"}},
        "spec": {"groups": groups},
    }


class _Dumper(yaml.SafeDumper):
    """Multi-line expressions as literal blocks, as alerts.yml writes them."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def render(alerts_text: str) -> str:
    body = yaml.dump(
        prometheus_rule(alerts_text),
        Dumper=_Dumper,
        sort_keys=False,
        allow_unicode=True,
        width=100,
    )
    return HEADER + body


def main() -> None:
    TARGET.write_text(render(ALERTS.read_text(encoding="utf-8")), encoding="utf-8")


if __name__ == "__main__":
    main()
