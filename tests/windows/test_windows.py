from __future__ import annotations

from stream_dp.windows import TumblingWindows, WatermarkTracker
from stream_dp.windows.tumbling import iso_utc
from stream_dp.windows.watermark import IDLE_CONFIRM_S


def test_tumbling_alignment_and_closing() -> None:
    w = TumblingWindows(size_s=3600, grace_s=60)
    assert w.start_of(7199.9) == 3600
    assert w.start_of(7200) == 7200
    assert not w.is_closed(3600, None)
    assert not w.is_closed(3600, 7199)
    assert w.is_closed(3600, 7200)
    assert iso_utc(1596240000) == "2020-08-01T00:00:00Z"


def test_watermark_is_min_over_partitions_minus_grace() -> None:
    t = WatermarkTracker(grace_s=10, idle_timeout_s=30)
    t.assign([0, 1], now_s=0)
    t.observe(0, 1000, now_s=1)
    assert t.watermark(now_s=1) is None  # partition 1 has not spoken yet
    t.observe(1, 500, now_s=2)
    assert t.watermark(now_s=2) == 490
    t.observe(1, 2000, now_s=3)
    assert t.watermark(now_s=3) == 990


def test_idle_partition_stops_holding_back() -> None:
    t = WatermarkTracker(grace_s=0, idle_timeout_s=30)
    t.assign([0, 1], now_s=0)
    t.observe(0, 100, now_s=1)
    t.observe(1, 50, now_s=1)
    assert t.watermark(now_s=2) == 50
    t.observe(0, 500, now_s=40)  # partition 1 silent since t=1
    assert t.watermark(now_s=40) == 500


def test_wall_clock_rule_only_when_whole_stream_idle() -> None:
    t = WatermarkTracker(grace_s=5, idle_timeout_s=2)
    t.assign([0], now_s=0)
    t.observe(0, 1000, now_s=0)
    assert t.watermark(now_s=1) == 995
    # Records keep arriving fast (replay): no wall-clock advance however long it runs.
    for now in range(1, 100):
        t.observe(0, 1000, now_s=now)
        assert t.watermark(now_s=now) == 995
    # Stream idle for 10 s: the watermark moves with the wall clock from the max event time.
    assert t.watermark(now_s=109) == 1000 + 10 - 5


def test_watermark_never_moves_back() -> None:
    t = WatermarkTracker(grace_s=0, idle_timeout_s=30)
    t.assign([0], now_s=0)
    t.observe(0, 1000, now_s=0)
    assert t.watermark(now_s=0) == 1000
    t.assign([1], now_s=1)
    t.observe(1, 10, now_s=1)
    assert t.watermark(now_s=1) == 1000


def test_silence_is_idleness_only_as_far_as_a_read_to_the_end_proves_it() -> None:
    """With ``require_read_proof`` (the worker) a partition is idle only through the last
    fetch that found its reader at the log's end: a reader that cannot fetch proves
    nothing, so its unread events cannot become late."""
    t = WatermarkTracker(grace_s=0, idle_timeout_s=30, require_read_proof=True)
    t.assign([0, 1], now_s=0)
    t.observe(0, 100, now_s=1)
    t.observe(1, 50, now_s=1)
    t.observe(0, 500, now_s=60)  # partition 1 silent since t=1, never read to its end
    assert t.watermark(now_s=60) == 50 and not t.is_idle(1, now_s=60)
    t.read_to_end(1, at_s=20)  # proven quiet 19 s < 30
    assert t.watermark(now_s=60) == 50
    t.read_to_end(1, at_s=31)  # proven quiet 30 s
    assert t.is_idle(1, now_s=60) and t.watermark(now_s=60) == 500
    assert t.idle_for(now_s=60) == 0.0  # partition 0 is active


def test_the_wall_clock_rule_advances_only_as_far_as_reads_prove_silence() -> None:
    t = WatermarkTracker(grace_s=5, idle_timeout_s=2, require_read_proof=True)
    t.assign([0], now_s=0)
    t.observe(0, 1000, now_s=0)
    assert t.watermark(now_s=100) == 995  # 100 s without a fetch: no advance
    t.read_to_end(0, at_s=10)
    assert t.watermark(now_s=100) == 1000 + 10 - 5
    assert t.idle_for(now_s=100) == 10
    t.read_to_end(0, at_s=20)
    assert t.watermark(now_s=100) == 1000 + 20 - 5


def _reported(*partitions: int) -> WatermarkTracker:
    """A tracker of partitions whose idleness only their readers' reports establish."""
    t = WatermarkTracker(grace_s=1, idle_timeout_s=5)
    t.expect(partitions)
    return t


def test_a_reported_idle_partition_stops_holding_back_once_confirmed() -> None:
    t = _reported(0, 1)
    t.report(0, 100, 0.0, now_s=0)
    t.report(1, 50, 0.0, now_s=0)
    assert t.watermark(now_s=0) == 49
    t.report(0, 200, 0.0, now_s=10)
    t.report(1, 50, 6.0, now_s=10)  # idle by its reader, said once
    assert t.watermark(now_s=10) == 49
    t.report(1, 50, 6.9, now_s=11)
    assert t.watermark(now_s=11) == 49
    t.report(1, 50, 6.0 + IDLE_CONFIRM_S, now_s=11)
    assert t.watermark(now_s=11) == 199  # partition 1 no longer holds partition 0 back
    assert not t.is_idle(0, now_s=11) and t.is_idle(1, now_s=11)


def test_after_another_partition_advances_idle_reports_must_be_confirmed_again() -> None:
    """A burst after a quiet spell: partition 0 advances while partitions 1 and 2 were last
    reported idle. Their share of the burst may still be on its way: they hold the
    watermark back until their readers report them idle IDLE_CONFIRM_S longer."""
    t = _reported(0, 1, 2)
    t.report(0, 20, 0.0, now_s=0)
    t.report(1, 12, 0.0, now_s=0)
    for idle in (10.0, 11.0, 12.0):  # quiet: every reader reports idle, re-sent every second
        for p, max_t in ((0, 20), (1, 12), (2, None)):
            t.report(p, max_t, idle, now_s=idle)
    assert all(t.is_idle(p, now_s=12) for p in (0, 1, 2))
    assert t.watermark(now_s=12) == 20 + 12 - 1  # the whole stream idle: the wall clock
    t.report(0, 40, 0.0, now_s=12)  # the burst, at partition 0
    assert not t.is_idle(1, now_s=12) and not t.is_idle(2, now_s=12)
    assert t.watermark(now_s=12) == 31  # held (the old rule: 40 - 1 = 39)
    t.report(1, 12, 12.5, now_s=12.5)  # first idle reports since the advance
    t.report(2, None, 12.5, now_s=12.5)
    assert t.watermark(now_s=12.5) == 31
    t.report(1, 12, 12.5 + IDLE_CONFIRM_S, now_s=13.5)  # partition 1 confirmed
    t.report(2, None, 13.4, now_s=13.5)
    assert t.watermark(now_s=13.5) == 31  # partition 2 never had an event and is not idle
    t.report(2, None, 12.5 + IDLE_CONFIRM_S, now_s=13.5)
    assert t.watermark(now_s=13.5) == 39


def test_a_partition_that_reports_its_share_of_the_burst_holds_the_watermark() -> None:
    t = _reported(0, 1)
    t.report(0, 20, 0.0, now_s=0)
    t.report(1, 12, 0.0, now_s=0)
    for idle in (10.0, 11.0, 12.0):
        t.report(0, 20, idle, now_s=idle)
        t.report(1, 12, idle, now_s=idle)
    assert t.watermark(now_s=12) == 31  # the whole stream idle: the wall clock
    t.report(0, 40, 0.0, now_s=12)
    t.report(1, 15, 0.0, now_s=12.5)  # its share arrived: active at 15
    for now in (13.5, 30.0):  # partition 0 keeps reporting, never advancing
        t.report(0, 40, 0.0, now_s=now)
        t.report(1, 15, 0.0, now_s=now)
        assert t.watermark(now_s=now) == 31  # min(40, 15) - 1 = 14 is behind: kept
    t.report(1, 30, 0.0, now_s=31)
    assert t.watermark(now_s=31) == 31
    t.report(1, 45, 0.0, now_s=32)  # both past 39: as far as the slower one
    assert t.watermark(now_s=32) == 39


def test_a_quiet_reported_partition_does_not_stall_one_that_keeps_advancing() -> None:
    t = _reported(0, 1)
    for now in range(60):
        t.report(0, now, 0.0, now_s=now)  # live: one advance a second
        t.report(1, min(now, 3), max(0.0, now - 3.0), now_s=now)  # its last event at 3
    watermark = t.watermark(now_s=59)
    assert watermark is not None and watermark >= 50  # the rule before confirmation: 58


def test_a_reported_partition_is_quiet_only_as_far_as_its_last_report() -> None:
    """Reports stop when its reader stops (a stalled worker): idleness is not extrapolated
    past the last one by this tracker's clock."""
    t = _reported(0)
    t.report(0, 20, 10.0, now_s=10)
    t.report(0, 20, 10.0 + IDLE_CONFIRM_S, now_s=11)
    assert t.watermark(now_s=11) == 20 + 11 - 1
    assert t.watermark(now_s=100) == 20 + 11 - 1  # no report since t=11
    t.report(0, 20, 15.0, now_s=15)
    assert t.watermark(now_s=100) == 20 + 15 - 1
