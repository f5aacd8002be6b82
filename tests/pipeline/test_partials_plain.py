"""Stage 2's msgspec path for plain partials in the per-key form of earlier versions
(stream_dp/pipeline/formats/partials_plain.py) gives exactly what the orjson path gives, or
leaves the record to it: checked differentially on stage 1's records written in that form
(tests.pipeline.support.partials_as_totals) and on records edited to hit every known
difference between the two parsers."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from stream_dp.pipeline.formats.partials import (
    Partial,
    PartialPart,
    decode,
    encode_partial,
    new_version,
)
from stream_dp.pipeline.formats.partials_plain import plain_partial
from stream_dp.privacy.group_values import JSON_TRUE
from stream_dp.privacy.key_totals import KeyTotals
from tests.pipeline.partials_paths import both, byte_edited, plain_value
from tests.pipeline.support import partials_as_totals

T0 = 1_596_240_000


def _both(value: bytes, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """(with the msgspec path, orjson and the general reader alone)."""
    return both(value, monkeypatch, "plain_partial")


def _record(rng: random.Random, n: int, groups: list[tuple[Any, ...]] | None = None) -> bytes:
    if groups is None:
        groups = list(
            dict.fromkeys(
                tuple(plain_value(rng) for _ in range(rng.randrange(4))) for _ in range(n)
            )
        )
    n = len(groups)
    numbers = [np.array([rng.randrange(-(10**12), 10**12) for _ in range(n)]) for _ in range(3)]
    partial = Partial(
        query=rng.choice(["visits", 'q"\\é']),
        window_start_s=T0,
        source_partition=rng.randrange(4),
        version=new_version(),
        totals=KeyTotals(groups, *numbers),
        events_seen=7,
        events_retained=5,
        key_id="k1",
        fingerprint="f" * 16,
        key_check="c" * 8,
        erasures_through=rng.choice([0, 3]),
    )
    ((_, value),) = encode_partial(partial, max_bytes=1 << 22)
    return partials_as_totals(value)


def test_stage_ones_plain_records_take_the_msgspec_path_and_decode_as_by_orjson(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = random.Random(43)
    for trial in range(300):
        value = _record(rng, rng.choice([0, 1, 2, 30]))
        assert plain_partial(value) is not None, trial  # the path under test is taken
        fast, slow = _both(value, monkeypatch)
        assert fast[0] == "part", (trial, fast)
        assert fast == slow, trial


# Totals spliced into a valid record: each is either read alike or left to orjson.
_TOTALS = [
    b"[]",
    b'[[["a"],1,2,3]]',
    b'[[["a"] , 1 ,2,3] ]\n',
    b'[[["a"],1,2,3],[["a"],4,5,6]]',  # a key twice in one part
    b'[[["a",null,-5],1,2,3],[[],0,0,-0]]',
    b'[[["a"],1.0,2,3]]',
    b'[[["a"],1e2,2,3]]',
    b'[[["a"],true,2,3]]',
    b"[[[true],1,2,3]]",
    b"[[[1.0],1,2,3]]",
    b"[[[1.5],1,2,3]]",
    b"[[[18446744073709551615],1,2,3]]",
    b"[[[18446744073709551616],1,2,3]]",  # orjson: a float key
    b"[[[-9223372036854775809],1,2,3]]",
    b"[[[9223372036854775808],1,2,3]]",
    b'[[["a"],-9223372036854775809,2,3]]',  # orjson: a float, truncated to -2**63
    b'[[["a"],9223372036854775808,2,3]]',
    b'[[["a"],-9223372036854775808,2,9223372036854775807]]',
    b'[[["a"],1,2,3,4]]',
    b'[[["a"],1,2,3,4,5]]',
    b'[[["a"],1,2]]',
    b'[[["a"],1,2,3]],',
    b'[[["a"],1,2,3]] x',
    b'[[["a"],1,2,3]',
    b'[["a",1,2,3]]',
    b'[[["\\ud800"],1,2,3]]',
    b'[[["\\ud83d\\ude00"],1,2,3]]',
    b'[[["\xed\xa0\x80"],1,2,3]]',
    b'[[["\xff"],1,2,3]]',
    b'[[["a\x01"],1,2,3]]',
    b'[[["\\u0000\\"\\/"],1,2,3]]',
    b'\xef\xbb\xbf[[["a"],1,2,3]]',
    b'[[["a"],01,2,3]]',
    b'[[["a"],-,2,3]]',
    b"[[[],1,2,3]]",
    b'[[["a"],1,2,3]] ,"totals":[]',
    b"{}",
    b"null",
]


@pytest.mark.parametrize("totals", _TOTALS)
def test_edited_totals_decode_as_by_orjson(totals: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(totals)
    base = _record(rng, 1)
    at = base.rindex(b',"totals":') + len(b',"totals":')
    for value in (base[:at] + totals + b"}", base[:at] + totals + b" }"):
        fast, slow = _both(value, monkeypatch)
        assert fast == slow, value


@pytest.mark.parametrize(
    "edit",
    [
        lambda v: v.replace(b'"kind":"partial"', b'"kind":"watermark"'),
        lambda v: v.replace(b'"part":0', b'"part":2'),
        lambda v: v.replace(b'"part":0', b'"part":0.5'),
        lambda v: v.replace(b'"version":', b'"version":1,"version":'),
        lambda v: v.replace(b'"events_seen":7', b'"events_seen":"7"'),
        lambda v: v.replace(b'"events_seen":7', b'"events_seen":18446744073709551616'),
        lambda v: v.replace(b'{"schema_version"', b'{"totals":[[["z"],1,1,1]],"schema_version"'),
        lambda v: v.replace(b',"totals":', b',"totals":[],"totals":'),
        lambda v: v.replace(b',"totals":', b', "totals":'),
        lambda v: v[:-1] + b',"x":1}',
        lambda v: v[:-1] + b"}}",
        lambda v: v + b" ",
        lambda v: b"{" + v[v.index(b',"totals":') :],
        lambda v: b'{"kind":"partial"' + v[v.index(b',"totals":') :],
        lambda v: v.replace(b'"schema_version"', b'"histograms":{"a":[1]},"schema_version"'),
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
        value = byte_edited(rng, _record(rng, rng.choice([1, 2, 5])))
        fast, slow = _both(value, monkeypatch)
        assert fast == slow, (trial, value)


def test_other_group_values_and_statistics_are_left_to_orjson() -> None:
    """Booleans and floats take a canonical form; weights, squares and histograms add
    items: those records are read by the general path."""
    rng = random.Random(5)
    assert plain_partial(_record(rng, 0, groups=[(JSON_TRUE,)])) is None
    assert plain_partial(_record(rng, 0, groups=[(0.5,)])) is None
    partial = Partial(
        query="visits",
        window_start_s=T0,
        source_partition=0,
        version=new_version(),
        totals=KeyTotals([("a",)], *(np.array([1]) for _ in range(5))),
        events_seen=1,
        events_retained=1,
    )
    ((_, value),) = encode_partial(partial, max_bytes=1 << 20)
    value = partials_as_totals(value)
    assert plain_partial(value) is None
    assert isinstance(decode(value), PartialPart)
