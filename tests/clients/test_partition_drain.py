"""PartitionDrain's contract on a scripted consumer (no broker): every record a partition
gives is returned, an error of one partition is raised by the next call (before anything is
taken), at once when nothing was taken, and the partitions take turns at going first."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import CorruptRecordException, KafkaError

from stream_dp.clients.partition_drain import PartitionDrain

A, B, C = (TopicPartition("t", p) for p in range(3))


class ScriptedConsumer:
    """Per partition, the records it holds (taken from the front) or an error it raises."""

    def __init__(self, held: dict[TopicPartition, list[int] | KafkaError]) -> None:
        self.held = held
        self.calls: list[tuple[TopicPartition, ...]] = []

    def assignment(self) -> set[TopicPartition]:
        return set(self.held)

    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: int, max_records: int
    ) -> dict[TopicPartition, list[int]]:
        self.calls.append(partitions)
        out: dict[TopicPartition, list[int]] = {}
        for tp in partitions or sorted(self.held):
            if max_records == 0:
                break  # aiokafka's loop stops once max_records are taken
            held = self.held[tp]
            if isinstance(held, KafkaError):
                if out:  # aiokafka's loop: the records taken before are dropped
                    out.clear()
                raise held
            if held:
                out[tp], self.held[tp] = held[:max_records], held[max_records:]
                max_records -= len(out[tp])
        return out


def _drain(consumer: ScriptedConsumer) -> PartitionDrain:
    return PartitionDrain(consumer)  # type: ignore[arg-type]


def _counts(batch: dict[TopicPartition, Sequence[Any]]) -> dict[int, list[int]]:
    return {tp.partition: list(records) for tp, records in sorted(batch.items())}


async def test_a_partition_s_error_comes_after_the_others_records() -> None:
    error = CorruptRecordException("bad batch")
    consumer = ScriptedConsumer({A: [0, 1, 2], B: error, C: [0, 1]})
    drain = _drain(consumer)
    first = await drain.getmany(timeout_ms=200, max_records=100)
    assert _counts(first) == {0: [0, 1, 2], 2: [0, 1]}
    # The waiting call took one record; then one call per partition.
    assert consumer.calls == [(), (A,), (B,), (C,)]
    with pytest.raises(CorruptRecordException) as raised:
        await drain.getmany(timeout_ms=200, max_records=100)
    assert raised.value is error
    assert len(consumer.calls) == 4  # raised before anything was fetched


async def test_an_error_before_any_record_is_raised_at_once() -> None:
    error = CorruptRecordException("bad batch")
    consumer = ScriptedConsumer({A: error, B: [0]})
    with pytest.raises(CorruptRecordException):
        await _drain(consumer).getmany(timeout_ms=200, max_records=100)
    assert consumer.held[B] == [0]  # nothing taken


async def test_max_records_holds_and_the_partitions_take_turns() -> None:
    consumer = ScriptedConsumer({A: list(range(10)), B: list(range(10)), C: list(range(10))})
    drain = _drain(consumer)
    firsts = []
    returned: dict[TopicPartition, list[int]] = {A: [], B: [], C: []}
    for _ in range(3):
        consumer.calls.clear()
        batch = await drain.getmany(timeout_ms=200, max_records=4)
        assert sum(len(r) for r in batch.values()) == 4
        firsts.append(consumer.calls[1])
        for tp, records in batch.items():
            returned[tp].extend(records)
    assert firsts == [(A,), (B,), (C,)]
    # Nothing lost or repeated: what was returned, then what is left, is every record.
    held = consumer.held
    assert {tp: returned[tp] + held[tp] for tp in returned} == {  # type: ignore[operator]
        tp: list(range(10)) for tp in returned
    }


async def test_nothing_fetched_is_an_empty_batch() -> None:
    consumer = ScriptedConsumer({A: [], B: []})
    assert await _drain(consumer).getmany(timeout_ms=200, max_records=100) == {}
    assert consumer.calls == [()]
