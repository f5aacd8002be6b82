"""Per-query series exist from the start, at zero, under the query's own label; a revoked
partition's lag and fetch-age series are gone, not left at a stale value."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from stream_dp.ops.metrics import Metrics


def _samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_a_new_query_has_its_epsilon_series_at_zero_under_its_name() -> None:
    metrics = Metrics(process=False)
    metrics.add_query("visits")
    series = {
        k: v for k, v in _samples(metrics).items() if k[0] == "stream_dp_window_epsilon_spent"
    }
    assert series == {("stream_dp_window_epsilon_spent", (("query", "visits"),)): 0.0}


def test_forgetting_a_partition_drops_its_lag_and_fetch_age_series_only() -> None:
    metrics = Metrics(process=False)
    for partition in (0, 1):
        metrics.fetch_age.labels("events", str(partition)).set(3.0)
        metrics.consumer_lag.labels("events", str(partition)).set(7.0)
    metrics.forget_partition("events", 1)
    left = {
        (name, labels)
        for name, labels in _samples(metrics)
        if name in ("stream_dp_fetch_age_seconds", "stream_dp_consumer_lag_records")
    }
    assert {dict(labels)["partition"] for _, labels in left} == {"0"}
    assert len(left) == 2


def test_a_new_query_has_its_counters_at_zero_under_its_name_only() -> None:
    metrics = Metrics(process=False)
    metrics.add_query("visits")
    counters = (
        "stream_dp_windows_released_total",
        "stream_dp_releases_published_total",
        "stream_dp_keys_released_total",
        "stream_dp_budget_exhausted_total",
    )
    for name in counters:
        series = {k: v for k, v in _samples(metrics).items() if k[0] == name}
        assert series == {(name, (("query", "visits"),)): 0.0}, name
