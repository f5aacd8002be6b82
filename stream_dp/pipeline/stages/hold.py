"""Bounds on a held window: completeness before a stage-2 release.

Stage 2 releases a window once every source partition's watermark has passed it
(:meth:`~stream_dp.pipeline.stages.partials_inbox.PartialsInbox.passed_through`): a
source's watermark follows, on every partials partition, each partial it sealed before it,
so a source that wrote no partial of the window had no events in it — its watermark is its
sealed report. Two ways a source's report can still be missing, and stage 2 must not take
them for "no events":

* a source never heard of (no watermark on this partials partition): the window is not
  due (``passed_through`` is None); :class:`SourceCompleteness` logs which sources it
  waits for;
* a partial read in part only (a part lost from the log, or malformed): the source
  reported the window and its share is not all here. The window is held
  (:meth:`SourceCompleteness.holds`), with ``stream_dp_partials_incomplete`` and a WARNING
  naming the source; a complete version from the source's next owner releases it.
"""

from __future__ import annotations

import logging

from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.stages.partials_inbox import PartialsInbox
from stream_dp.windows.tumbling import iso_utc

log = logging.getLogger(__name__)


class SourceCompleteness:
    """Whether every source's report of a due window is here in full (module docstring)."""

    def __init__(self, inbox: PartialsInbox, metrics: Metrics) -> None:
        self._inbox = inbox
        self._metrics = metrics
        #: (window, query, source) already warned about: one WARNING each, not one per loop.
        self._warned: set[tuple[int, str, int]] = set()
        #: Per partials partition, the sources last logged as awaited.
        self._awaited: dict[int, tuple[int, ...]] = {}
        #: Incomplete partials of windows held this round (for the gauge).
        self._held: dict[int, int] = {}

    def begin(self) -> None:
        """A new round of due-window checks."""
        self._held = {}

    def end(self) -> None:
        self._metrics.partials_incomplete.set(sum(self._held.values()))
        self._warned = {w for w in self._warned if w[0] in self._held}

    def holds(self, window_start_s: int) -> bool:
        """Whether a due window must wait: a source's partial of it is incomplete."""
        missing = self._inbox.incomplete_sources(window_start_s)
        if not missing:
            return False
        self._held[window_start_s] = len(missing)
        for query, source in missing:
            if (window_start_s, query, source) in self._warned:
                continue
            self._warned.add((window_start_s, query, source))
            log.warning(
                "a window waits for the rest of source partition %d's partial: released "
                "without it, that source's events would count as none",
                source,
                extra={"window": iso_utc(window_start_s), "query": query, "source": source},
            )
        return True

    def note_unheard(self, r: int, sources: tuple[int, ...]) -> None:
        """Log (once per change) the sources partials partition ``r`` waits to hear from."""
        if self._awaited.get(r, ()) == sources:
            return
        self._awaited[r] = sources
        if sources:
            log.info(
                "partials partition %d waits for the watermarks of source partitions %s",
                r,
                ", ".join(map(str, sources)),
            )
