"""The maximum hold (the age of the oldest internal record unreleased windows pin) and the
memory cap on held state."""

from __future__ import annotations

import pytest

from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.stages.hold import (
    HeldRecordAge,
    HeldStateCap,
    HeldStateTooLargeError,
    MaxHoldExceededError,
)

PARTIALS, REPART, INPUT = "partials", "repartition", "events"
NOW = 1_800_000_000.0


def _age(max_hold_s: float = 600.0) -> tuple[HeldRecordAge, Metrics]:
    metrics = Metrics(process=False)
    return HeldRecordAge({PARTIALS, REPART}, max_hold_s=max_hold_s, metrics=metrics), metrics


def test_the_age_is_that_of_the_record_at_the_safe_offset() -> None:
    held, metrics = _age()
    # Records 0..9 written a second apart, from NOW - 100 s on.
    held.observe(REPART, 0, [(i, NOW - 100 + i) for i in range(10)])
    assert held.check({(REPART, 0): 3}, NOW) == pytest.approx(97)
    assert metrics.held_record_age._value.get() == pytest.approx(97)
    assert held.check({(REPART, 0): 10}, NOW) == 0  # everything fetched is done


def test_samples_behind_the_safe_offset_are_forgotten_and_never_make_it_younger() -> None:
    held, _ = _age(max_hold_s=10_000)  # one sample per 10 s
    held.observe(PARTIALS, 1, [(i, NOW - 1000 + i) for i in range(100)])
    age = held.check({(PARTIALS, 1): 55}, NOW)
    # The pinned record is 945 s old; the sample behind it at most one step older.
    assert 945 <= age <= 955
    assert held.check({(PARTIALS, 1): 99}, NOW) >= 901


def test_a_topic_not_tracked_holds_nothing() -> None:
    held, _ = _age()
    held.observe(INPUT, 0, [(0, NOW - 10_000)])
    assert held.check({(INPUT, 0): 0}, NOW) == 0


def test_reading_again_from_an_earlier_offset_restarts_the_samples() -> None:
    held, _ = _age()
    held.observe(REPART, 0, [(50, NOW - 10)])
    held.observe(REPART, 0, [(20, NOW - 300), (21, NOW - 299)])  # taken again from 20
    assert held.check({(REPART, 0): 20}, NOW) == pytest.approx(300)


def test_past_the_maximum_it_stops_with_what_to_do() -> None:
    held, metrics = _age(max_hold_s=600)
    held.resume_reading(NOW - 10_000)  # reading all along
    held.observe(REPART, 2, [(7, NOW - 601), (8, NOW - 1)])
    with pytest.raises(MaxHoldExceededError) as info:
        held.check({(REPART, 2): 7, (PARTIALS, 0): 0}, NOW)
    text = str(info.value)
    assert "repartition[2] at offset 7 for 601 s while this worker could read it" in text
    assert "(601 s since it was written)" in text and "max_hold_s = 600" in text
    assert "internal_retention_s" in text and "stream-dp topics apply" in text
    assert "runbook (StreamDPMaxHoldExceeded)" in text
    assert metrics.max_hold_exceeded._value.get() == 1
    assert held.check({(REPART, 2): 8}, NOW) == pytest.approx(1)  # released: moves on


def test_an_outage_does_not_count_the_worker_catches_up_first() -> None:
    """A record pinned since long before this worker (re)started reading: the maximum hold
    counts from the restart, while the age in the log (what retention measures) is reported
    as it is."""
    held, metrics = _age(max_hold_s=600)
    held.observe(REPART, 0, [(3, NOW - 5000), (4, NOW - 4999)])
    held.resume_reading(NOW - 599)  # restarted 599 s ago, after a long outage
    assert held.check({(REPART, 0): 3}, NOW) == pytest.approx(5000)
    assert metrics.held_record_age._value.get() == pytest.approx(5000)
    assert metrics.max_hold_exceeded._value.get() == 0
    with pytest.raises(MaxHoldExceededError) as info:  # still pinned 2 s later: stuck
        held.check({(REPART, 0): 3}, NOW + 2)
    assert "for 601 s while this worker could read it (5002 s since it was written)" in str(
        info.value
    )


def test_before_it_reads_nothing_is_held_against_the_worker() -> None:
    held, metrics = _age(max_hold_s=600)
    held.observe(REPART, 0, [(3, NOW - 5000)])
    assert held.check({(REPART, 0): 3}, NOW) == pytest.approx(5000)  # reading_since unset
    assert metrics.max_hold_exceeded._value.get() == 0


# -- the memory cap -------------------------------------------------------------------------


def _cap(max_bytes: int | None = 1000) -> tuple[HeldStateCap, Metrics]:
    metrics = Metrics(process=False)
    return HeldStateCap(max_bytes, max_backpressure_s=60, metrics=metrics), metrics


def test_under_the_cap_nothing_pauses() -> None:
    cap, metrics = _cap()
    assert cap.backpressure(1000, 0.0) is False
    assert metrics.held_state._value.get() == 1000
    assert metrics.backpressure._value.get() == 0


def test_above_the_cap_fetching_pauses_until_back_under() -> None:
    cap, metrics = _cap()
    assert cap.backpressure(1001, 0.0) is True
    assert metrics.backpressure._value.get() == 1
    assert cap.backpressure(5000, 59.0) is True
    assert cap.backpressure(900, 60.0) is False  # a window sealed: fetching again
    assert metrics.backpressure._value.get() == 0
    assert cap.backpressure(1001, 100.0) is True  # a new spell starts its own clock
    assert cap.backpressure(1001, 159.0) is True


def test_above_the_cap_for_too_long_is_a_clear_stop() -> None:
    cap, _ = _cap()
    cap.backpressure(2000, 0.0)
    with pytest.raises(HeldStateTooLargeError, match=r"max_held_state_bytes = 1000, for 61 s"):
        cap.backpressure(2000, 61.0)


def test_without_a_cap_nothing_ever_pauses() -> None:
    cap, metrics = _cap(None)
    assert cap.backpressure(10**12, 0.0) is False
    assert cap.backpressure(10**12, 10**6) is False
    assert metrics.held_state._value.get() == 10**12
