"""A record's value is one JSON document, on the column paths as on the per-record paths.

msgspec once decoded a batch as the lines of one joined buffer, which it reads as documents
separated by any whitespace: a line holding two documents (``{A} {B}``, ``{A}\\t{B}``,
``{A}{B}``…) next to one holding none (an empty or whitespace-only value, or the start of a
document another line ends) gave as many documents as records, so the records between them
took their neighbours' fields and the two bad records vanished from the dead letters. The
per-record path dead-letters both (``not_json``); the column paths must too — stage 0's
packed routing, stage 1's column ingest, and the decode under them with msgspec or with
orjson.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence
from itertools import product
from typing import Any

import orjson
import pytest

from stream_dp.config.model import Config
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.formats import struct_decode
from stream_dp.pipeline.formats.decode import REASONS, BadRecord, Decoder
from stream_dp.pipeline.formats.packed import decode_binary
from stream_dp.pipeline.stages import columns, ingest_columns
from stream_dp.pipeline.stages.ingest import IngestSettings, IngestStage, InputRecord
from tests.pipeline.support import KEYRING, NOW, T0, config

QUERIES: list[dict[str, Any]] = [
    {"name": "visits", "group_by": ["domain"], "epsilon": 1e6, "delta": 1e-6},
    {"name": "all", "epsilon": 1e6, "keys": {}},
]
DECODER = Decoder(
    user_field="user_id",
    time_field="timestamp",
    max_record_bytes=1 << 20,
    max_future_s=300,
    scalar_fields=["domain"],
)


def _event(user: str, t: float, domain: str) -> bytes:
    return orjson.dumps({"user_id": user, "timestamp": T0 + t, "domain": domain})


#: Each good record is told apart by its user, time and domain: a record that takes another's
#: fields shows.
GOOD = [_event(f"g{i}", 1 + i, f"d{i}") for i in range(4)]
A, B = _event("ua", 2.5, "da"), _event("ub", 3.5, "db")
#: Values holding two JSON documents, with each JSON whitespace (or none) between them.
TWO_DOCUMENTS = {
    "space": A + b" " + B,
    "tab": A + b"\t" + B,
    "cr": A + b"\r" + B,
    "lf": A + b"\n" + B,
    "crlf": A + b"\r\n" + B,
    "adjacent": A + B,
    "spaces-around": b" " + A + b" \t " + B + b" ",
}
#: Values holding no JSON document.
BLANKS = {
    "empty": b"",
    "space": b" ",
    "tab": b"\t",
    "cr": b"\r",
    "lf": b"\n",
    "crlf": b"\r\n",
    "mix": b" \t\r \t",
    "mix-lf": b"\t \r\n \n",
}
#: Where the two bad values go among the good ones (indices into the batch).
PLACES = {
    "two-then-blank": (1, 4),
    "blank-then-two": (4, 1),
    "blank-first": (3, 0),
    "blank-last": (1, 5),
}
SMUGGLING = [
    pytest.param(two, blank, place, id=f"{t}-{b}-{place}")
    for (t, two), (b, blank), place in product(TWO_DOCUMENTS.items(), BLANKS.items(), PLACES)
]


def _batch(two: bytes, blank: bytes, place: str) -> tuple[list[bytes], list[int]]:
    """Four good records and, among them, a value of two documents and one of none; and
    the offsets of those two."""
    at_two, at_blank = PLACES[place]
    good = iter(GOOD)
    values = [two if i == at_two else blank if i == at_blank else next(good) for i in range(6)]
    return values, sorted((at_two, at_blank))


#: The same two documents, one split across two records: a line that ends inside a
#: document another line ends holds no document of its own.
SPLIT = [A + b' {"user_id":"uc",', b'"timestamp":%d,"domain":"dc"}' % (T0 + 4)]
SPLIT_BATCHES = {
    "split": [GOOD[0], *SPLIT, GOOD[1]],
    "split-object-open": [GOOD[0], A + b" {", b"}", GOOD[1]],
    "split-then-blank": [GOOD[0], *SPLIT, b" ", GOOD[1], A + b" " + B, GOOD[2]],
    # A line that ends inside a string (of a field msgspec skips) and the next that ends the
    # string: one document only if a string could hold a raw newline, which JSON forbids.
    "split-in-a-string": [
        GOOD[0],
        b'{"user_id":"ux","timestamp":%d,"domain":"dx","x":"}' % (T0 + 5),
        b'{"}',
        A + b" " + B,
        GOOD[1],
    ],
}


@functools.cache
def _cfg() -> Config:
    return config(queries=QUERIES, delta_per_window=1e-6, k=50)


def _bad_counts(metrics: Metrics) -> dict[str, float]:
    return {r: metrics.bad_records.labels(reason=r)._value.get() for r in REASONS}


def _expected_dead(values: Sequence[bytes]) -> list[tuple[str, int]]:
    """The per-record decode's verdicts: here every bad record is not JSON."""
    dead = []
    for offset, value in enumerate(values):
        parts = DECODER.decode_parts(value, NOW)
        if isinstance(parts, BadRecord):
            dead.append((parts.reason, offset))
    return dead


def _records(values: Sequence[bytes]) -> list[InputRecord]:
    return [(offset, None, value) for offset, value in enumerate(values)]


def _routed_events(out: Sequence[tuple[bytes, bytes, int]], packed: bool) -> dict[int, Any]:
    """Per source offset, the routed event: target, key id, pseudonym, time, domain."""
    got: dict[int, Any] = {}
    for _key, value, target in out:
        if not packed:
            body = orjson.loads(value)
            got[body["src"][1]] = (target, body["k"], body["u"], body["t"], body["e"]["domain"])
            continue
        events = decode_binary(value, ["domain"])
        for j, offset in enumerate(events.offsets.tolist()):
            (domain,) = events.signatures[events.signature_index[j]]
            pseudonym = events.pseudonyms[16 * j : 16 * (j + 1)].hex()
            got[offset] = (target, events.key_id, pseudonym, float(events.times[j]), domain)
    return got


def _check_stage_0(values: list[bytes]) -> None:
    """Packed routing (columns) dead-letters, counts and routes what routing record by
    record does: the same dead letters with reasons, the same bad_records counts, each good
    record routed with its own fields."""
    records = _records(values)
    expected = _expected_dead(values)
    stages = []
    for _ in range(2):
        settings = IngestSettings(routed_partitions=3)
        stage = IngestStage(_cfg(), KEYRING, metrics=Metrics(), settings=settings)
        stage.assign_routed([0], 0.0)
        stages.append(stage)
    one, packed = stages
    out_one, dead_one = one.route(0, records, now_s=NOW, now_mono_s=0)
    out_packed, dead_packed = packed.route_packed(0, records, now_s=NOW, now_mono_s=0)
    assert [(d.reason, d.offset) for d in dead_one] == expected
    assert [(d.reason, d.detail, d.offset) for d in dead_packed] == [
        (d.reason, d.detail, d.offset) for d in dead_one
    ]
    assert _bad_counts(packed.metrics) == _bad_counts(one.metrics)
    assert _bad_counts(one.metrics)["not_json"] == len(expected)
    routed_one = _routed_events(out_one, packed=False)
    dead_offsets = {offset for _, offset in expected}
    assert sorted(routed_one) == [o for o in range(len(values)) if o not in dead_offsets]
    assert _routed_events(out_packed, packed=True) == routed_one
    for offset, (_target, _key_id, _u, t, domain) in routed_one.items():
        event = orjson.loads(values[offset])
        assert (t, domain) == (event["timestamp"], event["domain"])


def _ingest(values: list[bytes], *, columns_on: bool) -> tuple[Any, ...]:
    stage = IngestStage(_cfg(), KEYRING, metrics=Metrics(), sampling_rng=random.Random(0))
    stage.assign([0], 0.0, routed=False)
    with pytest.MonkeyPatch.context() as mp:
        if not columns_on:
            mp.setattr(ingest_columns, "decode_columns", lambda *a: None)
        dead = stage.ingest(0, _records(values), now_s=NOW, now_mono_s=0.5)
    totals = {
        (ws, partial.query): (dict(partial.totals), partial.events_seen)
        for p, ws in stage.all_open()
        for partial in stage.seal(p, ws)
    }
    m = stage.metrics
    return (
        [(d.reason, d.detail, d.offset) for d in dead],
        _bad_counts(m),
        totals,
        m.events_consumed._value.get(),
        stage.safe_offsets(),
    )


def _check_stage_1(values: list[bytes]) -> None:
    """Column ingest (stage 1 on raw input) gives what ingest record by record gives: dead
    letters with reasons, bad_records counts, and per domain the good records' counts."""
    on, off = _ingest(values, columns_on=True), _ingest(values, columns_on=False)
    assert [(r, o) for r, _, o in off[0]] == _expected_dead(values)
    assert on == off
    dead_offsets = {offset for _, offset in _expected_dead(values)}
    per_domain: dict[tuple[str], int] = {}
    for offset, value in enumerate(values):
        if offset not in dead_offsets:
            domain = orjson.loads(value)["domain"]
            per_domain[(domain,)] = per_domain.get((domain,), 0) + 1
    seen: dict[tuple[Any, ...], int] = {}
    for (_ws, query), (totals, _seen) in off[2].items():
        if query == "visits":
            for key, total in totals.items():
                seen[key] = seen.get(key, 0) + total.events
    assert seen == per_domain


def _check_decode(values: list[bytes]) -> None:
    """The batch decode under both stages, with msgspec and with orjson alone, refuses the
    batch (its bad records go to the per-record path), and msgspec gives no columns."""
    assert _expected_dead(values)
    assert struct_decode.struct_columns(("user_id", "timestamp", "domain"), values, 999) is None
    assert columns.decode_columns(DECODER, ["domain"], values, NOW) is None
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(struct_decode, "struct_columns", lambda *a: None)
        assert columns.decode_columns(DECODER, ["domain"], values, NOW) is None


@pytest.mark.parametrize(("two", "blank", "place"), SMUGGLING)
def test_a_value_of_two_documents_and_a_blank_one_are_dead_lettered_by_the_column_paths(
    two: bytes, blank: bytes, place: str
) -> None:
    values, bad = _batch(two, blank, place)
    assert _expected_dead(values) == [("not_json", offset) for offset in bad]
    _check_decode(values)
    _check_stage_0(values)
    _check_stage_1(values)


@pytest.mark.parametrize("name", list(SPLIT_BATCHES))
def test_a_document_split_across_two_values_is_dead_lettered_by_the_column_paths(
    name: str,
) -> None:
    """No blank value, yet as many documents as records: ``{A} {"user_id":…,`` then
    ``"timestamp":…}`` decode as the lines ``{A}`` and one document spanning two lines."""
    values = SPLIT_BATCHES[name]
    _check_decode(values)
    _check_stage_0(values)
    _check_stage_1(values)


@pytest.mark.parametrize("value", [*TWO_DOCUMENTS.values(), *BLANKS.values(), *SPLIT])
def test_each_value_alone_and_among_good_ones_is_dead_lettered_by_the_column_paths(
    value: bytes,
) -> None:
    """Alone, with no partner to even the count of documents out, each is refused too."""
    for values in ([value], [GOOD[0], value, GOOD[1]]):
        _check_decode(values)
        _check_stage_0(values)
        _check_stage_1(values)


def test_good_records_with_whitespace_around_them_still_take_the_column_paths() -> None:
    """Whitespace around one document is JSON the per-record path takes: msgspec decodes
    such a batch, and it takes the column path with each record's own fields."""
    values = [GOOD[0], b" \t" + GOOD[1] + b"\r ", GOOD[2], b"\r" + GOOD[3]]
    assert _expected_dead(values) == []
    assert struct_decode.struct_columns(("user_id", "timestamp", "domain"), values, 999)
    cols = columns.decode_columns(DECODER, ["domain"], values, NOW)
    assert cols is not None
    events = [orjson.loads(v) for v in values]
    assert cols.users == [e["user_id"] for e in events]
    assert cols.times.tolist() == [e["timestamp"] for e in events]
    assert cols.fields == [[e["domain"] for e in events]]
    _check_stage_0(values)
    _check_stage_1(values)
