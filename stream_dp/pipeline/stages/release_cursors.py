"""Which windows stage 2 has released: the first covered window, and per partials
partition a *cursor* — the next window not yet released.

Every window before a partition's cursor is released and published, and a ``progress``
record in the ledger says so; windows are released strictly in cursor order. The cursors
move on when this process finishes a window (:meth:`ReleaseCursors.advance`) and when the
ledger says another worker, or an earlier run, released further
(:meth:`ReleaseCursors.adopt`); those read from the ledger tell replayed events (of windows
released before this process read it) from late ones.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from stream_dp.pipeline.formats.ledger import LedgerIndex
from stream_dp.windows import TumblingWindows

log = logging.getLogger(__name__)


class ReleaseCursors:
    """The first covered window and the cursor of each partials partition."""

    def __init__(
        self, windows: TumblingWindows, partials_partitions: int, coverage_start_s: int | None
    ) -> None:
        self.windows = windows
        self.partials_partitions = partials_partitions
        #: The first covered window: from the configuration, else set by the transport
        #: (from the ledger's coverage record). Nothing is released while it is unknown.
        self.coverage_start_s = coverage_start_s
        #: Per partials partition, the next window not yet released (own and ledger-read).
        self._cursor: dict[int, int] = {}
        #: The cursors as last read from the ledger: windows before them were released by
        #: an earlier run or another worker (their events are replays, not late).
        self._cursor_read: dict[int, int] = {}

    def set_coverage(self, first_window_start_s: int) -> None:
        self.coverage_start_s = self.windows.start_of(first_window_start_s)

    def first_on(self, r: int) -> int:
        """The first covered window that maps to partials partition ``r``."""
        assert self.coverage_start_s is not None
        size, parts = self.windows.size_s, self.partials_partitions
        first = self.coverage_start_s
        return first + ((r - self.windows.partition_of(first, parts)) % parts) * size

    def cursor(self, r: int) -> int:
        """The next window of partials partition ``r`` not yet released."""
        first = self.first_on(r)
        return max(first, self._cursor.get(r, first))

    def first_unreleased(self) -> int | None:
        """The earliest covered window not known released, over every partials partition
        (None while the coverage is unknown): event time is at least there after a restart."""
        if self.coverage_start_s is None:
            return None
        return min(self.cursor(r) for r in range(self.partials_partitions))

    def due_count(self, r: int, passed_through_s: float) -> int:
        """How many windows of partials partition ``r`` every source has passed
        (``passed_through_s``) but are not released yet: counted, not listed, so that a
        backlog of 10^5 windows after a long idle stop costs nothing to measure."""
        cursor = self.cursor(r)
        last_start = passed_through_s - self.windows.size_s
        if last_start < cursor:
            return 0
        step = self.windows.size_s * self.partials_partitions
        return int((last_start - cursor) // step) + 1

    def released(self, window_start_s: int) -> bool:
        """Whether a covered window is known released (by anyone, as far as read)."""
        if self.coverage_start_s is None or window_start_s < self.coverage_start_s:
            return False
        r = self.windows.partition_of(window_start_s, self.partials_partitions)
        return window_start_s < self.cursor(r)

    def released_earlier(self, window_start_s: int) -> bool:
        """Released before this process read the ledger (its events are replays)."""
        if self.coverage_start_s is None or window_start_s < self.coverage_start_s:
            return False
        r = self.windows.partition_of(window_start_s, self.partials_partitions)
        return window_start_s < self._cursor_read.get(r, self.first_on(r))

    def last_released(self, r: int) -> int | None:
        """The latest window of partials partition ``r`` known released (None: none yet)."""
        if self.coverage_start_s is None:
            return None
        cursor = self.cursor(r)
        return (
            None
            if cursor <= self.first_on(r)
            else cursor - self.windows.size_s * self.partials_partitions
        )

    def released_in_ledger(self, ledger: LedgerIndex, window_start_s: int) -> bool:
        """Whether a progress record read from the ledger covers the window."""
        if ledger.partials_partitions != self.partials_partitions:
            return False
        r = self.windows.partition_of(window_start_s, self.partials_partitions)
        return window_start_s < ledger.progress.get(r, window_start_s)

    def adopt(self, ledger: LedgerIndex) -> None:
        """Take in the ledger's coverage and progress records (cursors only move on)."""
        if self.coverage_start_s is None and ledger.coverage_start_s is not None:
            self.set_coverage(ledger.coverage_start_s)
        if ledger.partials_partitions not in (None, self.partials_partitions):
            log.error(
                "the ledger's progress records were written for %s partials partitions, "
                "this worker sees %d: the partials topic changed while windows were open",
                ledger.partials_partitions,
                self.partials_partitions,
            )
            return
        self._move(self._cursor, ledger.progress)
        self._move(self._cursor_read, ledger.progress)

    @staticmethod
    def _move(cursors: dict[int, int], progress: Mapping[int, int]) -> None:
        for r, nxt in progress.items():
            if nxt > cursors.get(r, nxt - 1):
                cursors[r] = nxt

    def advance(self, window_start_s: int) -> int:
        """This process finished the window: its partition's cursor passes it. Returns the
        partition."""
        r = self.windows.partition_of(window_start_s, self.partials_partitions)
        if window_start_s >= self.cursor(r):
            self._cursor[r] = window_start_s + self.windows.size_s * self.partials_partitions
        return r
