from __future__ import annotations

import orjson

from stream_dp.pipeline.ledger import (
    RECORDS_PER_PART,
    LedgerIndex,
    LedgerRelease,
    OutputRecord,
    encode_fence,
    encode_published,
    encode_release,
)
from stream_dp.pipeline.records import dumps


def _release(n: int, rid: str = "r1") -> LedgerRelease:
    recs = [
        OutputRecord(f"q|w|{i}", {"kind": "release", "value": i, "ci95": 1.5e-6}) for i in range(n)
    ]
    return LedgerRelease(rid, "q", 3600, 7200, 0.5, 1e-6, recs)


def test_round_trip_and_parts() -> None:
    rel = _release(RECORDS_PER_PART * 2 + 1)
    encoded = encode_release(rel, now_s=0)
    assert len(encoded) == 3
    idx = LedgerIndex()
    idx.load([(k, v) for k, v in encoded])
    got = idx.get("q", 3600)
    assert got is not None and not got.published
    assert [dumps(r.value) for r in got.records] == [dumps(r.value) for r in rel.records]
    assert idx.unpublished() == [got]


def test_incomplete_release_is_not_ledgered() -> None:
    encoded = encode_release(_release(RECORDS_PER_PART + 5), now_s=0)
    idx = LedgerIndex()
    idx.load([*encoded[:1], encode_fence("f")])
    assert idx.get("q", 3600) is None


def test_published_marker_and_latest_wins() -> None:
    rel = _release(3)
    idx = LedgerIndex()
    first = encode_release(rel, now_s=0)
    idx.load([*first, *first, encode_published(rel)])
    got = idx.get("q", 3600)
    assert got is not None and got.published and len(got.records) == 3
    assert idx.unpublished() == []


def test_values_are_canonical_json() -> None:
    _key, value = encode_release(_release(1), now_s=0)[0]
    assert value == orjson.dumps(orjson.loads(value), option=orjson.OPT_SORT_KEYS)
