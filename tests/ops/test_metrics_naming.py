"""Metrics are named the Prometheus way (promtool's rules, plus ours) and parse back."""

from __future__ import annotations

import math
import re

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.parser import text_string_to_metric_families

from stream_dp.ops.metrics import (
    BATCH_PROCESSING_BUCKETS_S,
    RELEASE_DELAY_BUCKETS_S,
    Metrics,
)

ALLOWED_LABELS = {"query", "partition", "reason", "topic", "le", "export"}
#: Info metrics' labels: the build, and the deployment (kafka.group_id: configuration, not
#: data; alert rules group each deployment's series by it).
BUILD_INFO_LABELS = {"version", "python", "group_id"}
FORBIDDEN_LABELS = {"user", "user_id", "key", "domain", "pseudonym", "group", "value"}
SNAKE = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")
NON_BASE_UNITS = re.compile(
    r"_(milliseconds|millis|ms|microseconds|us|nanoseconds|ns|minutes|hours|days|"
    r"kilobytes|kb|megabytes|mb|bits|percent)(_|$)"
)
TIME_WORDS = re.compile(r"(seconds|duration|delay|latency|time|timestamp|age)")

#: The public contract: attribute → (exposed sample name, type, label names).
EXPECTED: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "events_consumed": ("stream_dp_events_consumed_total", "counter", ()),
    "bad_records": ("stream_dp_bad_records_total", "counter", ("reason",)),
    "late_events": ("stream_dp_late_events_total", "counter", ()),
    "replayed_events_skipped": ("stream_dp_replayed_events_skipped_total", "counter", ()),
    "query_events_dropped": (
        "stream_dp_query_events_dropped_total",
        "counter",
        ("query", "reason"),
    ),
    "windows_open": ("stream_dp_windows_open", "gauge", ()),
    "windows_due": ("stream_dp_windows_due", "gauge", ()),
    "windows_released": ("stream_dp_windows_released_total", "counter", ("query",)),
    "releases_published": ("stream_dp_releases_published_total", "counter", ("query",)),
    "keys_released": ("stream_dp_keys_released_total", "counter", ("query",)),
    "membership_lost": ("stream_dp_membership_lost_total", "counter", ()),
    "topology_changes": ("stream_dp_topology_changes_total", "counter", ("topic",)),
    "ledger_lost": ("stream_dp_ledger_lost", "gauge", ()),
    "ledger_draws_discarded": ("stream_dp_ledger_draws_discarded_total", "counter", ()),
    "records_too_large": ("stream_dp_records_too_large_total", "counter", ()),
    "budget_exhausted": ("stream_dp_budget_exhausted_total", "counter", ("query",)),
    "epsilon_spent": ("stream_dp_window_epsilon_spent", "gauge", ("query",)),
    "epsilon_remaining": ("stream_dp_window_epsilon_remaining", "gauge", ()),
    "horizon_epsilon_spent": ("stream_dp_horizon_epsilon_spent", "gauge", ()),
    "horizon_epsilon_remaining": ("stream_dp_horizon_epsilon_remaining", "gauge", ()),
    "bounds_contributions_per_window": (
        "stream_dp_bounds_max_contributions_per_window",
        "gauge",
        (),
    ),
    "bounds_keys_per_user": ("stream_dp_bounds_max_keys_per_user", "gauge", ()),
    "bounds_contributions_per_key": ("stream_dp_bounds_max_contributions_per_key", "gauge", ()),
    "bounds_epsilon_spent": ("stream_dp_bounds_epsilon_spent", "gauge", ()),
    "release_delay": ("stream_dp_release_delay_seconds", "histogram", ()),
    "batch_processing": ("stream_dp_batch_processing_seconds", "histogram", ()),
    "consumer_lag": ("stream_dp_consumer_lag_records", "gauge", ("topic", "partition")),
    "fetch_age": ("stream_dp_fetch_age_seconds", "gauge", ("topic", "partition")),
    "ledger_windows_loaded": ("stream_dp_ledger_windows_loaded_total", "counter", ()),
    "ledger_republished": ("stream_dp_ledger_republished_total", "counter", ()),
    "watermark": ("stream_dp_watermark_timestamp_seconds", "gauge", ()),
    "oldest_open_window_end": (
        "stream_dp_oldest_open_window_end_timestamp_seconds",
        "gauge",
        (),
    ),
    "last_release": ("stream_dp_last_release_timestamp_seconds", "gauge", ()),
    "config_window_size": ("stream_dp_config_window_size_seconds", "gauge", ()),
    "config_window_grace": ("stream_dp_config_window_grace_seconds", "gauge", ()),
    "config_window_idle_close": ("stream_dp_config_window_idle_close_seconds", "gauge", ()),
    "config_input_max_future": ("stream_dp_config_input_max_future_seconds", "gauge", ()),
    "input_clock_skew": ("stream_dp_input_clock_skew_seconds", "gauge", ()),
    "ready": ("stream_dp_ready", "gauge", ()),
    "broker_errors": ("stream_dp_broker_errors_total", "counter", ()),
    "fetch_errors": ("stream_dp_fetch_errors_total", "counter", ("reason",)),
    "events_repartitioned": ("stream_dp_events_repartitioned_total", "counter", ()),
    "repartition_duplicates_skipped": (
        "stream_dp_repartition_duplicates_skipped_total",
        "counter",
        (),
    ),
    "partials_published": ("stream_dp_partials_published_total", "counter", ()),
    "partials_ignored": ("stream_dp_partials_ignored_total", "counter", ("reason",)),
    "erasure_requests_applied": ("stream_dp_erasure_requests_applied_total", "counter", ()),
    "erasures_active": ("stream_dp_erasures_active", "gauge", ()),
    "export_records": ("stream_dp_export_records_total", "counter", ("export",)),
    "export_records_suppressed": (
        "stream_dp_export_records_suppressed_total",
        "counter",
        ("export",),
    ),
    "build_info": ("stream_dp_build_info", "info", ("version", "python")),
    "deployment_info": ("stream_dp_deployment_info", "info", ("group_id",)),
    "offset_out_of_range": ("stream_dp_offset_out_of_range_total", "counter", ("topic",)),
    "partials_incomplete": ("stream_dp_partials_incomplete", "gauge", ()),
    "held_record_age": ("stream_dp_held_record_age_seconds", "gauge", ()),
    "max_hold_exceeded": ("stream_dp_max_hold_exceeded_total", "counter", ()),
    "config_max_hold": ("stream_dp_config_max_hold_seconds", "gauge", ()),
    "held_state": ("stream_dp_held_state_bytes", "gauge", ()),
    "config_max_held_state": ("stream_dp_config_max_held_state_bytes", "gauge", ()),
    "backpressure": ("stream_dp_backpressure", "gauge", ()),
}


def naming_violations(exposition: str) -> list[str]:
    """promtool-style lint of a text exposition, plus stream-dp's own rules."""
    problems: list[str] = []
    for family in text_string_to_metric_families(exposition):
        name = family.name
        sample_names = {s.name for s in family.samples}
        if not name.startswith("stream_dp_") and not name.startswith("process_"):
            problems.append(f"{name}: missing the stream_dp_ prefix")
        if not SNAKE.match(name):
            problems.append(f"{name}: not snake_case")
        if NON_BASE_UNITS.search(name):
            problems.append(f"{name}: not in base units (use _seconds, _bytes, ratios)")
        if TIME_WORDS.search(name) and not name.endswith("_seconds"):
            problems.append(f"{name}: a time must be in _seconds")
        if not family.documentation or len(family.documentation) < 20:
            problems.append(f"{name}: help text missing or too short")
        if family.type == "counter":
            if not all(n.endswith("_total") for n in sample_names):
                problems.append(f"{name}: counter samples must end in _total: {sample_names}")
        elif any(n.endswith("_total") for n in sample_names | {name}):
            problems.append(f"{name}: a {family.type} must not end in _total")
        if name.endswith("_created") or any(n.endswith("_created") for n in sample_names):
            problems.append(f"{name}: _created series are not exposed")
        for sample in family.samples:
            labels = set(sample.labels)
            # The 0.0.4 text format exposes an Info as a gauge named ..._info.
            info = family.type == "info" or name.endswith("_info")
            allowed = ALLOWED_LABELS | (BUILD_INFO_LABELS if info else set())
            if labels & FORBIDDEN_LABELS:
                problems.append(
                    f"{sample.name}: forbidden label {sorted(labels & FORBIDDEN_LABELS)}"
                )
            elif not labels <= allowed:
                problems.append(f"{sample.name}: unexpected labels {sorted(labels - allowed)}")
    return problems


def populated() -> Metrics:
    """A Metrics with a child for every labelled metric and a value in every series."""
    m = Metrics(
        queries=["visits_by_domain"],
        partitions=[("events", 0), ("events", 1)],
        reasons=["not_json"],
    )
    m.events_consumed.inc(10)
    m.bad_records.labels(reason="missing_user").inc()
    m.late_events.inc()
    m.replayed_events_skipped.inc(2)
    m.windows_released.labels(query="visits_by_domain").inc()
    m.releases_published.labels(query="visits_by_domain").inc(4)
    m.keys_released.labels(query="visits_by_domain").inc(4)
    m.budget_exhausted.labels(query="visits_by_domain").inc()
    m.epsilon_spent.labels(query="visits_by_domain").set(0.5)
    m.epsilon_remaining.set(0.5)
    m.horizon_epsilon_spent.set(3.0)
    m.horizon_epsilon_remaining.set(21.0)
    m.release_delay.observe(42.0)
    m.batch_processing.observe(0.002)
    m.set_consumer_lag("events", 0, 12)
    m.fetch_age.labels(topic="events", partition="0").set(0.4)
    m.ledger_windows_loaded.inc()
    m.ledger_republished.inc()
    m.watermark.set(1_596_283_200.0)
    m.set_open_windows(2, 1_596_286_800.0)
    m.last_release.set(1_596_283_260.0)
    m.set_config(300, 30, 30.0, 300.0, group_id="stream-dp")
    m.ready.set(1)
    m.broker_errors.inc()
    m.events_repartitioned.inc(9)
    m.repartition_duplicates_skipped.inc(2)
    m.partials_published.inc(6)
    m.partials_ignored.labels(reason="duplicate_version").inc()
    m.topology_changes.labels(topic="events").inc()
    m.erasure_requests_applied.inc()
    m.erasures_active.set(1)
    m.export_records.labels(export="acme").inc(3)
    m.export_records_suppressed.labels(export="acme").inc()
    m.offset_out_of_range.labels(topic="events").inc()
    return m


def test_naming_rules_hold_for_every_exposed_family() -> None:
    text = populated().exposition().decode()
    assert naming_violations(text) == []


def test_the_naming_check_catches_bad_names() -> None:
    registry = CollectorRegistry()
    Counter("requests", "h", registry=registry).inc()
    Gauge("stream_dp_queue_total", "A gauge wrongly named like a counter.", registry=registry)
    Gauge("stream_dp_lag_ms", "Lag in milliseconds is not a base unit.", registry=registry)
    Gauge("stream_dp_delay", "A time without its unit in the name.", registry=registry)
    Gauge(
        "stream_dp_per_user", "Per-user series are forbidden.", ["user"], registry=registry
    ).labels(user="alice").set(1)
    from prometheus_client import generate_latest

    problems = "\n".join(naming_violations(generate_latest(registry).decode()))
    assert "requests: missing the stream_dp_ prefix" in problems
    assert "requests: help text missing" in problems
    assert "stream_dp_queue_total: a gauge must not end in _total" in problems
    assert "stream_dp_lag_ms: not in base units" in problems
    assert "stream_dp_delay: a time must be in _seconds" in problems
    assert "forbidden label ['user']" in problems


@pytest.mark.parametrize("attribute", sorted(EXPECTED))
def test_attribute_exposes_the_agreed_name_type_and_labels(attribute: str) -> None:
    sample_name, kind, labels = EXPECTED[attribute]
    m = populated()
    metric = getattr(m, attribute)
    assert metric._type == kind  # prometheus_client's own type tag
    # this attribute's own family (not just some metric in the registry) has the name/labels
    family = metric.describe()[0]
    family_suffix = {"counter": "_total", "info": "_info"}.get(kind, "")
    assert family.name == sample_name.removesuffix(family_suffix)
    if kind != "info":  # an Info's "labels" are its info keys, checked below
        assert tuple(metric._labelnames) == labels
    suffix = "_count" if kind == "histogram" else ""
    assert sample_name + suffix in m.names()
    parsed = {
        s.name: s
        for fam in text_string_to_metric_families(m.exposition().decode())
        for s in fam.samples
    }
    assert sample_name + suffix in parsed
    exposed_labels = set(parsed[sample_name + suffix].labels) - {"le"}
    assert exposed_labels == set(labels)


def test_every_attribute_is_listed_in_the_contract() -> None:
    m = Metrics()
    from prometheus_client.metrics import MetricWrapperBase

    exposed = {a for a, v in vars(m).items() if isinstance(v, MetricWrapperBase)}
    assert exposed == set(EXPECTED)


def test_names_covers_labelled_metrics_before_their_first_child() -> None:
    names = Metrics().names()
    assert "stream_dp_windows_released_total" in names
    assert "stream_dp_bad_records_total" in names
    assert "stream_dp_consumer_lag_records" in names
    assert {
        "stream_dp_release_delay_seconds_bucket",
        "stream_dp_release_delay_seconds_sum",
        "stream_dp_release_delay_seconds_count",
    } <= names


def test_names_matches_what_is_exposed_once_every_series_exists() -> None:
    m = populated()
    exposed = {
        s.name
        for fam in text_string_to_metric_families(m.exposition().decode())
        for s in fam.samples
    }
    assert exposed == m.names()


def test_exposition_parses_back_with_the_values_set() -> None:
    m = populated()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(m.exposition().decode())
        for s in fam.samples
    }
    assert samples[("stream_dp_events_consumed_total", ())] == 10
    assert samples[("stream_dp_bad_records_total", (("reason", "missing_user"),))] == 1
    assert samples[("stream_dp_bad_records_total", (("reason", "not_json"),))] == 0
    assert (
        samples[("stream_dp_consumer_lag_records", (("partition", "0"), ("topic", "events")))] == 12
    )
    assert (
        samples[("stream_dp_consumer_lag_records", (("partition", "1"), ("topic", "events")))] == 0
    )
    assert samples[("stream_dp_window_epsilon_spent", (("query", "visits_by_domain"),))] == 0.5
    assert samples[("stream_dp_release_delay_seconds_count", ())] == 1
    assert samples[("stream_dp_release_delay_seconds_bucket", (("le", "60.0"),))] == 1
    assert samples[("stream_dp_release_delay_seconds_bucket", (("le", "30.0"),))] == 0
    assert samples[("stream_dp_windows_open", ())] == 2
    assert samples[("stream_dp_events_repartitioned_total", ())] == 9
    assert samples[("stream_dp_repartition_duplicates_skipped_total", ())] == 2
    assert samples[("stream_dp_partials_published_total", ())] == 6
    ignored = "stream_dp_partials_ignored_total"
    assert samples[(ignored, (("reason", "duplicate_version"),))] == 1
    # Every reason is exposed at 0 before it first happens (alerts need the series).
    assert samples[(ignored, (("reason", "window_released"),))] == 0
    assert samples[(ignored, (("reason", "malformed"),))] == 0
    build = [k for k in samples if k[0] == "stream_dp_build_info"]
    assert len(build) == 1 and dict(build[0][1])["version"]


def test_two_workers_in_one_process_do_not_collide() -> None:
    a, b = Metrics(queries=["q"]), Metrics(queries=["q"])
    a.events_consumed.inc(5)
    a.windows_released.labels(query="q").inc()
    assert b"stream_dp_events_consumed_total 0.0" in b.exposition()
    assert b"stream_dp_events_consumed_total 5.0" in a.exposition()
    assert a.registry is not b.registry


def test_buckets_are_in_seconds_over_the_agreed_ranges() -> None:
    assert RELEASE_DELAY_BUCKETS_S[0] == 1.0 and RELEASE_DELAY_BUCKETS_S[-1] == 86_400.0
    assert BATCH_PROCESSING_BUCKETS_S[0] == 1e-4 and BATCH_PROCESSING_BUCKETS_S[-1] == 10.0
    for buckets in (RELEASE_DELAY_BUCKETS_S, BATCH_PROCESSING_BUCKETS_S):
        assert list(buckets) == sorted(set(buckets))


def test_no_open_window_is_nan_not_zero() -> None:
    m = Metrics()
    assert math.isnan(m.oldest_open_window_end._value.get())
    m.set_open_windows(1, 1_000.0)
    assert m.oldest_open_window_end._value.get() == 1_000.0
    m.set_open_windows(0, None)
    assert math.isnan(m.oldest_open_window_end._value.get())
    assert m.windows_open._value.get() == 0


def test_revoked_partition_lag_series_is_removed() -> None:
    m = Metrics(partitions=[("events", 3)])
    m.set_consumer_lag("events", 3, -5)  # the embedded broker's high watermark can be behind
    m.set_consumer_lag("partials", 3, 7)
    assert b'stream_dp_consumer_lag_records{partition="3",topic="events"} 0.0' in m.exposition()
    m.forget_partition("events", 3)
    m.forget_partition("events", 3)  # idempotent
    assert b'partition="3",topic="events"' not in m.exposition()
    assert b'partition="3",topic="partials"} 7.0' in m.exposition()  # other topics stay


def test_process_metrics_and_every_bad_record_reason_exist_from_the_start() -> None:
    from stream_dp.pipeline.formats.decode import REASONS

    text = Metrics(reasons=REASONS).exposition().decode()
    for name in ("process_resident_memory_bytes", "process_open_fds", "process_cpu_seconds_total"):
        assert f"\n{name} " in text, name
    for reason in REASONS:  # pre-initialised: rate() sees the series before the first one
        assert f'stream_dp_bad_records_total{{reason="{reason}"}} 0.0' in text, reason


def test_the_worker_exports_its_window_settings_for_the_alert_thresholds() -> None:
    # Alert rules derive StreamDPReleaseStalled's threshold from these gauges, so they must
    # carry the worker's own configuration (not the defaults, not zero).
    from stream_dp.pipeline.kafka.worker import Worker
    from tests.pipeline.support import KEYRING, config

    cfg = config()
    worker = Worker(cfg, KEYRING, bootstrap_servers="127.0.0.1:1")
    text = worker.metrics.exposition().decode()
    samples = {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert samples["stream_dp_config_window_size_seconds"] == cfg.window.size_s
    assert samples["stream_dp_config_window_grace_seconds"] == cfg.window.grace_s
    assert samples["stream_dp_config_window_idle_close_seconds"] == cfg.window.idle_close_s
    assert (cfg.window.size_s, cfg.window.grace_s) != (3600, 60)  # not the defaults
