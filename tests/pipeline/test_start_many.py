""":meth:`Publisher.start_many` (a write left in flight: stage 1's partials) when the write
fails: a first attempt that fails is redone whole, as every write is (retried, bounded), and
the returned task ends once that succeeds; a write that keeps failing makes the task raise,
and each failure is counted. No broker: a producer that fails the batches it is told to.
(On a real broker: tests/integration/test_partials_in_flight.py.)"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError

from stream_dp.errors import StreamDPError
from stream_dp.ops.health import Health
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.faults import NO_FAULTS
from stream_dp.pipeline.kafka.context import WorkerContext
from stream_dp.pipeline.kafka.publisher import Publisher
from tests.pipeline.support import config

#: A hang guard far above the retry's first back-offs (a fraction of a second).
HANG_GUARD_S = 60.0


class Batch:
    def __init__(self) -> None:
        self.records: list[tuple[Any, Any]] = []

    def append(self, *, key: Any, value: Any, timestamp: Any, headers: Any) -> object:
        self.records.append((key, value))
        return object()  # appended (a full batch answers None)

    def record_count(self) -> int:
        return len(self.records)


class FailingFirst:
    """A producer whose first ``failing`` batches fail (as a broker connection lost)."""

    def __init__(self, failing: int) -> None:
        self.failing = failing
        self.delivered: list[tuple[int, Any, Any]] = []

    def create_batch(self) -> Batch:
        return Batch()

    async def send_batch(self, batch: Batch, topic: str, *, partition: int) -> asyncio.Future[Any]:
        ack: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.failing > 0:
            self.failing -= 1
            ack.set_exception(KafkaConnectionError("test: connection lost"))
        else:
            self.delivered.extend((partition, k, v) for k, v in batch.records)
            ack.set_result(None)
        return ack


def _publisher(producer: FailingFirst, stopping: asyncio.Event) -> tuple[Publisher, Metrics]:
    metrics = Metrics(process=False)
    publisher = Publisher(WorkerContext(config(), metrics, Health(), stopping, NO_FAULTS))
    publisher.producer = producer  # type: ignore[assignment]
    return publisher, metrics


ITEMS = [(f"key{i}", b"value %d" % i, i % 2) for i in range(10)]


def _errors(metrics: Metrics) -> float:
    return metrics.broker_errors._value.get()  # type: ignore[no-any-return]


async def test_a_first_attempt_that_fails_is_redone_whole() -> None:
    producer = FailingFirst(failing=2)  # both partitions' batches of the first attempt
    publisher, metrics = _publisher(producer, asyncio.Event())
    acknowledged = await publisher.start_many("partials", ITEMS)
    assert await asyncio.wait_for(acknowledged, HANG_GUARD_S) is None
    assert sorted(producer.delivered) == sorted((p, k.encode(), v) for k, v, p in ITEMS)
    assert _errors(metrics) == 1


async def test_a_write_that_keeps_failing_raises_from_its_task() -> None:
    stopping = asyncio.Event()
    stopping.set()  # a stopping worker gives up after a few failures, not give_up_after_s
    producer = FailingFirst(failing=1_000_000)
    publisher, metrics = _publisher(producer, stopping)
    acknowledged = await publisher.start_many("partials", ITEMS)
    with pytest.raises((StreamDPError, KafkaConnectionError)):
        await asyncio.wait_for(acknowledged, HANG_GUARD_S)
    assert producer.delivered == []
    assert _errors(metrics) >= 2  # the first attempt's failure and the retries'
