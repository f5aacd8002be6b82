"""The binary packed records stage 0 writes to the repartition topic (the layout: docs/topics.md).

Every event comes back as it went in, from the binary record and from the same record in the
JSON format of earlier versions; stage 1 reads both formats in one stream (a rolling upgrade
leaves older records on the topic), drops events re-sent across the two, and dead-letters a
truncated or corrupt binary record as it does a corrupt JSON one, taking the rest of the batch.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.formats.packed import (
    PACKED_MAGIC,
    decode_binary,
    decode_events,
    encode_events,
    is_binary,
)
from stream_dp.pipeline.stages.ingest import IngestSettings, IngestStage
from stream_dp.privacy.group_values import canonical_key
from tests.pipeline.support import (
    KEYRING,
    NOW,
    T0,
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
_EVENTS = [
    ("alice", 1.0, "a"),
    ("bob", 2.5, "b"),
    ("alice", 3.0, "b"),
    (42, 4.0, "a"),
    ("Alice ", 12.0, "a"),
    ("carol", 15.5, "c"),
]
HEADER = struct.Struct("<BBHIIIq")


def _router(partition: int) -> IngestStage:
    stage = IngestStage(config(queries=QUERIES, delta_per_window=1e-6), KEYRING, metrics=Metrics())
    stage.assign_routed([partition], 0.0)
    return stage


def _owner(input_partitions: int = 2) -> IngestStage:
    stage = IngestStage(
        config(queries=QUERIES, delta_per_window=1e-6, k=50),
        KEYRING,
        metrics=Metrics(),
        sampling_rng=random.Random(0),
        settings=IngestSettings(input_partitions=input_partitions),
    )
    stage.assign([0], 0.0, routed=True)
    return stage


def _routed(
    partition: int, events: Sequence[tuple[str | int, float, str]], first: int = 0
) -> list[bytes]:
    records, dead = _router(partition).route_packed(
        partition, numbered(events, first=first), now_s=NOW, now_mono_s=0
    )
    assert dead == []
    return [value for _, value, _ in records]


# -- round trip ---------------------------------------------------------------------------------

_SCALARS = st.one_of(
    st.text(max_size=12),
    st.integers(-(2**63), 2**63 - 1),
    st.none(),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
)


@st.composite
def _packed(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 40))
    fields = draw(st.lists(st.text(min_size=1, max_size=8), max_size=3, unique=True))
    signatures = draw(st.lists(st.tuples(*(_SCALARS for _ in fields)), min_size=1, max_size=6))
    first = draw(st.integers(0, 2**62))
    gaps = draw(st.lists(st.integers(1, 10**6), min_size=n - 1, max_size=n - 1))
    return {
        "src_partition": draw(st.integers(0, 2**31 - 1)),
        "offsets": np.array([first, *(first + np.cumsum(gaps, dtype=np.int64))], np.int64),
        "key_id": draw(st.text(max_size=10)),
        "key_check": draw(st.text("0123456789abcdef", min_size=16, max_size=16)),
        "fields": fields,
        "pseudonyms": draw(st.binary(min_size=16 * n, max_size=16 * n)),
        "times": np.array(
            draw(st.lists(st.floats(-1e12, 1e12), min_size=n, max_size=n)), np.float64
        ),
        "signatures": [canonical_key(s) for s in signatures],
        "signature_index": np.array(
            draw(st.lists(st.integers(0, len(signatures) - 1), min_size=n, max_size=n)), np.int64
        ),
    }


def _typed(values: Sequence[Any]) -> tuple[tuple[str, Any], ...]:
    """Values with their types: 1, 1.0 and true are told apart."""
    return tuple((type(v).__name__, v) for v in values)


def _events_of(packed: Any) -> list[tuple[Any, ...]]:
    return [
        (
            packed.src_partition,
            packed.key_id,
            packed.key_check,
            offset,
            packed.pseudonyms[16 * j : 16 * (j + 1)],
            float(packed.times[j]),
            _typed(packed.signatures[packed.signature_index[j]]),
        )
        for j, offset in enumerate(packed.offsets.tolist())
    ]


@settings(max_examples=150, deadline=None)
@given(_packed(), st.sampled_from([1_000_000, 1_400]))
def test_every_event_comes_back_from_binary_and_json_records(
    spec: dict[str, Any], max_bytes: int
) -> None:
    """Random packed events (any scalar signature values, offsets far past 2**32, a record
    limit that splits them or not): reading the binary records — and the same records in
    the JSON format of earlier versions — gives back every event, in order."""
    values = encode_events(**spec, max_bytes=max_bytes)
    assert all(is_binary(v) and len(v) <= max_bytes for v in values)
    n = len(spec["offsets"])
    expected = [
        (
            spec["src_partition"],
            spec["key_id"],
            spec["key_check"],
            int(spec["offsets"][j]),
            spec["pseudonyms"][16 * j : 16 * (j + 1)],
            float(spec["times"][j]),
            _typed(spec["signatures"][int(spec["signature_index"][j])]),
        )
        for j in range(n)
    ]
    fields = spec["fields"]
    binary = [e for v in values for e in _events_of(decode_binary(v, fields))]
    legacy = [
        e
        for v in values
        for e in _events_of(decode_events(orjson.loads(packed_as_json(v)), fields))
    ]
    assert binary == expected
    assert legacy == expected


# -- both formats in one stream -----------------------------------------------------------------


def test_stage_1_reads_binary_and_json_packed_records_in_one_stream() -> None:
    """After an upgrade the topic holds an older worker's JSON packed records followed by a
    new worker's binary ones, interleaved across input partitions: the totals are those of
    the same events all in one format."""
    from_0 = _routed(0, _EVENTS)
    from_1 = _routed(1, [("dave", 5.0, "a"), ("alice", 6.0, "c"), ("erin", 13.0, "b")])
    mixed, binary = _owner(), _owner()
    assert feed_routed(mixed, [packed_as_json(from_0[0]), from_1[0]]) == []
    assert feed_routed(binary, [from_0[0], from_1[0]]) == []
    assert mixed.metrics.repartition_duplicates_skipped._value.get() == 0
    assert sealed_totals(mixed) == sealed_totals(binary)
    (partial,) = [p for p in sealed_totals(binary).items() if p[0] == (T0, "all")]
    assert partial[1][1] == 6  # the events of window T0 from both partitions


def test_a_batch_resent_in_the_new_format_is_dropped_event_by_event() -> None:
    """An older worker routed offsets 0..3 (JSON) and stopped before committing them; the
    new worker routes 2..5 again (binary): offsets 2 and 3 are dropped as re-sent."""
    owner = _owner(1)
    feed_routed(owner, [packed_as_json(v) for v in _routed(0, _EVENTS[:4])])
    feed_routed(owner, _routed(0, _EVENTS[2:], first=2), first=1)
    assert owner.metrics.repartition_duplicates_skipped._value.get() == 2
    once = _owner(1)
    feed_routed(once, _routed(0, _EVENTS))
    assert sealed_totals(owner) == sealed_totals(once)


# -- corrupt binary records ---------------------------------------------------------------------


def _good() -> bytes:
    (value,) = _routed(0, _EVENTS)
    return value


def _rebuilt(good: bytes, *, header: dict[str, int] | None = None, meta: Any = None) -> bytes:
    """``good`` with header fields (magic, version, reserved, n, src, meta_bytes, first)
    replaced, or its metadata replaced (bytes as they are, anything else as JSON)."""
    names = ("magic", "version", "reserved", "n", "src", "meta_bytes", "first")
    fields = dict(zip(names, HEADER.unpack_from(good), strict=True))
    body = good[HEADER.size : HEADER.size + 32 * fields["n"]]
    tail = good[HEADER.size + len(body) :]
    if meta is not None:
        tail = meta if isinstance(meta, bytes) else orjson.dumps(meta)
        fields["meta_bytes"] = len(tail)
    fields |= header or {}
    return HEADER.pack(*fields.values()) + body + tail


def _corrupt() -> dict[str, bytes]:
    good = _good()
    meta = orjson.loads(good[HEADER.size + 32 * 6 :])
    nan = struct.pack("<d", float("nan"))
    index_at = HEADER.size + 28 * 6
    return {
        "a byte more": good + b" ",
        "another version": _rebuilt(good, header={"version": 2}),
        "reserved bits set": _rebuilt(good, header={"reserved": 1}),
        "n one more": _rebuilt(good, header={"n": 7}),
        "n zero": HEADER.pack(PACKED_MAGIC, 1, 0, 0, 0, len(orjson.dumps(meta)), 0)
        + orjson.dumps(meta),
        "n huge": _rebuilt(good, header={"n": 2**32 - 1}),
        "metadata length short": _rebuilt(good, header={"meta_bytes": len(good) - 1}),
        "negative first offset": _rebuilt(good, header={"first": -5}),
        "metadata not JSON": _rebuilt(good, meta=b"\xff{"),
        "metadata a list": _rebuilt(good, meta=[meta]),
        "no key check": _rebuilt(good, meta={k: v for k, v in meta.items() if k != "c"}),
        "key id a number": _rebuilt(good, meta={**meta, "k": 1}),
        "nested signature": _rebuilt(good, meta={**meta, "sig": [["a"], [["x"]]]}),
        "time not finite": good[: HEADER.size] + nan + good[HEADER.size + 8 :],
        "signature index past the dictionary": (
            good[:index_at] + b"\xff\xff\xff\x7f" + good[index_at + 4 :]
        ),
    }


@pytest.mark.parametrize("case", sorted(_corrupt()))
def test_corrupt_binary_records_are_dead_lettered_like_corrupt_json_ones(case: str) -> None:
    """Refused by the reader, dead-lettered as bad_internal_record with its place on the
    repartition topic; the good record after it in the batch is taken."""
    bad = _corrupt()[case]
    assert is_binary(bad)
    with pytest.raises((TypeError, ValueError, KeyError)):
        decode_binary(bad, ["domain"])
    owner = _owner(1)
    dead = feed_routed(owner, [bad, _good()])
    assert [(d.reason, d.offset, d.topic) for d in dead] == [("bad_internal_record", 0, "rp")]
    assert owner.open_windows() == [T0, T0 + 10]
    assert owner.metrics.bad_records.labels(reason="bad_internal_record")._value.get() == 1


def test_a_binary_record_cut_anywhere_is_dead_lettered() -> None:
    """Every prefix of a binary record (a record cut short by a writer other than stream-dp,
    or a torn copy) is dead-lettered, none taken, and the whole record after them is."""
    good = _good()
    cuts = [good[:size] for size in range(1, len(good))]
    for cut in cuts:
        with pytest.raises((TypeError, ValueError, KeyError)):
            decode_binary(cut, ["domain"])
    owner = _owner(1)
    dead = feed_routed(owner, [*cuts, good])
    assert [(d.reason, d.offset) for d in dead] == [
        ("bad_internal_record", offset) for offset in range(len(cuts))
    ]
    assert owner.open_windows() == [T0, T0 + 10]
    assert owner.metrics.repartition_duplicates_skipped._value.get() == 0
