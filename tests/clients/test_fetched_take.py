"""The fetch adapter's batch path (``take``) hands out what aiokafka's per-record generator
hands out, moves the position as it does, and stops at an unreadable batch as it does.

Differential, without a broker: two adapters over the same record batches (data batches,
control batches, batches whose tail was compacted away, records below the fetch offset, an
unreadable batch), one read through ``take`` as the worker's ``getall`` does, the other
through the generator as ``getall`` iterates it, both in steps of ``max_records``; after
every step the records, the position and any error must be the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka.errors import CorruptRecordException, UnsupportedCodecError
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_dp.kafka_client.fetched import _RecordColumns, raw_value, record_columns_installed

pytestmark = pytest.mark.skipif(
    not record_columns_installed(), reason="the adapter is not installed on this aiokafka"
)


@dataclass(frozen=True)
class _Record:
    offset: int
    value: bytes


@dataclass
class _Batch:
    offsets: list[int]
    next_offset: int
    is_control_batch: bool = False
    crc_ok: bool = True
    producer_id: Any = None
    is_transactional: bool = False

    def validate_crc(self) -> bool:
        return self.crc_ok

    def __iter__(self) -> Any:
        return iter([_Record(o, b"v%d" % o) for o in self.offsets])


@dataclass
class _Records:
    """aiokafka's MemoryRecords as the adapter reads it; an Exception in place of a batch is
    raised by next_batch (a codec this process lacks)."""

    batches: list[Any]
    at: int = field(default=0)

    def has_next(self) -> bool:
        return self.at < len(self.batches)

    def next_batch(self) -> Any:
        batch = self.batches[self.at]
        self.at += 1
        if isinstance(batch, Exception):
            raise batch
        return batch


def _adapter(batches: list[Any], fetch_offset: int) -> _RecordColumns:
    return _RecordColumns("tp", _Records(list(batches)), [], fetch_offset, None, raw_value, True, 0)


def _step_generator(records: _RecordColumns, max_records: int) -> tuple[list[int], bool]:
    """One ``getall`` over the generator: records, and whether the fetch is used up."""
    out = []
    for record in records:
        out.append(record.offset)
        if len(out) >= max_records:
            return out, False
    return out, True


def _run(step: Any, records: _RecordColumns, max_records: int) -> list[Any]:
    trace: list[Any] = []
    for _ in range(100):
        try:
            offsets, used_up = step(records, max_records)
        except (CorruptRecordException, UnsupportedCodecError) as exc:
            trace.append(("error", type(exc).__name__, records.next_fetch_offset))
            offsets, used_up = step(records, max_records)  # the same fetch, asked again
            trace.append(("after error", offsets, records.next_fetch_offset))
            return trace
        trace.append((offsets, records.next_fetch_offset))
        if used_up:
            return trace
    raise AssertionError("no end")


def _take(records: _RecordColumns, max_records: int) -> tuple[list[int], bool]:
    assert records.takes_batches()
    out, used_up = records.take(max_records)
    return [r.offset for r in out], used_up


@st.composite
def _layouts(draw: Any) -> tuple[list[Any], int]:
    batches: list[Any] = []
    offset = 0
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["data", "data", "data", "control", "bad_crc", "codec"]))
        size = draw(st.integers(0, 6))
        if kind == "codec":
            batches.append(UnsupportedCodecError("lz4"))
            continue
        kept = [o for o in range(offset, offset + size) if draw(st.booleans()) or o == offset]
        tail = draw(st.integers(0, 2))  # records compacted away at the batch's end
        batches.append(
            _Batch(
                kept if size else [],
                offset + size + tail,
                is_control_batch=kind == "control",
                crc_ok=kind != "bad_crc",
            )
        )
        offset += size + tail
    fetch_offset = draw(st.integers(0, 3))  # records below it are skipped
    return batches, fetch_offset


@settings(max_examples=300, deadline=None)
@given(_layouts(), st.integers(1, 5))
def test_take_hands_out_and_positions_as_the_generator(
    layout: tuple[list[Any], int], max_records: int
) -> None:
    batches, fetch_offset = layout
    taken = _run(_take, _adapter(batches, fetch_offset), max_records)
    streamed = _run(_step_generator, _adapter(batches, fetch_offset), max_records)
    assert taken == streamed


def test_an_unreadable_batch_after_records_ends_the_fetch_then_raises_on_the_next() -> None:
    batches = [_Batch([0, 1], 2), UnsupportedCodecError("lz4"), _Batch([3], 4)]
    first = _adapter(batches, 0)
    assert _take(first, 10) == ([0, 1], True)
    assert first.next_fetch_offset == 2
    again = _adapter(batches[1:], 2)  # the next fetch starts at the unreadable batch
    with pytest.raises(UnsupportedCodecError):
        again.take(10)
    assert again.take(10) == ([], True)  # never the records behind it
    assert again.next_fetch_offset == 2
