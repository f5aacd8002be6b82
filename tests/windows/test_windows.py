from __future__ import annotations

from stream_dp.windows import TumblingWindows, WatermarkTracker
from stream_dp.windows.tumbling import iso_utc


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
