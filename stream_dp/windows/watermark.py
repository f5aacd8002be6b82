"""The watermark: how far event time has certainly progressed.

watermark = min over assigned partitions of the largest event time seen, minus grace.

* A partition that delivered nothing for ``idle_timeout_s`` (wall clock) stops holding the
  watermark back, so one quiet partition cannot stall every window.
* When no record arrived at all for ``idle_timeout_s``, the watermark advances with the wall
  clock from the largest event time seen, so open windows close in bounded time. This rule
  runs only while the whole stream is idle: replaying old data at full speed never closes
  windows early.
* The watermark never moves backwards.
* Silence is idleness only as far as it is proven (``require_read_proof``): a partition is
  quiet through the last fetch answer that found its reader at the log's end, not through
  "now" — a reader that cannot fetch (a broker stall, a paused or reassigned partition)
  proves nothing, and its unread events must not become late. A reported partition is
  quiet through its last report.

Times are passed in (``now_s`` from a monotonic clock), so the tracker is pure and testable.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

#: A partition reported idle must stay so this much longer, after another partition last
#: woke up from idleness, before it stops holding windows back: a stale "idle" report must
#: not let one partition's burst close windows before the others' share of it arrives.
IDLE_CONFIRM_S = 1.0


@dataclass
class _PartitionClock:
    max_event_time_s: float | None
    last_activity_s: float
    #: Set for partitions whose idleness only reports establish (see ``expect``).
    reported: bool = False
    #: Idle duration in its first idle report since another partition last woke up.
    idle_base_s: float | None = None
    #: Silence up to here is the partition's own (its reader was at the log's end then, or
    #: its last report said so); inf: silence is trusted up to now.
    read_through_s: float = math.inf


class WatermarkTracker:
    def __init__(
        self, *, grace_s: float, idle_timeout_s: float, require_read_proof: bool = False
    ) -> None:
        self.grace_s = grace_s
        self.idle_timeout_s = idle_timeout_s
        #: Silence counts only through :meth:`read_to_end` proofs (the worker); without it
        #: (offline use, tests of the rules) silence counts up to now.
        self.require_read_proof = require_read_proof
        self._partitions: dict[int, _PartitionClock] = {}
        self._max_event_time_s: float | None = None
        self._last_record_s: float | None = None
        self._watermark_s: float | None = None

    def _clock(self, now_s: float) -> _PartitionClock:
        clock = _PartitionClock(None, now_s)
        if self.require_read_proof:
            clock.read_through_s = -math.inf
        return clock

    def assign(self, partitions: Iterable[int], now_s: float) -> None:
        for p in partitions:
            if p not in self._partitions:
                self._partitions[p] = self._clock(now_s)

    def read_to_end(self, partition: int, at_s: float) -> None:
        """The partition's reader was at the log's end at ``at_s``: its silence until then
        is the partition's, not a stalled reader's."""
        clock = self._partitions.get(partition)
        if clock is not None and not clock.reported and at_s > clock.read_through_s:
            clock.read_through_s = at_s

    def _quiet_for(self, clock: _PartitionClock, now_s: float) -> float:
        """How long the partition is known to have been quiet at ``now_s``."""
        return min(now_s, clock.read_through_s) - clock.last_activity_s

    def start_at(self, first_event_time_s: float, now_s: float) -> None:
        """Event time begins here (the first covered window), not at the first event: with
        no event at all, the wall-clock rule still advances the watermark from it — once
        every partition is idle: by its own silence since ``now_s``, or for partitions whose
        idleness only reports establish (:meth:`expect`), once they say so."""
        if self._max_event_time_s is None or first_event_time_s > self._max_event_time_s:
            self._max_event_time_s = first_event_time_s
        if self._last_record_s is None:
            reported = any(c.reported for c in self._partitions.values())
            self._last_record_s = math.inf if reported else now_s

    def expect(self, partitions: Iterable[int]) -> None:
        """Partitions whose idleness only :meth:`report` can establish (never by silence)."""
        for p in partitions:
            self._partitions.setdefault(p, _PartitionClock(None, math.inf, reported=True))

    def report(
        self, partition: int, max_event_time_s: float | None, idle_for_s: float, now_s: float
    ) -> None:
        """What a partition's reader says of it: largest event time, and idle for how long.

        Such a partition is idle only when its reader says so: silence here may be a slow or
        dead reader, not an idle partition. And only once confirmed: reported idle for
        ``IDLE_CONFIRM_S`` more since another partition last woke up.
        """
        clock = self._partitions.get(partition)
        if clock is None:
            clock = self._partitions[partition] = _PartitionClock(None, math.inf, reported=True)
        if max_event_time_s is not None and (
            clock.max_event_time_s is None or max_event_time_s > clock.max_event_time_s
        ):
            clock.max_event_time_s = max_event_time_s
            if self._max_event_time_s is None or max_event_time_s > self._max_event_time_s:
                self._max_event_time_s = max_event_time_s
        if clock.idle_base_s is not None and idle_for_s < self.idle_timeout_s:
            # It woke up (a burst?): the other idle partitions must confirm again that the
            # burst did not reach them too.
            for other in self._partitions.values():
                if other is not clock and other.reported:
                    other.idle_base_s = None
                    other.last_activity_s = math.inf
        if idle_for_s >= self.idle_timeout_s:
            if clock.idle_base_s is None:
                clock.idle_base_s = idle_for_s
            confirmed = idle_for_s - clock.idle_base_s >= IDLE_CONFIRM_S
        else:
            clock.idle_base_s = None
            confirmed = False
        clock.last_activity_s = now_s - idle_for_s if confirmed else math.inf
        # Quiet as far as this report: if reports stop, idleness stops growing here.
        clock.read_through_s = now_s
        activity = [c.last_activity_s for c in self._partitions.values()]
        # The whole stream is idle (wall-clock rule) only when every partition is reported so.
        self._last_record_s = max(activity) if activity else None

    def revoke(self, partitions: Iterable[int]) -> None:
        for p in partitions:
            self._partitions.pop(p, None)

    @property
    def partitions(self) -> list[int]:
        return sorted(self._partitions)

    def observe(self, partition: int, max_event_time_s: float, now_s: float) -> None:
        """Record that ``partition`` delivered events up to ``max_event_time_s`` at ``now_s``."""
        clock = self._partitions.get(partition)
        if clock is None:
            clock = self._partitions[partition] = self._clock(now_s)
        if clock.max_event_time_s is None or max_event_time_s > clock.max_event_time_s:
            clock.max_event_time_s = max_event_time_s
        clock.last_activity_s = now_s
        if self._max_event_time_s is None or max_event_time_s > self._max_event_time_s:
            self._max_event_time_s = max_event_time_s
        self._last_record_s = now_s

    def touch(self, partition: int, now_s: float) -> None:
        """A partition delivered records (even bad or late ones): it is not idle."""
        clock = self._partitions.get(partition)
        if clock is not None:
            clock.last_activity_s = now_s
        self._last_record_s = now_s

    def idle_for(self, now_s: float) -> float:
        """How long every partition has been idle (0 while any is active)."""
        if not self._partitions or not all(self.is_idle(p, now_s) for p in self._partitions):
            return 0.0
        return max(0.0, min(self._quiet_for(c, now_s) for c in self._partitions.values()))

    def is_idle(self, partition: int, now_s: float) -> bool:
        """Whether the partition is known to have delivered nothing for the idle timeout
        (unknown: idle)."""
        clock = self._partitions.get(partition)
        return clock is None or self._quiet_for(clock, now_s) >= self.idle_timeout_s

    def restart_idle_clocks(self, now_s: float) -> None:
        """Forget idleness, e.g. after a broker outage: silence then was not an idle stream."""
        for clock in self._partitions.values():
            if clock.last_activity_s < math.inf:
                clock.last_activity_s = now_s
        if self._last_record_s is not None and self._last_record_s < math.inf:
            self._last_record_s = now_s

    @property
    def max_event_time_s(self) -> float | None:
        return self._max_event_time_s

    def watermark(self, now_s: float) -> float | None:
        """The current watermark in event-time seconds (None before any event)."""
        candidate: float | None = None
        clocks = self._partitions.values()
        active = [c for c in clocks if self._quiet_for(c, now_s) < self.idle_timeout_s]
        if active and all(c.max_event_time_s is not None for c in active):
            candidate = min(c.max_event_time_s for c in active if c.max_event_time_s is not None)
            candidate -= self.grace_s
        elif not active and self._max_event_time_s is not None:
            # Every partition is idle: the slowest no longer holds the others back.
            candidate = self._max_event_time_s - self.grace_s
        # The stream is idle as far as every partition's silence is proven.
        known_s = min((min(now_s, c.read_through_s) for c in clocks), default=now_s)
        stream_idle_s = None if self._last_record_s is None else known_s - self._last_record_s
        if (
            stream_idle_s is not None
            and stream_idle_s >= self.idle_timeout_s
            and self._max_event_time_s is not None
        ):
            by_wall_clock = self._max_event_time_s + stream_idle_s - self.grace_s
            candidate = by_wall_clock if candidate is None else max(candidate, by_wall_clock)
        if candidate is not None and (self._watermark_s is None or candidate > self._watermark_s):
            self._watermark_s = candidate
        return self._watermark_s
