"""A restart while the input is idle (issue 28, failure 1): stage 1's event time starts from
what is known — the first window not yet released, carried on by the wall time since the
deployment's last release once every source is proven read to its end and quiet — never
from the deployment's first covered window, and never past what the read proofs allow. A
deployment that never released, or released far behind the wall clock (a backfill), keeps
one second of event time per second: it never jumps to the wall clock."""

from __future__ import annotations

import logging
import random
from typing import Any

import orjson
import pytest

from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.backlog import DueBacklog
from stream_dp.pipeline.formats.ledger import LedgerIndex, encode_progress
from stream_dp.pipeline.formats.partials import SourceWatermark, encode_watermark
from stream_dp.pipeline.stages.ingest import IngestSettings, IngestStage
from stream_dp.pipeline.stages.release_stage import ReleaseStage
from stream_dp.windows.watermark import IDLE_CONFIRM_S
from tests.pipeline.support import KEYRING, NOW, T0, config, numbered, rec

#: The wall clock at the restart: about eleven days of 10-s windows after the coverage start.
WALL = T0 + 1_000_000.0
GRACE_S, IDLE_S = 1, 5  # support.config's window.grace_s and window.idle_close_s
#: input.max_future_s: the clock error the deployment tolerates. A restart trusts its own
#: wall clock only this far behind it (beyond, only as far as the last release's stamp).
TOLERANCE_S = config().input.max_future_s
#: The wall clock less the tolerance: where a restart long after the last release starts.
TRUSTED = WALL - TOLERANCE_S


def _released_through(
    next_by_partition: dict[int, int],
    partitions: int = 2,
    *,
    released_at_s: float | None = -1.0,
) -> ReleaseStage:
    """Stage 2 after reading a ledger whose progress records say these cursors, the newest
    written at wall time ``released_at_s`` (default: the first window not released, so
    that the deployment's carried clock is the wall clock; None: no broker time known)."""
    ledger = LedgerIndex()
    ledger.load(encode_progress(r, partitions, nxt) for r, nxt in sorted(next_by_partition.items()))
    if released_at_s is not None:
        at_s = min(next_by_partition.values()) if released_at_s == -1.0 else released_at_s
        ledger.note_progress_time(int(at_s * 1000))
    stage = ReleaseStage(config(), partials_partitions=partitions, ledger=ledger)
    stage.adopt_ledger()
    return stage


def _stage1(
    released: ReleaseStage | None, *, keyed: bool = True, input_partitions: int = 1
) -> IngestStage:
    return IngestStage(
        config(keyed_by_user=keyed),
        KEYRING,
        released=released,
        metrics=Metrics(),
        sampling_rng=random.Random(0),
        # read proof required as in the worker
        settings=IngestSettings(require_read_proof=True, input_partitions=input_partitions),
    )


def _watermark(stage: IngestStage, now_mono_s: float) -> float | None:
    stage.due(now_mono_s)
    (mark,) = stage.watermarks(now_mono_s)
    return mark.watermark_s


def test_event_time_starts_at_the_first_window_not_released_not_at_the_coverage_start() -> None:
    """Windows up to T0+990 on partials partition 1 and T0+1000 on 0 are released: after a
    restart an idle partition's event time runs from T0+990, not from T0 (the coverage
    start, 99 windows back), so it takes no 990 s to reach the due windows."""
    release = _released_through({0: T0 + 1000, 1: T0 + 990})
    assert release.first_unreleased_s == T0 + 990
    stage = _stage1(release)
    stage.assign([0], 0.0, routed=False)  # no wall clock: the last released window alone
    assert _watermark(stage, 6.0) is None  # no fetch proved the reader at the end yet
    stage.read_to_end(0, 6.0, input_topic=False)
    assert _watermark(stage, 6.0) == T0 + 990 + 6.0 - GRACE_S


def test_with_the_wall_clock_an_idle_partition_catches_up_once_proven_read_to_its_end() -> None:
    """Restarted long after its last release, with no new event: once a fetch proves the
    reader at the end for window.idle_close_s, the watermark is the wall clock at that
    proof less the clock tolerance and the grace — every due window but the last
    input.max_future_s closes at once, none in the future."""
    release = _released_through({0: T0 + 1000, 1: T0 + 990})
    stage = _stage1(release)
    stage.assign([0], 100.0, routed=False, now_s=WALL)
    assert _watermark(stage, 200.0) is None  # silence without a read proof is no idleness
    stage.read_to_end(0, 100.0 + IDLE_S - 0.5, input_topic=False)
    assert _watermark(stage, 200.0) is None  # proven quiet for less than idle_close_s
    stage.read_to_end(0, 100.0 + IDLE_S, input_topic=False)
    # Proven quiet through mono 105 = wall WALL + 5: windows ending by then less the
    # tolerance, minus grace.
    assert _watermark(stage, 200.0) == TRUSTED + IDLE_S - GRACE_S


def test_replayed_events_keep_the_wall_clock_start_from_closing_their_windows_early() -> None:
    """A restart that replays a backlog: while records arrive the partition is active and
    its own events hold the watermark; the wall clock counts only after proven silence."""
    stage = _stage1(_released_through({0: T0, 1: T0 + 10}))
    stage.assign([0], 0.0, routed=False, now_s=WALL)
    assert (
        stage.ingest(
            0, [rec(0, "u", 3, key=b"u"), rec(1, "u", 17, key=b"u")], now_s=WALL, now_mono_s=1.0
        )
        == []
    )
    stage.read_to_end(0, 3.0, input_topic=False)
    assert _watermark(stage, 3.0) == T0 + 17 - GRACE_S  # its events, not the wall clock
    assert stage.open_windows() == [T0, T0 + 10]
    stage.read_to_end(0, 1.0 + IDLE_S, input_topic=False)
    # Idle since the last record at mono 1, proven through 6: the wall clock at the take
    # (WALL, mono 0) plus the proven silence — at most the wall clock of the proof.
    wm = _watermark(stage, 6.0)
    assert wm is not None and wm <= WALL + 6.0 - GRACE_S
    assert {ws for _, ws in stage.due(6.0)} == {T0, T0 + 10}


def _marks(stage: IngestStage, now_mono_s: float) -> list[dict[str, Any]]:
    return [orjson.loads(m) for m in stage.progress_marks(now_mono_s)]


def test_a_router_reports_the_wall_clock_only_for_an_input_partition_proven_idle() -> None:
    """Input not keyed by user: the router owns the read proof, so it is the one that says
    how far an idle input partition got — the wall clock at its take, once proven quiet
    for window.idle_close_s; before that, only the events it routed."""
    router = _stage1(_released_through({0: T0, 1: T0}), keyed=False)
    router.assign_routed([0, 1], 10.0, now_s=WALL)
    router.read_to_end(0, 10.0 + IDLE_S - 1, input_topic=True)
    assert [m["t"] for m in _marks(router, 30.0)] == [None, None]  # not idle long enough
    router.route(1, numbered([("u", 5, "a")]), now_s=NOW, now_mono_s=11.0)
    router.read_to_end(0, 10.0 + IDLE_S, input_topic=True)
    router.read_to_end(1, 11.0 + IDLE_S - 1, input_topic=True)
    marks = _marks(router, 30.0)
    assert marks[0] == {"t": TRUSTED, "idle_s": IDLE_S, "src": [0, -1]}
    assert marks[1] == {"t": T0 + 5, "idle_s": IDLE_S - 1, "src": [1, -1]}  # active: events
    router.read_to_end(1, 11.0 + IDLE_S, input_topic=True)
    # Idle after an event at mono 11 (wall WALL + 1): t + idle_s is TRUSTED + 6, at most
    # the wall clock of the proof.
    assert _marks(router, 30.0)[1] == {"t": TRUSTED, "idle_s": IDLE_S, "src": [1, -1]}
    router.forget_routed([0])
    router.assign_routed([0], 40.0)  # taken again without a wall clock: events only
    router.read_to_end(0, 60.0, input_topic=True)
    assert _marks(router, 60.0)[0]["t"] is None


def test_a_repartition_partition_catches_up_with_its_idle_routers_wall_clock() -> None:
    """Stage 1 on the repartition topic, restarted with its routers while the input is idle:
    the routers' marks carry the wall clock, so the due windows close within the idle
    timeout (and the confirmation), not at one second per second from the last release."""
    release = _released_through({0: T0 + 1000, 1: T0 + 990})
    router = _stage1(release, keyed=False)
    router.assign_routed([0, 1], 0.0, now_s=WALL)
    owner = _stage1(release, keyed=False, input_partitions=2)
    owner.assign([0], 0.0, routed=True, now_s=WALL)
    offset = 0
    for now in (IDLE_S, IDLE_S + IDLE_CONFIRM_S):
        for p in (0, 1):
            router.read_to_end(p, now, input_topic=True)
        marks = [(offset + i, None, m) for i, m in enumerate(router.progress_marks(now))]
        offset += len(marks)
        assert owner.ingest(0, marks, now_s=WALL + now, now_mono_s=now, routed=True) == []
    expected = TRUSTED + IDLE_S + IDLE_CONFIRM_S - GRACE_S
    assert _watermark(owner, IDLE_S + IDLE_CONFIRM_S) == expected


def test_stage2_counts_a_backlog_of_due_windows_without_listing_it() -> None:
    """After weeks idle with short windows, 10^5 windows may be due at once: the count the
    worker exports is arithmetic, and agrees with the windows due_windows would list."""
    release = _released_through({0: T0 + 1000, 1: T0 + 990})
    through = T0 + 1000 + 10 * 100_000 + 5  # every source passed 100,000 windows more
    for r in (0, 1):
        for source in range(2):
            mark = SourceWatermark(source, 2, through, True, False, 60.0)
            release.ingest(r, [(source, encode_watermark(mark)[1])])
    assert release.windows_due_count() == 100_000 + 1  # from T0+990 to T0+1_000_990
    assert release.windows_due_count() == len(release.due_windows())
    assert len(release.due_windows(limit=32)) == 32


def test_a_backlog_of_due_windows_is_exported_and_logged_at_its_start_and_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = Metrics()
    backlog = DueBacklog(metrics, per_iteration=32)
    with caplog.at_level(logging.INFO, logger="stream_dp.pipeline.backlog"):
        backlog.note(3)  # a few due windows: normal, no log line
        backlog.note(100_001)
        backlog.note(99_969)
        assert metrics.windows_due._value.get() == 99_969
        backlog.note(0)
    assert [r.getMessage() for r in caplog.records] == [
        "100001 due windows wait for release (a restart after the input was idle, or an "
        "outage): they are released in order, 32 per loop iteration; stream_dp_windows_due "
        "counts down",
        "the due windows are released",
    ]
    assert metrics.windows_due._value.get() == 0


def test_a_deployment_that_never_released_keeps_one_second_per_second() -> None:
    """A first start on old coverage (a backfill: nothing released yet) never takes the
    wall clock: it would close every window up to now and drop the rest of the input as
    late. Event time runs from the coverage start at one second per second."""
    release = ReleaseStage(config(), partials_partitions=2, ledger=LedgerIndex())
    release.adopt_ledger()
    assert release.last_release_wall_s is None
    stage = _stage1(release)
    stage.assign([0], 100.0, routed=False, now_s=WALL)
    stage.read_to_end(0, 100.0 + IDLE_S, input_topic=False)
    wm = _watermark(stage, 100.0 + IDLE_S)
    assert wm is not None and wm < T0 + 1000  # nowhere near WALL (T0 + 1,000,000)
    router = _stage1(release, keyed=False)
    router.assign_routed([0], 10.0, now_s=WALL)
    router.read_to_end(0, 10.0 + IDLE_S, input_topic=True)
    assert [m["t"] for m in _marks(router, 30.0)] == [None]  # no wall clock to report


def test_a_backfill_restarted_carries_its_own_clock_not_the_wall_clock() -> None:
    """Windows from T0 released a minute before the restart (event time far behind the
    wall clock): after the restart event time runs on from the first window not released
    by the minute that passed since, not from the wall clock."""
    release = _released_through({0: T0 + 1000, 1: T0 + 990}, released_at_s=WALL - 60)
    stage = _stage1(release)
    stage.assign([0], 100.0, routed=False, now_s=WALL)
    stage.read_to_end(0, 100.0 + IDLE_S, input_topic=False)
    assert _watermark(stage, 100.0 + IDLE_S) == T0 + 990 + 60 + IDLE_S - GRACE_S


@pytest.mark.parametrize("keyed", [True, False], ids=["keyed-by-user", "repartitioned"])
def test_a_fast_clock_taking_partitions_starts_at_most_at_the_true_time(keyed: bool) -> None:
    """Issue 39: another worker released at the true time REAL; this worker's clock is
    input.max_future_s fast. The time since that release is measured across two clocks:
    taken alone, the fast one would start event time in the future and release windows
    before they begin. Event time starts at most at the true time (plus the proven quiet)."""
    real = T0 + 1000.0
    fast = real + TOLERANCE_S
    release = _released_through({0: T0 + 1000, 1: T0 + 990}, released_at_s=real)
    stage = _stage1(release, keyed=keyed)
    if keyed:
        stage.assign([0], 100.0, routed=False, now_s=fast)
        stage.read_to_end(0, 100.0 + IDLE_S, input_topic=False)
        wm = _watermark(stage, 100.0 + IDLE_S)
        assert wm is not None and wm <= real + IDLE_S - GRACE_S
    else:
        stage.assign_routed([0], 100.0, now_s=fast)
        stage.read_to_end(0, 100.0 + IDLE_S, input_topic=True)
        (mark,) = _marks(stage, 100.0 + IDLE_S)
        assert mark["t"] is not None and mark["t"] + mark["idle_s"] <= real + IDLE_S


def test_a_slow_clock_taking_partitions_starts_behind_never_ahead() -> None:
    """The same take with a clock input.max_future_s slow: event time starts behind the
    true time (windows close late, never early): a clock behind the last release's stamp
    carries nothing, event time runs on from the first window not released."""
    real = T0 + 1000.0
    release = _released_through({0: T0 + 1000, 1: T0 + 990}, released_at_s=real)
    stage = _stage1(release)
    stage.assign([0], 100.0, routed=False, now_s=real - TOLERANCE_S)
    stage.read_to_end(0, 100.0 + IDLE_S, input_topic=False)
    wm = _watermark(stage, 100.0 + IDLE_S)
    assert wm == T0 + 990 + IDLE_S - GRACE_S
