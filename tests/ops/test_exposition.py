"""``/metrics``'s cheap rendering (:class:`stream_dp.ops.exposition.Exposition`) prints the
bytes prometheus_client's ``generate_latest`` prints (``registry_exposition``, ``*_created``
left out) for the same registry state, and every scrape shows the values of its moment:
only the text around the values is kept between scrapes, never a value or a series."""

from __future__ import annotations

import math
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, Summary
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    Metric,
    StateSetMetricFamily,
)
from prometheus_client.parser import text_string_to_metric_families

from stream_dp.ops.exposition import Exposition
from stream_dp.ops.metrics import Metrics, registry_exposition
from stream_dp.pipeline.formats.decode import REASONS
from stream_dp.sink.metrics import SinkMetrics
from tests.ops.test_metrics_naming import populated

#: Label values the text format must escape or carry as they are.
AWKWARD = ('say "hi"', "back\\slash", "two\nlines", "ünïcode ✓", "", "a,b=c}")
#: Values whose text needs Go's float formatting (exponents, NaN, infinities, signed zero).
VALUES = (0.0, -0.0, 1.0, -2.5, 1e20, 123456789.0, 1.5e-7, math.inf, -math.inf, math.nan)


class _Stamped:
    """A collector of our own kind: timestamps, OpenMetrics-only types, a counter with a
    creation time (its ``_created`` sample is left out like prometheus_client's own)."""

    def __init__(self) -> None:
        self.value = 1.0

    def collect(self) -> Iterator[Metric]:
        stamped = GaugeMetricFamily("custom_stamped", "A gauge with a timestamp.", labels=["k"])
        stamped.add_metric(["x"], self.value, timestamp=1_700_000_000.5)
        yield stamped
        counter = CounterMetricFamily(
            "custom_events", "A counter with a creation time.", labels=["k"], created=1.0
        )
        counter.add_metric(["y"], self.value, created=1_700_000_000.0)
        yield counter
        yield GaugeHistogramMetricFamily(
            "custom_gauge_histogram",
            "Buckets.",
            buckets=[("1.0", 2.0), ("+Inf", 3.0)],
            gsum_value=4,
        )
        yield StateSetMetricFamily("custom_state", "A state set.", {"a": True, "b": False})


def _every_kind(registry: CollectorRegistry) -> dict[str, object]:
    """One metric of every kind, labelled and not, with awkward labels and values."""
    counter = Counter("t_counter", "A counter.", ["a", "b"], registry=registry)
    plain = Counter("t_plain", "An unlabelled counter \\ with\na new line.", registry=registry)
    gauge = Gauge("t_gauge", "A gauge.", ["v"], registry=registry)
    calls = Gauge("t_called", "A gauge whose value is a call.", registry=registry)
    unit = Gauge("t_size_bytes", "A gauge with a unit.", unit="bytes", registry=registry)
    histogram = Histogram("t_seconds", "A histogram.", ["q"], registry=registry)
    summary = Summary("t_summary", "A summary.", ["q"], registry=registry)
    info = Info("t_build", "An info.", registry=registry)
    stamped = _Stamped()
    registry.register(stamped)  # type: ignore[arg-type]
    for i, value in enumerate(AWKWARD):
        counter.labels(a=value, b=str(i)).inc(i)
        gauge.labels(v=value).set(VALUES[i])
    for i, value in enumerate(VALUES):
        gauge.labels(v=f"v{i}").set(value)
    plain.inc(3)
    calls.set_function(lambda: stamped.value * 2)
    unit.set(1024)
    histogram.labels(q="a").observe(0.3)
    histogram.labels(q="b").observe(100.0)
    summary.labels(q="a").observe(2.0)
    info.info({"version": "1.0", "quote": '"'})
    return {
        "counter": counter,
        "gauge": gauge,
        "histogram": histogram,
        "summary": summary,
        "info": info,
        "stamped": stamped,
        "unit": unit,
    }


def _assert_alike(exposition: Exposition, registry: CollectorRegistry) -> None:
    assert exposition.render().decode() == registry_exposition(registry).decode()


def test_every_kind_of_metric_prints_as_generate_latest_prints_it() -> None:
    for target_info in (None, {"service": "stream-dp", "zone": 'a "b"'}):
        registry = CollectorRegistry(auto_describe=True, target_info=target_info)
        _every_kind(registry)
        exposition = Exposition(registry)
        _assert_alike(exposition, registry)
        _assert_alike(exposition, registry)  # the second scrape, from the cached text, too


def test_a_worker_and_a_sink_scrape_print_as_generate_latest_prints_them() -> None:
    worker = populated()
    worker.bad_records.labels(reason=REASONS[0]).inc(7)
    sink = SinkMetrics(partitions=[0, 1])
    sink.records_consumed.inc(5)
    for metrics, registry in ((worker, worker.registry), (sink, sink.registry)):
        first = metrics.exposition()
        # Process CPU, memory and descriptors move between two reads: compare those as
        # series, everything else byte for byte.
        expected = registry_exposition(registry)
        assert _without_process(first) == _without_process(expected)
        assert _series(first) == _series(expected)


def test_a_quiet_worker_scrape_is_byte_for_byte_what_generate_latest_prints() -> None:
    metrics = Metrics(reasons=REASONS, queries=["q1", "q2"], partitions=[("t", 0)], process=False)
    metrics.set_config(60, 2, 3, 300, group_id="g")
    for _ in range(2):
        assert metrics.exposition() == registry_exposition(metrics.registry)


def test_each_scrape_shows_the_values_and_series_of_its_moment() -> None:
    registry = CollectorRegistry(auto_describe=True)
    made = _every_kind(registry)
    exposition = Exposition(registry)
    before = exposition.render()
    counter, gauge, histogram = made["counter"], made["gauge"], made["histogram"]
    assert isinstance(counter, Counter) and isinstance(gauge, Gauge)
    assert isinstance(histogram, Histogram) and isinstance(made["info"], Info)
    assert isinstance(made["stamped"], _Stamped) and isinstance(made["unit"], Gauge)
    changes = (
        lambda: counter.labels(a=AWKWARD[0], b="0").inc(2),
        lambda: gauge.labels(v="v3").set(-7.25),
        lambda: histogram.labels(q="a").observe(0.001),
        lambda: histogram.labels(q="new").observe(5.0),  # a new child
        lambda: gauge.remove("v1"),  # a child gone
        lambda: made["info"].info({"version": "2.0"}),  # type: ignore[attr-defined]
        lambda: setattr(made["stamped"], "value", 9.0),  # collected and set_function values
        lambda: made["unit"].inc(),  # type: ignore[attr-defined]
        lambda: registry.unregister(made["summary"]),  # type: ignore[arg-type]
    )
    for change in changes:
        change()
        now = exposition.render()
        assert now != before
        _assert_alike(exposition, registry)
        before = now


def test_series_that_come_and_go_print_right_past_the_text_cache() -> None:
    """Partitions revoked and assigned again and again (47 label sets over the run, more than
    the text cache keeps for the few left): only the series present print, with their values."""
    metrics = Metrics(process=False)
    expected: dict[str, float] = {}
    for round_ in range(40):
        for partition in range(round_, round_ + 8):
            metrics.set_consumer_lag("t", partition, partition * 10 + round_)
            expected[str(partition)] = partition * 10 + round_
        for partition in range(round_, round_ + 8, 3):
            metrics.forget_partition("t", partition)
            expected.pop(str(partition))
        assert metrics.exposition() == registry_exposition(metrics.registry)
    lag = {
        s.labels["partition"]: s.value
        for family in text_string_to_metric_families(metrics.exposition().decode())
        for s in family.samples
        if s.name == "stream_dp_consumer_lag_records"
    }
    assert lag == expected


def _without_process(text: bytes) -> bytes:
    return b"".join(line for line in text.splitlines(keepends=True) if b"process_" not in line)


def _series(text: bytes) -> set[tuple[str, str, tuple[tuple[str, str], ...]]]:
    return {
        (family.name, s.name, tuple(sorted(s.labels.items())))
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }
