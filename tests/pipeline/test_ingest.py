"""Stage 1 (IngestStage) without Kafka: per-partition windows and sealing, lateness, stage 0's
repartitioning, re-sent records, user-keyed input, offsets, watermarks and bounding."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import orjson
import pytest

from stream_dp.config.model import Config
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.formats.partials import Partial, SourceWatermark
from stream_dp.pipeline.stages.ingest import IngestSettings, IngestStage, user_key
from stream_dp.pipeline.stages.placement import (
    crc32_partition,
    murmur2_partition,
    partition_function,
)
from stream_dp.privacy.release import KeyAggregate
from stream_dp.windows.watermark import IDLE_CONFIRM_S
from tests.helpers import schema_validator
from tests.pipeline.support import KEYRING, NOW, T0, config, numbered, rec

A, B = ("a",), ("b",)


def _stage(cfg: Config | None = None, *, partitions: Sequence[int] = (0, 1)) -> IngestStage:
    stage = IngestStage(
        cfg if cfg is not None else config(),
        KEYRING,
        metrics=Metrics(),
        sampling_rng=random.Random(0),
        settings=IngestSettings(source_partitions=len(partitions)),
    )
    stage.assign(partitions, 0.0, routed=False)
    return stage


def _owner(input_partitions: int, *, k: int = 3, cfg: Config | None = None) -> IngestStage:
    """Stage 1 of repartition partition 0, fed by ``input_partitions`` input partitions."""
    stage = IngestStage(
        cfg if cfg is not None else config(k=k),
        KEYRING,
        metrics=Metrics(),
        sampling_rng=random.Random(0),
        # one repartition partition: every pseudonym belongs here
        settings=IngestSettings(input_partitions=input_partitions),
    )
    stage.assign([0], 0.0, routed=True)
    return stage


def _router(
    *input_partitions: int, now_mono_s: float = 0.0, settings: IngestSettings | None = None
) -> IngestStage:
    """Stage 0 of a worker that owns these input partitions."""
    stage = IngestStage(config(), KEYRING, metrics=Metrics(), settings=settings or IngestSettings())
    stage.assign_routed(input_partitions, now_mono_s)
    return stage


class Repartition:
    """Repartition partition 0 as a log: stage 0 appends, its stage-1 owner reads on."""

    def __init__(self, owner: IngestStage) -> None:
        self.owner = owner
        self.log: list[tuple[bytes | None, bytes]] = []
        self.read = 0

    def route(
        self,
        router: IngestStage,
        partition: int,
        events: Sequence[tuple[str | int, float, str]],
        *,
        first: int = 0,
        now_mono_s: float = 0.0,
        here: bool = True,
    ) -> list[tuple[bytes, bytes]]:
        """Route input events; ``here``: their users' records land on this partition."""
        routed, dead = router.route(
            partition, numbered(events, first), now_s=NOW, now_mono_s=now_mono_s
        )
        assert dead == []
        assert {target for _, _, target in routed} <= {0}  # one repartition partition
        out = [(key, value) for key, value, _ in routed]
        if here:
            self.log += out
        return out

    def marks(self, router: IngestStage, now_mono_s: float) -> None:
        """The router's progress marks, which it writes to every repartition partition."""
        self.log += [(None, mark) for mark in router.progress_marks(now_mono_s)]

    def deliver(self, now_mono_s: float) -> None:
        batch = [(self.read + i, k, v) for i, (k, v) in enumerate(self.log[self.read :])]
        self.read = len(self.log)
        dead = self.owner.ingest(0, batch, now_s=NOW, now_mono_s=now_mono_s, routed=True)
        assert dead == []


def _totals(partials: list[Partial], query: str) -> dict[tuple[Any, ...], KeyAggregate]:
    (partial,) = [p for p in partials if p.query == query]
    return dict(partial.totals)


def _seal_all(stage: IngestStage, now_mono_s: float) -> dict[tuple[int, int], list[Partial]]:
    """Seal and drop every due (partition, window), as the worker does after publishing."""
    out = {}
    for p, ws in stage.due(now_mono_s):
        out[(p, ws)] = stage.seal(p, ws)
        stage.drop(p, ws)
    return out


# -- per-partition sealing ------------------------------------------------------------------


def test_a_window_is_due_for_a_partition_when_its_own_watermark_passes_the_end() -> None:
    stage = _stage()
    stage.ingest(0, [rec(0, "u", 1), rec(1, "u", 10.999)], now_s=NOW, now_mono_s=1)
    stage.ingest(1, [rec(0, "v", 2)], now_s=NOW, now_mono_s=1)
    assert stage.due(1) == []  # partition 0: 10.999 - grace 1 < window end 10
    stage.ingest(0, [rec(2, "u", 11)], now_s=NOW, now_mono_s=1)
    assert stage.due(1) == [(0, T0)]  # watermark exactly at the end: closed
    sealed = _seal_all(stage, 1)
    assert _totals(sealed[(0, T0)], "all") == {(): KeyAggregate(1, 1, 0)}
    # Partition 1 still holds its own part of the same window; it seals independently.
    assert stage.open_windows() == [T0, T0 + 10]
    assert stage.due(2) == []
    stage.ingest(1, [rec(1, "v", 30)], now_s=NOW, now_mono_s=2)
    assert stage.due(2) == [(1, T0)]  # watermark 29: T0+30 (its other window) stays open
    assert _totals(_seal_all(stage, 2)[(1, T0)], "all") == {(): KeyAggregate(1, 1, 0)}
    assert stage.open_windows() == [T0 + 10, T0 + 30]


def test_late_events_are_per_partition() -> None:
    stage = _stage()
    stage.ingest(0, [rec(0, "u", 1), rec(1, "u", 15)], now_s=NOW, now_mono_s=0)
    stage.ingest(1, [rec(0, "v", 3)], now_s=NOW, now_mono_s=0)
    assert _seal_all(stage, 0).keys() == {(0, T0)}
    # Window T0 is sealed on partition 0 only: late there, on time on partition 1.
    stage.ingest(0, [rec(2, "w", 2), rec(3, "w", 9.9)], now_s=NOW, now_mono_s=1)
    stage.ingest(1, [rec(1, "w", 2)], now_s=NOW, now_mono_s=1)
    assert stage.metrics.late_events._value.get() == 2
    stage.ingest(1, [rec(2, "v", 12)], now_s=NOW, now_mono_s=1)
    sealed = _seal_all(stage, 1)
    assert _totals(sealed[(1, T0)], "all") == {(): KeyAggregate(2, 2, 0)}
    assert stage.open_windows() == [T0 + 10]  # the late events opened nothing


def test_seal_gives_one_partial_per_query_with_a_fresh_version() -> None:
    stage = _stage()
    stage.ingest(0, [rec(0, "u", 1), rec(1, "v", 2, "b"), rec(2, "v", 3)], now_s=NOW, now_mono_s=0)
    first = stage.seal(0, T0)
    again = stage.seal(0, T0)  # re-sealed (the publication failed): same counts, new version
    assert [(p.query, p.window_start_s, p.source_partition) for p in first] == [
        ("visits", T0, 0),
        ("all", T0, 0),
    ]
    assert _totals(first, "visits") == {A: KeyAggregate(2, 2, 0), B: KeyAggregate(1, 1, 0)}
    assert _totals(first, "all") == {(): KeyAggregate(3, 2, 0)}
    assert [(p.events_seen, p.events_retained) for p in first] == [(3, 3), (3, 3)]
    assert _totals(again, "visits") == _totals(first, "visits")
    assert first[0].version == first[1].version != again[0].version
    stage.drop(0, T0)
    assert stage.open_windows() == []
    assert stage.metrics.partials_published._value.get() == 2


# -- bounding -------------------------------------------------------------------------------


def test_bounding_per_user_holds_per_partition() -> None:
    k = 3
    stage = _stage(config(k=k))
    heavy = [("heavy", 1 + i / 100, "a" if i % 2 else "b") for i in range(10 * k)]
    stage.ingest(
        0, numbered([*heavy, ("light", 2, "a"), ("light", 3, "b")]), now_s=NOW, now_mono_s=0
    )
    stage.ingest(
        1, numbered([("other", 1 + i / 100, "a") for i in range(10 * k)]), now_s=NOW, now_mono_s=0
    )
    p0, p1 = stage.seal(0, T0), stage.seal(1, T0)
    assert _totals(p0, "all") == {(): KeyAggregate(k + 2, 2, 0)}
    assert sum(a.events for a in _totals(p0, "visits").values()) == k + 2
    assert [(p.events_seen, p.events_retained) for p in p0] == [(10 * k + 2, k + 2)] * 2
    assert _totals(p1, "all") == {(): KeyAggregate(k, 1, 0)}
    assert _totals(p1, "visits") == {A: KeyAggregate(k, 1, 0)}


def test_repartitioning_bounds_a_user_spread_over_input_partitions() -> None:
    """Unkeyed input: one user's events on two input partitions meet in one repartition
    partition (keyed by pseudonym) and are bounded together."""
    k = 3
    topic = Repartition(_owner(2, k=k))
    out0 = topic.route(_router(0), 0, [("heavy", 1 + i / 100, "a") for i in range(5 * k)])
    out1 = topic.route(_router(1), 1, [("heavy", 2 + i / 100, "b") for i in range(5 * k)])
    assert {key for key, _ in out0} == {key for key, _ in out1}  # one pseudonym, one key
    topic.deliver(0)
    partials = topic.owner.seal(0, T0)
    assert _totals(partials, "all") == {(): KeyAggregate(k, 1, 0)}
    assert [(p.events_seen, p.events_retained) for p in partials] == [(10 * k, k)] * 2


# -- stage 0: repartitioning ----------------------------------------------------------------


def test_route_output_validates_and_carries_no_raw_user_id() -> None:
    validator = schema_validator("repartition.schema.json")
    stage = _stage()
    records = [
        rec(7, "alice@example.com", 1, email="alice@example.com", note="x"),
        (8, None, b"not json"),
        rec(9, 123456789, 2, "b"),
        (10, None, orjson.dumps({"timestamp": T0 + 1})),
    ]
    out, dead = stage.route(3, records, now_s=NOW, now_mono_s=0)
    assert [(d.reason, d.partition, d.offset) for d in dead] == [
        ("not_json", 3, 8),
        ("missing_user", 3, 10),
    ]
    assert len(out) == 2
    bodies = []
    for key, value, target in out:
        body = orjson.loads(value)
        validator.validate(body)
        assert key == body["u"].encode()
        assert body["k"] == "k1"  # the key's id, never the key
        assert target == 0  # the router knows one repartition partition
        assert b"alice" not in key + value and b"123456789" not in key + value
        bodies.append(body)
    assert [b["src"] for b in bodies] == [[3, 7], [3, 9]]
    assert [b["e"] for b in bodies] == [{"domain": "a"}, {"domain": "b"}]  # query fields only
    assert [b["t"] for b in bodies] == [T0 + 1, T0 + 2]
    assert bodies[0]["u"] == KEYRING.current.pseudonym("alice@example.com").hex()
    assert stage.metrics.events_repartitioned._value.get() == 2
    assert stage.metrics.events_consumed._value.get() == 4
    assert stage.metrics.bad_records.labels(reason="not_json")._value.get() == 1
    assert stage.open_windows() == []  # routing keeps no window state


def test_every_record_stage_0_writes_validates_against_the_schema() -> None:
    validator = schema_validator("repartition.schema.json")
    router = _router(0)
    out, _ = router.route(0, numbered([("u", 1, "a"), ("v", 2, "b")]), now_s=NOW, now_mono_s=0)
    marks = router.progress_marks(1)
    assert len(out) == 2 and len(marks) == 1
    for value in [*(v for _, v, _ in out), *marks]:
        validator.validate(orjson.loads(value))
    # Before anything was routed the mark has no time yet; it validates too.
    (empty,) = _router(3).progress_marks(0)
    validator.validate(orjson.loads(empty))


def test_progress_marks_report_the_largest_time_routed_and_idleness() -> None:
    router = _router(0, 1, now_mono_s=0)

    def marks(now_mono_s: float) -> list[Any]:
        return [orjson.loads(m) for m in router.progress_marks(now_mono_s)]

    assert marks(0) == [
        {"t": None, "idle_s": 0.0, "src": [0, -1]},
        {"t": None, "idle_s": 0.0, "src": [1, -1]},
    ]
    router.route(0, numbered([("u", 20, "a"), ("alice", 5, "a")]), now_s=NOW, now_mono_s=1)
    assert marks(3) == [
        {"t": T0 + 20, "idle_s": 2.0, "src": [0, -1]},
        {"t": None, "idle_s": 3.0, "src": [1, -1]},
    ]
    assert not any(b"alice" in m for m in router.progress_marks(3))
    router.route(0, numbered([("u", 7, "a")], first=2), now_s=NOW, now_mono_s=4)
    assert marks(4)[0] == {"t": T0 + 20, "idle_s": 0.0, "src": [0, -1]}  # never back
    # A batch of bad records is not activity: the partition stays idle (one bad record a
    # second on one partition must not stall every window — issue 13, break 4).
    router.route(1, [(0, None, b"not json")], now_s=NOW, now_mono_s=6)
    assert marks(6)[1] == {"t": None, "idle_s": 6.0, "src": [1, -1]}
    router.restart_idle_clocks(10)  # after a broker outage: silence was not idleness
    assert [m["idle_s"] for m in marks(10)] == [0.0, 0.0]
    router.forget_routed([0])  # partition 0 moved to another worker
    assert [m["src"] for m in marks(11)] == [[1, -1]]


def test_progress_marks_call_an_input_partition_idle_only_as_far_as_a_fetch_proved_it() -> None:
    """In the worker, silence counts as idleness only up to the last fetch answer that found
    the reader at the partition's end: a reader that cannot fetch (a broker stall, a paused
    partition) proves nothing, and its unread events must not become late (the CI chaos
    smoke lost a third of a window that way)."""
    router = _router(0, 1, now_mono_s=0, settings=IngestSettings(require_read_proof=True))

    def idle(now_mono_s: float) -> list[float]:
        return [orjson.loads(m)["idle_s"] for m in router.progress_marks(now_mono_s)]

    router.route(0, numbered([("u", 20, "a")]), now_s=NOW, now_mono_s=1)
    assert idle(60) == [0.0, 0.0]  # a minute of silence, no fetch at the end: not idle
    router.read_to_end(0, 15, input_topic=True)
    router.read_to_end(1, 12, input_topic=True)
    assert idle(60) == [14.0, 12.0]  # quiet from the last activity to the last proof
    router.read_to_end(0, 10, input_topic=True)  # an older proof changes nothing
    assert idle(60) == [14.0, 12.0]
    router.read_to_end(0, 59, input_topic=True)
    assert idle(50)[0] == 49.0  # never beyond now
    router.route(0, numbered([("v", 21, "a")], first=1), now_s=NOW, now_mono_s=61)
    assert idle(70)[0] == 0.0  # activity after the last proof: quiet for none of it yet
    router.forget_routed([1])  # moved away: its proof goes with it
    router.assign_routed([1], 70)
    assert idle(80)[1] == 0.0


def test_progress_marks_let_a_partition_without_a_sources_users_advance() -> None:
    """Input partition 1's users all go to other repartition partitions; its progress
    marks, written to every repartition partition, still move its clock here."""
    topic = Repartition(_owner(2))
    router0, router1 = _router(0), _router(1)
    topic.route(router0, 0, [("u", 1, "a"), ("u", 13, "a")])
    topic.marks(router0, 1)
    topic.deliver(1)
    assert topic.owner.due(1) == []  # input partition 1 unheard of
    topic.route(router1, 1, [("v", 2, "a"), ("v", 12, "b")], here=False)
    topic.marks(router1, 1)
    topic.deliver(1)
    assert topic.owner.due(1) == [(0, T0)]  # min(13, 12) - grace 1 = 11 ≥ 10
    assert _totals(topic.owner.seal(0, T0), "all") == {(): KeyAggregate(1, 1, 0)}
    assert topic.owner.metrics.repartition_duplicates_skipped._value.get() == 0


def test_routed_ingest_drops_records_re_sent_after_a_crash() -> None:
    topic = Repartition(_owner(2))
    out0 = topic.route(_router(0), 0, [("u", 1, "a"), ("v", 2, "a"), ("w", 3, "b")], here=False)
    topic.log += out0[:2]
    topic.deliver(0)
    # The router crashed after writing offsets 0-1, before committing: its successor
    # routes 0-2 again.
    topic.route(_router(0), 0, [("u", 1, "a"), ("v", 2, "a"), ("w", 3, "b")])
    topic.deliver(0)
    assert topic.owner.metrics.repartition_duplicates_skipped._value.get() == 2
    # The same source offset from another input partition is a different record.
    out1 = topic.route(_router(1), 1, [("x", 4, "b")])
    assert orjson.loads(out1[0][1])["src"] == [1, 0]
    topic.deliver(0)
    assert topic.owner.metrics.repartition_duplicates_skipped._value.get() == 2
    partials = topic.owner.seal(0, T0)
    assert _totals(partials, "visits") == {A: KeyAggregate(2, 2, 0), B: KeyAggregate(2, 2, 0)}
    assert topic.owner.metrics.events_consumed._value.get() == 0  # counted at routing
    assert topic.owner.safe_offsets() == {0: 0}  # the window's first record


def test_a_routed_partition_waits_for_its_slowest_active_source() -> None:
    topic = Repartition(_owner(2))
    fast, slow = _router(0), _router(1)
    topic.route(fast, 0, [("u", 1, "a"), ("u", 30, "a")])
    topic.marks(fast, 1)
    topic.route(slow, 1, [("v", 2, "b")])
    topic.marks(slow, 1)
    topic.deliver(1)
    assert topic.owner.due(1) == []  # the slow source is at 2 - grace
    topic.route(slow, 1, [("v", 12, "b")], first=1, now_mono_s=2)
    topic.marks(slow, 2)
    topic.deliver(2)
    assert topic.owner.due(2) == [(0, T0)]  # min(30, 12) - 1 = 11 ≥ 10; T0+10 still open
    assert [m.watermark_s for m in topic.owner.watermarks(2)] == [T0 + 11.0]


def test_silence_never_makes_a_routed_source_idle_only_its_router_does() -> None:
    topic = Repartition(_owner(2))
    fast, slow = _router(0), _router(1, now_mono_s=0)
    topic.route(fast, 0, [("u", 1, "a"), ("u", 25, "a")])
    topic.marks(fast, 1)
    topic.deliver(1)
    assert topic.owner.due(1000) == []  # source 1 never spoke: it may be a slow reader
    topic.marks(slow, 4.9)
    topic.deliver(1001)
    assert topic.owner.due(1001) == []  # its router has seen input 4.9 s ago: not idle
    topic.marks(slow, 5)
    topic.deliver(1002)
    assert topic.owner.due(1002) == []  # idle by its router (5 s), said once: not trusted yet
    topic.marks(slow, 5.9)
    topic.deliver(1003)
    assert topic.owner.due(1003) == []
    topic.marks(slow, 5 + IDLE_CONFIRM_S)
    topic.deliver(1004)
    assert topic.owner.due(1004) == [(0, T0)]  # still idle 1 s later: 25 - 1 = 24
    (mark,) = topic.owner.watermarks(1004)
    assert (mark.watermark_s, mark.idle) == (T0 + 24.0, False)  # source 0 is not idle


def test_when_every_source_is_reported_idle_the_wall_clock_advances() -> None:
    topic = Repartition(_owner(2))
    router = _router(0, 1, now_mono_s=0)
    topic.route(router, 0, [("u", 1, "a")])
    topic.marks(router, 10)  # both silent for 10 s ≥ idle_close_s
    topic.deliver(10)
    assert topic.owner.due(10) == []  # not confirmed: no wall-clock advance yet
    topic.marks(router, 10.9)
    topic.deliver(10.9)
    assert topic.owner.due(10.9) == []
    topic.marks(router, 10 + IDLE_CONFIRM_S)  # still silent 1 s later: confirmed
    topic.deliver(11)
    # Idle since 0 on the owner's clock: watermark = 1 + (now - 0) - grace 1.
    assert topic.owner.due(11) == [(0, T0)]
    (mark,) = topic.owner.watermarks(11)
    assert (mark.watermark_s, mark.idle, mark.open_windows) == (T0 + 11.0, True, True)
    assert mark.idle_for_s == 11.0


# -- user-keyed input ---------------------------------------------------------------------


def test_keyed_input_dead_letters_records_not_keyed_by_their_user() -> None:
    stage = _stage(config(keyed_by_user=True), partitions=(0,))
    assert stage.enforce_user_keys
    records = [
        rec(0, "alice", 1, key=b"alice"),
        rec(1, "alice", 1, key=b"bob"),
        rec(2, "alice", 1, key=None),
        rec(3, 17, 1, key=b"17"),
        rec(4, 17, 1, key=user_key(17)),
        rec(5, 17, 1, key=b"017"),
        rec(6, "17", 1, key=b"17"),
    ]
    dead = stage.ingest(0, records, now_s=NOW, now_mono_s=0)
    assert [(d.reason, d.partition, d.offset, d.payload) for d in dead] == [
        ("not_keyed_by_user", 0, 1, None),
        ("not_keyed_by_user", 0, 2, None),
        ("not_keyed_by_user", 0, 5, None),
    ]
    assert "input.keyed_by_user" in dead[0].detail
    assert stage.metrics.bad_records.labels(reason="not_keyed_by_user")._value.get() == 3
    assert user_key(17) == b"17"
    # alice once; 17, 17 and "17" are one user (ids are canonical, as the keys are).
    assert _totals(stage.seal(0, T0), "all") == {(): KeyAggregate(4, 2, 0)}


def test_keyed_input_with_payloads_in_dead_letters() -> None:
    cfg = config(keyed_by_user=True, output={"dead_letter_include_payload": True})
    stage = _stage(cfg, partitions=(0,))
    (dead,) = stage.ingest(0, [rec(0, "alice", 1, key=b"bob")], now_s=NOW, now_mono_s=0)
    assert dead.payload == rec(0, "alice", 1)[2]


def test_unkeyed_input_accepts_any_key() -> None:
    stage = _stage(config(keyed_by_user=False))
    assert not stage.enforce_user_keys
    dead = stage.ingest(
        0, [rec(0, "alice", 1, key=b"bob"), rec(1, "bob", 1)], now_s=NOW, now_mono_s=0
    )
    assert dead == []
    assert _totals(stage.seal(0, T0), "all") == {(): KeyAggregate(2, 2, 0)}


def test_routed_records_are_not_checked_against_user_keys() -> None:
    """Repartitioned records are keyed by pseudonym, never by user id."""
    topic = Repartition(_owner(1, cfg=config(keyed_by_user=True)))
    assert topic.owner.enforce_user_keys
    topic.route(_router(0), 0, [("alice", 1, "a")])
    topic.deliver(0)  # asserts no dead letters
    assert _totals(topic.owner.seal(0, T0), "all") == {(): KeyAggregate(1, 1, 0)}


# -- offsets --------------------------------------------------------------------------------


def test_safe_offsets_never_skip_an_unsealed_windows_first_offset() -> None:
    stage = _stage()
    stage.ingest(0, [rec(5, "u", 1), rec(6, "u", 12), rec(7, "u", 2)], now_s=NOW, now_mono_s=0)
    assert stage.safe_offsets() == {0: 5}
    stage.ingest(0, [rec(8, "u", 25), rec(9, "u", 13)], now_s=NOW, now_mono_s=0)
    assert stage.safe_offsets() == {0: 5}
    assert _seal_all(stage, 0).keys() == {(0, T0), (0, T0 + 10)}  # watermark 24
    assert stage.safe_offsets() == {0: 8}  # T0+20 starts at 8
    stage.ingest(1, [rec(0, "v", 40), rec(1, "v", 3)], now_s=NOW, now_mono_s=0)  # 3 is on time
    assert stage.safe_offsets() == {0: 8, 1: 0}
    stage.ingest(0, [rec(10, "u", 4)], now_s=NOW, now_mono_s=0)  # late: needs nothing
    assert stage.safe_offsets() == {0: 8, 1: 0}
    stage.ingest(0, [rec(11, "u", 50)], now_s=NOW, now_mono_s=0)
    _seal_all(stage, 0)
    assert stage.safe_offsets() == {0: 11, 1: 0}  # T0+50 (offset 11) is still open
    for p, ws in stage.all_open():
        stage.seal(p, ws)
        stage.drop(p, ws)
    assert stage.safe_offsets() == {0: 12, 1: 2}


def test_revoke_drops_a_partitions_state_and_offsets() -> None:
    stage = _stage()
    stage.ingest(0, [rec(0, "u", 1)], now_s=NOW, now_mono_s=0)
    stage.ingest(1, [rec(3, "v", 12)], now_s=NOW, now_mono_s=0)
    stage.revoke([0])
    assert stage.partitions == [1]
    assert stage.open_windows() == [T0 + 10]
    assert stage.safe_offsets() == {1: 3}
    assert [m.source_partition for m in stage.watermarks(0)] == [1]


def test_events_of_released_windows_are_dropped_as_replays_or_late() -> None:
    """Windows read from the ledger: their events are replays. Windows this process
    released itself (stage 2 saw every source sealed or idle): their events are late."""

    class Released:
        coverage_start_s = T0
        first_unreleased_s = None
        last_release_wall_s = None

        def released(self, window_start_s: int) -> bool:
            return window_start_s in (T0, T0 + 10)

        def released_earlier(self, window_start_s: int) -> bool:
            return window_start_s == T0

    stage = IngestStage(config(), KEYRING, released=Released(), metrics=Metrics())
    stage.assign([0], 0.0, routed=False)
    records = [rec(0, "u", 1), rec(1, "u", 2), rec(2, "u", 12), rec(3, "u", 25)]
    stage.ingest(0, records, now_s=NOW, now_mono_s=0)
    assert stage.open_windows() == [T0 + 20]
    assert stage.metrics.replayed_events_skipped._value.get() == 2
    assert stage.metrics.late_events._value.get() == 1
    assert stage.safe_offsets() == {0: 3}


# -- watermarks -----------------------------------------------------------------------------


def test_watermarks_flag_idle_partitions_and_open_windows() -> None:
    stage = _stage()  # assigned at 0; idle after 5 s without records
    stage.ingest(0, [rec(0, "u", 1)], now_s=NOW, now_mono_s=1)
    assert stage.watermarks(2) == [
        SourceWatermark(0, 2, None, idle=False, open_windows=True),
        SourceWatermark(1, 2, None, idle=False, open_windows=False),
    ]
    assert stage.watermarks(5.5) == [
        SourceWatermark(0, 2, None, idle=False, open_windows=True),
        SourceWatermark(1, 2, None, idle=True, open_windows=False, idle_for_s=5.5),  # since 0
    ]
    assert stage.watermarks(6) == [
        SourceWatermark(0, 2, None, idle=True, open_windows=True, idle_for_s=5.0),  # holds T0
        SourceWatermark(1, 2, None, idle=True, open_windows=False, idle_for_s=6.0),
    ]
    # Idle for long enough, the watermark moves with the wall clock: 1 + (15 - 1) - 1.
    assert _seal_all(stage, 15).keys() == {(0, T0)}
    assert stage.watermarks(15) == [
        SourceWatermark(0, 2, T0 + 14.0, idle=True, open_windows=False, idle_for_s=14.0),
        SourceWatermark(1, 2, None, idle=True, open_windows=False, idle_for_s=15.0),
    ]
    stage.ingest(1, [rec(0, "v", 20)], now_s=NOW, now_mono_s=16)  # partition 1 wakes up
    assert stage.watermarks(16)[1] == SourceWatermark(1, 2, None, idle=False, open_windows=True)


def test_a_routed_partition_is_idle_only_when_every_source_is() -> None:
    topic = Repartition(_owner(2))
    router0, router1 = _router(0), _router(1)
    topic.route(router0, 0, [("u", 1, "a")])
    topic.marks(router0, 5)  # source 0 idle by its router
    topic.marks(router0, 5 + IDLE_CONFIRM_S)  # and still, 1 s later: confirmed
    topic.deliver(6)
    (mark,) = topic.owner.watermarks(100)  # source 1 never reported: not idle
    assert (mark.idle, mark.open_windows, mark.source_partitions) == (False, True, 1)
    assert mark.idle_for_s == 0.0
    topic.marks(router1, 5)
    topic.deliver(7)
    (mark,) = topic.owner.watermarks(7)
    assert not mark.idle  # source 1's first idle report: not confirmed
    topic.marks(router1, 5 + IDLE_CONFIRM_S)
    topic.deliver(7)
    (mark,) = topic.owner.watermarks(7)
    # Source 0 idle since 6 - 6 = 0, source 1 since 7 - 6 = 1 (on the owner's clock).
    assert (mark.idle, mark.idle_for_s) == (True, 6.0)


def test_idle_reports_from_before_a_burst_do_not_let_another_sources_share_seal() -> None:
    """Both input partitions were reported idle (confirmed); then a burst reaches both.
    Input 0's share and its advancing mark arrive first, input 1's mark still says idle:
    the window must wait for input 1 to show its share, or to be idle again, confirmed."""
    topic = Repartition(_owner(2))
    router0, router1 = _router(0), _router(1)
    topic.route(router0, 0, [("u", 1, "a")])
    topic.route(router1, 1, [("v", 2, "b")])
    for now in (6, 7, 8):  # quiet: both idle since 0, re-sent every second
        topic.marks(router0, now)
        topic.marks(router1, now)
    topic.deliver(8)
    (mark,) = topic.owner.watermarks(8)
    assert mark.idle  # confirmed; the wall clock moves the watermark: 2 + 8 - 1 = 9 < 10
    assert topic.owner.due(8) == []
    topic.route(router0, 0, [("u", 5, "a"), ("u", 25, "a")], first=1, now_mono_s=9)
    topic.marks(router0, 9)
    topic.deliver(9)
    # The old rule sealed T0 here (input 1 idle: 25 - 1 = 24) without input 1's share.
    assert topic.owner.due(9) == []
    (mark,) = topic.owner.watermarks(9)
    assert not mark.idle
    topic.route(router1, 1, [("v", 6, "b")], first=1, now_mono_s=9.5)  # input 1's share
    topic.marks(router1, 9.5)
    topic.deliver(10)
    assert topic.owner.due(10) == []  # min(25, 6) - 1 = 5
    topic.marks(router1, 14.5)  # idle again (5 s): the first report since the burst
    topic.deliver(14.5)
    assert topic.owner.due(14.5) == []
    topic.marks(router1, 14.5 + IDLE_CONFIRM_S)
    topic.deliver(15.5)
    assert topic.owner.due(15.5) == [(0, T0)]  # input 0 alone: 25 - 1 = 24
    assert _totals(topic.owner.seal(0, T0), "visits") == {
        A: KeyAggregate(2, 1, 0),
        B: KeyAggregate(2, 1, 0),
    }


# -- keyed input is checked, not trusted (issue 12, break 2) ----------------------------------


@pytest.mark.parametrize("partitioner", ["murmur2", "crc32"])
def test_keyed_records_on_a_partition_their_key_does_not_map_to_are_dead_lettered(
    partitioner: str,
) -> None:
    """One user's records, all keyed by the user id, forced onto four partitions (producers
    with different partitioners, partitions added): accepting them would bound the user
    once per partition — k = 3 per window would become 12."""
    cfg = config(keyed_by_user=True, **{})
    cfg = cfg.model_copy(
        update={"input": cfg.input.model_copy(update={"partitioner": partitioner})}
    )
    stage = _stage(cfg, partitions=(0, 1, 2, 3))
    home = partition_function(partitioner)(b"alice", 4)  # type: ignore[arg-type]
    accepted = 0
    for p in range(4):
        records = [rec(i, "alice", 1 + i / 10, key=b"alice") for i in range(10)]
        dead = stage.ingest(p, records, now_s=NOW, now_mono_s=0)
        if p == home:
            assert dead == []
            accepted += 1
        else:
            assert {d.reason for d in dead} == {"misplaced_key"}
            assert len(dead) == 10
            assert "partitioner" in dead[0].detail
    assert accepted == 1
    totals = [_totals(stage.seal(p, ws), "all") for p, ws in stage.all_open()]
    assert sum(t[()].events for t in totals) == 3  # bounded once: k, never 4k
    assert stage.metrics.bad_records.labels(reason="misplaced_key")._value.get() == 30


def test_the_placement_check_matches_kafka_clients() -> None:
    """Known values of the Java client's murmur2 (Kafka's UtilsTest) and zlib's CRC-32."""
    assert [murmur2_partition(k, 2**31 - 1) for k in (b"21", b"foobar", b"abc")] == [
        (-973932308) & 0x7FFFFFFF,
        (-790332482) & 0x7FFFFFFF,
        479470107,
    ]
    assert crc32_partition(b"123456789", 2**32) == 0xCBF43926


def test_routed_records_are_checked_against_the_pseudonym_partition() -> None:
    """The repartition topic gained partitions while windows were open: records stage 0
    placed under the old count sit on partitions the new count does not map them to."""
    owner = _owner(1)
    owner.learn_partitions(4)
    router = _router(0, settings=IngestSettings(routed_partitions=4))
    out, _ = router.route(
        0, numbered([(f"user-{i}", 1, "a") for i in range(40)]), now_s=NOW, now_mono_s=0
    )
    records = [(i, key, value) for i, (key, value, _) in enumerate(out)]
    dead = owner.ingest(0, records, now_s=NOW, now_mono_s=0, routed=True, topic="rp")
    here = sum(1 for _, _, target in out if target == 0)
    assert 0 < here < 40
    assert len(dead) == 40 - here
    assert {(d.reason, d.topic) for d in dead} == {("misplaced_key", "rp")}
    assert _totals(owner.seal(0, T0), "all") == {(): KeyAggregate(here, here, 0)}


def test_malformed_repartition_records_are_dead_lettered_not_fatal() -> None:
    """A malformed record on the repartition topic crash-looped the worker (issue 13, 8)."""
    owner = _owner(1)
    bad = [
        (0, None, b"not json"),
        (1, None, b"[]"),
        (2, None, orjson.dumps({"u": "zz", "t": T0 + 1, "e": {}, "src": [0, 0]})),
        (3, None, orjson.dumps({"u": "00" * 16, "t": "soon", "e": {}, "src": [0, 1]})),
        (4, None, orjson.dumps({"u": "00" * 16, "t": T0 + 1, "e": [], "src": [0, 2]})),
        (5, None, None),
    ]
    dead = owner.ingest(0, bad, now_s=NOW, now_mono_s=0, routed=True, topic="rp")
    assert [(d.reason, d.offset, d.topic) for d in dead] == [
        ("bad_internal_record", i, "rp") for i in range(6)
    ]
    assert owner.open_windows() == []


def test_repartitioned_events_of_another_pseudonym_key_are_dropped() -> None:
    """A rotation moved while a window was open: records pseudonymized under another key
    than the window's must not join it (one user, two pseudonyms). A record of an earlier
    version (no key id, no key check value) cannot say which secret it was made under: it
    is dead-lettered (tests/pipeline/test_key_check.py)."""
    owner = _owner(1)
    check = KEYRING.current.key_check
    stale = orjson.dumps(
        {"u": "00" * 16, "t": T0 + 1, "e": {"domain": "a"}, "src": [0, 0], "k": "k0", "c": check}
    )
    current = orjson.dumps(
        {"u": "11" * 16, "t": T0 + 1, "e": {"domain": "a"}, "src": [0, 1], "k": "k1", "c": check}
    )
    old_format = orjson.dumps({"u": "22" * 16, "t": T0 + 1, "e": {"domain": "a"}, "src": [0, 2]})
    dead = owner.ingest(
        0,
        [(0, None, stale), (1, None, current), (2, None, old_format)],
        now_s=NOW,
        now_mono_s=0,
        routed=True,
    )
    assert [(d.reason, d.offset) for d in dead] == [("key_check_mismatch", 2)]
    assert _totals(owner.seal(0, T0), "all") == {(): KeyAggregate(1, 1, 0)}


# -- progress that bad data cannot fake (issue 13, breaks 4 and 5) ----------------------------


def test_a_partition_delivering_only_bad_or_late_records_goes_idle() -> None:
    stage = _stage()
    stage.ingest(0, [rec(0, "u", 1)], now_s=NOW, now_mono_s=0)
    stage.ingest(0, [rec(1, "u", 25)], now_s=NOW, now_mono_s=0)  # partition 0 moves on
    for second in range(1, 30):
        # Partition 1: one malformed record a second, and an event of a sealed window.
        stage.ingest(1, [(second, None, b"{")], now_s=NOW, now_mono_s=second)
    marks = {m.source_partition: m for m in stage.watermarks(29)}
    assert marks[1].idle and not marks[1].open_windows  # it holds nothing back
    assert (0, T0) in stage.due(29)


def test_an_event_stamped_ahead_of_the_clock_moves_the_watermark_no_further_than_now() -> None:
    """One event 4 minutes ahead (within max_future_s) closed the current window and made
    everyone's next events late."""
    stage = _stage(partitions=(0,))
    now = T0 + 5.0
    stage.ingest(0, [rec(0, "u", 1), rec(1, "v", 5 + 240)], now_s=now, now_mono_s=0)
    assert stage.due(0) == []  # the watermark is at most now - grace: T0 is still open
    assert stage.ingest(0, [rec(2, "w", 4)], now_s=now, now_mono_s=0) == []
    assert stage.metrics.late_events._value.get() == 0
    far = stage.ingest(0, [rec(3, "x", 5 + 301)], now_s=now, now_mono_s=0)
    assert [d.reason for d in far] == ["timestamp_out_of_range"]  # beyond max_future_s


AHEAD_PATHS = ("stage-0 rows", "stage-0 columns", "stage-1 columns", "stage-1 per record")


@pytest.mark.parametrize("path", AHEAD_PATHS)
def test_an_event_stamped_ahead_of_the_clock_closes_no_window_on_any_path(path: str) -> None:
    """The guard of the test above on every path an event can take: stage 0's router (one
    record per event, and packed columns) and stage 1 on raw input (the column path, and the
    per-record path it leaves a batch to). Stage 0 reports its progress in marks that stage 1
    turns into its watermark: a mark ahead of the clock would close the window there."""
    now = T0 + 5.0
    events = [rec(0, "u", 1), rec(1, "v", 5 + 240)]  # 4 minutes ahead, within max_future_s
    if path.startswith("stage-0"):
        router = _router(0)
        route = router.route if path == "stage-0 rows" else router.route_packed
        routed, dead = route(0, events, now_s=now, now_mono_s=0)
        assert dead == [] and routed
        marks = router.progress_marks(0)
        assert [orjson.loads(m)["t"] for m in marks] == [now]  # the clock, not T0 + 245
        owner = _owner(1)
        batch = [(i, k, v) for i, (k, v, _) in enumerate(routed)]
        batch += [(len(batch) + i, None, m) for i, m in enumerate(marks)]
        assert owner.ingest(0, batch, now_s=now, now_mono_s=0, routed=True) == []
        assert owner.due(0) == []  # the watermark is at most now - grace: T0 is still open
        return
    stage = _stage(partitions=(0,))
    took_columns: list[bool] = []
    by_columns = stage.records.columns.ingest_columns

    def spy(*args: Any) -> bool:
        took_columns.append(by_columns(*args) if path == "stage-1 columns" else False)
        return took_columns[-1]

    stage.records.columns.ingest_columns = spy  # type: ignore[method-assign,assignment]
    assert stage.ingest(0, events, now_s=now, now_mono_s=0) == []
    assert took_columns == [path == "stage-1 columns"]
    assert stage.due(0) == []  # the watermark is at most now - grace: T0 is still open
    assert stage.ingest(0, [rec(2, "w", 4)], now_s=now, now_mono_s=0) == []
    assert stage.metrics.late_events._value.get() == 0


def test_events_before_the_first_covered_window_are_late() -> None:
    class Released:
        coverage_start_s = T0 + 10
        first_unreleased_s = None
        last_release_wall_s = None

        def released(self, window_start_s: int) -> bool:
            return False

        def released_earlier(self, window_start_s: int) -> bool:
            return False

    stage = IngestStage(config(), KEYRING, released=Released(), metrics=Metrics())
    stage.assign([0], 0.0, routed=False)
    stage.ingest(0, [rec(0, "u", 1), rec(1, "u", 12)], now_s=NOW, now_mono_s=0)
    assert stage.open_windows() == [T0 + 10]
    assert stage.metrics.late_events._value.get() == 1


def test_an_idle_stream_without_events_still_advances_from_the_first_covered_window() -> None:
    class Released:
        coverage_start_s = T0
        first_unreleased_s = None
        last_release_wall_s = None

        def released(self, window_start_s: int) -> bool:
            return False

        def released_earlier(self, window_start_s: int) -> bool:
            return False

    stage = IngestStage(config(), KEYRING, released=Released(), metrics=Metrics())
    stage.assign([0], 0.0, routed=False)
    stage.due(100)
    (mark,) = stage.watermarks(100)
    assert mark.watermark_s is not None and mark.watermark_s >= T0 + 90  # by wall clock
    assert mark.quiet


# -- bounded memory (issue 13, break 10) ------------------------------------------------------


def test_interned_signatures_go_with_their_windows() -> None:
    cfg = config(queries=[{"name": "all", "group_by": ["domain"], "epsilon": 1e6, "delta": 1e-6}])
    stage = _stage(cfg, partitions=(0,))
    offset = 0
    for w in range(40):  # 40 windows of 1,000 distinct keys each, sealed one after another
        batch = [rec(offset + i, f"u{i}", 10 * w + 1, f"k{w}-{i}") for i in range(1000)]
        offset += len(batch)
        stage.ingest(0, batch, now_s=T0 + 10_000, now_mono_s=0)
        for p, ws in stage.due(0):
            stage.seal(p, ws)
            stage.drop(p, ws)
    assert stage.signature_count <= 2 * 4096  # not 40,000
    # What is still open projects as before the renumbering.
    (open_ws,) = stage.open_windows()
    totals = _totals(stage.seal(0, open_ws), "all")
    assert set(totals) == {(f"k39-{i}",) for i in range(1000)}
