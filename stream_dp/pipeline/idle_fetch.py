"""How long the worker's fetch waits when nothing arrives: short while records arrive, longer
once a fetch came back empty.

aiokafka's ``getmany`` returns as soon as records arrive, whatever its timeout: the timeout
only sets how often a loop with nothing to read turns. Each turn of the worker's loop checks
the stages' timers (idle closes, grace, the hand-off's watermarks, due releases, commits):
about 1 ms of CPU with nothing to do, five times a second at 200 ms — a quarter of what a
worker with nothing to read costs, paid by every extra worker of a group for as long as it
runs. After an empty fetch the next one waits :data:`IDLE_FETCH_TIMEOUT_MS`; the first fetch
that brings records goes back to :data:`BUSY_FETCH_TIMEOUT_MS`. What the longer wait delays
is only timer-driven work with nothing arriving (an idle close, a grace period's end, a
release), by at most the difference (0.3 s), never a record: none of them is a guarantee.
"""

from __future__ import annotations

from collections.abc import Mapping, Sized
from typing import Final

#: The fetch's timeout while records arrive (the loop's cadence with a backlog is the
#: records', not this).
BUSY_FETCH_TIMEOUT_MS: Final = 200
#: The fetch's timeout after a fetch that brought nothing.
IDLE_FETCH_TIMEOUT_MS: Final = 500


class FetchTimeout:
    """The timeout of the next fetch, from what the last one brought."""

    def __init__(self) -> None:
        self.ms = BUSY_FETCH_TIMEOUT_MS

    def fetched(self, batch: Mapping[object, Sized] | None) -> None:
        """Note what a fetch brought (None: nothing, e.g. stopped)."""
        empty = not batch or not any(len(records) for records in batch.values())
        self.ms = IDLE_FETCH_TIMEOUT_MS if empty else BUSY_FETCH_TIMEOUT_MS
