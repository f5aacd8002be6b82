"""When an erasure applies to a window's release: the exact cut-off (README, "Erasure").

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
recomputed: a second noise draw would let anyone average the two (PRIVACY.md invariant 3),
and its values are differentially private for the user already.

**The response.** The worker that records a request then reads the ledger to fresh fences:
every cut and release before that point is known. Windows up to the latest cut or release
seen are reported as released (not recomputed; they *may* include the user's events — some
of them will not, if their cut came after all); every later window is reported as released
without the user, and that is exact: its cut, written after the fence, follows the erasure.

Pure: the worker and :class:`~stream_dp.pipeline.local.LocalPipeline` do the I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from stream_dp.pipeline.release_stage import ReleaseStage
from stream_dp.privacy.erasure import ErasureSet


class ErasureGate:
    """Stage 2's side of the rule: per window, the erasure-log position its partials must
    have applied, fixed when its cut was written."""

    def __init__(self, erasures: ErasureSet) -> None:
        self.erasures = erasures
        self._required: dict[int, int] = {}

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

    def ready(self, window_start_s: int, stage: ReleaseStage) -> bool:
        """Whether every partial the window would merge applied the erasures it must."""
        return stage.erasures_applied(window_start_s) >= self._required[window_start_s]

    def finish(self, window_start_s: int) -> None:
        self._required.pop(window_start_s, None)

    def forget(self, released: Callable[[int], bool]) -> None:
        """Drop windows known released (by anyone)."""
        for ws in [w for w in self._required if released(w)]:
            del self._required[ws]


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
