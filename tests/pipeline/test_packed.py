"""Stage 0's packed repartition records: many events per record, as columns. What stage 1
makes of them equals what it made of one record per event — totals, re-sent events,
misplaced events, stale keys — and a malformed one is dead-lettered, never fatal."""

from __future__ import annotations

import base64
import random
from typing import Any

import orjson
import pytest

from stream_dp.config.model import Config
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.formats.packed import (
    PACKED_KEY_PREFIX,
    decode_binary,
    decode_events,
    is_binary,
)
from stream_dp.pipeline.stages.ingest import IngestSettings, IngestStage, InputRecord
from stream_dp.privacy.erasure import Erasure, ErasureSet, erasure_pseudonyms
from stream_dp.privacy.group_values import canonical_key
from stream_dp.privacy.pseudonymize import KeyRing, Pseudonymizer
from tests.helpers import schema_validator
from tests.pipeline.support import (
    KEYRING,
    NOW,
    T0,
    TEST_KEY,
    config,
    feed_routed,
    numbered,
    packed_as_json,
    sealed_totals,
)

QUERIES: list[dict[str, Any]] = [
    {"name": "visits", "group_by": ["domain"], "epsilon": 1e6, "delta": 1e-6},
    {"name": "all", "epsilon": 1e6, "keys": {}},
]


def _cfg(**kw: Any) -> Config:
    return config(queries=QUERIES, delta_per_window=1e-6, **kw)


def _router(
    *partitions: int,
    cfg: Config | None = None,
    routed_partitions: int = 1,
    erasures: ErasureSet | None = None,
) -> IngestStage:
    settings = IngestSettings(routed_partitions=routed_partitions, erasures=erasures)
    stage = IngestStage(cfg or _cfg(), KEYRING, metrics=Metrics(), settings=settings)
    stage.assign_routed(partitions, 0.0)
    return stage


def _owner(
    input_partitions: int,
    *,
    cfg: Config | None = None,
    partitions: int = 1,
    keyring: KeyRing = KEYRING,
    erasures: ErasureSet | None = None,
) -> IngestStage:
    stage = IngestStage(
        cfg or _cfg(k=50),
        keyring,
        metrics=Metrics(),
        sampling_rng=random.Random(0),
        settings=IngestSettings(
            input_partitions=input_partitions, source_partitions=partitions, erasures=erasures
        ),
    )
    stage.assign([0], 0.0, routed=True)
    return stage


_EVENTS = [
    ("alice", 1.0, "a"),
    ("bob", 2.5, "b"),
    ("alice", 3.0, "b"),
    (42, 4.0, "a"),
    ("Alice ", 12.0, "a"),
    ("carol", 15.5, "c"),
]


def test_packed_records_give_the_totals_of_one_record_per_event() -> None:
    per_event, packed = _owner(2), _owner(2)
    for partition, events in ((0, _EVENTS), (1, [("dave", 5.0, "a"), ("alice", 6.0, "c")])):
        router = _router(partition)
        one_each, dead = router.route(partition, numbered(events), now_s=NOW, now_mono_s=0)
        assert dead == []
        feed_routed(per_event, [v for _, v, _ in one_each])
        router = _router(partition)
        records, dead = router.route_packed(partition, numbered(events), now_s=NOW, now_mono_s=0)
        assert dead == []
        assert len(records) == 1  # one repartition partition, one key: one record
        assert router.metrics.events_repartitioned._value.get() == len(events)
        assert feed_routed(packed, [v for _, v, _ in records]) == []
    assert sealed_totals(packed) == sealed_totals(per_event)
    assert packed.metrics.late_events._value.get() == 0


def test_packed_records_validate_and_hold_no_raw_id() -> None:
    """Decoded, every packed event is its input event with the user id replaced by the
    keyed pseudonym (computed here with the test key), and no record — its bytes as
    written, its decoded pseudonyms, times, offsets and signatures, and the same record in
    the JSON format of earlier versions — holds a raw id or any 8 bytes of one."""
    validator = schema_validator("repartition.schema.json")
    router = _router(3, routed_partitions=4)
    events = [(f"user-{i}@example.com", i / 10, f"d{i % 3}") for i in range(200)]
    records, _ = router.route_packed(3, numbered(events, first=70), now_s=NOW, now_mono_s=0)
    assert {target for _, _, target in records} == {0, 1, 2, 3}
    pseudonymizer = KEYRING.for_window(T0)
    raw_ids = [u.encode() for u, _, _ in events]
    seen: dict[int, tuple[bytes, float, tuple[Any, ...]]] = {}
    for key, value, _target in records:
        assert is_binary(value)
        as_json = packed_as_json(value)
        validator.validate(orjson.loads(as_json))  # the same information as before
        assert key == (PACKED_KEY_PREFIX + "3").encode()
        packed = decode_binary(value, ["domain"])
        assert packed.key_id == "k1" and packed.src_partition == 3
        columns = [
            value,
            as_json,
            packed.pseudonyms,
            packed.times.tobytes(),
            packed.offsets.tobytes(),
            orjson.dumps(packed.signatures),
        ]
        for raw in raw_ids:
            pieces = {raw[i : i + 8] for i in range(len(raw) - 7)}
            assert not any(piece in column for piece in pieces for column in columns), raw
        for j, offset in enumerate(packed.offsets.tolist()):
            pseudonym = packed.pseudonyms[16 * j : 16 * (j + 1)]
            signature = packed.signatures[packed.signature_index[j]]
            assert offset not in seen
            seen[offset] = (pseudonym, float(packed.times[j]), signature)
    assert seen == {
        70 + i: (pseudonymizer.pseudonym(user), T0 + t, (domain,))
        for i, (user, t, domain) in enumerate(events)
    }
    for mark in router.progress_marks(1.0):
        validator.validate(orjson.loads(mark))


def test_a_batch_sent_again_after_a_crash_is_dropped_event_by_event() -> None:
    owner = _owner(1)
    events = numbered(_EVENTS)
    first, _ = _router(0).route_packed(0, events[:4], now_s=NOW, now_mono_s=0)
    feed_routed(owner, [v for _, v, _ in first])
    # The router crashed before committing offset 4: its successor routes 2..5 again.
    again, _ = _router(0).route_packed(0, events[2:], now_s=NOW, now_mono_s=0)
    feed_routed(owner, [v for _, v, _ in again], first=1)
    assert owner.metrics.repartition_duplicates_skipped._value.get() == 2
    once = _owner(1)
    records, _ = _router(0).route_packed(0, events, now_s=NOW, now_mono_s=0)
    feed_routed(once, [v for _, v, _ in records])
    assert sealed_totals(owner) == sealed_totals(once)


def test_events_on_a_partition_their_pseudonym_does_not_map_to_are_dead_lettered() -> None:
    """The repartition topic gained partitions while windows were open: events placed under
    the old count are dead-lettered one by one, with their input position."""
    owner = _owner(1, partitions=4)
    router = _router(0)  # still believes in one repartition partition
    events = numbered([(f"user-{i}", 1, "a") for i in range(40)], first=100)
    records, _ = router.route_packed(0, events, now_s=NOW, now_mono_s=0)
    dead = feed_routed(owner, [v for _, v, _ in records])
    here = 40 - len(dead)
    assert 0 < here < 40
    assert {(d.reason, d.topic, d.partition) for d in dead} == {("misplaced_key", None, 0)}
    assert {d.offset for d in dead} < set(range(100, 140))
    assert sealed_totals(owner)[(T0, "all")][0] == {(): _agg(here, here)}


def _agg(events: int, users: int) -> Any:
    from stream_dp.privacy.release import KeyAggregate

    return KeyAggregate(events, users, 0)


def test_packed_events_of_another_pseudonym_key_are_dropped() -> None:
    old = KeyRing(Pseudonymizer(TEST_KEY, "k0"))
    stale_router = IngestStage(_cfg(), old, metrics=Metrics())
    stale_router.assign_routed([0], 0.0)
    records, _ = stale_router.route_packed(0, numbered(_EVENTS), now_s=NOW, now_mono_s=0)
    owner = _owner(1)
    assert feed_routed(owner, [v for _, v, _ in records]) == []
    assert owner.open_windows() == []
    assert owner.metrics.late_events._value.get() == len(_EVENTS)


def _packed_body() -> dict[str, Any]:
    """A packed record in the JSON format of earlier versions, as a dict."""
    records, _ = _router(0).route_packed(0, numbered(_EVENTS), now_s=NOW, now_mono_s=0)
    body: dict[str, Any] = orjson.loads(packed_as_json(records[0][1]))
    return body


@pytest.mark.parametrize(
    "change",
    [
        {"u": "not base64!"},
        {"u": "AAAA"},
        {"n": 0},
        {"n": "6"},
        {"t": "AAAA"},
        {"s": "////////////////////////////////"},
        {"sig": [["a"], [["nested"]]]},
        {"sig": "a"},
        {"sig": [["a", "b"]]},
        {"sig": [{"domain": "a"}]},
        {"sig": [["a"], [None], [{"x": 1}]]},
        {"sig": None},
        {"src": [0, -3]},
        {"fields": None},
        {"k": 1},
    ],
)
def test_malformed_packed_records_are_dead_lettered_not_fatal(change: dict[str, Any]) -> None:
    owner = _owner(1)
    good = _packed_body()
    with pytest.raises((TypeError, ValueError, KeyError)):  # refused by the format's reader
        decode_events({**good, **change}, ["domain"])
    bad = orjson.dumps({**good, **change})
    dead = feed_routed(owner, [bad, orjson.dumps(good)])
    assert [(d.reason, d.offset, d.topic) for d in dead] == [("bad_internal_record", 0, "rp")]
    assert owner.open_windows() == [T0, T0 + 10]  # the good one was taken


def test_large_batches_are_split_under_the_message_limit() -> None:
    cfg = _cfg(output={})
    router = _router(0, cfg=cfg)
    limit = cfg.kafka.max_message_bytes
    long = "x" * 3000
    events = [(f"u{i}", i / 1000, f"{long}{i}") for i in range(1000)]  # 3 MB of domains
    records, _ = router.route_packed(0, numbered(events), now_s=NOW, now_mono_s=0)
    assert len(records) >= 3
    assert all(len(k) + len(v) <= limit - 512 for k, v, _ in records)
    owner = _owner(1)
    assert feed_routed(owner, [v for _, v, _ in records]) == []
    (partial,) = [p for p in owner.seal(0, T0) if p.query == "visits"]
    assert len(partial.totals) == 1000


def test_routing_dead_letters_and_progress_match_the_per_event_router() -> None:
    records: list[InputRecord] = [
        *numbered([("u", 1, "a"), ("v", 2, "b")]),
        (2, None, b"not json"),
        (3, None, orjson.dumps({"user_id": "   ", "timestamp": T0 + 3, "domain": "a"})),
        (4, None, orjson.dumps({"user_id": "w", "timestamp": T0 + 40, "domain": "a"})),
    ]
    one, packed = _router(0, 1), _router(0, 1)
    _, dead_one = one.route(0, records, now_s=NOW, now_mono_s=2)
    out, dead_packed = packed.route_packed(0, records, now_s=NOW, now_mono_s=2)
    assert [(d.reason, d.offset) for d in dead_packed] == [(d.reason, d.offset) for d in dead_one]
    assert [(d.reason, d.offset) for d in dead_one] == [("not_json", 2), ("bad_user", 3)]
    assert packed.progress_marks(5) == one.progress_marks(5)
    assert sum(len(decode_binary(v, [])) for _, v, _ in out) == 3
    assert packed.metrics.events_consumed._value.get() == 5


def test_erased_users_are_repartitioned_like_anyone_and_not_taken_from_packed_records() -> None:
    """Erasure (docs/erasure.md): stage 0 repartitions an erased user's events like anyone's,
    on both routers (what a worker holds, and so /metrics, must not depend on whom an erasure
    names: docs/attack-model.md); stage 1 drops them from packed records on arrival."""
    erasures = ErasureSet()
    erasures.add(Erasure(0, erasure_pseudonyms("alice", KEYRING, "nfkc_casefold_strip"), T0 + 3600))
    one, packed = _router(0, erasures=erasures), _router(0, erasures=erasures)
    one_each, _ = one.route(0, numbered(_EVENTS), now_s=NOW, now_mono_s=1)
    records, _ = packed.route_packed(0, numbered(_EVENTS), now_s=NOW, now_mono_s=1)
    assert sum(len(decode_binary(v, [])) for _, v, _ in records) == len(one_each) == 6
    assert packed.metrics.events_repartitioned._value.get() == 6
    assert one.metrics.events_repartitioned._value.get() == 6
    assert packed.progress_marks(2) == one.progress_marks(2)
    owner = _owner(1, erasures=erasures)
    feed_routed(owner, [v for _, v, _ in records])
    others = [e for e in _EVENTS if e[0] not in ("alice", "Alice ")]
    without, _ = _router(0).route_packed(0, numbered(others), now_s=NOW, now_mono_s=1)
    fresh = _owner(1)
    feed_routed(fresh, [v for _, v, _ in without])
    assert sealed_totals(owner) == sealed_totals(fresh)


def _typed(values: tuple[Any, ...]) -> tuple[tuple[str, Any], ...]:
    """Values with their types: 1, 1.0 and true are told apart."""
    return tuple((type(v).__name__, v) for v in values)


@pytest.mark.parametrize("group_by", [["domain"], ["domain", "country"]])
def test_each_packed_event_is_the_per_event_routers_record(group_by: list[str]) -> None:
    """Across windows, a key rotation and five repartition partitions, with one query field
    or two: every event of the packed records is the per-event router's record of it, on
    the same repartition partition under the same key id — pseudonym, time, query fields."""
    cfg = config(
        queries=[{"name": "q", "group_by": group_by, "epsilon": 1e6, "delta": 1e-6}],
        delta_per_window=1e-6,
    )
    keyring = KeyRing(Pseudonymizer(b"n" * 32, "k2"), Pseudonymizer(TEST_KEY, "k1"), T0 + 20)
    rng = random.Random(7)
    users: list[str | int] = ["alice", "Alice ", "bob", 42, "42", "   "]
    users += [f"u{i}" for i in range(30)]
    records: list[InputRecord] = []
    for offset in range(400):
        user = rng.choice(users)
        event = {
            "user_id": user,
            "timestamp": T0 + rng.uniform(0, 40),
            "domain": rng.choice(["a", "b", True, 1, 2.0, None]),
            "country": rng.choice(["fr", "de", 3]),
        }
        records.append((100 + offset, None, orjson.dumps(event)))
    stages = []
    for _ in range(2):
        settings = IngestSettings(routed_partitions=5)
        stage = IngestStage(cfg, keyring, metrics=Metrics(), settings=settings)
        stage.assign_routed([2], 0.0)
        stages.append(stage)
    one, packed = stages
    one_each, dead_one = one.route(2, records, now_s=NOW, now_mono_s=0)
    out, dead_packed = packed.route_packed(2, records, now_s=NOW, now_mono_s=0)
    assert [(d.reason, d.offset) for d in dead_packed] == [(d.reason, d.offset) for d in dead_one]
    expected = {}
    for _key, value, target in one_each:
        body = orjson.loads(value)
        fields = _typed(canonical_key(body["e"][f] for f in group_by))
        expected[body["src"][1]] = (target, body["k"], body["u"], body["t"], fields)
    assert len({k for _, k, _, _, _ in expected.values()}) == 2  # both keys are in the batch
    got = {}
    for _key, value, target in out:
        events = decode_binary(value, group_by)
        for j, offset in enumerate(events.offsets.tolist()):
            signature = events.signatures[events.signature_index[j]]
            got[offset] = (
                target,
                events.key_id,
                events.pseudonyms[16 * j : 16 * (j + 1)].hex(),
                float(events.times[j]),
                _typed(signature),
            )
    assert got == expected
    assert len({target for target, *_ in got.values()}) == 5


@pytest.mark.parametrize(
    "sig",
    [
        [["fr", "a"], ["de", 7], [None, "b"]],
        [["fr", "a"], ["de", True], ["fr", False]],
        [["fr", "a"], ["de", True], [None, 2.5], ["fr", False]],
    ],
)
def test_signatures_are_read_canonical_in_the_readers_field_order(sig: list[Any]) -> None:
    """A record's signature dictionary, read for fields in another order and one it does not
    carry, gives each signature's canonical values in the reader's order (None for the
    missing field) — booleans as JSON booleans, not the integers they equal in Python."""
    body = {**_packed_body(), "fields": ["country", "domain"], "sig": sig}
    body["s"] = base64.b64encode(bytes(4 * body["n"])).decode()  # every event: signature 0
    wanted = ["domain", "path", "country"]
    expected = [canonical_key([d, None, c]) for c, d in sig]
    assert [_typed(s) for s in decode_events(body, wanted).signatures] == list(
        map(_typed, expected)
    )
    same_order = decode_events(body, ["country", "domain"]).signatures
    assert [_typed(s) for s in same_order] == [_typed(canonical_key(e)) for e in sig]


def test_a_signature_of_the_wrong_shape_is_refused() -> None:
    """Each signature lists one scalar per field the record carries: one value too many or
    too few, a nested value or an entry that is not a list is refused, whichever entry."""
    good = _packed_body()
    *head, last = good["sig"]
    assert decode_events(good, ["domain"]).signatures  # the record itself is read
    for bad in ([*last, "x"], [], {"domain": "a"}, "a", [["a"]], [{"x": 1}]):
        with pytest.raises(TypeError):
            decode_events({**good, "sig": [*head, bad]}, ["domain"])
