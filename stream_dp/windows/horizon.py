"""Horizons of a cumulative query: consecutive blocks of T windows.

A horizon starts at ``origin + n·T·S`` for a whole number n (S the window size, T the
query's ``horizon_windows``; the origin defaults to the Unix epoch, a Thursday, so set it to a
Monday for weekly totals since Monday). Every window belongs to exactly one horizon, at step
1 … T; its running total covers the horizon's windows up to and including it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HorizonPosition:
    horizon_start_s: int
    #: 1 … horizon_windows: windows of the horizon up to and including this one
    step: int
    horizon_windows: int
    window_size_s: int

    @property
    def horizon_end_s(self) -> int:
        return self.horizon_start_s + self.horizon_windows * self.window_size_s

    @property
    def is_last(self) -> bool:
        return self.step == self.horizon_windows

    def window_start_of(self, step: int) -> int:
        """Start of the horizon's window at ``step`` (1-based)."""
        if not 1 <= step <= self.horizon_windows:
            raise ValueError(f"step must be in 1…{self.horizon_windows}, got {step}")
        return self.horizon_start_s + (step - 1) * self.window_size_s


def horizon_position(
    window_start_s: int, *, window_size_s: int, horizon_windows: int, origin_s: int = 0
) -> HorizonPosition:
    """The horizon holding the window that starts at ``window_start_s``, and its step."""
    if window_size_s <= 0 or horizon_windows < 1:
        raise ValueError("window_size_s and horizon_windows must be positive")
    offset = window_start_s - origin_s
    if offset % window_size_s:
        raise ValueError(
            f"window start {window_start_s} is not on the window grid of the horizon origin "
            f"{origin_s} (window size {window_size_s} s)"
        )
    span = window_size_s * horizon_windows
    start = origin_s + (offset // span) * span
    step = (window_start_s - start) // window_size_s + 1
    return HorizonPosition(start, step, horizon_windows, window_size_s)
