"""An idle worker's loop turns less often: after a fetch that brought nothing the next one
waits as long as the idle marks' interval (stream_dp/pipeline/idle_fetch.py), the first that
brings records goes back to the short wait (no broker: a scripted drain records each fetch's
timeout)."""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import TopicPartition

from stream_dp.ops.health import Health
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.faults import NO_FAULTS
from stream_dp.pipeline.handoff import marks_interval_s
from stream_dp.pipeline.idle_fetch import (
    BUSY_FETCH_TIMEOUT_MS,
    IDLE_FETCH_TIMEOUT_MS,
    idle_fetch_timeout_ms,
)
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


def test_an_idle_loop_turns_as_often_as_its_marks_are_due() -> None:
    # every second with a long idle_close_s; twice per idle_close_s when that is shorter
    # (stage 0's progress marks are due then); never more often than a busy loop's timeout
    assert marks_interval_s(60.0) == 1.0
    assert idle_fetch_timeout_ms(marks_interval_s(60.0)) == IDLE_FETCH_TIMEOUT_MS == 1_000
    assert idle_fetch_timeout_ms(marks_interval_s(1.2)) == 600
    assert idle_fetch_timeout_ms(marks_interval_s(0.1)) == BUSY_FETCH_TIMEOUT_MS


def test_an_empty_fetch_makes_the_next_wait_longer_and_records_make_it_short() -> None:
    cfg = config()
    assert cfg.window.idle_close_s >= 2  # the idle wait is then the longest one
    context = WorkerContext(cfg, Metrics(process=False), Health(), asyncio.Event(), NO_FAULTS)
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
