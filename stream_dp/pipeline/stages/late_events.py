"""Late and uncovered events are never silent: a rate-limited WARNING with the fix.

A worker covers the windows from ``window.start_at``, or, when that is unset, from the
window of the wall clock at its first start (recorded in the ledger). Events stamped before
the first covered window, and events whose window already closed, are dropped and counted
in ``stream_dp_late_events_total``. A topic of old events (a recorded file, a backlog) then
releases nothing, and the counter alone does not say why: :class:`LateEventsNotice` logs a
WARNING with how many were dropped, the first covered window and what to change — at once
for the first ones, then at most every :data:`NOTICE_INTERVAL_S` while more arrive.

It reads only counts and the coverage start: never an event, a user id or a value.
"""

from __future__ import annotations

import logging
import math
from datetime import datetime
from typing import Final

from stream_dp.ops.metrics import Metrics
from stream_dp.windows.tumbling import iso_utc

log = logging.getLogger(__name__)

#: At most one WARNING per this many seconds while late events keep arriving.
NOTICE_INTERVAL_S: Final = 300.0
#: The sample of ``Metrics.late_events`` (a counter) that holds its total.
LATE_EVENTS_SAMPLE: Final = "stream_dp_late_events_total"


def late_events_message(dropped: int, coverage_start_s: int | None, *, start_at_set: bool) -> str:
    """The WARNING's text: the count, the first covered window, and the fix."""
    first = "not chosen yet" if coverage_start_s is None else iso_utc(coverage_start_s)
    origin = "window.start_at" if start_at_set else "the first start, window.start_at unset"
    fix = (
        "to count older events, set window.start_at to the first window you want released "
        "(e.g. window.start_at: 2020-08-01T00:00:00Z) before the first run of a new "
        "kafka.group_id — every window from it to now is released and charged — or run "
        "`stream-dp replay` on a file of them; events that arrive after their window closed "
        "need a larger window.grace_s"
    )
    return (
        f"{dropped} events dropped as late: their windows are before the first covered "
        f"window {first} (from {origin}) or already closed; {fix}"
    )


class LateEventsNotice:
    """Turns growth of the late-events total into a rate-limited WARNING."""

    def __init__(
        self,
        metrics: Metrics,
        start_at: datetime | None,
        *,
        interval_s: float = NOTICE_INTERVAL_S,
    ) -> None:
        """``start_at``: the configuration's ``window.start_at`` (None: unset)."""
        self._metrics = metrics
        self._start_at_set = start_at is not None
        self._interval_s = interval_s
        self._reported_total = 0.0
        self._warned_mono_s = -math.inf

    def observe(self, coverage_start_s: int | None, now_mono_s: float) -> str | None:
        """Warn when the late-events total grew since the last warning and the interval
        passed; returns the message logged, else None."""
        late_total = self._metrics.registry.get_sample_value(LATE_EVENTS_SAMPLE) or 0.0
        dropped = int(late_total - self._reported_total)
        if dropped <= 0 or now_mono_s - self._warned_mono_s < self._interval_s:
            return None
        self._reported_total = late_total
        self._warned_mono_s = now_mono_s
        message = late_events_message(dropped, coverage_start_s, start_at_set=self._start_at_set)
        log.warning("%s", message)
        return message
