"""Stage 2 (ReleaseStage) without Kafka: when a window is due, which partial versions are
merged, what is ignored and counted, the ledger, and offsets on the partials topic."""

from __future__ import annotations

import logging
import random
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import pytest

from stream_dp.config.model import Config
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.formats.continual_state import ContinualStore
from stream_dp.pipeline.formats.ledger import (
    LedgerIndex,
    LedgerRelease,
    encode_progress,
    encode_published,
    encode_release,
)
from stream_dp.pipeline.formats.partials import (
    GroupKey,
    Partial,
    SourceWatermark,
    encode_partial,
    encode_watermark,
    new_version,
)
from stream_dp.pipeline.stages.ingest import IngestStage, InputRecord
from stream_dp.pipeline.stages.partials_inbox import _newer
from stream_dp.pipeline.stages.release_stage import ReleaseStage
from stream_dp.privacy.release import KeyAggregate
from stream_dp.windows.watermark import IDLE_CONFIRM_S
from tests.helpers import schema_validator
from tests.pipeline.support import KEYRING, NOW, QUERIES, T0, config, rec, values

END = T0 + 10  # end of window T0
A, B = ("a",), ("b",)
#: A small record limit: a few hundred keys take two parts.
SMALL_BYTES = 8192
MB = 1_000_000
MANY = {(f"d{i}",): KeyAggregate(1, 1, 0) for i in range(600)}  # two parts at SMALL_BYTES


class Feed:
    """Delivers records to one ReleaseStage as partials-topic partitions would, with offsets."""

    def __init__(self, stage: ReleaseStage) -> None:
        self.stage = stage
        self.next_offset: dict[int, int] = {}

    def values(self, r: int, values: Sequence[bytes | None]) -> None:
        start = self.next_offset.get(r, 0)
        self.next_offset[r] = start + len(values)
        self.stage.ingest(r, [(start + i, v) for i, v in enumerate(values)])

    def partial(self, r: int, partial: Partial) -> None:
        self.values(r, [v for _, v in encode_partial(partial, max_bytes=SMALL_BYTES)])

    def mark(
        self,
        r: int,
        source: int,
        watermark_s: float | None,
        *,
        sources: int = 3,
        idle: bool = False,
        open_windows: bool = True,
        idle_for_s: float = 0.0,
    ) -> None:
        mark = SourceWatermark(source, sources, watermark_s, idle, open_windows, idle_for_s)
        self.values(r, [encode_watermark(mark)[1]])

    def idle(self, r: int, source: int, idle_for_s: float, *, sources: int = 3) -> None:
        """A source with no watermark, idle for ``idle_for_s`` with nothing open."""
        self.mark(
            r, source, None, sources=sources, idle=True, open_windows=False, idle_for_s=idle_for_s
        )

    def marks(self, r: int, watermark_s: float | None, *, sources: int = 3) -> None:
        for p in range(sources):
            self.mark(r, p, watermark_s, sources=sources)


def _stage(
    cfg: Config | None = None, *, ledger: LedgerIndex | None = None, partitions: int = 1, **kw: Any
) -> ReleaseStage:
    stage = ReleaseStage(
        cfg if cfg is not None else config(),
        partials_partitions=partitions,
        ledger=ledger,
        metrics=Metrics(),
        **kw,
    )
    stage.assign(range(partitions))
    return stage


def _partial(
    query: str,
    source: int,
    totals: Mapping[GroupKey, KeyAggregate],
    *,
    window_start_s: int = T0,
    version: str | None = None,
) -> Partial:
    events = sum(a.events for a in totals.values())
    return Partial(
        query, window_start_s, source, version or new_version(), dict(totals), events, events
    )


def _both(source: int, visits: Mapping[GroupKey, KeyAggregate], **kw: Any) -> list[Partial]:
    """One seal's partials: 'visits' by domain and 'all' (its totals summed), one version."""
    version = kw.pop("version", None) or new_version()
    events = sum(a.events for a in visits.values())
    users = max((a.users for a in visits.values()), default=0)
    total = {(): KeyAggregate(events, users, 0)} if visits else {}
    return [
        _partial("visits", source, visits, version=version, **kw),
        _partial("all", source, total, version=version, **kw),
    ]


def _release(stage: ReleaseStage, ws: int = T0) -> list[LedgerRelease]:
    """What the worker does with a due window: draw, ledger, publish the ledger's winners
    (as read back), finish."""
    for rel in stage.compute_release(ws, now_s=NOW):
        stage.ledger.load(encode_release(rel, now_s=NOW, max_bytes=MB))
    winners = stage.winners(ws)
    stage.ledger.load([encode_published(rel) for rel in winners])
    stage.finish_window(ws, winners, NOW)
    return winners


def _ignored(stage: ReleaseStage, reason: str) -> float:
    return float(stage.metrics.partials_ignored.labels(reason=reason)._value.get())


def _three_sources(feed: Feed, r: int = 0, ws: int = T0) -> None:
    for source, visits in enumerate(
        [{A: KeyAggregate(2, 2, 0)}, {B: KeyAggregate(1, 1, 0)}, {A: KeyAggregate(3, 1, 0)}]
    ):
        for partial in _both(source, visits, window_start_s=ws):
            feed.partial(r, partial)


# -- when a window is due -------------------------------------------------------------------


def test_due_only_when_every_source_passed_the_window_end() -> None:
    stage = _stage()
    feed = Feed(stage)
    _three_sources(feed)
    assert stage.due_windows() == []  # no watermark yet
    feed.mark(0, 0, END)
    feed.mark(0, 1, END + 5)
    assert stage.due_windows() == []  # source 2 unheard of
    feed.mark(0, 2, END - 0.001)
    assert stage.due_windows() == []
    feed.mark(0, 2, END)  # exactly at the end is past it
    assert stage.due_windows() == [T0]
    releases = _release(stage)
    assert values(releases, "visits") == {
        '{"domain":"a"}': 5,
        '{"domain":"b"}': 1,
        "null": "window",
    }
    assert stage.due_windows() == []
    assert stage.open_windows() == []


@pytest.mark.parametrize(
    ("idle", "open_windows", "due"),
    [(True, False, True), (True, True, False), (False, False, False)],
)
def test_a_source_without_a_watermark_clears_only_when_idle_with_nothing_open(
    idle: bool, open_windows: bool, due: bool
) -> None:
    stage = _stage()
    feed = Feed(stage)
    _three_sources(feed)
    feed.mark(0, 0, END)
    feed.mark(0, 1, END)
    feed.mark(0, 2, None, idle=idle, open_windows=open_windows, idle_for_s=30.0)
    # One mark cannot tell a current "idle" from one written just before a burst.
    assert stage.due_windows() == []
    later = 30.0 + IDLE_CONFIRM_S
    feed.mark(0, 2, None, idle=idle, open_windows=open_windows, idle_for_s=later)
    assert stage.due_windows() == ([T0] if due else [])


def test_an_idle_source_behind_the_window_clears_once_nothing_is_open() -> None:
    stage = _stage()
    feed = Feed(stage)
    _three_sources(feed)
    feed.marks(0, END)
    feed.mark(0, 2, END - 5)  # a restarted source 2, sealing nothing yet: moves nothing back
    assert stage.due_windows() == [T0]
    other = _stage()
    feed = Feed(other)
    _three_sources(feed)
    feed.mark(0, 0, END)
    feed.mark(0, 1, END)
    feed.mark(0, 2, END - 5)  # behind and active
    assert other.due_windows() == []
    feed.mark(0, 2, END - 5, idle=True, open_windows=False, idle_for_s=5.0)  # silent, empty
    assert other.due_windows() == []  # not confirmed yet
    feed.mark(0, 2, END - 5, idle=True, open_windows=False, idle_for_s=5.0 + IDLE_CONFIRM_S)
    assert other.due_windows() == [T0]


def _quiet_spell(feed: Feed, until_s: float, r: int = 0) -> None:
    """Every source idle with nothing open for a long time, re-sent every second."""
    for idle_for in (until_s - 2, until_s - 1, until_s):
        for source in range(3):
            feed.idle(r, source, idle_for)


def _source_0_seals_its_share(feed: Feed) -> str:
    """A burst after the quiet spell: source 0 seals its share of T0 (partial + watermark)."""
    version = new_version()
    for partial in _both(0, {A: KeyAggregate(2, 2, 0)}, version=version):
        feed.partial(0, partial)
    feed.mark(0, 0, END)
    return version


def test_idle_marks_from_before_a_burst_do_not_release_its_window() -> None:
    """Sources 1 and 2 said "idle, nothing open" before the burst; their share of it may be
    on its way. The window waits until each has stayed idle IDLE_CONFIRM_S after the burst
    showed on the partition."""
    stage = _stage()
    feed = Feed(stage)
    _quiet_spell(feed, until_s=12.0)
    version = _source_0_seals_its_share(feed)
    assert stage.due_windows() == []  # the stale marks alone no longer clear it
    feed.idle(0, 1, 12.5)
    feed.idle(0, 2, 12.5)
    assert stage.due_windows() == []  # first idle marks since the burst: the base
    feed.idle(0, 1, 12.5 + IDLE_CONFIRM_S)  # source 1 confirmed
    feed.idle(0, 2, 13.4)
    assert stage.due_windows() == []  # source 2 has grown 0.9 s only
    feed.idle(0, 2, 12.5 + IDLE_CONFIRM_S)
    assert stage.due_windows() == [T0]
    releases = _release(stage)
    assert values(releases, "visits") == {
        '{"domain":"a"}': 2,
        '{"domain":"b"}': 0,
        "null": "window",
    }
    assert [r.sources for r in releases] == [{0: version}, {0: version}]


@pytest.mark.parametrize(
    ("idle", "open_windows"),
    [(False, True), (True, True), (False, False)],
    ids=["active", "idle-with-open-windows", "active-nothing-open"],
)
def test_an_idle_source_whose_share_arrives_holds_the_window_back(
    idle: bool, open_windows: bool
) -> None:
    stage = _stage()
    feed = Feed(stage)
    _quiet_spell(feed, until_s=12.0)
    _source_0_seals_its_share(feed)
    feed.idle(0, 1, 12.5)
    feed.idle(0, 2, 12.5)
    # Source 2's share of the burst reaches its stage 1: it no longer says idle-and-empty.
    feed.mark(0, 2, None, idle=idle, open_windows=open_windows, idle_for_s=13.5 if idle else 0)
    feed.idle(0, 1, 13.5)  # source 1 confirmed
    assert stage.due_windows() == []
    feed.mark(0, 2, None, idle=idle, open_windows=open_windows, idle_for_s=40.0 if idle else 0)
    feed.idle(0, 1, 40.0)
    assert stage.due_windows() == []  # however long it says so
    # Source 2 seals; source 1 has stayed idle since source 2 woke up: the window is due.
    for partial in _both(2, {B: KeyAggregate(1, 1, 0)}):
        feed.partial(0, partial)
    feed.mark(0, 2, END)
    assert stage.due_windows() == [T0]
    assert values(_release(stage), "visits") == {
        '{"domain":"a"}': 2,
        '{"domain":"b"}': 1,
        "null": "window",
    }


@pytest.mark.parametrize(
    ("progress", "due_after_one_second"),
    [
        ("partial", True),
        ("watermark_advance", True),
        ("same_watermark_again", True),
        ("wake_up", False),
    ],
)
def test_only_a_wake_up_between_idle_marks_restarts_their_confirmation(
    progress: str, due_after_one_second: bool
) -> None:
    stage = _stage()
    feed = Feed(stage)
    _source_0_seals_its_share(feed)
    feed.idle(0, 1, 20.0)
    feed.idle(0, 2, 20.0)
    if progress == "partial":  # source 0's burst goes on into the next window
        for partial in _both(0, {A: KeyAggregate(1, 1, 0)}, window_start_s=T0 + 10):
            feed.partial(0, partial)
    elif progress == "watermark_advance":  # a live source advancing is no news of a burst
        feed.mark(0, 0, END + 3)
    elif progress == "wake_up":  # source 0 was idle with nothing open, and now is not
        feed.idle(0, 0, 20.0)
        feed.mark(0, 0, END, idle=False, open_windows=True, idle_for_s=0.0)
    else:  # a re-sent mark: nothing new
        feed.mark(0, 0, END)
    feed.idle(0, 1, 20.0 + IDLE_CONFIRM_S)
    feed.idle(0, 2, 20.0 + IDLE_CONFIRM_S)
    assert stage.due_windows() == ([T0] if due_after_one_second else [])
    feed.idle(0, 1, 20.0 + 2 * IDLE_CONFIRM_S)
    feed.idle(0, 2, 20.0 + 2 * IDLE_CONFIRM_S)
    assert stage.due_windows() == [T0]


def test_progress_on_another_partials_partition_does_not_restart_confirmation() -> None:
    """Confirmation is per partials partition: progress on one resets only its own."""
    stage = _stage(partitions=2)
    feed = Feed(stage)
    _source_0_seals_its_share(feed)  # on partition 0
    for r in (0, 1):
        feed.idle(r, 1, 20.0)
        feed.idle(r, 2, 20.0)
    feed.mark(1, 0, END + 50)  # progress on partition 1 only
    for r in (0, 1):
        feed.idle(r, 1, 21.0)
        feed.idle(r, 2, 21.0)
    # T0 on partition 0; partition 1's own windows up to END + 50 (odd tens) are due too.
    assert stage.due_windows() == [T0, T0 + 10, T0 + 30, T0 + 50]


def test_watermarks_read_on_another_partials_partition_do_not_count() -> None:
    stage = _stage(partitions=2)
    feed = Feed(stage)
    _three_sources(feed, r=0)
    feed.mark(0, 0, END)
    feed.mark(0, 1, END)
    feed.marks(1, END + 100)  # all three on partition 1, which holds none of T0's partials
    assert T0 not in stage.due_windows()
    feed.mark(0, 2, END)
    assert T0 in stage.due_windows()


def test_the_number_of_sources_comes_from_the_watermarks() -> None:
    """A watermark saying there are 4 source partitions makes the window wait for a 4th."""
    stage = _stage()
    feed = Feed(stage)
    _three_sources(feed)
    feed.marks(0, END)
    feed.mark(0, 0, END, sources=4)
    assert stage.due_windows() == []
    feed.mark(0, 3, END, sources=4, idle=True, open_windows=False)
    assert stage.due_windows() == [T0]


def test_a_watermark_never_moves_back() -> None:
    stage = _stage()
    feed = Feed(stage)
    _three_sources(feed)
    feed.marks(0, END)
    feed.mark(0, 1, END - 8)  # a restarted stage 1 that has not sealed anything yet
    feed.mark(0, 2, None)
    assert stage.due_windows() == [T0]
    assert stage.watermark_s() == END


def test_newer_keeps_the_largest_watermark_and_the_latest_flags() -> None:
    old = SourceWatermark(1, 3, 20.0, idle=False, open_windows=True)
    behind = SourceWatermark(1, 3, 5.0, idle=True, open_windows=False)
    assert _newer(old, behind) == SourceWatermark(1, 3, 20.0, idle=True, open_windows=False)
    unknown = SourceWatermark(1, 4, None, idle=False, open_windows=True)
    assert _newer(old, unknown) == SourceWatermark(1, 4, 20.0, idle=False, open_windows=True)
    ahead = SourceWatermark(1, 3, 25.0, idle=False, open_windows=False)
    assert _newer(old, ahead) == ahead
    assert _newer(None, behind) == behind
    assert _newer(unknown, behind) == behind


# -- which versions are taken, what is ignored ----------------------------------------------


def test_a_second_version_of_a_partial_is_ignored_and_counted() -> None:
    stage = _stage()
    feed = Feed(stage)
    _three_sources(feed)
    again = _partial("visits", 1, {B: KeyAggregate(7, 7, 0), A: KeyAggregate(1, 1, 0)})
    feed.partial(0, again)  # source 1's 'visits' was already complete: this one is ignored
    assert _ignored(stage, "duplicate_version") == 1
    feed.marks(0, END)
    releases = _release(stage)
    assert values(releases, "visits") == {
        '{"domain":"a"}': 5,
        '{"domain":"b"}': 1,
        "null": "window",
    }
    assert _ignored(stage, "window_released") == 0
    assert _ignored(stage, "malformed") == 0


def test_every_part_of_an_ignored_version_is_counted() -> None:
    stage = _stage()
    feed = Feed(stage)
    _three_sources(feed)
    feed.partial(0, _partial("visits", 0, MANY))  # 2 parts
    assert _ignored(stage, "duplicate_version") == 2


def test_the_first_complete_version_wins_over_an_earlier_incomplete_one() -> None:
    stage = _stage()
    feed = Feed(stage)
    crashed = _partial("visits", 0, MANY, version="c" * 32)
    feed.values(0, [encode_partial(crashed, max_bytes=SMALL_BYTES)[0][1]])  # writer died
    taken = _both(0, {A: KeyAggregate(4, 2, 0)}, version="d" * 32)
    for partial in taken:
        feed.partial(0, partial)
    late = encode_partial(crashed, max_bytes=SMALL_BYTES)[1][1]
    feed.values(0, [late])  # the rest arrives late: not merged
    feed.marks(0, END, sources=1)
    releases = _release(stage)
    assert values(releases, "visits") == {
        '{"domain":"a"}': 4,
        '{"domain":"b"}': 0,
        "null": "window",
    }
    assert {r.query: r.sources for r in releases} == {"visits": {0: "d" * 32}, "all": {0: "d" * 32}}
    assert _ignored(stage, "duplicate_version") == 1  # the late part of the crashed version


def test_an_incomplete_partial_holds_its_window_until_a_complete_version_comes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Source 1 reported the window (a part of its partial is here) but not all of it: a
    release now would count its events as none. The window waits, says for which source,
    and is released with source 1's share once a complete version arrives."""
    stage = _stage()
    feed = Feed(stage)
    feed.values(0, [encode_partial(_partial("visits", 1, MANY), max_bytes=SMALL_BYTES)[0][1]])
    for partial in _both(0, {A: KeyAggregate(4, 2, 0)}):
        feed.partial(0, partial)
    feed.marks(0, END, sources=2)
    with caplog.at_level(logging.WARNING, logger="stream_dp"):
        assert stage.due_windows() == []
        assert stage.due_windows() == []  # warned once, not once per loop
    assert stage.metrics.partials_incomplete._value.get() == 1
    waits = [r for r in caplog.records if "source partition 1" in r.getMessage()]
    assert len(waits) == 1 and getattr(waits[0], "source", None) == 1
    for partial in _both(1, {B: KeyAggregate(1, 1, 0)}):  # source 1's next owner reseals
        feed.partial(0, partial)
    assert stage.due_windows() == [T0]
    assert stage.metrics.partials_incomplete._value.get() == 0
    releases = _release(stage)
    assert values(releases, "visits") == {
        '{"domain":"a"}': 4,
        '{"domain":"b"}': 1,
        "null": "window",
    }
    assert {r.query: sorted(r.sources) for r in releases} == {"visits": [0, 1], "all": [0, 1]}


def test_a_source_not_heard_of_holds_the_window_and_is_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stage = _stage()
    feed = Feed(stage)
    _three_sources(feed)
    feed.mark(0, 0, END, sources=3)
    feed.mark(0, 2, END, sources=3)  # source 1: no watermark, no sealed report
    with caplog.at_level(logging.INFO, logger="stream_dp"):
        assert stage.due_windows() == []
    assert any(
        "waits for the watermarks of source partitions 1" in r.getMessage() for r in caplog.records
    )


def test_partials_of_released_windows_are_ignored() -> None:
    stage = _stage()
    feed = Feed(stage)
    _three_sources(feed)
    feed.marks(0, END)
    _release(stage)
    position = feed.next_offset[0]
    for partial in _both(1, {A: KeyAggregate(9, 9, 0)}):  # a re-seal after a stage-1 crash
        feed.partial(0, partial)
    assert _ignored(stage, "window_released") == 2
    assert _ignored(stage, "duplicate_version") == 0
    assert stage.open_windows() == []
    assert stage.due_windows() == []
    assert stage.safe_offsets() == {0: position + 2}  # nothing held back for them


def test_malformed_records_are_counted_and_skipped() -> None:
    stage = _stage()
    feed = Feed(stage)
    feed.values(0, [None, b"not json", b'{"kind": "checkpoint"}', b'{"kind": "partial"}'])
    assert _ignored(stage, "malformed") == 4
    assert stage.open_windows() == []
    assert stage.safe_offsets() == {0: 4}
    _three_sources(feed)
    # A part numbered outside its version's parts would never complete it (or crash it).
    (_, value) = encode_partial(
        _partial("visits", 0, {A: KeyAggregate(1, 1, 0)}), max_bytes=SMALL_BYTES
    )[0]
    feed.values(0, [b"[]", orjson.dumps({**orjson.loads(value), "part": 3, "parts": 2})])
    feed.marks(0, END)
    assert _ignored(stage, "malformed") == 6
    assert values(_release(stage), "all") == {"{}": 6, "null": "window"}


# -- the ledger -----------------------------------------------------------------------------


def test_the_ledger_records_the_version_taken_per_source() -> None:
    stage = _stage()
    feed = Feed(stage)
    versions = {p: f"{p}" * 32 for p in range(3)}
    for source, visits in enumerate([{A: KeyAggregate(1, 1, 0)}, {}, {B: KeyAggregate(2, 1, 0)}]):
        for partial in _both(source, visits, version=versions[source]):
            feed.partial(0, partial)
    feed.marks(0, END)
    releases = _release(stage)
    assert [r.sources for r in releases] == [versions, versions]
    # Written and read back through the ledger topic's format.
    encoded = [kv for rel in releases for kv in encode_release(rel, now_s=NOW, max_bytes=MB)]
    ledger_schema = schema_validator("ledger.schema.json")
    for _, value in encoded:
        ledger_schema.validate(orjson.loads(value))
    index = LedgerIndex()
    index.load(encoded)
    assert {r.query: r.sources for r in index.releases()} == {"visits": versions, "all": versions}


def _ledger_of(
    releases: Sequence[LedgerRelease], *, published: bool = True
) -> list[tuple[str, bytes]]:
    """The ledger records a worker writes for these releases (with the partition's progress
    record when they are published)."""
    records = [kv for rel in releases for kv in encode_release(rel, now_s=NOW, max_bytes=MB)]
    if published:
        records += [encode_published(rel) for rel in releases]
        records += [encode_progress(0, 1, max(r.window_start_s for r in releases) + 10)]
    return records


def test_adopting_another_workers_ledger_stops_a_second_release() -> None:
    first, second = _stage(), _stage()
    feeds = Feed(first), Feed(second)
    for feed in feeds:
        _three_sources(feed)
        feed.marks(0, END)
    assert first.due_windows() == second.due_windows() == [T0]
    drawn = _release(first)
    # The partials partition moved to the second worker, which reads the ledger first.
    second.ledger.load(_ledger_of(drawn))
    second.adopt_ledger()
    assert second.due_windows() == []
    assert second.open_windows() == []
    assert second.released(T0) and second.released_earlier(T0)
    assert not first.released_earlier(T0)  # the first released it itself
    assert second.accountant.window_spent(T0)[0] == pytest.approx(2e6)
    second.ledger.load(_ledger_of(drawn))
    second.adopt_ledger()  # adopting again charges nothing more
    assert second.accountant.window_spent(T0)[0] == pytest.approx(2e6)
    for partial in _both(0, {A: KeyAggregate(1, 1, 0)}):
        feeds[1].partial(0, partial)
    assert _ignored(second, "window_released") == 2
    assert second.due_windows() == []


def test_adopting_a_partly_ledgered_window_reuses_the_ledgered_query() -> None:
    first, second = _stage(), _stage()
    for feed in (Feed(first), Feed(second)):
        _three_sources(feed)
        feed.marks(0, END)
    drawn = {r.query: r for r in first.compute_release(T0, now_s=NOW)}
    second.ledger.load(_ledger_of([drawn["visits"]], published=False))
    second.adopt_ledger()
    assert second.due_windows() == [T0]
    redo = {r.query: r for r in _release(second)}
    assert redo["visits"].release_id == drawn["visits"].release_id
    assert redo["all"].release_id != drawn["all"].release_id
    assert second.accountant.window_spent(T0)[0] == pytest.approx(2e6)


# -- merging equals one partition -----------------------------------------------------------

SUM_QUERIES: list[dict[str, Any]] = [
    {"name": "visits", "group_by": ["domain"], "epsilon": 1e6, "keys": {"domain": ["a", "b"]}},
    {"name": "users", "statistic": "count_distinct_users", "epsilon": 1e6, "keys": {}},
    {
        "name": "bytes",
        "statistic": "sum",
        "value_field": "size",
        "lower": 0,
        "upper": 100,
        "group_by": ["domain"],
        "epsilon": 1e6,
        "keys": {"domain": ["a", "b"]},
    },
]


def test_merged_totals_of_three_sources_equal_one_partitions() -> None:
    k = 3
    cfg = config(k=k, queries=SUM_QUERIES, epsilon_per_window=4e6)
    # (user, t, domain, size): 12 users with 1-3 events (≤ k), "heavy" with 10 alike events.
    events = [
        (f"user-{i}", 1 + (i * 7 + j) % 9, "ab"[(i + j) % 2], (i * 13 + j * 5) % 120)
        for i in range(12)
        for j in range(1 + i % 3)
    ] + [("heavy", 1 + j / 10, "a", 10) for j in range(10)]

    def run(partitions: int) -> tuple[list[LedgerRelease], dict[str, Any]]:
        ingest = IngestStage(cfg, KEYRING, sampling_rng=random.Random(0))
        exact: dict[str, Any] = {}
        stage = _stage(cfg, exact_totals_observer=lambda q, ws, agg: exact.update({q: dict(agg)}))
        feed = Feed(stage)
        by_partition: dict[int, list[InputRecord]] = {}
        for u, t, d, size in events:
            batch = by_partition.setdefault(zlib.crc32(u.encode()) % partitions, [])
            batch.append(rec(len(batch), u, t, d, size=size))
        assert sorted(by_partition) == list(range(partitions))  # every source has a share
        for p, batch in by_partition.items():
            assert ingest.ingest(p, batch, now_s=NOW, now_mono_s=0) == []
        for p in sorted(by_partition):
            for partial in ingest.seal(p, T0):
                feed.partial(0, partial)
            feed.mark(0, p, END, sources=partitions)
        assert stage.due_windows() == [T0]
        return _release(stage), exact

    one, exact_one = run(1)
    three, exact_three = run(3)
    assert exact_three == exact_one
    # The exact totals themselves, bounded: heavy keeps k of its 10 events.
    kept = [e for e in events if e[0] != "heavy"] + [("heavy", 1, "a", 10)] * k
    granularity = cfg.queries[2].value_granularity
    expected_visits = {}
    expected_bytes = {}
    for domain in "ab":
        mine = [e for e in kept if e[2] == domain]
        users = len({e[0] for e in mine})
        units = sum(round(min(max(e[3], 0), 100) / granularity) for e in mine)
        expected_visits[(domain,)] = KeyAggregate(len(mine), users, 0)
        expected_bytes[(domain,)] = KeyAggregate(len(mine), users, units)
    assert exact_one == {
        "visits": expected_visits,
        "users": {(): KeyAggregate(len(kept), 13, 0)},
        "bytes": expected_bytes,
    }
    for query in ("visits", "users", "bytes"):
        assert values(three, query) == values(one, query), query
    assert values(one, "users") == {"{}": 13, "null": "window"}
    assert [sorted(r.sources) for r in three] == [[0, 1, 2]] * 3


# -- offsets --------------------------------------------------------------------------------


def test_safe_offsets_hold_back_the_first_partial_of_an_unreleased_window() -> None:
    stage = _stage(partitions=2)  # T0 and T0 + 20 on partition 0, T0 + 10 on partition 1
    feed = Feed(stage)
    feed.marks(0, None)  # offsets 0-2
    feed.marks(1, None)  # offsets 0-2
    assert stage.safe_offsets() == {0: 3, 1: 3}
    _three_sources(feed, 0, T0)  # offsets 3-8
    _three_sources(feed, 0, T0 + 20)  # offsets 9-14
    _three_sources(feed, 1, T0 + 10)  # partition 1, offsets 3-8
    assert stage.safe_offsets() == {0: 3, 1: 3}
    feed.marks(0, END)  # offsets 15-17
    assert stage.due_windows() == [T0]
    _release(stage, T0)
    assert stage.safe_offsets() == {0: 9, 1: 3}
    feed.marks(0, END + 20)
    feed.marks(1, END + 10)
    assert stage.due_windows() == [T0 + 10, T0 + 20]
    _release(stage, T0 + 10)
    assert stage.safe_offsets() == {0: 9, 1: 12}
    _release(stage, T0 + 20)
    assert stage.safe_offsets() == {0: 21, 1: 12}
    stage.revoke([1])
    assert stage.safe_offsets() == {0: 21}
    assert stage.partitions == [0]


# -- every covered window, with or without data (issue 12, break 5) --------------------------


def test_windows_without_events_are_released_in_order() -> None:
    """A stream with nobody active in some windows still gets those windows: public keys
    with their noisy values, every window its window record. Whether output exists must not
    tell whether anyone was active."""
    private = {"name": "private", "group_by": ["domain"], "epsilon": 1e6, "delta": 1e-6}
    stage = _stage(config(queries=QUERIES_WITH(private), epsilon_per_window=3e6))
    feed = Feed(stage)
    for partial in _both(0, {A: KeyAggregate(2, 2, 0)}, window_start_s=T0 + 20):
        feed.partial(0, partial)
    feed.marks(0, END + 30, sources=1)  # only window T0 + 20 has events
    due = stage.due_windows()
    assert due == [T0, T0 + 10, T0 + 20, T0 + 30]
    for ws in due:
        releases = {r.query: r for r in _release(stage, ws)}
        assert set(releases) == {"visits", "all", "private"}
        kinds = [r.value["kind"] for r in releases["visits"].records]
        assert kinds == ["release", "release", "window"]  # both public keys, every window
        assert releases["private"].records[-1].value["kind"] == "window"
    assert stage.due_windows() == []


def QUERIES_WITH(extra: dict[str, Any]) -> list[dict[str, Any]]:
    return [*QUERIES, extra]


def test_nothing_before_the_first_covered_window() -> None:
    stage = _stage()
    feed = Feed(stage)
    for partial in _both(0, {A: KeyAggregate(2, 2, 0)}, window_start_s=T0 - 10):
        feed.partial(0, partial)
    assert _ignored(stage, "before_coverage") == 2
    feed.marks(0, END, sources=1)
    assert stage.due_windows() == [T0]


def test_due_windows_come_in_bounded_batches() -> None:
    stage = _stage()
    feed = Feed(stage)
    feed.marks(0, T0 + 10 * 100, sources=1)
    first = stage.due_windows(limit=32)
    assert first == [T0 + 10 * i for i in range(32)]
    for ws in first:
        _release(stage, ws)
    assert stage.due_windows(limit=32)[0] == T0 + 320
    assert len(stage.due_windows()) == 100 - 32


def test_a_window_merges_partials_of_one_partition_layout_only() -> None:
    """Partitions were added to the stage-1 topic while T0 was open: a user may have a share
    on a partition of each layout. Only the first layout's partials are merged."""
    stage = _stage()
    feed = Feed(stage)
    old = _partial("visits", 0, {A: KeyAggregate(5, 5, 0)})
    feed.partial(0, old)
    new = Partial("visits", T0, 1, new_version(), {A: KeyAggregate(5, 5, 0)}, 5, 5, 4, "k1")
    feed.partial(0, new)
    assert _ignored(stage, "layout_changed") == 1
    feed.marks(0, END, sources=4)
    (visits,) = [r for r in _release(stage) if r.query == "visits"]
    assert visits.sources == {0: old.version}
    assert values([visits], "visits")['{"domain":"a"}'] == 5


def test_partials_of_another_pseudonym_key_are_not_merged() -> None:
    stage = _stage()
    feed = Feed(stage)
    stale = Partial("visits", T0, 0, new_version(), {A: KeyAggregate(5, 5, 0)}, 5, 5, 1, "k0")
    feed.partial(0, stale)
    assert _ignored(stage, "key_mismatch") == 1


def test_the_stage_keeps_the_running_total_store_it_is_given_even_when_empty() -> None:
    """The worker's continual reader feeds the store it handed the stage: an empty store (a
    new deployment) is still that store, not replaced by a fresh one that nothing feeds
    (which made every worker take its own running-total draw for another owner's)."""
    store = ContinualStore()
    assert len(store) == 0
    assert _stage(continual_store=store).continual_store is store
