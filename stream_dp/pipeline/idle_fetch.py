"""How long the worker's fetch waits when nothing arrives: short while records arrive, longer
once a fetch came back empty.

aiokafka's ``getmany`` returns as soon as records arrive, whatever its timeout: the timeout
only sets how often a loop with nothing to read turns. Each turn of the worker's loop checks
the stages' timers (idle closes, grace, the hand-off's watermarks, due releases, commits):
about 1 ms of CPU with nothing to do, paid by every extra worker of a group for as long as it
has nothing to read. After an empty fetch the next one waits :func:`idle_fetch_timeout_ms`:
as long as the interval at which an idle worker's watermarks and progress marks are due
(:func:`~stream_dp.pipeline.handoff.marks_interval_s`: every second, or twice per
``idle_close_s`` when that is shorter), so each turn of an idle loop has marks to send and
none is skipped for lack of a turn. The first fetch that brings records goes back to
:data:`BUSY_FETCH_TIMEOUT_MS`. What the longer wait delays is only timer-driven work with
nothing arriving (an idle close, a grace period's end, a release), by at most the idle wait
less the busy one (0.8 s), never a record: none of them is a guarantee.
"""

from __future__ import annotations

from collections.abc import Mapping, Sized
from typing import Final

#: The fetch's timeout while records arrive (the loop's cadence with a backlog is the
#: records', not this).
BUSY_FETCH_TIMEOUT_MS: Final = 200
#: The fetch's timeout after a fetch that brought nothing, at most (the interval of the
#: idle marks, :data:`~stream_dp.pipeline.handoff.WATERMARK_INTERVAL_S`).
IDLE_FETCH_TIMEOUT_MS: Final = 1_000


def idle_fetch_timeout_ms(marks_interval_s: float) -> int:
    """The fetch's timeout after an empty fetch: the idle marks' interval
    (:func:`~stream_dp.pipeline.handoff.marks_interval_s`) up to
    :data:`IDLE_FETCH_TIMEOUT_MS`, never below :data:`BUSY_FETCH_TIMEOUT_MS`."""
    interval_ms = int(marks_interval_s * 1000)
    return max(BUSY_FETCH_TIMEOUT_MS, min(IDLE_FETCH_TIMEOUT_MS, interval_ms))


class FetchTimeout:
    """The timeout of the next fetch, from what the last one brought."""

    def __init__(self, idle_ms: int = IDLE_FETCH_TIMEOUT_MS) -> None:
        self.ms = BUSY_FETCH_TIMEOUT_MS
        self.idle_ms = idle_ms

    def fetched(self, batch: Mapping[object, Sized] | None) -> None:
        """Note what a fetch brought (None: nothing, e.g. stopped)."""
        empty = not batch or not any(len(records) for records in batch.values())
        self.ms = self.idle_ms if empty else BUSY_FETCH_TIMEOUT_MS
