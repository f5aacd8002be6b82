"""Event-time tumbling windows of ``size_s`` seconds, aligned to the Unix epoch."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from datetime import UTC, datetime


@dataclass(frozen=True)
class TumblingWindows:
    size_s: int
    grace_s: int

    def start_of(self, event_time_s: float) -> int:
        """Start (epoch seconds) of the window holding this event time."""
        return math.floor(event_time_s / self.size_s) * self.size_s

    def end_of(self, window_start_s: int) -> int:
        return window_start_s + self.size_s

    def partition_of(self, window_start_s: int, partitions: int) -> int:
        """The partition of a window on a topic spread by window (partials, ledger):
        consecutive windows go to different partitions."""
        return (window_start_s // self.size_s) % partitions

    def is_closed(self, window_start_s: int, watermark_s: float | None) -> bool:
        """Closed once the watermark (max event time − grace) has passed the window end."""
        return watermark_s is not None and watermark_s >= window_start_s + self.size_s


@functools.lru_cache(maxsize=4096)
def iso_utc(epoch_s: float) -> str:
    """``2020-08-01T00:00:00Z`` — the form every record uses for window bounds."""
    return datetime.fromtimestamp(epoch_s, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def epoch_of_iso(iso: str) -> int:
    """The inverse of :func:`iso_utc` for whole seconds."""
    return int(datetime.fromisoformat(iso).timestamp())
