"""Every alert of ops/prometheus/alerts.yml evaluated by Prometheus' own rule engine
(`promtool test rules`, Debian's prometheus package) over the series of two deployments
scraped by one Prometheus: one in trouble, one healthy. Each alert must fire for the one in
trouble, with that deployment's labels, and never for the healthy one — an aggregation over
all series (a healthy deployment's releases hiding a stalled one's) turns this red.

The rules are tested as shipped, less their annotations (text for people, checked by
tests/ops/test_deploy_files.py; promtool would compare their rendered text too)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "ops" / "prometheus" / "alerts.yml"
PROMTOOL = shutil.which("promtool")

#: The two deployments: the same scrape job name in two namespaces, and two consumer groups.
TROUBLE = {"namespace": "team-a", "job": "stream-dp", "instance": "10.0.0.1:9108"}
HEALTHY = {"namespace": "team-b", "job": "stream-dp", "instance": "10.0.1.1:9108"}
SINK_TROUBLE = {"namespace": "team-a", "job": "stream-dp-sink", "instance": "10.0.0.2:9109"}
SINK_HEALTHY = {"namespace": "team-b", "job": "stream-dp-sink", "instance": "10.0.1.2:9109"}
GROUP_IDS = {"team-a": "clicks", "team-b": "visits"}
MINUTES = 90


@dataclass(frozen=True)
class Series:
    """One metric with extra labels: its values (promtool's expanding notation, one step a
    minute) in the deployment in trouble and in the healthy one."""

    metric: str
    trouble: str
    healthy: str
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Case:
    series: tuple[Series, ...]
    #: Labels of the alert beyond the deployment's (and severity): those the expression
    #: keeps (a metric's own labels where it does not aggregate them away).
    labels: dict[str, str] = field(default_factory=dict)
    #: Labels of the deployment the alert keeps (all three unless the rule aggregates).
    keeps: tuple[str, ...] = ("namespace", "job", "instance")
    sink: bool = False


def counter(metric: str, **labels: str) -> Series:
    """A counter that grows by 1 a minute in trouble and stays at 0 when healthy."""
    return Series(metric, f"0+1x{MINUTES}", f"0x{MINUTES}", labels)


def gauge(metric: str, trouble: float, healthy: float, **labels: str) -> Series:
    return Series(metric, f"{trouble:g}x{MINUTES}", f"{healthy:g}x{MINUTES}", labels)


def same(metric: str, value: float, **labels: str) -> Series:
    return gauge(metric, value, value, **labels)


CONSUMED = Series("stream_dp_events_consumed_total", f"0+600x{MINUTES}", f"0+600x{MINUTES}")
WINDOW = (
    same("stream_dp_config_window_size_seconds", 60),
    same("stream_dp_config_window_grace_seconds", 5),
    same("stream_dp_config_window_idle_close_seconds", 5),
)

CASES: dict[str, Case] = {
    "StreamDPDown": Case((gauge("up", 0, 1),)),
    "StreamDPNotReady": Case((gauge("stream_dp_ready", 0, 1),)),
    "StreamDPConsumerLagGrowing": Case(
        (
            Series(
                "stream_dp_consumer_lag_records",
                f"20000+100x{MINUTES}",
                f"20000x{MINUTES}",
                {"topic": "events", "partition": "0"},
            ),
        )
    ),
    # The deployment in trouble released once, at 60 s; the healthy one releases every
    # minute (its last release is always now). A max over both would hide the stall.
    "StreamDPReleaseStalled": Case(
        (
            Series("stream_dp_last_release_timestamp_seconds", f"60x{MINUTES}", f"60+60x{MINUTES}"),
            *WINDOW,
        ),
        keeps=("namespace", "job"),
    ),
    "StreamDPBudgetExhausted": Case(
        (counter("stream_dp_budget_exhausted_total", query="visits"),), {"query": "visits"}
    ),
    "StreamDPDeadLetterRateHigh": Case(
        (
            Series(
                "stream_dp_bad_records_total",
                f"0+60x{MINUTES}",
                f"0x{MINUTES}",
                {"reason": "bad_json"},
            ),
            CONSUMED,
        )
    ),
    "StreamDPBrokerErrors": Case(
        (Series("stream_dp_broker_errors_total", f"0+60x{MINUTES}", f"0x{MINUTES}"),)
    ),
    "StreamDPPartialsMalformed": Case(
        (counter("stream_dp_partials_ignored_total", reason="malformed"),),
        {"reason": "malformed"},
    ),
    "StreamDPPartialsFingerprintMismatch": Case(
        (counter("stream_dp_partials_ignored_total", reason="fingerprint_mismatch"),),
        {"reason": "fingerprint_mismatch"},
    ),
    "StreamDPClockSkew": Case(
        (
            gauge("stream_dp_input_clock_skew_seconds", 200, 10),
            same("stream_dp_config_input_max_future_seconds", 300),
        )
    ),
    "StreamDPLateEvents": Case(
        (
            Series("stream_dp_late_events_total", f"0+60x{MINUTES}", f"0x{MINUTES}"),
            CONSUMED,
        )
    ),
    "StreamDPQueryEventsDropped": Case(
        (
            Series(
                "stream_dp_query_events_dropped_total",
                f"0+60x{MINUTES}",
                f"0x{MINUTES}",
                {"query": "countries", "reason": "outside_key_list"},
            ),
            CONSUMED,
        ),
        {"query": "countries", "reason": "outside_key_list"},
    ),
    "StreamDPMisplacedKeyedRecords": Case(
        (counter("stream_dp_bad_records_total", reason="misplaced_key"),),
        {"reason": "misplaced_key"},
    ),
    "StreamDPMembershipLost": Case(
        (Series("stream_dp_membership_lost_total", f"0+1x{MINUTES}", f"0x{MINUTES}"),)
    ),
    "StreamDPTopologyChanged": Case(
        (counter("stream_dp_topology_changes_total", topic="events"),), {"topic": "events"}
    ),
    "StreamDPLedgerLost": Case((gauge("stream_dp_ledger_lost", 1, 0),)),
    "StreamDPLedgerDrawDiscarded": Case((counter("stream_dp_ledger_draws_discarded_total"),)),
    "StreamDPRecordTooLarge": Case((counter("stream_dp_records_too_large_total"),)),
    "StreamDPErasureStale": Case(
        (counter("stream_dp_partials_ignored_total", reason="erasure_stale"),),
        {"reason": "erasure_stale"},
    ),
    "StreamDPInputFetchStalled": Case(
        (gauge("stream_dp_fetch_age_seconds", 300, 1, topic="events", partition="0"),),
        {"topic": "events", "partition": "0"},
    ),
    "StreamDPFetchFailing": Case(
        (counter("stream_dp_fetch_errors_total", reason="unsupported_codec"),),
        {"reason": "unsupported_codec"},
    ),
    "StreamDPOffsetOutOfRange": Case(
        (counter("stream_dp_offset_out_of_range_total", topic="events"),), {"topic": "events"}
    ),
    "StreamDPHeldTooLong": Case(
        (
            gauge("stream_dp_held_record_age_seconds", 4000, 10),
            same("stream_dp_config_max_hold_seconds", 7200),
        )
    ),
    "StreamDPMaxHoldExceeded": Case((counter("stream_dp_max_hold_exceeded_total"),)),
    "StreamDPPartialsIncomplete": Case((gauge("stream_dp_partials_incomplete", 1, 0),)),
    "StreamDPBackpressure": Case((gauge("stream_dp_backpressure", 1, 0),)),
    "StreamDPSinkDown": Case((gauge("up", 0, 1),), sink=True),
    "StreamDPSinkNotReady": Case((gauge("stream_dp_sink_ready", 0, 1),), sink=True),
    "StreamDPSinkHalted": Case((gauge("stream_dp_sink_halted", 1, 0),), sink=True),
    "StreamDPSinkOffsetOutOfRange": Case(
        (counter("stream_dp_sink_offset_out_of_range_total", topic="out"),),
        {"topic": "out"},
        sink=True,
    ),
    # Both have records waiting; only the one in trouble has not committed for long.
    "StreamDPSinkBehind": Case(
        (
            same("stream_dp_sink_consumer_lag_records", 5, topic="out", partition="0"),
            Series(
                "stream_dp_sink_last_commit_timestamp_seconds",
                f"60x{MINUTES}",
                f"60+60x{MINUTES}",
            ),
        ),
        sink=True,
    ),
    "StreamDPSinkDatabaseErrors": Case(
        (counter("stream_dp_sink_database_errors_total"),), sink=True
    ),
    "StreamDPSinkRecordsRefused": Case(
        (counter("stream_dp_sink_bad_records_total", reason="malformed"),),
        {"reason": "malformed"},
        sink=True,
    ),
    "StreamDPSinkConflictingRecords": Case(
        (counter("stream_dp_sink_conflicting_records_total"),), sink=True
    ),
}


def _rules() -> dict[str, Any]:
    return dict(yaml.safe_load(ALERTS.read_text(encoding="utf-8")))


def _alerts(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"] if "alert" in r}


def _selector(metric: str, labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{metric}{{{inner}}}"


def _minutes(duration: str | None) -> int:
    if duration is None:
        return 0
    assert duration.endswith("m"), duration  # every rule's `for` is in minutes
    return int(duration[:-1])


def _test_case(name: str, case: Case, rule: dict[str, Any]) -> dict[str, Any]:
    deployments = (SINK_TROUBLE, SINK_HEALTHY) if case.sink else (TROUBLE, HEALTHY)
    input_series = []
    for deployment in deployments:
        values = "trouble" if deployment is deployments[0] else "healthy"
        info = {**deployment, "group_id": GROUP_IDS[deployment["namespace"]]}
        input_series.append(
            {"series": _selector("stream_dp_deployment_info", info), "values": f"1x{MINUTES}"}
        )
        for s in case.series:
            input_series.append(
                {
                    "series": _selector(s.metric, {**deployment, **s.labels}),
                    "values": getattr(s, values),
                }
            )
    trouble = deployments[0]
    labels = {k: trouble[k] for k in case.keeps}
    if "instance" not in case.keeps:
        labels["group_id"] = GROUP_IDS[trouble["namespace"]]
    labels.update(case.labels)
    labels["severity"] = rule["labels"]["severity"]
    # Well past `for`, and past the 15-minute windows of increase() and rate().
    at = f"{_minutes(rule.get('for')) + 30}m"
    return {
        "interval": "1m",
        "input_series": input_series,
        "alert_rule_test": [
            {"eval_time": at, "alertname": name, "exp_alerts": [{"exp_labels": labels}]}
        ],
    }


def _promtool(tmp_path: Path, doc: dict[str, Any], cases: dict[str, Case]) -> str:
    """`promtool test rules` over ``doc`` (annotations dropped) and ``cases``; its output,
    AssertionError with it when it fails."""
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(doc), encoding="utf-8")
    alerts = _alerts(doc)
    tests = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [_test_case(name, case, alerts[name]) for name, case in cases.items()],
    }
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(tests, sort_keys=False), encoding="utf-8")
    assert PROMTOOL is not None
    done = subprocess.run(
        [PROMTOOL, "test", "rules", "tests.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,  # a hang guard: it takes well under a second
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    return output


needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool not installed (`make test` installs Debian's prometheus package as root)",
)


def test_every_alert_has_a_two_deployment_case() -> None:
    assert set(CASES) == set(_alerts(_rules()))


@needs_promtool
def test_every_alert_fires_for_the_deployment_in_trouble_only(tmp_path: Path) -> None:
    output = _promtool(tmp_path, _rules(), CASES)
    assert output.split() == ["Unit", "Testing:", "tests.yml", "SUCCESS"], output


@needs_promtool
def test_the_release_check_of_one_prometheus_for_all_deployments_is_caught(
    tmp_path: Path,
) -> None:
    """The check of this file bites: the release rule as it was (a max over every series)
    lets the healthy deployment's releases hide the stalled one, and promtool says so."""
    doc = _rules()
    stalled = _alerts(doc)["StreamDPReleaseStalled"]
    stalled["expr"] = (
        "time() - max(stream_dp_last_release_timestamp_seconds > 0) > "
        "2 * max(stream_dp_config_window_size_seconds) "
        "+ max(stream_dp_config_window_grace_seconds) "
        "+ max(stream_dp_config_window_idle_close_seconds)"
    )
    with pytest.raises(AssertionError) as failed:
        _promtool(tmp_path, doc, {"StreamDPReleaseStalled": CASES["StreamDPReleaseStalled"]})
    assert "FAILED" in str(failed.value)
    assert "alertname: StreamDPReleaseStalled" in str(failed.value)


@needs_promtool
def test_the_clock_skew_alert_fires_for_a_fast_clock_too(tmp_path: Path) -> None:
    """Issue 39: a worker clock 200 s fast (fresh input records stamped 200 s behind it) is
    trusted only within input.max_future_s when it takes partitions: the alert fires for
    it as for a slow one, for the deployment in trouble only."""
    fast = Case(
        (
            gauge("stream_dp_input_clock_skew_seconds", -200, -10),
            same("stream_dp_config_input_max_future_seconds", 300),
        )
    )
    output = _promtool(tmp_path, _rules(), {"StreamDPClockSkew": fast})
    assert output.split() == ["Unit", "Testing:", "tests.yml", "SUCCESS"], output
