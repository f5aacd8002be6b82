"""The deployment files: Prometheus rules, Grafana, the runbook. (docker-compose.yml and the
Dockerfile: test_compose.py and test_dockerfile.py.)"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml

from stream_dp.kafka_client.fetch_errors import FETCH_ERROR_REASONS
from stream_dp.ops.metrics import Metrics
from stream_dp.sink.metrics import SinkMetrics
from tests.ops.test_compose import load_compose

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "ops" / "prometheus" / "alerts.yml"
PROMETHEUS = REPO / "ops" / "prometheus" / "prometheus.yml"
DASHBOARD = REPO / "ops" / "grafana" / "dashboards" / "stream-dp.json"
DATASOURCE = REPO / "ops" / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
DASHBOARD_PROVIDER = REPO / "ops" / "grafana" / "provisioning" / "dashboards" / "dashboards.yml"
RUNBOOK = REPO / "ops" / "RUNBOOK.md"

METRIC_NAME = re.compile(r"\bstream_dp_[a-z0-9_]+")

# --- alerts and dashboard --------------------------------------------------------------------


def _all_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _alert_rules() -> list[dict[str, Any]]:
    """The alerts, each expression with the recording rules it reads written out."""
    recorded = {r["record"]: r["expr"] for r in _all_rules() if "record" in r}
    alerts = [dict(r) for r in _all_rules() if "alert" in r]
    for rule in alerts:
        for name, expr in recorded.items():
            rule["expr"] = re.sub(
                rf"(?<![\w:]){re.escape(name)}(?![\w:])", f"({expr})", rule["expr"]
            )
    return alerts


def test_every_rule_is_an_alert_or_a_recording_rule_an_alert_reads() -> None:
    alerts = " ".join(r["expr"] for r in _all_rules() if "alert" in r)
    for rule in _all_rules():
        assert ("alert" in rule) != ("record" in rule), rule
        if "record" in rule:
            assert rule["record"] in alerts, f"{rule['record']} is read by no alert"
            _parse(rule["expr"])
    assert not any(":" in name for r in _alert_rules() for name in _metrics(r["expr"]))


#: Grafana's variables that stand where PromQL needs a duration (label values such as "$job"
#: are strings to the parser); replaced by a duration before parsing.
GRAFANA_DURATIONS = re.compile(r"\$__(?:rate_)?interval|\$__range")


def _parse(expr: str) -> promql_parser.Expr:
    """The expression's syntax tree (promql-parser, a port of Prometheus' own parser);
    ValueError with the reason when Prometheus would refuse it."""
    return promql_parser.parse(GRAFANA_DURATIONS.sub("1m", expr))


def _selectors(expr: str) -> list[promql_parser.VectorSelector]:
    found: list[promql_parser.VectorSelector] = []

    def visit(node: object) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            found.append(node)

    promql_parser.walk(_parse(expr), pre_visit=visit)
    return found


def _metrics(expr: str) -> set[str]:
    return {s.name for s in _selectors(expr) if s.name}


def test_the_parser_refuses_what_prometheus_refuses() -> None:
    for broken in ("sum(rate(x[5m])", "x >", "rate(x)[5m]]", "sum by (instance (x)"):
        with pytest.raises(ValueError):
            _parse(broken)
    assert _metrics('sum(rate(a_total{job="$job"}[$__rate_interval])) / b') == {"a_total", "b"}


def test_alert_rules_parse_and_cover_the_agreed_alerts() -> None:
    rules = _alert_rules()
    names = {r["alert"] for r in rules}
    assert {
        "StreamDPConsumerLagGrowing",
        "StreamDPReleaseStalled",
        "StreamDPBudgetExhausted",
        "StreamDPDeadLetterRateHigh",
        "StreamDPNotReady",
        "StreamDPLateEvents",
        "StreamDPMisplacedKeyedRecords",
        "StreamDPMembershipLost",
        "StreamDPTopologyChanged",
        "StreamDPLedgerDrawDiscarded",
        "StreamDPRecordTooLarge",
        "StreamDPInputFetchStalled",
        "StreamDPFetchFailing",
    } <= names
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations", "keep_firing_for"}
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"]
        _parse(rule["expr"])  # raises on anything Prometheus would refuse to load
    # Release lag in wall-clock terms that holds for backfilled input too: time since the
    # group last released (every covered window is released), not now minus event time.
    stalled = next(r for r in rules if r["alert"] == "StreamDPReleaseStalled")
    flat = " ".join(stalled["expr"].split())
    assert "time() - (max by (namespace, job, group_id) (" in flat
    assert "(stream_dp_last_release_timestamp_seconds > 0)" in flat
    assert "2 * stream_dp_config_window_size_seconds" in flat
    assert "oldest_open_window_end" not in flat
    misplaced = next(r for r in rules if r["alert"] == "StreamDPMisplacedKeyedRecords")
    assert "misplaced_key" in misplaced["expr"]


RUNBOOK_URL = "{{ $externalLabels.runbook_base_url }}/runbook/#"


def _runbook_anchors() -> set[str]:
    """The ids the docs site gives the runbook's headings (docs/runbook.md includes
    ops/RUNBOOK.md; MkDocs' toc extension makes the ids with Python-Markdown's slugify)."""
    from markdown.extensions.toc import slugify

    text = RUNBOOK.read_text(encoding="utf-8")
    return {slugify(h, "-") for h in re.findall(r"^#{1,6} (.+?)\s*$", text, re.M)}


def test_every_alert_links_its_runbook_section_on_the_docs_site() -> None:
    headings = set(re.findall(r"^## (\S+)", RUNBOOK.read_text(encoding="utf-8"), re.M))
    anchors = _runbook_anchors()
    for rule in _alert_rules():
        assert rule["alert"] in headings, f"RUNBOOK.md lacks '## {rule['alert']}'"
        url = rule["annotations"]["runbook_url"]
        assert url.startswith(RUNBOOK_URL), f"{rule['alert']}: {url}"
        anchor = url.removeprefix(RUNBOOK_URL)
        assert anchor in anchors, f"{rule['alert']}: no #{anchor} on the runbook page"
        assert anchor == rule["alert"].lower()
    # the page the URLs name: docs/runbook.md, in the site's nav, made of ops/RUNBOOK.md
    page = (REPO / "docs" / "runbook.md").read_text(encoding="utf-8")
    assert "<!-- include: ops/RUNBOOK.md -->" in page
    assert "runbook.md" in (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    # and the URL base the annotations read is set in the shipped Prometheus config
    labels = yaml.safe_load(PROMETHEUS.read_text(encoding="utf-8"))["global"]["external_labels"]
    assert labels["runbook_base_url"].startswith("http")


def test_every_fetch_error_reason_has_its_runbook_entry() -> None:
    """The worker's ERROR line and the alert send the operator to StreamDPFetchFailing; the
    metric's reason label picks the entry there."""
    text = RUNBOOK.read_text(encoding="utf-8")
    section = text.split("## StreamDPFetchFailing\n", 1)[1].split("\n## ", 1)[0]
    entries = re.findall(r"^### (\S+)$", section, re.M)
    assert entries == list(FETCH_ERROR_REASONS)


def test_the_anchor_check_catches_a_missing_section() -> None:
    assert "streamdpsinkdown" in _runbook_anchors()
    assert "streamdpsinkdwn" not in _runbook_anchors()


def _scrape_jobs() -> set[str]:
    jobs = yaml.safe_load(PROMETHEUS.read_text(encoding="utf-8"))["scrape_configs"]
    return {job["job_name"] for job in jobs}


def test_alerts_reference_only_existing_metrics() -> None:
    worker, sink = Metrics().names(), SinkMetrics().names()
    for rule in _alert_rules():
        used = _metrics(rule["expr"])
        job = re.fullmatch(r'up\{job="([a-z-]+)"\} == 0', rule["expr"].strip())
        if job:  # Prometheus' own `up` of a scrape job
            assert job[1] in _scrape_jobs(), rule["alert"]
            continue
        assert used, f"{rule['alert']} uses no stream_dp metric"
        known = sink if rule["alert"].startswith("StreamDPSink") else worker
        assert used <= known, f"{rule['alert']}: unknown {sorted(used - known)}"


def test_the_sink_has_alerts() -> None:
    rules = {r["alert"]: r for r in _alert_rules()}
    assert rules["StreamDPSinkDown"]["expr"].strip() == 'up{job="stream-dp-sink"} == 0'
    assert "stream_dp_sink_consumer_lag_records" in rules["StreamDPSinkBehind"]["expr"]
    assert "stream_dp_sink_bad_records_total" in rules["StreamDPSinkRecordsRefused"]["expr"]
    assert "stream_dp_sink_database_errors_total" in rules["StreamDPSinkDatabaseErrors"]["expr"]
    assert "stream_dp_sink_ready" in rules["StreamDPSinkNotReady"]["expr"]


WINDOW_GAUGES = {
    "stream_dp_config_window_size_seconds",
    "stream_dp_config_window_grace_seconds",
    "stream_dp_config_window_idle_close_seconds",
}


def test_time_thresholds_are_derived_from_the_window_config() -> None:
    # A release is due once per window: a fixed number of seconds fires every window for
    # long windows (3,600 s: a critical alert each hour) and far too late for short ones.
    # Every "time since" that waits for a release compares against the exported settings.
    for rule in _alert_rules():
        expr = rule["expr"]
        if "stream_dp_last_release_timestamp_seconds" not in expr:
            continue
        assert _metrics(expr) >= WINDOW_GAUGES, rule["alert"]
        numbers = set(re.findall(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.])", expr))
        assert numbers <= {"0", "2"}, f"{rule['alert']}: hard-coded {sorted(numbers)}"


def _dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text(encoding="utf-8")))


def _dashboard_exprs() -> list[str]:
    return [t["expr"] for p in _dashboard()["panels"] for t in p.get("targets", [])]


def test_dashboard_parses_and_chooses_its_datasource() -> None:
    # No hard-coded datasource uid: a datasource variable (the compose stack's default
    # Prometheus is chosen by itself), and the ${DS_PROMETHEUS} input for an import elsewhere.
    dashboard = _dashboard()
    assert dashboard["uid"] == "stream-dp"
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert (variables["datasource"]["type"], variables["datasource"]["query"]) == (
        "datasource",
        "prometheus",
    )
    chosen = {"type": "prometheus", "uid": "${datasource}"}
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"] == chosen, panel["title"]
            assert panel["targets"], panel["title"]
            for target in panel["targets"]:
                assert target["datasource"] == chosen, panel["title"]
    for name in ("job", "instance", "sink_job", "sink_instance"):
        assert variables[name]["datasource"] == chosen, name
    provisioned = yaml.safe_load(DATASOURCE.read_text(encoding="utf-8"))["datasources"][0]
    assert provisioned["isDefault"] and provisioned["type"] == "prometheus"
    assert f'"uid": "{provisioned["uid"]}"' not in DASHBOARD.read_text(encoding="utf-8")
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    provider = yaml.safe_load(DASHBOARD_PROVIDER.read_text(encoding="utf-8"))
    mounted = load_compose()["services"]["grafana"]["volumes"]
    assert f"./ops/grafana/dashboards:{provider['providers'][0]['options']['path']}:ro" in mounted


def test_every_dashboard_query_is_scoped_to_the_chosen_job_and_instances() -> None:
    # Two deployments (or a worker and its sink) in one Prometheus must not be summed
    # together: every series selector carries the job and instance variables.
    for expr in _dashboard_exprs():
        for selector in _selectors(expr):
            prefix = "sink_" if selector.name.startswith("stream_dp_sink_") else ""
            matchers = [(m.name, m.op, m.value) for m in selector.matchers.matchers]
            assert ("job", promql_parser.MatchOp.Equal, f"${prefix}job") in matchers, expr
            assert ("instance", promql_parser.MatchOp.Re, f"${prefix}instance") in matchers, expr
    variables = {v["name"]: v for v in _dashboard()["templating"]["list"]}
    assert variables["instance"]["multi"] and variables["instance"]["allValue"] == ".*"
    assert "stream_dp_build_info" in variables["job"]["definition"]
    assert "stream_dp_sink_build_info" in variables["sink_job"]["definition"]


def test_dashboard_references_only_existing_metrics() -> None:
    known = Metrics().names() | SinkMetrics().names()
    for expr in _dashboard_exprs():
        used = _metrics(expr)
        assert used <= known, f"unknown {sorted(used - known)} in {expr}"
    for variable in _dashboard()["templating"]["list"]:
        used = set(METRIC_NAME.findall(variable.get("definition", "")))
        assert used <= known, variable["name"]


def test_dashboard_has_a_sink_row() -> None:
    panels = _dashboard()["panels"]
    rows = [i for i, p in enumerate(panels) if p["type"] == "row"]
    (start,) = [i for i in rows if panels[i]["title"].startswith("Sink")]
    end = next((i for i in rows if i > start), len(panels))
    used = {
        name
        for panel in panels[start + 1 : end]
        for target in panel["targets"]
        for name in _metrics(target["expr"])
    }
    assert {
        "stream_dp_sink_ready",
        "stream_dp_sink_consumer_lag_records",
        "stream_dp_sink_last_commit_timestamp_seconds",
        "stream_dp_sink_bad_records_total",
        "stream_dp_sink_database_errors_total",
        "stream_dp_sink_releases_stored_total",
        "stream_dp_sink_offset_out_of_range_total",
        "stream_dp_sink_records_skipped_total",
    } <= used


DASHBOARDS = sorted((REPO / "ops" / "grafana" / "dashboards").glob("*.json"))


def _datasource_refs(node: object) -> list[dict[str, Any]]:
    """Every ``"datasource": {...}`` object anywhere in a dashboard."""
    found: list[dict[str, Any]] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource" and isinstance(value, dict):
                found.append(value)
            else:
                found.extend(_datasource_refs(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(_datasource_refs(item))
    return found


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.name for p in DASHBOARDS])
def test_a_dashboard_imports_with_every_input_used_and_says_its_grafana_version(
    path: Path,
) -> None:
    """Grafana's import replaces each ``${DS_…}`` of ``__inputs`` with the datasource the
    user picks: an input nothing reads is a prompt that does nothing. Every panel, target
    and variable reads a datasource variable of its plugin, and each such variable starts
    at the input of that plugin; provisioned (compose), the variable picks the default."""
    dashboard = json.loads(path.read_text(encoding="utf-8"))
    inputs = {i["name"]: i for i in dashboard["__inputs"]}
    requires = {r["id"]: r for r in dashboard["__requires"]}
    assert re.fullmatch(r"\d+\.\d+\.\d+", requires["grafana"]["version"])
    chooser = {v["name"]: v for v in dashboard["templating"]["list"] if v["type"] == "datasource"}
    assert chooser
    for variable in chooser.values():
        value = variable["current"]["value"]
        assert value == variable["current"]["text"]
        name = re.fullmatch(r"\$\{(DS_[A-Z_]+)\}", value)
        assert name and inputs[name[1]]["pluginId"] == variable["query"], variable["name"]
        assert variable["query"] in requires, f"no __requires entry for {variable['query']}"
    body = {k: v for k, v in dashboard.items() if k != "__inputs"}
    for name in inputs:
        assert f"${{{name}}}" in json.dumps(body), f"input {name} is used nowhere"
    refs = _datasource_refs(dashboard["panels"]) + _datasource_refs(dashboard["templating"])
    assert refs
    for ref in refs:
        variable = re.fullmatch(r"\$\{(\w+)\}", ref["uid"])
        assert variable and variable[1] in chooser, ref
        assert ref["type"] == chooser[variable[1]]["query"], ref


def test_dashboard_has_the_agreed_panels() -> None:
    used = {name for expr in _dashboard_exprs() for name in _metrics(expr)}
    assert {
        "stream_dp_events_consumed_total",
        "stream_dp_bad_records_total",
        "stream_dp_late_events_total",
        "stream_dp_windows_open",
        "stream_dp_windows_released_total",
        "stream_dp_keys_released_total",
        "stream_dp_window_epsilon_spent",
        "stream_dp_window_epsilon_remaining",
        "stream_dp_horizon_epsilon_spent",
        "stream_dp_horizon_epsilon_remaining",
        "stream_dp_release_delay_seconds_bucket",
        "stream_dp_batch_processing_seconds_bucket",
        "stream_dp_consumer_lag_records",
        "stream_dp_ready",
    } <= used


def test_alertmanager_routes_to_a_declared_receiver() -> None:
    # Prometheus' alerting block points at the compose Alertmanager, whose route must name
    # a receiver it declares (Alertmanager refuses to start otherwise).
    config = yaml.safe_load(
        (REPO / "ops" / "alertmanager" / "alertmanager.yml").read_text(encoding="utf-8")
    )
    receivers = {r["name"] for r in config["receivers"]}
    assert config["route"]["receiver"] in receivers
    (manager,) = yaml.safe_load(PROMETHEUS.read_text(encoding="utf-8"))["alerting"]["alertmanagers"]
    (target,) = manager["static_configs"][0]["targets"]
    host, port = target.split(":")
    alertmanager = load_compose()["services"][host]
    assert f"127.0.0.1:{port}:{port}" in alertmanager["ports"]
    assert (
        "./ops/alertmanager/alertmanager.yml:/etc/alertmanager/alertmanager.yml:ro"
        in (alertmanager["volumes"])
    )
