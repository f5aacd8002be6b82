"""Horizons of cumulative queries: consecutive blocks of T windows from an origin."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from stream_dp.windows.horizon import horizon_position

HOUR = 3600
MONDAY = int(datetime(2024, 1, 1, tzinfo=UTC).timestamp())  # 2024-01-01 was a Monday


def test_every_window_has_one_horizon_and_step() -> None:
    seen: dict[int, list[int]] = {}
    for w in range(MONDAY - 200 * HOUR, MONDAY + 400 * HOUR, HOUR):
        pos = horizon_position(w, window_size_s=HOUR, horizon_windows=168, origin_s=MONDAY)
        assert pos.window_start_of(pos.step) == w
        assert pos.horizon_start_s <= w < pos.horizon_end_s
        assert (pos.horizon_start_s - MONDAY) % (168 * HOUR) == 0
        seen.setdefault(pos.horizon_start_s, []).append(pos.step)
    for steps in seen.values():
        assert steps == list(range(steps[0], steps[0] + len(steps)))
    assert seen[MONDAY] == list(range(1, 169))


def test_weekly_horizon_from_a_monday() -> None:
    sunday_23h = MONDAY + 7 * 24 * HOUR - HOUR
    pos = horizon_position(sunday_23h, window_size_s=HOUR, horizon_windows=168, origin_s=MONDAY)
    assert (pos.horizon_start_s, pos.step, pos.is_last) == (MONDAY, 168, True)
    nxt = horizon_position(
        sunday_23h + HOUR, window_size_s=HOUR, horizon_windows=168, origin_s=MONDAY
    )
    assert (nxt.horizon_start_s, nxt.step) == (MONDAY + 168 * HOUR, 1)


def test_default_origin_is_the_epoch() -> None:
    pos = horizon_position(10 * 60, window_size_s=60, horizon_windows=4)
    assert (pos.horizon_start_s, pos.step) == (8 * 60, 3)
    before = horizon_position(-60, window_size_s=60, horizon_windows=4)
    assert (before.horizon_start_s, before.step) == (-240, 4)


def test_misaligned_windows_are_refused() -> None:
    with pytest.raises(ValueError, match="not on the window grid"):
        horizon_position(MONDAY + 30, window_size_s=HOUR, horizon_windows=24, origin_s=MONDAY)
    with pytest.raises(ValueError, match="positive"):
        horizon_position(0, window_size_s=0, horizon_windows=24)
    pos = horizon_position(0, window_size_s=60, horizon_windows=2)
    with pytest.raises(ValueError, match="step must be"):
        pos.window_start_of(3)
