"""When an erasure applies to a window's release: the exact cut-off (docs/erasure.md).

**The rule.** Before drawing a window, its releaser (the owner of the window's partials
partition) writes a ``cut`` record for the window to the ledger and waits for the broker's
acknowledgement, then reads the erasure log to a fresh fence. Every erasure recorded before
the cut was acknowledged is therefore known to it, and the window is drawn only once every
partial it merges says it applied them (``erasures_through`` at least one past the last such
erasure's position): stage 1 publishes a new version of a sealed window's partial when an
erasure reaches it, and stage 2 takes the version that applied the most erasures.

So an erasure recorded (acknowledged in the erasure log) at time *t* is applied to every
window whose cut is acknowledged after *t* — in particular to every window whose release
had not begun at *t*. A window whose cut came first is released as it was drawn and never
recomputed: a second noise draw would let anyone average the two (docs/privacy.md#invariant-3),
and its values are differentially private for the user already.

**The response.** The worker that records a request then reads the ledger to fresh fences:
every cut and release before that point is known. Windows up to the latest cut or release
seen are reported as released (not recomputed; they *may* include the user's events — some
of them will not, if their cut came after all); every later window is reported as released
without the user, and that is exact: its cut, written after the fence, follows the erasure.

Pure: the worker and :class:`~stream_dp.pipeline.local.local.LocalPipeline` do the I/O.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from stream_dp.pipeline.stages.release_stage import ReleaseStage
from stream_dp.privacy.erasure import ErasureSet
from stream_dp.windows.tumbling import iso_utc

log = logging.getLogger(__name__)


#: How long a window waits at least for a partial that applied its erasures before the
#: stale partials are left out (:meth:`ErasureGate.ready`).
MIN_STALE_AFTER_S = 300.0


class ErasureGate:
    """Stage 2's side of the rule: per window, the erasure-log position its partials must
    have applied, fixed when its cut was written.

    Liveness: stage 1 re-seals a kept window as soon as an erasure reaches it, and a window
    whose stage-1 owner died is rebuilt and sealed again by the next owner. A partial that
    can never be replaced — sealed by a worker without erasure on, whose state and offsets
    are gone (turning erasure on while a window waits) — would hold its window forever: after
    ``stale_after_s`` such partials are left out (counted, logged). Privacy-safe: the window
    then lacks that source partition's data, never holds the erased user's.
    """

    def __init__(self, erasures: ErasureSet, *, stale_after_s: float = MIN_STALE_AFTER_S) -> None:
        self.erasures = erasures
        self.stale_after_s = stale_after_s
        self._required: dict[int, int] = {}
        self._waiting_since: dict[int, float] = {}

    def has_cut(self, window_start_s: int) -> bool:
        return window_start_s in self._required

    def record_cut(self, window_start_s: int) -> int:
        """The cut is acknowledged and the erasure log read to a fence after it: fix what
        the window must apply. Returns that position."""
        required = self.erasures.required_position(window_start_s)
        self._required[window_start_s] = required
        return required

    def required(self, window_start_s: int) -> int:
        return self._required[window_start_s]

    def ready(
        self, window_start_s: int, stage: ReleaseStage, *, now_mono_s: float | None = None
    ) -> bool:
        """Whether every partial the window would merge applied the erasures it must. With
        ``now_mono_s``, partials still stale ``stale_after_s`` after the first refusal are
        left out of the window, which is then ready."""
        required = self._required[window_start_s]
        if stage.erasures_applied(window_start_s) >= required:
            return True
        if now_mono_s is None:
            return False
        since = self._waiting_since.setdefault(window_start_s, now_mono_s)
        if now_mono_s - since < self.stale_after_s:
            return False
        dropped = stage.drop_stale_partials(window_start_s, required)
        log.error(
            "%d partials never applied an erasure of their window's cut within %g s: left "
            "out of the window (their source partitions' data is missing from it)",
            dropped,
            self.stale_after_s,
            extra={"window": iso_utc(window_start_s)},
        )
        return True

    def finish(self, window_start_s: int) -> None:
        self._required.pop(window_start_s, None)
        self._waiting_since.pop(window_start_s, None)

    def forget(self, released: Callable[[int], bool]) -> None:
        """Drop windows known released (by anyone)."""
        for ws in [w for w in self._required if released(w)]:
            self.finish(ws)


def released_until(stage: ReleaseStage) -> int | None:
    """The end of the latest window known released, or whose release had begun (a cut),
    at least the first covered window: what a response reports as released before the
    request (None while the first covered window is unknown)."""
    coverage = stage.coverage_start_s
    if coverage is None:
        return None
    size = stage.windows.size_s
    until = coverage
    cut = stage.ledger.latest_cut_s
    if cut is not None:
        until = max(until, cut + size)
    for r in range(stage.partials_partitions):
        last = stage.last_released(r)
        if last is not None:
            until = max(until, last + size)
    return until


def replay_applies_from(requested_at_s: float, *, size_s: int, grace_s: int) -> int:
    """Offline, the first window a request made at ``requested_at_s`` affects: the first
    whose release point (end + grace, event time running at wall-clock speed) is after it.
    Windows released at or before the request stand."""
    return math.floor((requested_at_s - size_s - grace_s) / size_s) * size_s + size_s
