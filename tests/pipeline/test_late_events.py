"""Late and uncovered events are never silent: the rate-limited WARNING and its text."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import pytest

from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.stages.late_events import LateEventsNotice

COVERAGE_S = 1_764_201_600  # 2025-11-27T00:00:00Z


def test_first_late_events_warn_at_once_with_count_coverage_and_fix(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = Metrics()
    notice = LateEventsNotice(metrics, None, interval_s=300.0)
    assert notice.observe(COVERAGE_S, now_mono_s=10.0) is None  # nothing late: silent
    metrics.late_events.inc(1662)
    with caplog.at_level(logging.WARNING, logger="stream_dp.pipeline.stages.late_events"):
        message = notice.observe(COVERAGE_S, now_mono_s=11.0)
    assert message is not None
    assert [r.getMessage() for r in caplog.records] == [message]
    assert caplog.records[0].levelno == logging.WARNING
    assert message.startswith("1662 events dropped as late")
    assert "2025-11-27T00:00:00Z" in message and "window.start_at unset" in message
    assert "window.start_at:" in message and "stream-dp replay" in message


def test_rate_limited_and_counts_only_new_drops() -> None:
    metrics = Metrics()
    notice = LateEventsNotice(metrics, None, interval_s=300.0)
    metrics.late_events.inc(5)
    assert notice.observe(COVERAGE_S, now_mono_s=0.0) is not None
    metrics.late_events.inc(7)
    assert notice.observe(COVERAGE_S, now_mono_s=299.0) is None  # within the interval
    later = notice.observe(COVERAGE_S, now_mono_s=300.0)
    assert later is not None and later.startswith("7 events dropped")
    assert notice.observe(COVERAGE_S, now_mono_s=10_000.0) is None  # no new drops


def test_names_start_at_as_the_origin_when_set() -> None:
    metrics = Metrics()
    start = datetime(2025, 11, 27, tzinfo=UTC)
    metrics.late_events.inc(1)
    message = LateEventsNotice(metrics, start).observe(COVERAGE_S, now_mono_s=0.0)
    assert message is not None and "(from window.start_at)" in message


def test_observe_reads_its_counters_without_collecting_the_registry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker's loop calls observe every iteration (an idle worker about five times a
    second): it reads the two counters, never a whole-registry collect (a scrape's work per
    call, the largest part of an idle worker's CPU before)."""
    from stream_dp.config.model import QueryConfig

    query = QueryConfig(
        name="visits", statistic="count", group_by=["domain"], epsilon=1.0, delta=1e-6
    )
    metrics = Metrics()
    collects: list[int] = []
    whole = metrics.registry.collect

    def counted() -> object:
        collects.append(1)
        return whole()

    monkeypatch.setattr(metrics.registry, "collect", counted)
    notice = LateEventsNotice(metrics, None, [query], interval_s=300.0)
    assert notice.observe(COVERAGE_S, now_mono_s=0.0) is None
    metrics.late_events.inc(3)
    metrics.query_events_dropped.labels(query="visits", reason="outside_key_list").inc(4)
    metrics.query_events_dropped.labels(query="visits", reason="where").inc(9)
    with pytest.MonkeyPatch.context() as m:
        logged: list[str] = []
        m.setattr(
            "stream_dp.pipeline.stages.late_events.log.warning",
            lambda fmt, text: logged.append(text),
        )
        late = notice.observe(COVERAGE_S, now_mono_s=1.0)
    assert late is not None and late.startswith("3 events dropped as late")
    assert len(logged) == 2 and logged[1] == late  # the query's drop first, then the late
    assert logged[0].startswith("query visits dropped 4 events whose 'domain' value")
    assert collects == []


def test_observe_reads_the_counters_at_most_once_per_check_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker fed a trickle turns its loop several times a second: the counters are read at
    most once per CHECK_EVERY_S, and a warning due is given at the first read after it."""
    from stream_dp.pipeline.stages import late_events

    metrics = Metrics()
    reads: list[str] = []
    totals = late_events.counter_totals

    def counted(counter: object, sample: str) -> dict[tuple[str, ...], float]:
        reads.append(sample)
        return totals(counter, sample)  # type: ignore[arg-type]

    monkeypatch.setattr(late_events, "counter_totals", counted)
    notice = LateEventsNotice(metrics, None, interval_s=300.0)
    assert notice.observe(COVERAGE_S, now_mono_s=0.0) is None
    read_once = len(reads)
    assert read_once > 0
    metrics.late_events.inc(3)
    half = late_events.CHECK_EVERY_S / 2
    assert notice.observe(COVERAGE_S, now_mono_s=half) is None
    assert len(reads) == read_once  # within the interval: nothing read
    late = notice.observe(COVERAGE_S, now_mono_s=late_events.CHECK_EVERY_S)
    assert late is not None and late.startswith("3 events dropped as late")
    assert len(reads) == 2 * read_once


def test_the_final_notice_warns_of_every_drop_not_yet_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """At the worker's stop: read at once (no check interval) and warn of what the rate limit
    held back, late events and each query's drops; nothing new, nothing said."""
    from stream_dp.config.model import QueryConfig

    query = QueryConfig.model_validate(
        {"name": "countries", "group_by": ["country"], "keys": {"country": ["DE"]}, "epsilon": 1.0}
    )
    metrics = Metrics()
    notice = LateEventsNotice(metrics, None, [query], interval_s=300.0)
    metrics.late_events.inc(5)
    assert notice.observe(COVERAGE_S, now_mono_s=0.0) is not None
    metrics.late_events.inc(7)
    metrics.query_events_dropped.labels(query="countries", reason="outside_key_list").inc(3)
    assert notice.observe(COVERAGE_S, now_mono_s=0.5) is None  # within the check interval
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="stream_dp.pipeline.stages.late_events"):
        final = notice.observe(COVERAGE_S, now_mono_s=0.6, final=True)
    assert final is not None and final.startswith("7 events dropped as late")
    assert [r.getMessage() for r in caplog.records] == [
        "query countries dropped 3 events whose 'country' value is not on its public key list "
        "(keys): list the values as the events spell them (letter case included) or use "
        "keys: private; `stream-dp check` compares a sample of the topic with the "
        "configuration",
        final,
    ]
    caplog.clear()
    assert notice.observe(COVERAGE_S, now_mono_s=0.7, final=True) is None  # nothing new
    assert caplog.records == []
