"""Due windows not yet released: a backlog after a restart while the input was idle.

Stage 1's event time catches up with the wall clock once the input is proven read to its
end and quiet (:func:`~stream_dp.pipeline.stages.restart_clock.event_time_start`), so
every window since the last release becomes due at once. The worker releases them in order,
a bounded number per loop iteration (fetching, committing and heart-beating in between);
this exports how many are left and logs when such a backlog starts and ends.
"""

from __future__ import annotations

import logging

from stream_dp.ops.metrics import Metrics

log = logging.getLogger(__name__)


class DueBacklog:
    """``stream_dp_windows_due`` and one log line at the start and end of a backlog."""

    def __init__(self, metrics: Metrics, per_iteration: int) -> None:
        self.metrics = metrics
        self.per_iteration = per_iteration
        self.draining = False

    def note(self, due: int) -> None:
        """After an iteration's releases: ``due`` windows every source passed wait."""
        self.metrics.windows_due.set(due)
        if due > self.per_iteration and not self.draining:
            log.warning(
                "%d due windows wait for release (a restart after the input was idle, or an "
                "outage): they are released in order, %d per loop iteration; "
                "stream_dp_windows_due counts down",
                due,
                self.per_iteration,
            )
            self.draining = True
        elif due == 0 and self.draining:
            log.info("the due windows are released")
            self.draining = False
