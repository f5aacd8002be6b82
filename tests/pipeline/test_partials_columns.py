"""Stage 2's msgspec path for a part's ``columns`` member
(stream_dp/pipeline/formats/partials_columns.py) gives exactly what orjson and the general
reader give, or leaves the record to them: checked differentially on stage 1's records,
on members edited to hit what the two parsers or the checks treat differently, and on
random byte edits."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import orjson
import pytest

from stream_dp.pipeline.formats.partials import (
    Partial,
    PartialPart,
    decode,
    encode_partial,
    new_version,
)
from stream_dp.pipeline.formats.partials_columns import columns_partial
from stream_dp.privacy.group_values import JSON_TRUE
from stream_dp.privacy.key_totals import KeyTotals
from tests.pipeline.partials_paths import both, byte_edited, plain_value

T0 = 1_596_240_000
MEMBER = b',"columns":'


def _both(value: bytes, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """(with the msgspec path, orjson and the general reader alone)."""
    return both(value, monkeypatch, "columns_partial")


def _record(
    rng: random.Random,
    n: int,
    groups: list[tuple[Any, ...]] | None = None,
    statistic: str = "count",
) -> bytes:
    if groups is None:
        groups = list(
            dict.fromkeys(
                tuple(plain_value(rng) for _ in range(rng.randrange(4))) for _ in range(n)
            )
        )
    n = len(groups)

    def column(low: int) -> np.ndarray:
        return np.array([rng.randrange(low, 10**12) for _ in range(n)], dtype=np.int64)

    totals = KeyTotals(
        groups,
        column(0),
        column(0),
        column(-(10**12)),
        selection_weights=column(0) if statistic in ("weighted", "variance") else None,
        value_squares=column(0) if statistic == "variance" else None,
        value_bins=np.array([[rng.randrange(3) for _ in range(5)] for _ in range(n)])
        if statistic == "quantile" and n
        else None,
    )
    partial = Partial(
        query=rng.choice(["visits", 'q"\\é']),
        window_start_s=T0,
        source_partition=rng.randrange(4),
        version=new_version(),
        totals=totals,
        events_seen=7,
        events_retained=5,
        key_id="k1",
        fingerprint="f" * 16,
        key_check="c" * 8,
        erasures_through=rng.choice([0, 3]),
    )
    ((_, value),) = encode_partial(partial, max_bytes=1 << 22)
    return value


@pytest.mark.parametrize("statistic", ["count", "weighted", "variance", "quantile"])
def test_stage_ones_records_take_the_msgspec_path_and_decode_as_by_orjson(
    statistic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(43)
    for trial in range(150):
        value = _record(rng, rng.choice([0, 1, 2, 30]), statistic=statistic)
        assert columns_partial(value) is not None, trial  # the path under test is taken
        fast, slow = _both(value, monkeypatch)
        assert fast[0] == "part", (trial, fast)
        assert fast == slow, trial


# Members spliced into a valid record: each is either read alike or left to orjson.
_MEMBERS = [
    b'{"groups":[],"events":[],"users":[],"value_sums":[]}',
    b'{"groups":[["a"]],"events":[1],"users":[2],"value_sums":[3]}',
    b' { "groups" : [ ["a"] ] ,"events":[1],"users":[2],"value_sums":[3] }\n',
    b'{"events":[1],"users":[2],"value_sums":[3],"groups":[["a",null,-5]]}',
    b'{"groups":[["a"],["a"]],"events":[1,1],"users":[2,2],"value_sums":[3,3]}',
    b'{"groups":[["a"]],"events":[1.0],"users":[2],"value_sums":[3]}',
    b'{"groups":[["a"]],"events":[1e2],"users":[2],"value_sums":[3]}',
    b'{"groups":[["a"]],"events":[true],"users":[2],"value_sums":[3]}',
    b'{"groups":[["a"]],"events":[-1],"users":[2],"value_sums":[3]}',
    b'{"groups":[["a"]],"events":[1],"users":[2],"value_sums":[-9223372036854775809]}',
    b'{"groups":[["a"]],"events":[1],"users":[2],"value_sums":[9223372036854775808]}',
    b'{"groups":[["a"]],"events":[1],"users":[2],"value_sums":[-9223372036854775808]}',
    b'{"groups":[["a"]],"events":[9223372036854775807],"users":[2],"value_sums":[3]}',
    b'{"groups":[[true]],"events":[1],"users":[2],"value_sums":[3]}',
    b'{"groups":[[1.0]],"events":[1],"users":[2],"value_sums":[3]}',
    b'{"groups":[[1.5]],"events":[1],"users":[2],"value_sums":[3]}',
    b'{"groups":[[18446744073709551615]],"events":[1],"users":[2],"value_sums":[3]}',
    b'{"groups":[[18446744073709551616]],"events":[1],"users":[2],"value_sums":[3]}',
    b'{"groups":[[-9223372036854775809]],"events":[1],"users":[2],"value_sums":[3]}',
    b'{"groups":[[9223372036854775808]],"events":[1],"users":[2],"value_sums":[3]}',
    b'{"groups":[["\\ud800"]],"events":[1],"users":[2],"value_sums":[3]}',
    b'{"groups":[["\\ud83d\\ude00"]],"events":[1],"users":[2],"value_sums":[3]}',
    b'{"groups":[["\xed\xa0\x80"]],"events":[1],"users":[2],"value_sums":[3]}',
    b'{"groups":[["\xff"]],"events":[1],"users":[2],"value_sums":[3]}',
    b'{"groups":[["a\x01"]],"events":[1],"users":[2],"value_sums":[3]}',
    b'{"groups":[["\\u0000\\"\\/"]],"events":[1],"users":[2],"value_sums":[3]}',
    b'{"groups":[[]],"events":[1],"users":[2],"value_sums":[3]}',
    b'{"groups":[["a"]],"events":[1],"users":[2]}',
    b'{"groups":[["a"]],"events":[1],"users":[2],"value_sums":[3],"x":[]}',
    b'{"groups":[["a"]],"events":[1],"users":[2],"value_sums":[3],"value_squares":null}',
    b'{"groups":[["a"]],"events":[1],"users":[2],"value_sums":[3],"value_squares":[-1]}',
    b'{"groups":[["a"]],"events":[1],"users":[2],"value_sums":[3],"selection_weights":[]}',
    b'{"groups":[["a"]],"events":[1],"users":[2],"value_sums":[3],"events":[4]}',
    b'{"groups":[["a"]],"events":[1],"users":[2],"value_sums":[3],"bins":4}',
    b'{"groups":[["a"]],"events":[1],"users":[2],"value_sums":[3],"bins":4,"bin_sizes":[1],'
    b'"bin_index":[3],"bin_counts":[2]}',
    b'{"groups":[["a"]],"events":[1],"users":[2],"value_sums":[3],"bins":4,"bin_sizes":[1],'
    b'"bin_index":[4],"bin_counts":[2]}',
    b'{"groups":[["a"]],"events":[1],"users":[2],"value_sums":[3],"bins":4,"bin_sizes":[2],'
    b'"bin_index":[2,1],"bin_counts":[1,1]}',
    b'{"groups":[["a"]],"events":[1],"users":[2],"value_sums":[3],"bins":0,"bin_sizes":[0],'
    b'"bin_index":[],"bin_counts":[]}',
    b'{"groups":[["a"]],"events":[1],"users":[2],"value_sums":[3],"bins":true,"bin_sizes":[0],'
    b'"bin_index":[],"bin_counts":[]}',
    b'{"groups":[["a"]],"events":[1],"users":[2],"value_sums":[3]},',
    b'{"groups":[["a"]],"events":[1],"users":[2],"value_sums":[3]} x',
    b'{"groups":[["a"]],"events":[1],"users":[2],"value_sums":[3]',
    b'{"groups":["a"],"events":[1],"users":[2],"value_sums":[3]}',
    b'{"groups":[["a"]],"events":[1],"users":[2],"value_sums":[3]} ,"columns":{}',
    b'\xef\xbb\xbf{"groups":[],"events":[],"users":[],"value_sums":[]}',
    b"[]",
    b"{}",
    b"null",
]


@pytest.mark.parametrize("member", _MEMBERS)
def test_edited_members_decode_as_by_orjson(member: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(member)
    base = _record(rng, 1)
    at = base.rindex(MEMBER) + len(MEMBER)
    for value in (base[:at] + member + b"}", base[:at] + member + b" }"):
        fast, slow = _both(value, monkeypatch)
        assert fast == slow, value


@pytest.mark.parametrize(
    "edit",
    [
        lambda v: v.replace(b'"kind":"partial"', b'"kind":"watermark"'),
        lambda v: v.replace(b'"part":0', b'"part":2'),
        lambda v: v.replace(b'"version":', b'"version":1,"version":'),
        lambda v: v.replace(b'"events_seen":7', b'"events_seen":"7"'),
        lambda v: v.replace(b'{"schema_version"', b'{"totals":[[["z"],1,1,1]],"schema_version"'),
        lambda v: v.replace(b'{"schema_version"', b'{"columns":{},"schema_version"'),
        lambda v: v.replace(MEMBER, b',"columns":{},"columns":'),
        lambda v: v.replace(MEMBER, b', "columns":'),
        lambda v: v[:-1] + b',"x":1}',
        lambda v: v[:-1] + b',"totals":[]}',
        lambda v: v[:-1] + b"}}",
        lambda v: v + b" ",
        lambda v: b"{" + v[v.index(MEMBER) :],
        lambda v: b'{"kind":"partial"' + v[v.index(MEMBER) :],
        lambda v: v[: len(v) // 2],
    ],
)
def test_edited_records_decode_as_by_orjson(edit: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(7)
    for n in (0, 1, 3):
        value = edit(_record(rng, n))
        fast, slow = _both(value, monkeypatch)
        assert fast == slow, value


def test_random_byte_edits_decode_as_by_orjson(monkeypatch: pytest.MonkeyPatch) -> None:
    """A byte of a record replaced, deleted or inserted, 3,000 times."""
    rng = random.Random(4343)
    for trial in range(3000):
        statistic = rng.choice(["count", "variance", "quantile"])
        value = byte_edited(rng, _record(rng, rng.choice([1, 2, 5]), statistic=statistic))
        fast, slow = _both(value, monkeypatch)
        assert fast == slow, (trial, value)


def test_group_values_that_take_a_canonical_form_are_left_to_orjson() -> None:
    """Booleans and floats take a canonical form: those records are read by the general
    path, and read right."""
    rng = random.Random(5)
    for group, canonical in (((JSON_TRUE,), (JSON_TRUE,)), ((0.5,), (0.5,))):
        value = _record(rng, 0, groups=[group])
        assert columns_partial(value) is None
        part = decode(value)
        assert isinstance(part, PartialPart)
        assert [key for key, _ in part.totals] == [canonical]
    assert orjson.loads(_record(rng, 0, groups=[(JSON_TRUE,)]))["columns"]["groups"] == [[True]]
