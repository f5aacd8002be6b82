"""Where stage 1's event time starts when it takes a partition (after a start, a restart or
a rebalance): at the first covered window not yet released, carried on by the deployment's
own clock (docs/operations.md, "A restart while the input is idle").

The start counts only once every partition is proven read to its end and quiet for
``window.idle_close_s`` (the watermark tracker's read-proof rule): no window closes before
its sources are proven read past its end plus the grace.

No single clock moves it (docs/operations.md, "Clocks"): the time since the last release is
the taking worker's clock minus the releasing worker's stamp, two clocks that may disagree.
A worker's clock is trusted only within the deployment's clock tolerance
(``input.max_future_s``, the error it already accepts between producers' and workers'
clocks): beyond ``now − tolerance`` event time jumps only as far as the stream itself shows
time has passed (the last release's stamp). So a worker whose clock is up to the tolerance
fast starts at most at the true time, and releases no window before it ends.
"""

from __future__ import annotations

import logging

from stream_dp.pipeline.stages.ingest_columns import ReleasedWindows
from stream_dp.windows import TumblingWindows
from stream_dp.windows.tumbling import iso_utc

log = logging.getLogger("stream_dp.pipeline.stages.ingest")


def first_unreleased(released: ReleasedWindows) -> float | None:
    """The first covered window not known released (None: the coverage is unknown) —
    never the first covered window of a deployment that released since."""
    coverage = released.coverage_start_s
    if coverage is None:
        return None
    return float(max(coverage, released.first_unreleased_s or coverage))


def carried_clock(
    released: ReleasedWindows, start_s: float, now_s: float | None, *, clock_tolerance_s: float
) -> float | None:
    """Event time as the deployment's clock would show it had it never stopped: as far past
    ``start_s`` (the first window not released) as the wall clock ``now_s`` has moved since
    the deployment's last release (its newest progress record's time stamp), and at most
    ``now_s`` — but by this worker's clock alone at most to ``now_s − clock_tolerance_s``:
    further only as far as the last release's stamp (time the stream itself shows passed).
    A clock up to ``clock_tolerance_s`` fast cannot start event time in the future. None
    when the deployment never released (or the time is unknown): then event time starts at
    ``start_s`` and runs at one second per second, so a deployment covering old windows (a
    backfill) never jumps to the wall clock and drops the rest of its input as late."""
    last_s = released.last_release_wall_s
    if now_s is None or last_s is None or now_s <= last_s:
        return None
    carried = min(now_s, start_s + (now_s - last_s))
    return max(min(carried, last_s), carried - clock_tolerance_s)


def carried_start(
    released: ReleasedWindows, now_s: float | None, clock_tolerance_s: float
) -> float | None:
    """What an input partition's router reports once proven idle (None: only its events):
    the deployment's carried clock, from the first window not released."""
    start_s = first_unreleased(released)
    if start_s is None:
        return None
    return carried_clock(released, start_s, now_s, clock_tolerance_s=clock_tolerance_s)


def event_time_start(
    released: ReleasedWindows,
    windows: TumblingWindows,
    now_s: float | None,
    clock_tolerance_s: float,
    *,
    wall_clock: bool = True,
) -> float | None:
    """Where a newly assigned partition's event time starts (None: coverage unknown): the
    first window not yet released and, with ``now_s`` and ``wall_clock`` (a stage-1
    partition of the input itself; a repartition partition learns it from its routers),
    the deployment's clock carried on (:func:`carried_clock`): a deployment that ran live
    and then stood idle or stopped, for minutes or weeks, starts at about the wall clock
    and releases its due windows at once."""
    start_s = first_unreleased(released)
    if start_s is None:
        return None
    carried = carried_clock(released, start_s, now_s, clock_tolerance_s=clock_tolerance_s)
    if carried is None:
        return start_s
    due = int((carried - start_s) // windows.size_s)
    if due > 0:
        log.info(
            "partitions taken: %d windows from %s (the first not released) are due; with "
            "the input idle they are released once every input partition is proven read "
            "to its end and quiet for window.idle_close_s",
            due,
            iso_utc(int(start_s)),
        )
    return carried if wall_clock else start_s
