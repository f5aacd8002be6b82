"""An idle worker's loop turns less often: after a fetch that brought nothing the next one
waits longer (stream_dp/pipeline/idle_fetch.py), the first that brings records goes back to
the short wait (no broker: a scripted drain records each fetch's timeout)."""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import TopicPartition

from stream_dp.ops.health import Health
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.faults import NO_FAULTS
from stream_dp.pipeline.idle_fetch import BUSY_FETCH_TIMEOUT_MS, IDLE_FETCH_TIMEOUT_MS
from stream_dp.pipeline.kafka.context import WorkerContext
from stream_dp.pipeline.kafka.membership import MAX_RECORDS_PER_FETCH, Membership
from tests.pipeline.support import config


class ScriptedDrain:
    """Hands out the scripted batches in turn, noting each fetch's timeout."""

    def __init__(self, consumer: object, batches: list[dict[TopicPartition, list[Any]]]) -> None:
        self.consumer = consumer
        self.batches = batches
        self.timeouts_ms: list[int] = []

    async def getmany(self, *, timeout_ms: int, max_records: int) -> dict[Any, list[Any]]:
        assert max_records == MAX_RECORDS_PER_FETCH
        self.timeouts_ms.append(timeout_ms)
        return self.batches.pop(0)


def test_an_empty_fetch_makes_the_next_wait_longer_and_records_make_it_short() -> None:
    context = WorkerContext(config(), Metrics(process=False), Health(), asyncio.Event(), NO_FAULTS)
    membership = Membership(context)
    tp = TopicPartition(membership.input_topic, 0)
    consumer = object()
    membership.consumer = consumer  # type: ignore[assignment]
    script: list[dict[TopicPartition, list[Any]]] = [{}, {tp: []}, {tp: ["r"]}, {}, {tp: ["r"]}]
    drain = ScriptedDrain(consumer, script)
    membership.drain = drain  # type: ignore[assignment]

    async def fetch_all() -> list[Any]:
        return [await membership.fetch() for _ in range(5)]

    got = asyncio.run(fetch_all())
    assert got == [{}, {tp: []}, {tp: ["r"]}, {}, {tp: ["r"]}]
    busy, idle = BUSY_FETCH_TIMEOUT_MS, IDLE_FETCH_TIMEOUT_MS
    assert busy < idle
    assert drain.timeouts_ms == [busy, idle, idle, busy, idle]
