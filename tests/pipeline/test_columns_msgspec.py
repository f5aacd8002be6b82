"""The msgspec decode of a batch (stream_dp/pipeline/formats/struct_decode.py) agrees exactly
with orjson and the per-record path: differentially on batches mixing good events with nasty
records, and on each known difference between msgspec and orjson as an example."""

from __future__ import annotations

import random
import sys
from collections.abc import Sequence
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_dp.pipeline.formats import struct_decode
from stream_dp.pipeline.formats.decode import BadRecord, Decoder
from stream_dp.pipeline.formats.struct_decode import orjson_ints, struct_columns
from stream_dp.pipeline.stages import columns
from tests.pipeline.support import NOW, T0

FIELDS = ["domain", "premium", "bytes"]
NAMES = ("user_id", "timestamp", *FIELDS)
DECODER = Decoder(
    user_field="user_id",
    time_field="timestamp",
    max_record_bytes=1 << 20,
    max_future_s=300,
    scalar_fields=["domain", "premium"],
    numeric_fields=["bytes"],
)

GOOD_USERS = [b'"u1"', b'"u2"', b"7", b"8", b'" U1 "', b'"\\u00fc3"', '"ü3"'.encode(), b"-3"]
GOOD_TIMES = [
    b"%d" % (T0 + 1),
    b"%d" % ((T0 + 2) * 1000),
    b"%r" % (T0 + 1.5),
    b"1596240003.1234567",
    b'"2020-08-01T00:00:01+00:00"',
    b'"2020-08-01T02:00:04+02:00"',
]
GOOD_VALUES = [
    b'"a"',
    b'"b"',
    b"1",
    b"-2",
    b"1.0",
    b"2.5",
    b"-0.0",
    b"0",
    b"true",
    b"false",
    b"null",
    b'"\\u00e9"',
    '"é"'.encode(),
    b'"\\n\\t\\"\\\\\\/"',
    b"12345678901234567",
]
#: Values where msgspec and orjson differ or could (the brief's list and more), or that are
#: bad JSON to both.
NASTY = [
    b"1E2",
    b"1e-3",
    b"-2.5E+3",
    b"1e400",
    b"-1E400",
    b"1e-400",
    b"9" * 400,
    b"-" + b"9" * 400,
    b"1" * 300 + b".5",
    b"18446744073709551615",
    b"18446744073709551616",
    b"-9223372036854775808",
    b"-9223372036854775809",
    b"99999999999999999999999",
    b"1.0000000000000000000000001",
    b"1.7976931348623157e308",
    b"1.8e308",
    b"5e-324",
    b"2.4703282292062327e-324",
    b"NaN",
    b"Infinity",
    b"-Infinity",
    b"nan",
    b"tru",
    b"nul",
    b"01",
    b"1.",
    b".5",
    b"+1",
    b"-",
    b"1e",
    b"0x1",
    b"1.e5",
    b'"\\ud800"',
    b'"\\udc00"',
    b'"\\ud800\\udc00"',
    b'"\\ud800x"',
    b'"\xed\xa0\x80"',
    b'"\xff"',
    b'"\xc0\x80"',
    b'"\xf0\x9f\x98"',
    b'"\xf4\x90\x80\x80"',
    b'"a\x01b"',
    b'"\t"',
    b'"\x7f"',
    b'"\\u0000"',
    b'"\\q"',
    b'"\\u00"',
    b'"\\uZZZZ"',
    b'[1,2,{"a":[true,null]}]',
    b'{"a":1,"a":2}',
    b"[]",
    b"{}",
    b"[" * 1100 + b"]" * 1100,
    b"[" * 500 + b"]" * 500,
    b"[1,]",
    b'{"a":1,}',
    b'"3e4f-uuid"',
    b'"550e8400-e29b-41d4-a716-446655440000"',
    b'"site00012.example"',
    b"[1e400]",
    b"[18446744073709551616]",
    b'{"\\q":1}',
    b'{"a\x01":1}',
    b'{"\\udc00\\ud800":1}',
    b'["\\q"]',
    b"1" * 309,
    b"0." + b"1" * 500,
    b'"\\ud800\\u0041"',
    b'"\\uDBFF\\uDFFF"',
    b"1e+-1",
    b"-0.0e0",
    b'"' + b"x" * 2100 + b'"',
    b'"\xe2\x80\xa8"',
]
#: Keys: the needed fields (also spelled with escapes), others.
KEYS = [
    b'"user_id"',
    b'"timestamp"',
    b'"domain"',
    b'"premium"',
    b'"bytes"',
    b'"x"',
    b'"y"',
    b'"user\\u005fid"',
    b'"\\u0064omain"',
    b'"\xff"',
    b'""',
    b'"\\q"',
    b'"\\ud800"',
    b'"a\x01"',
]
#: Whole records that are not one JSON object (or are, unusually spelled).
ODD_RECORDS = [
    b"",
    b" ",
    b"[1]",
    b'"s"',
    b"1",
    b"null",
    b"\xef\xbb\xbf{}",
    b"{} x",
    b"{}\x00",
    b"{",
    b'{"user_id":"u1"}\n{"timestamp":1}',
    b'\n{"user_id":"u1","timestamp":%d}' % (T0 + 1),
    b' {"user_id":"u1","timestamp":%d} ' % (T0 + 1),
    b'{"user_id":"u1",\r\n"timestamp":%d}' % T0,
    b"\t",
    b"\r",
    b" \t\r\n ",
    b"{} {}",
    b"{}\t{}",
    b"{}\r{}",
    b"{}{}",
]
#: JSON's whitespace, and nothing: what can stand between two documents in one value.
SEPARATORS = [b"", b" ", b"\t", b"\r", b"\n", b"\r\n", b" \t\r "]


def _record(rng: random.Random, damage: float) -> bytes:
    """An event, mostly good, with nasty values and keys and byte damage now and then (more
    often the higher ``damage``, 0..1)."""
    if rng.random() < 0.1 * damage:
        return rng.choice(ODD_RECORDS)
    parts = [
        (b'"user_id"', rng.choice(GOOD_USERS)),
        (b'"timestamp"', rng.choice(GOOD_TIMES)),
        (b'"domain"', rng.choice(GOOD_VALUES)),
        (b'"premium"', rng.choice(GOOD_VALUES)),
    ]
    if rng.random() < 0.5:
        parts.append((b'"bytes"', rng.choice([b"1", b"2.5", b"-0.0", b"null", b"-7"])))
    for _ in range(rng.choice([0, 0, 1, 2, 3])):
        value = rng.choice(NASTY) if rng.random() < damage else rng.choice(GOOD_VALUES)
        key = rng.choice(KEYS) if rng.random() < 0.2 else b'"x%d"' % rng.randrange(5)
        parts.append((key, value))
    rng.shuffle(parts)
    if rng.random() < 0.3 * damage:  # a needed field's value made nasty
        i = rng.randrange(len(parts))
        parts[i] = (parts[i][0], rng.choice(NASTY))
    sep = rng.choice([b",", b",", b", ", b" ,\t"])
    record = b"{" + sep.join(k + b":" + v for k, v in parts) + b"}"
    if rng.random() < 0.2 * damage:  # a random byte somewhere (invalid UTF-8 above 0x7f)
        at = rng.randrange(len(record) + 1)
        record = record[:at] + bytes([rng.randrange(256)]) + record[at + rng.randrange(2) :]
    return record


def _blank(rng: random.Random) -> bytes:
    """An empty or whitespace-only value."""
    return bytes(rng.choice(b" \t\r\n") for _ in range(rng.randrange(4)))


def _documents(rng: random.Random, batch: list[bytes]) -> None:
    """Values that are not one document each, in place: several documents in one value
    (with each separator), blank values, a document split across two values (its first
    half after another document), trailing garbage — the line count of the joined batch,
    or the document count, can come out right with them."""
    kinds = rng.choice([[0, 1], [2], [rng.randrange(4) for _ in range(rng.randrange(1, 4))]])
    for kind in kinds:
        i = rng.randrange(len(batch))
        sep = rng.choice(SEPARATORS)
        if kind == 0:
            batch[i] = sep.join([batch[i], *rng.choices(batch, k=rng.randint(1, 2))])
        elif kind == 1:
            batch.insert(i, _blank(rng))
        elif kind == 2:  # mostly after a comma or colon, where a document can go on
            record = batch[i]
            at = rng.choice([j + 1 for j, c in enumerate(record) if c in b",:"] or [0])
            at = rng.choice([at, rng.randrange(len(record) + 1)])
            batch[i : i + 1] = [rng.choice(batch) + sep + record[:at], record[at:]]
        else:
            batch[i] += sep + rng.choice([b"x", b"1", b"null", b"{}", b"{", b"}", b"]"])


def _batch(rng: random.Random) -> list[bytes]:
    damage = rng.choice([0.0, 0.02, 0.1, 0.3, 1.0])
    batch = [_record(rng, damage) for _ in range(rng.randrange(1, 24))]
    if rng.random() < 0.25:
        _documents(rng, batch)
    return batch


def _fools_the_count(values: Sequence[bytes]) -> bool:
    """Whether msgspec reads exactly as many documents as records from the joined batch
    while a record is not one JSON object (to orjson): the count alone would take it."""
    try:
        documents = msgspec.json.Decoder().decode_lines(b"\n".join(values))
    except (msgspec.DecodeError, RecursionError, ValueError):
        return False
    if len(documents) != len(values):
        return False
    for value in values:
        try:
            if type(orjson.loads(value)) is not dict:
                return True
        except orjson.JSONDecodeError:
            return True
    return False


def _struct(values: Sequence[bytes]) -> list[list[Any]] | None:
    return struct_columns(NAMES, values, max(map(len, values)))


def _key(value: Any) -> tuple[str, str]:
    """A value with its exact type (True is not 1, 1.0 is not 1, -0.0 is not 0.0)."""
    return type(value).__name__, repr(value)


def _same(mine: Any, theirs: Any) -> bool:
    """msgspec's value is orjson's, but for integers beyond 64 bits (exact, not a float);
    nested values compared without recursion (they can be 1,000 deep)."""
    pairs = [(mine, theirs)]
    while pairs:
        a, b = pairs.pop()
        if type(a) is int and type(b) is float and not -(2**63) <= a < 2**64:
            if float(a) != b:
                return False
        elif type(a) is list and type(b) is list and len(a) == len(b):
            pairs.extend(zip(a, b, strict=True))
        elif type(a) is dict and type(b) is dict and list(a) == list(b):
            pairs.extend((a[k], b[k]) for k in a)
        elif _key(a) != _key(b):
            return False
    return True


def _orjson_agrees(values: Sequence[bytes], cols: list[list[Any]]) -> None:
    """struct_columns' columns are orjson's ``dict.get`` values, record by record; an exact
    integer beyond 64 bits (orjson: a float) excepted, which orjson_ints flags in a column
    of scalars (the column path refuses lists and objects in every needed field)."""
    for i, value in enumerate(values):
        obj = orjson.loads(value)  # raises if msgspec took a record orjson refuses
        assert type(obj) is dict, value
        for column, name in zip(cols, NAMES, strict=True):
            mine, theirs = column[i], obj.get(name)
            assert _same(mine, theirs), (value, name)
            if _key(mine) != _key(theirs) and type(mine) is int:
                assert not orjson_ints(column, set(map(type, column))), (value, name)


def _per_record_agrees(values: Sequence[bytes], cols: columns.EventColumns) -> None:
    """Every record of a batch the column path took decodes on the per-record path, to the
    same user, time and canonical field values."""
    for i, value in enumerate(values):
        parts = DECODER.decode_parts(value, NOW)
        assert not isinstance(parts, BadRecord), (value, parts)
        user, t, obj = parts
        assert _key(cols.users[i]) == _key(user), value
        assert float(cols.times[i]) == t, value
        assert [_key(c[i]) for c in cols.fields] == [_key(obj.get(f)) for f in FIELDS], value


def _check(values: list[bytes]) -> tuple[bool, bool]:
    """Both agreements for one batch; (msgspec took it, the column path took it)."""
    struct = _struct(values)
    if struct is not None:
        _orjson_agrees(values, struct)
    cols = columns.decode_columns(DECODER, FIELDS, values, NOW)
    if cols is not None:
        _per_record_agrees(values, cols)
    return struct is not None, cols is not None


@settings(max_examples=300, deadline=None)
@given(st.randoms(use_true_random=False))
def test_msgspec_columns_agree_with_orjson_and_the_per_record_path(rng: random.Random) -> None:
    _check(_batch(rng))


def test_the_differential_fuzz_takes_both_paths_often() -> None:
    """A seeded run of the same fuzz: it passes, and it is not vacuous — many batches take
    the msgspec path, many mixed ones are refused, and some have as many documents as
    records without each record being one."""
    rng = random.Random(30)
    taken = refused = columns_taken = fooling = 0
    for _ in range(4000):
        batch = _batch(rng)
        took, cols_took = _check(batch)
        taken += took
        refused += not took
        columns_taken += cols_took
        fooling += _fools_the_count(batch)
    assert taken > 400 and refused > 600 and columns_taken > 300, (taken, refused, columns_taken)
    assert fooling > 20, fooling  # batches the document count alone would take


def _event(**fields: Any) -> bytes:
    return orjson.dumps({"user_id": "u1", "timestamp": T0 + 1, "domain": "a", **fields})


GOOD = [_event(), _event(user_id=7, premium=True), _event(domain=2.5, bytes=3)]


def test_a_batch_of_good_events_takes_the_msgspec_path() -> None:
    assert _struct(GOOD) is not None
    cols = columns.decode_columns(DECODER, FIELDS, GOOD, NOW)
    assert cols is not None
    _per_record_agrees(GOOD, cols)


@pytest.mark.parametrize(
    "record",
    [
        pytest.param(b'{"user_id":"u1","timestamp":%d,"x":1e400}' % (T0 + 1), id="1e400-skipped"),
        pytest.param(b'{"user_id":"u1","timestamp":%d,"x":-1E400}' % (T0 + 1), id="1E400-skipped"),
        pytest.param(
            b'{"user_id":"u1","timestamp":%d,"x":%s}' % (T0 + 1, b"9" * 400), id="400-digits"
        ),
        pytest.param(b'{"user_id":"u1","timestamp":%d,"x":"\xff"}' % (T0 + 1), id="not-utf8"),
        pytest.param(
            b'{"user_id":"u1","timestamp":%d,"x":"\xed\xa0\x80"}' % (T0 + 1),
            id="encoded-surrogate",
        ),
        pytest.param(
            b'{"user_id":"u1","timestamp":%d,"x":"\xc0\x80"}' % (T0 + 1), id="overlong-utf8"
        ),
        pytest.param(
            b'{"user_id":"u1","timestamp":%d,"x":"\\ud800"}' % (T0 + 1), id="lone-surrogate"
        ),
        pytest.param(b'{"user_id":"\\ud800","timestamp":%d}' % (T0 + 1), id="lone-surrogate-user"),
        pytest.param(b"\xef\xbb\xbf" + _event(), id="bom"),
        pytest.param(
            b'{"user_id":18446744073709551616,"timestamp":%d}' % (T0 + 1), id="user-2**64"
        ),
        pytest.param(
            b'{"user_id":-9223372036854775809,"timestamp":%d}' % (T0 + 1), id="user-below-int64"
        ),
        pytest.param(
            b'{"user_id":"u1","timestamp":%d}' % ((T0 + 1) * 10**12), id="time-beyond-64-bits"
        ),
        pytest.param(
            b'{"user_id":"u1","timestamp":%d,"x":%s}' % (T0 + 1, b"[" * 1100 + b"]" * 1100),
            id="nested-1100-deep",
        ),
        pytest.param(b"", id="empty"),
        pytest.param(b"[1]", id="not-an-object"),
    ],
)
def test_each_known_difference_leaves_the_batch_to_the_per_record_path(record: bytes) -> None:
    """orjson (and so the per-record path) refuses each of these records, where msgspec
    alone would take them (or give another value): the column path must not take the batch."""
    values = [*GOOD, record, *GOOD]
    assert columns.decode_columns(DECODER, FIELDS, values, NOW) is None
    assert any(isinstance(DECODER.decode_parts(v, NOW), BadRecord) for v in values)


@pytest.mark.parametrize(
    "record",
    [
        pytest.param(_event()[:-1] + b',"domain":18446744073709551616}', id="field-2**64"),
        pytest.param(_event()[:-1] + b',"bytes":99999999999999999999999}', id="numeric-big-int"),
        pytest.param(_event(premium=-(2**63))[:-1] + b',"x":-9223372036854775809}', id="skipped"),
    ],
)
def test_integers_beyond_64_bits_leave_the_batch_to_the_per_record_path(record: bytes) -> None:
    """orjson gives an integer beyond 64 bits as a float (a good group value, a good number),
    msgspec exactly: the column path refuses a batch with one in a needed field and takes one
    with one in a skipped field."""
    values = [*GOOD, record, *GOOD]
    assert not any(isinstance(DECODER.decode_parts(v, NOW), BadRecord) for v in values)
    cols = columns.decode_columns(DECODER, FIELDS, values, NOW)
    if b'"x"' in record:
        assert cols is not None
        _per_record_agrees(values, cols)
    else:
        assert cols is None


@pytest.mark.parametrize(
    "record",
    [
        pytest.param(b'{"user_id":"u1","user_id":7,"timestamp":%d}' % (T0 + 1), id="dup-key"),
        pytest.param(b'{"user_id":"u1","timestamp":%d,"x":1e-400}' % (T0 + 1), id="1e-400"),
        pytest.param(_event()[:-1] + b',"domain":-0.0,"bytes":1E5}', id="minus-zero-1E5"),
        pytest.param(_event()[:-1] + b',"premium":1.0}', id="one-point-zero"),
        pytest.param(b'{"user\\u005fid":"u9","timestamp":%d}' % (T0 + 1), id="escaped-key"),
        pytest.param(_event(domain="550e8400-e29b-41d4-a716-446655440000"), id="uuid"),
        pytest.param(_event()[:-1] + b',"bytes":18446744073709551615}', id="u64-max"),
        pytest.param(_event()[:-1] + b',"x":"' + b"y" * 3000 + b'"}', id="long-record"),
        pytest.param(_event()[:-1] + b',"x":' + b"1" * 300 + b"}", id="300-digits"),
        pytest.param(_event()[:-1] + b',"x":[' + b"[" * 900 + b"]" * 900 + b"]}", id="deep"),
    ],
)
def test_records_both_decoders_take_give_the_per_record_values(record: bytes) -> None:
    values = [*GOOD, record, *GOOD]
    cols = columns.decode_columns(DECODER, FIELDS, values, NOW)
    assert cols is not None
    _per_record_agrees(values, cols)
    struct = _struct(values)
    assert struct is not None
    _orjson_agrees(values, struct)


def test_nesting_deeper_than_orjson_takes_is_refused_whatever_the_recursion_limit() -> None:
    """orjson refuses 1,024 levels; msgspec's limit is Python's recursion limit, which a
    process may raise: a record long enough to nest that deep takes orjson's verdict."""
    deep = b'{"user_id":"u1","timestamp":%d,"x":%s}' % (T0 + 1, b"[" * 1100 + b"]" * 1100)
    values = [*GOOD, deep, *GOOD]
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(100_000)
    try:
        assert _struct(values) is None
        assert columns.decode_columns(DECODER, FIELDS, values, NOW) is None
    finally:
        sys.setrecursionlimit(before)
    assert isinstance(DECODER.decode_parts(deep, NOW), BadRecord)


def test_a_record_of_many_long_numbers_hides_no_other_from_the_scan() -> None:
    """The long-number scan stops early on a batch with many hits: it must then leave the
    batch to orjson, not take the records after the last hit it looked at unchecked."""
    many = _event()[:-1] + b"".join(b',"n%d":%s' % (i, b"7" * 300) for i in range(12)) + b"}"
    overflow = _event()[:-1] + b',"x":' + b"9" * 400 + b"}"
    values = [*GOOD, many, overflow, *GOOD]
    assert isinstance(DECODER.decode_parts(overflow, NOW), BadRecord)
    assert not isinstance(DECODER.decode_parts(many, NOW), BadRecord)
    assert _struct(values) is None
    assert columns.decode_columns(DECODER, FIELDS, values, NOW) is None


def test_a_record_holding_a_newline_leaves_the_batch_to_orjson() -> None:
    """A record holding a newline (JSON whitespace) leaves the batch to orjson, as when
    records were decoded as the lines of one buffer, which it would split; the column path
    takes it."""
    values = [*GOOD, _event()[:-1] + b',\n"x":1}', *GOOD]
    assert _struct(values) is None
    cols = columns.decode_columns(DECODER, FIELDS, values, NOW)
    assert cols is not None
    _per_record_agrees(values, cols)


def test_a_batch_of_many_candidates_is_decoded_by_orjson_whole() -> None:
    """UUIDs hold ``3e4``-like runs: past one record in eight, msgspec's columns are not
    patched record by record — the batch goes to orjson (and still takes the column path)."""
    uuids = [_event(domain=f"{i}e8400-e29b") for i in range(16)]
    assert struct_decode._candidates(b"\n".join(uuids), uuids, 100) is None
    assert _struct(uuids) is None
    cols = columns.decode_columns(DECODER, FIELDS, uuids, NOW)
    assert cols is not None
    _per_record_agrees(uuids, cols)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.lists(st.sampled_from([b"a", b"{}", b"\n", b"\r", b" "]), max_size=8).map(b"".join),
        min_size=1,
        max_size=12,
    )
)
def test_longest_line_is_the_longest_value_unless_one_holds_a_newline(
    values: list[bytes],
) -> None:
    """What decode_columns reads the longest record's length from (the cap on a record's
    size and the scans' thresholds): the joined batch's newlines, when each value is a line."""
    longest = struct_decode.longest_line(b"\n".join(values), len(values))
    if any(b"\n" in v for v in values):
        assert longest is None, values
    else:
        assert longest == max(map(len, values)), values


def test_a_record_one_byte_over_the_cap_takes_the_per_record_path() -> None:
    """The cap on a record's size holds wherever the longest record is in its batch."""
    longest = _event(domain="x" * 10)

    def capped(max_record_bytes: int) -> Decoder:
        return Decoder(
            user_field="user_id",
            time_field="timestamp",
            max_record_bytes=max_record_bytes,
            max_future_s=300,
        )

    for at in range(4):
        values = [_event(), _event(), _event()]
        values.insert(at, longest)
        assert columns.decode_columns(capped(len(longest)), [], values, NOW) is not None, at
        assert columns.decode_columns(capped(len(longest) - 1), [], values, NOW) is None, at


def test_a_record_over_the_cap_holding_a_newline_is_refused() -> None:
    """A record over the size cap whose newline (JSON whitespace) cuts it into lines under
    the cap: the longest record is the record's length, not its longest line."""
    half = _event(domain="x" * 40)
    record = half[:-1] + b',\n"pad":"' + b"y" * 40 + b'"}'
    decoder = Decoder(
        user_field="user_id",
        time_field="timestamp",
        max_record_bytes=len(record) - 1,
        max_future_s=300,
    )
    assert max(map(len, record.split(b"\n"))) < decoder.max_record_bytes
    assert isinstance(decoder.decode_parts(record, NOW), BadRecord)
    assert columns.decode_columns(decoder, [], [_event(), record, _event()], NOW) is None
