"""One fetched batch: first record of a key wins, duplicates and conflicts counted, offsets."""

from __future__ import annotations

import orjson

from stream_dp.sink.batch import Consumed, assemble
from tests.sink.support import window_records


def _consumed(values: list[bytes | None], partition: int = 0, first: int = 0) -> list[Consumed]:
    return [Consumed("out", partition, first + i, v) for i, v in enumerate(values)]


def test_duplicates_and_conflicts_in_one_batch() -> None:
    records = [v for _, v in window_records("q", 0, ["a", "b"])]
    changed = orjson.loads(records[0])
    changed["value"] += 1
    batch = assemble(
        _consumed(records)
        + _consumed(records, partition=1, first=40)
        + _consumed([orjson.dumps(changed), b"{"], partition=2, first=7)
    )
    assert batch.records == 8
    assert len(batch.releases) == 2 and len(batch.windows) == 1
    assert batch.duplicates == 3  # the second copy of each record
    assert batch.conflicts == 1  # same key, other value: kept out
    first = orjson.loads(records[0])
    assert batch.releases[next(iter(batch.releases))].value == first["value"]
    assert [(b.partition, b.offset, b.bad.reason) for b in batch.bad] == [(2, 8, "not_json")]
    assert batch.next_offsets == {("out", 0): 3, ("out", 1): 43, ("out", 2): 9}
    assert len(batch.touched_windows) == 1
    assert [len(single.consumed) for single in batch.split()] == [1] * 8


def test_touched_windows_are_sorted() -> None:
    records = [v for w in (3, 1, 2) for _, v in window_records("q", w, ["a"])]
    records += [v for _, v in window_records("p", 5, ["a"])]
    batch = assemble(_consumed(records))
    touched = batch.touched_windows
    assert touched == sorted(touched) and len(touched) == 4
    assert touched[0][0] == "p"
