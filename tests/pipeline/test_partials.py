"""The partials topic's records: encoding in parts, decoding, first-complete-version assembly,
merging per key, and the topic's JSON Schema."""

from __future__ import annotations

import dataclasses
import gc
import random
from typing import Any

import numpy as np
import orjson
import pytest

from stream_dp.pipeline.formats.partials import (
    RECORD_OVERHEAD_BYTES,
    WATERMARK_KEY_PREFIX,
    GroupKey,
    Partial,
    PartialAssembler,
    PartialFormatError,
    PartialPart,
    RecordTooLargeError,
    SourceWatermark,
    TotalsRows,
    decode,
    encode_partial,
    encode_watermark,
    merge_totals,
    new_version,
)
from stream_dp.pipeline.stages import partials_inbox
from stream_dp.pipeline.stages.ingest import IngestStage
from stream_dp.pipeline.stages.release_stage import ReleaseStage
from stream_dp.privacy.group_values import (
    JSON_FALSE,
    JSON_TRUE,
    JsonBool,
    canonical_key,
)
from stream_dp.privacy.key_totals import KeyTotals
from stream_dp.privacy.release import KeyAggregate
from stream_dp.windows import TumblingWindows
from tests.helpers import schema_validator
from tests.pipeline.support import (
    KEYRING,
    NOW,
    T0,
    WEIGHTED_VISITS,
    config,
    partials_as_totals,
    rec,
)

VALIDATOR = schema_validator("partials.schema.json")
NUMBERS = ("events", "users", "value_sums")
#: A small record limit, so that a few hundred keys already need several parts.
SMALL_BYTES = 8192


def _partial(
    totals: dict[GroupKey, KeyAggregate],
    *,
    version: str | None = None,
    source: int = 2,
    query: str = "visits",
    window_start_s: int = T0,
) -> Partial:
    return Partial(
        query=query,
        window_start_s=window_start_s,
        source_partition=source,
        version=version or new_version(),
        totals=totals,
        events_seen=sum(a.events for a in totals.values()) + 7,
        events_retained=sum(a.events for a in totals.values()),
    )


def _many_keys(n: int, scale: int = 1) -> dict[GroupKey, KeyAggregate]:
    return {(f"d{i}", i % 3): KeyAggregate(scale * (i + 2), i + 1, -scale * i) for i in range(n)}


def _parts(partial: Partial) -> list[PartialPart]:
    out = []
    for _, value in encode_partial(partial, max_bytes=SMALL_BYTES):
        part = decode(value)
        assert isinstance(part, PartialPart)
        out.append(part)
    return out


# -- encoding -------------------------------------------------------------------------------


def test_round_trip_in_parts_cut_by_encoded_size() -> None:
    partial = _partial(_many_keys(1000))
    encoded = encode_partial(partial, max_bytes=SMALL_BYTES)
    n = len(encoded)
    assert n >= 3
    assert all(len(key) + len(value) <= SMALL_BYTES - 512 for key, value in encoded)
    assert {key for key, _ in encoded} == {"visits|2020-08-01T00:00:00Z|2"}
    parts = [decode(value) for _, value in encoded]
    assert [(p.part, p.parts) for p in parts if isinstance(p, PartialPart)] == [
        (i, n) for i in range(n)
    ]
    # No key is in two parts, none is lost.
    keys = [k for p in parts if isinstance(p, PartialPart) for k, _ in p.totals]
    assert len(keys) == len(set(keys)) == len(partial.totals)
    assembler = PartialAssembler()
    added = [assembler.add(p) for p in parts if isinstance(p, PartialPart)]
    assert added == [False] * (n - 1) + [True]
    assert assembler.taken == partial


def test_long_group_keys_fit_under_the_message_limit() -> None:
    """~200-character keys (URLs) made a partial record exceed 1 MiB when parts were cut by
    key count, and the broker refused it for ever (issue 13, break 6)."""
    totals = {
        (f"https://example.com/{i:0180d}",): KeyAggregate(i % 7 + 1, i % 5 + 1, i)
        for i in range(20_000)
    }
    partial = _partial(totals)
    encoded = encode_partial(partial, max_bytes=1_000_000)
    assert len(encoded) >= 5
    assert all(len(key) + len(value) <= 1_000_000 - 512 for key, value in encoded)
    # Decoded, the parts hold every key once with its totals: the partial, nothing lost.
    parts = [decode(value) for _, value in encoded]
    assert all(isinstance(p, PartialPart) for p in parts)
    assembler = PartialAssembler()
    added = [assembler.add(p) for p in parts if isinstance(p, PartialPart)]
    assert added == [False] * (len(encoded) - 1) + [True]
    assert assembler.taken is not None
    assert assembler.taken.totals == totals
    assert assembler.taken == partial


def test_a_key_that_can_never_fit_is_a_clear_error() -> None:
    with pytest.raises(RecordTooLargeError, match=r"kafka\.max_message_bytes"):
        encode_partial(_partial({("x" * 9000,): KeyAggregate(1, 1, 0)}), max_bytes=SMALL_BYTES)


def test_round_trip_of_mixed_group_values_and_empty_totals() -> None:
    totals = {
        ("a", 1, 2.5, JSON_TRUE, None): KeyAggregate(3, 2, 40),
        (): KeyAggregate(1, 1, 0),
        ("ü€", -1, 0, JSON_FALSE, "x"): KeyAggregate(0, 0, -5),
        (2**64 - 1, -(2**63), 1e300): KeyAggregate(1, 1, 1),
    }
    for partial in (_partial(totals), _partial({})):
        (part,) = _parts(partial)
        assert (part.part, part.parts) == (0, 1)
        assembler = PartialAssembler()
        assert assembler.add(part)
        assert assembler.taken == partial
        # Canonical group values keep their types (true stays a boolean, 1 an int).
        assert sorted(map(repr, assembler.taken.totals)) == sorted(map(repr, partial.totals))


def test_selection_weights_travel_only_when_the_query_has_them() -> None:
    """weighted_gaussian's per-key weight sums are a column of their own: they survive the
    parts, and the other strategies' partials carry no such column."""
    weighted = {(f"d{i}",): KeyAggregate(i + 2, i + 1, 0, 4096 * (i + 1) - i) for i in range(600)}
    partial = _partial(weighted)
    parts = _parts(partial)
    assert len(parts) >= 2
    records = [orjson.loads(v) for _, v in encode_partial(partial, max_bytes=SMALL_BYTES)]
    assert all(set(r["columns"]) == {"groups", *NUMBERS, "selection_weights"} for r in records)
    for record in records:
        VALIDATOR.validate(record)
    assembler = PartialAssembler()
    assert [assembler.add(p) for p in parts][-1]
    assert assembler.taken == partial
    plain = encode_partial(_partial(_many_keys(10)), max_bytes=SMALL_BYTES)
    assert {tuple(orjson.loads(v)["columns"]) for _, v in plain} == {("groups", *NUMBERS)}
    # stage 2 sums them per key, like the counts
    other = _partial({("d0",): KeyAggregate(1, 1, 0, 2896)}, source=3)
    assert merge_totals([partial, other])[("d0",)] == KeyAggregate(3, 2, 0, 4096 + 2896)
    negative = {"groups": [["a"]], "events": [1], "users": [1], "value_sums": [0]}
    assert not VALIDATOR.is_valid({**records[0], "columns": negative | {"selection_weights": [-1]}})
    assert VALIDATOR.is_valid({**records[0], "columns": negative | {"selection_weights": [1]}})


def test_variance_squares_travel_as_a_column_and_merge_by_addition() -> None:
    """statistic: variance keeps Σ (v − c)² per key: a column of its own (no weights column
    beside it), across parts, valid under the schema, summed per key over source
    partitions."""
    squared = {(f"d{i}",): KeyAggregate(i + 2, i + 1, 5 * i, 0, 90_000 * i + 7) for i in range(600)}
    partial = _partial(squared)
    parts = _parts(partial)
    assert len(parts) >= 2
    records = [orjson.loads(v) for _, v in encode_partial(partial, max_bytes=SMALL_BYTES)]
    assert all(set(r["columns"]) == {"groups", *NUMBERS, "value_squares"} for r in records)
    assert records[0]["columns"]["value_squares"][0] == 7
    for record in records:
        VALIDATOR.validate(record)
    assembler = PartialAssembler()
    assert [assembler.add(p) for p in parts][-1]
    assert assembler.taken == partial
    other = _partial({("d1",): KeyAggregate(1, 1, 3, 0, 40_000)}, source=3)
    merged = merge_totals([partial, other])[("d1",)]
    assert merged == KeyAggregate(4, 3, 8, 0, 90_007 + 40_000)
    negative = {"groups": [["a"]], "events": [1], "users": [1], "value_sums": [0]}
    assert not VALIDATOR.is_valid({**records[0], "columns": negative | {"value_squares": [-1]}})


def test_a_weighted_query_seals_its_users_weights() -> None:
    queries = [
        WEIGHTED_VISITS,
        {"name": "plain", "group_by": ["domain"], "epsilon": 1e6, "delta": 1e-6},
    ]
    cfg = config(queries=queries, k=10, delta_per_window=2e-6)
    stage = IngestStage(cfg, KEYRING, sampling_rng=random.Random(0))
    # u visits a, b, c; v visits a twice; w visits b
    records = [
        rec(0, "u", 1),
        rec(1, "u", 2, "b"),
        rec(2, "u", 3, "c"),
        rec(3, "v", 4),
        rec(4, "v", 5),
        rec(5, "w", 6, "b"),
    ]
    stage.ingest(0, records, now_s=NOW, now_mono_s=0)
    weighted, plain = stage.seal(0, T0)
    w1, w3 = 4096, 2364  # floor(4096 / sqrt(d)) for d = 1, 3
    assert dict(weighted.totals) == {
        ("a",): KeyAggregate(3, 2, 0, w3 + w1),
        ("b",): KeyAggregate(2, 2, 0, w3 + w1),
        ("c",): KeyAggregate(1, 1, 0, w3),
    }
    assert all(a.selection_weight == 0 for a in plain.totals.values())
    for partial in (weighted, plain):
        for _, value in encode_partial(partial, max_bytes=SMALL_BYTES):
            VALIDATOR.validate(orjson.loads(value))


def test_partials_keep_json_true_apart_from_one_when_stage_2_merges() -> None:
    """Break 7 at stage 2: totals arrive keyed by decoded JSON arrays; a Python dict would
    merge [true] and [1] (True == 1) into one key labelled by whichever came first."""
    first = _partial({(JSON_TRUE,): KeyAggregate(1, 1, 0)}, source=0)
    second = _partial({(1,): KeyAggregate(600, 600, 0)}, source=1)
    third = _partial({(1.5,): KeyAggregate(2, 2, 0), (1,): KeyAggregate(5, 5, 0)}, source=2)
    taken = []
    for partial in (first, second, third):
        assembler = PartialAssembler()
        for value in [v for _, v in encode_partial(partial, max_bytes=SMALL_BYTES)]:
            item = decode(value)
            assert isinstance(item, PartialPart)
            assembler.add(item)
        assert assembler.taken is not None
        taken.append(assembler.taken)
    merged = merge_totals(taken)
    assert merged == {
        (JSON_TRUE,): KeyAggregate(1, 1, 0),
        (1,): KeyAggregate(605, 605, 0),
        (1.5,): KeyAggregate(2, 2, 0),
    }
    assert [type(k[0]) for k in merged] == [JsonBool, int, float]


def test_partials_decode_json_scalars_into_canonical_form() -> None:
    value = orjson.dumps(
        {
            "schema_version": 1,
            "kind": "partial",
            "query": "visits",
            "window_start": "2020-08-01T00:00:00Z",
            "source_partition": 0,
            "version": "v",
            "part": 0,
            "parts": 1,
            "events_seen": 3,
            "events_retained": 3,
            "totals": [[[True, 1.0, -0.0, 2.5], 3, 1, 0]],
        }
    )
    item = decode(value)
    assert isinstance(item, PartialPart)
    ((key, _),) = item.totals
    assert key == (JSON_TRUE, 1, 0, 2.5)
    assert [type(v) for v in key] == [JsonBool, int, int, float]


@pytest.mark.parametrize("watermark_s", [T0 + 9.5, None, 0.0])
@pytest.mark.parametrize(
    ("idle", "open_windows", "idle_for_s"), [(False, True, 0.0), (True, False, 12.25)]
)
def test_watermark_round_trip(
    watermark_s: float | None, idle: bool, open_windows: bool, idle_for_s: float
) -> None:
    mark = SourceWatermark(3, 4, watermark_s, idle, open_windows, idle_for_s)
    key, value = encode_watermark(mark)
    assert key == f"{WATERMARK_KEY_PREFIX}3"
    assert decode(value) == mark


def test_windows_spread_over_partitions_consecutively() -> None:
    windows = TumblingWindows(10, 1)
    got = [windows.partition_of(T0 + i * 10, 6) for i in range(12)]
    first = (T0 // 10) % 6
    assert got == [(first + i) % 6 for i in range(12)]
    assert windows.partition_of(T0 + 5 * 10, 1) == 0


# -- decoding errors ------------------------------------------------------------------------

_GOOD_PARTIAL: dict[str, Any] = orjson.loads(
    encode_partial(_partial({("a",): KeyAggregate(1, 1, 0)}), max_bytes=SMALL_BYTES)[0][1]
)
#: The same part as a worker before the columns form wrote it (entries per key, "totals").
_LEGACY_PARTIAL: dict[str, Any] = orjson.loads(partials_as_totals(orjson.dumps(_GOOD_PARTIAL)))
_COLUMNS: dict[str, Any] = _GOOD_PARTIAL["columns"]
_GOOD_MARK: dict[str, Any] = orjson.loads(
    encode_watermark(SourceWatermark(0, 1, 5.0, True, False, 7.5))[1]
)


def _broken(base: dict[str, Any], **changes: Any) -> bytes:
    return orjson.dumps({**base, **changes})


def _without(base: dict[str, Any], key: str) -> bytes:
    return orjson.dumps({k: v for k, v in base.items() if k != key})


@pytest.mark.parametrize(
    "value",
    [
        None,
        b"",
        b"\xff\xfe",
        b"not json",
        b"[]",
        b'"partial"',
        b"17",
        b"{}",
        _broken(_GOOD_PARTIAL, kind="checkpoint"),
        _without(_GOOD_PARTIAL, "version"),
        _without(_GOOD_PARTIAL, "columns"),
        _without(_LEGACY_PARTIAL, "totals"),
        _broken(_GOOD_PARTIAL, window_start="yesterday"),
        _broken(_GOOD_PARTIAL, part="first"),
        _broken(_GOOD_PARTIAL, part=1, parts=1),
        _broken(_GOOD_PARTIAL, part=-1),
        _broken(_GOOD_PARTIAL, source_partition=None),
        _broken(_LEGACY_PARTIAL, totals=[[["a"], 1, 1]]),
        _broken(_LEGACY_PARTIAL, totals=[[["a"], "many", 1, 0]]),
        _broken(_LEGACY_PARTIAL, totals={"a": 1}),
        _broken(_LEGACY_PARTIAL, totals=[[["a"], 1, 1, 0, -4096]]),  # a negative weight
        _broken(_LEGACY_PARTIAL, totals=[[["a"], 1, 1, 0, 4096, 1, 1]]),  # seven items
        _broken(_LEGACY_PARTIAL, totals=[[["a"], 1, 1, 0, 0, -1]]),  # a negative square sum
        _broken(_LEGACY_PARTIAL, totals=[["a", 1, 1, 0]]),  # group key not a list
        _broken(_LEGACY_PARTIAL, totals=[[["a"], 1, 1, 0], 7]),  # an entry not a list
        _broken(_LEGACY_PARTIAL, totals=[[["a"], 1, 1, 0], [["a"], 2, 2, 0]]),  # a key twice
        _broken(_LEGACY_PARTIAL, totals=[[["a"], 1, 1, 0], [["b"], 1, None, 0, 3]]),
        _broken(_GOOD_PARTIAL, totals=[[["a"], 1, 1, 0]]),  # columns and totals: which?
        _broken(_GOOD_PARTIAL, columns=[[["a"], 1, 1, 0]]),
        _broken(_GOOD_PARTIAL, columns={**_COLUMNS, "users": [1, 2]}),  # lengths differ
        _broken(_GOOD_PARTIAL, columns={**_COLUMNS, "users": ["many"]}),
        _broken(_GOOD_PARTIAL, columns={**_COLUMNS, "users": [True]}),
        _broken(_GOOD_PARTIAL, columns={**_COLUMNS, "users": [1.0]}),
        _broken(_GOOD_PARTIAL, columns={**_COLUMNS, "users": [2**63]}),
        _broken(_GOOD_PARTIAL, columns={**_COLUMNS, "users": None}),
        _broken(_GOOD_PARTIAL, columns={**_COLUMNS, "events": [-1]}),
        _broken(_GOOD_PARTIAL, columns={**_COLUMNS, "selection_weights": [-4096]}),
        _broken(_GOOD_PARTIAL, columns={**_COLUMNS, "value_squares": [-1]}),
        _broken(_GOOD_PARTIAL, columns={**_COLUMNS, "value_squares": []}),
        _broken(_GOOD_PARTIAL, columns={**_COLUMNS, "user_ids": [["alice"]]}),
        _broken(_GOOD_PARTIAL, columns={k: v for k, v in _COLUMNS.items() if k != "events"}),
        _broken(_GOOD_PARTIAL, columns={**_COLUMNS, "groups": ["a"]}),  # key not a list
        _broken(_GOOD_PARTIAL, columns={**_COLUMNS, "groups": [[["a"]]]}),  # unhashable
        _broken(  # a key twice
            _GOOD_PARTIAL,
            columns={"groups": [["a"], ["a"]], **{n: [1, 1] for n in NUMBERS}},
        ),
        _broken(_GOOD_PARTIAL, columns={**_COLUMNS, "bins": 4}),  # without its columns
        _broken(  # a bin index out of range
            _GOOD_PARTIAL,
            columns={**_COLUMNS, "bins": 4, "bin_sizes": [1], "bin_index": [4], "bin_counts": [1]},
        ),
        _broken(  # sizes that do not add up to the entries
            _GOOD_PARTIAL,
            columns={**_COLUMNS, "bins": 4, "bin_sizes": [2], "bin_index": [1], "bin_counts": [1]},
        ),
        _broken(  # indices not increasing within a key
            _GOOD_PARTIAL,
            columns={
                **_COLUMNS,
                "bins": 4,
                "bin_sizes": [2],
                "bin_index": [2, 1],
                "bin_counts": [1, 1],
            },
        ),
        _broken(  # a count of 0
            _GOOD_PARTIAL,
            columns={**_COLUMNS, "bins": 4, "bin_sizes": [1], "bin_index": [1], "bin_counts": [0]},
        ),
        _without(_GOOD_MARK, "idle"),
        _broken(_GOOD_MARK, watermark_s="soon"),
        _broken(_GOOD_MARK, source_partitions=[1]),
        _broken(_GOOD_MARK, idle_for_s="long"),
        _broken(_GOOD_MARK, idle_for_s=None),
    ],
    ids=lambda v: repr(v)[:60],
)
def test_malformed_records_raise_partial_format_error(value: bytes | None) -> None:
    with pytest.raises(PartialFormatError):
        decode(value)


def test_entries_with_and_without_a_selection_weight_decode_into_one_set_of_columns() -> None:
    totals = [[["a"], 3, 2, 0], [["b", True], 5, 4, 1, 4096], [[None], 1, 1, -2]]
    part = decode(_broken(_LEGACY_PARTIAL, totals=totals))
    assert isinstance(part, PartialPart)
    assert isinstance(part.totals, TotalsRows)
    columns = part.totals.columns
    assert columns.groups == [("a",), ("b", JSON_TRUE), (None,)]
    assert columns.events.tolist() == [3, 5, 1]
    assert columns.users.tolist() == [2, 4, 1]
    assert columns.value_sums.tolist() == [0, 1, -2]
    assert columns.selection_weights.tolist() == [0, 4096, 0]


def test_the_unbroken_bases_decode() -> None:
    """The error cases above differ from these only in what they break."""
    assert isinstance(decode(orjson.dumps(_GOOD_PARTIAL)), PartialPart)
    assert isinstance(decode(orjson.dumps(_LEGACY_PARTIAL)), PartialPart)
    legacy, columns = decode(orjson.dumps(_LEGACY_PARTIAL)), decode(orjson.dumps(_GOOD_PARTIAL))
    assert isinstance(legacy, PartialPart) and isinstance(columns, PartialPart)
    assert dataclasses.replace(legacy, totals=()) == dataclasses.replace(columns, totals=())
    assert list(legacy.totals) == list(columns.totals) == [(("a",), KeyAggregate(1, 1, 0))]
    quantile = {**_COLUMNS, "bins": 4, "bin_sizes": [2], "bin_index": [1, 3], "bin_counts": [1, 5]}
    part = decode(_broken(_GOOD_PARTIAL, columns=quantile))
    assert isinstance(part, PartialPart) and next(iter(part.totals))[1].value_bins == (0, 1, 0, 5)
    assert isinstance(decode(orjson.dumps(_GOOD_MARK)), SourceWatermark)
    assert issubclass(PartialFormatError, ValueError)


def test_a_watermark_written_without_idle_for_s_reads_as_zero() -> None:
    """Marks of a stage 1 from before ``idle_for_s``: never confirmed idle by growth alone."""
    old = _without(_GOOD_MARK, "idle_for_s")
    mark = decode(old)
    assert isinstance(mark, SourceWatermark) and mark.idle_for_s == 0.0
    assert VALIDATOR.is_valid(orjson.loads(old))


# -- the first complete version, never a sum of two -----------------------------------------


def _two_versions() -> tuple[Partial, Partial, list[PartialPart], list[PartialPart]]:
    a = _partial(_many_keys(400, scale=1), version="a" * 32)
    b = _partial(_many_keys(400, scale=100), version="b" * 32)
    parts_a, parts_b = _parts(a), _parts(b)
    assert len(parts_a) == len(parts_b) == 2
    return a, b, parts_a, parts_b


def test_interleaved_versions_take_the_first_completed() -> None:
    _, b, (a0, a1), (b0, b1) = _two_versions()
    assembler = PartialAssembler()
    assert [assembler.add(p) for p in (a0, b0, b1, a1)] == [False, False, True, False]
    assert assembler.taken == b
    assert assembler.taken.totals == b.totals  # b's numbers alone: nothing of a added


def test_incomplete_first_version_then_a_complete_second() -> None:
    _, b, (a0, _), (b0, b1) = _two_versions()
    assembler = PartialAssembler()
    assert assembler.add(a0) is False
    assert assembler.add(b1) is False
    assert assembler.add(b0) is True
    assert assembler.taken == b
    # A complete third version later changes nothing.
    c = _partial(_many_keys(3, scale=1000))
    assert [assembler.add(p) for p in _parts(c)] == [False]
    assert assembler.taken == b


def test_a_part_delivered_twice_does_not_complete_a_version() -> None:
    _, _, (a0, a1), _ = _two_versions()
    assembler = PartialAssembler()
    assert [assembler.add(p) for p in (a0, a0)] == [False, False]
    assert assembler.taken is None
    assert assembler.add(a1) is True


# -- merging --------------------------------------------------------------------------------


def test_merge_totals_sums_per_key() -> None:
    p0 = _partial({("a",): KeyAggregate(3, 1, 10), ("b",): KeyAggregate(2, 2, -4)}, source=0)
    p1 = _partial({("a",): KeyAggregate(5, 4, 1)}, source=1)
    p2 = _partial({("c",): KeyAggregate(1, 1, 7), ("b",): KeyAggregate(1, 1, 1)}, source=2)
    assert merge_totals([p0, p1, p2]) == {
        ("a",): KeyAggregate(8, 5, 11),
        ("b",): KeyAggregate(3, 3, -3),
        ("c",): KeyAggregate(1, 1, 7),
    }
    assert merge_totals([p1]) == {("a",): KeyAggregate(5, 4, 1)}
    assert merge_totals([]) == {}
    assert p0.totals == {("a",): KeyAggregate(3, 1, 10), ("b",): KeyAggregate(2, 2, -4)}


# -- the schema -----------------------------------------------------------------------------


def test_every_encoded_record_validates_against_the_schema() -> None:
    partials = [
        _partial(_many_keys(400)),
        _partial({}),
        _partial({("a", 1, 2.5, True, None): KeyAggregate(3, 2, -40), (): KeyAggregate(1, 1, 0)}),
    ]
    records = [value for p in partials for _, value in encode_partial(p, max_bytes=SMALL_BYTES)]
    records += [
        encode_watermark(SourceWatermark(p, 3, wm, idle, open_windows, idle_for))[1]
        for p, wm, idle, open_windows, idle_for in [
            (0, T0 + 9.5, False, True, 0.0),
            (2, None, True, False, 12.25),
        ]
    ]
    assert len(records) == 2 + 1 + 1 + 2  # the 400 keys take two parts
    assert orjson.loads(records[-1])["idle_for_s"] == 12.25
    for value in records:
        VALIDATOR.validate(orjson.loads(value))


def test_stage_one_partials_validate_against_the_schema() -> None:
    stage = IngestStage(config(), KEYRING, sampling_rng=random.Random(0))
    stage.ingest(0, [rec(0, "u", 1), rec(1, "v", 2, "b"), rec(2, 7, 3)], now_s=NOW, now_mono_s=0)
    sealed = stage.seal(0, T0)
    assert [p.query for p in sealed] == ["visits", "all"]
    assert len({p.version for p in sealed}) == 1  # one version per seal, for every query
    for partial in sealed:
        for _, value in encode_partial(partial, max_bytes=SMALL_BYTES):
            VALIDATOR.validate(orjson.loads(value))
    marks = [*stage.watermarks(0), *stage.watermarks(30)]  # active, then idle
    assert [m.idle_for_s for m in marks] == [0.0, 30.0]
    for mark in marks:
        VALIDATOR.validate(orjson.loads(encode_watermark(mark)[1]))


def test_the_schema_rejects_what_decode_rejects() -> None:
    """The schema is not vacuous: broken records fail it too."""
    for value in (
        _without(_GOOD_PARTIAL, "version"),
        _broken(_GOOD_PARTIAL, version="not-hex"),
        _broken(_LEGACY_PARTIAL, totals=[[["a"], 1, 1]]),
        _broken(_GOOD_PARTIAL, totals=_LEGACY_PARTIAL["totals"]),  # both forms
        _without(_GOOD_PARTIAL, "columns"),
        _broken(_GOOD_PARTIAL, columns={**_COLUMNS, "users": [-1]}),
        _broken(_GOOD_PARTIAL, columns={**_COLUMNS, "user_ids": [["alice"]]}),
        _broken(_GOOD_PARTIAL, columns={k: v for k, v in _COLUMNS.items() if k != "events"}),
        _broken(_GOOD_PARTIAL, user_id="alice"),
        _without(_GOOD_MARK, "idle"),
        _broken(_GOOD_MARK, kind="checkpoint"),
        _broken(_GOOD_MARK, idle_for_s="long"),
        _broken(_GOOD_MARK, idle_for_s=None),
    ):
        assert not VALIDATOR.is_valid(orjson.loads(value)), value
    # Decoding takes any number; the schema says how long a partition was idle: never < 0.
    assert not VALIDATOR.is_valid({**_GOOD_MARK, "idle_for_s": -0.5})
    assert VALIDATOR.is_valid(_GOOD_MARK)
    assert VALIDATOR.is_valid(_GOOD_PARTIAL) and VALIDATOR.is_valid(_LEGACY_PARTIAL)


def test_stage_2_decodes_partials_with_cyclic_collection_paused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A part decodes into ~100,000 lists; collections they trigger traversed the whole
    process (5x the decoding of a 1,000,000-key window). Reference counting frees them."""
    seen: list[bool] = []

    def recording(value: bytes | None) -> PartialPart | SourceWatermark:
        seen.append(gc.isenabled())
        return decode(value)

    monkeypatch.setattr(partials_inbox, "decode", recording)
    stage = ReleaseStage(config())
    stage.assign([0])
    assert gc.isenabled()
    stage.ingest(
        0,
        [
            (0, _broken(_GOOD_PARTIAL)),
            (1, encode_watermark(SourceWatermark(0, 1, 5.0, False, False))[1]),
        ],
    )
    assert seen == [False, False]
    assert gc.isenabled()  # and on again after


def _random_group(rng: random.Random) -> GroupKey:
    """A canonical group key of 0 to 3 values of every kind a key holds, strings with
    JSON escapes and non-ASCII characters among them."""
    values: list[Any] = [
        None,
        JSON_TRUE,
        JSON_FALSE,
        rng.randrange(-(2**63), 2**63),
        rng.choice([0.5, -1e300, 2.25e-7, -2.5]),
        "".join(rng.choice('ab"\\\n\x01é€😀/') for _ in range(rng.randrange(6))),
    ]
    return tuple(rng.choice(values) for _ in range(rng.randrange(4)))


def _random_totals(rng: random.Random, n: int, statistic: str) -> KeyTotals:
    """Totals of up to ``n`` distinct random keys (every kind of group value), numbers up
    to int64's extremes, with the columns ``statistic`` adds."""
    groups = list(dict.fromkeys(_random_group(rng) for _ in range(n)))
    n = len(groups)
    extremes = [2**63 - 1, 0, 9, 10]

    def column(low: int = 0) -> np.ndarray:
        return np.array(
            [
                rng.choice(extremes) if rng.random() < 0.2 else rng.randrange(low, 10**9)
                for _ in range(n)
            ],
            dtype=np.int64,
        )

    return KeyTotals(
        groups,
        column(),
        column(),
        column(low=-(10**9)),
        selection_weights=column() if statistic in ("weighted", "variance") else None,
        value_squares=column() if statistic == "variance" else None,
        value_bins=np.array([[rng.randrange(9) for _ in range(3)] for _ in range(n)])
        if statistic == "quantile" and n
        else None,
    )


@pytest.mark.parametrize("statistic", ["count", "weighted", "variance", "quantile"])
def test_a_partial_is_cut_into_parts_under_the_limit_holding_every_key_once(
    statistic: str,
) -> None:
    """Whatever the keys, the statistic's columns and the limit (one where the whole just
    fits, one byte less, small ones), every record stays under the limit, the parts are
    consecutive slices of the keys, and stage 2 assembles exactly the sealed totals."""
    rng = random.Random(43)
    for trial in range(40):
        totals = _random_totals(rng, rng.choice([0, 1, 2, 5, 40, 333]), statistic)
        partial = dataclasses.replace(_partial({}, query=f"q{trial}"), totals=totals)
        ((_, one),) = encode_partial(partial, max_bytes=1 << 24)
        # The least limit one record could meet (the encoder keeps a few bytes spare).
        edge = len(one) + len(f"q{trial}|2020-08-01T00:00:00Z|2") + RECORD_OVERHEAD_BYTES
        limits = [edge + 64, 4096, SMALL_BYTES]
        limits += [edge - 1] if len(totals) >= 2 and edge > 4096 else []
        for max_bytes in limits:
            records = encode_partial(partial, max_bytes=max_bytes)
            assert all(len(k) + len(v) + RECORD_OVERHEAD_BYTES <= max_bytes for k, v in records)
            if max_bytes >= edge + 64:
                assert len(records) == 1, (trial, max_bytes)
            elif max_bytes < edge:
                assert len(records) >= 2, (trial, max_bytes)
            groups = [g for _, v in records for g in orjson.loads(v)["columns"]["groups"]]
            assert [canonical_key(g) for g in groups] == totals.groups
            assembler = PartialAssembler()
            assert [assembler.add(p) for p in map(decode, (v for _, v in records))][-1]
            taken = assembler.taken
            assert taken is not None and isinstance(taken.totals, KeyTotals)
            assert [tuple(map(repr, g)) for g in taken.totals.groups] == [
                tuple(map(repr, g)) for g in totals.groups
            ]
            for name in (*NUMBERS, "selection_weights", "value_squares"):
                assert np.array_equal(getattr(taken.totals, name), getattr(totals, name))
            assert taken.totals.value_bins == totals.value_bins
