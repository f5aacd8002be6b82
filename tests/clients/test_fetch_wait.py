"""The worker's consumer never long-polls while a partition is behind (stream_dp.kafka_client
.fetched, :func:`_actions_per_node`), on the embedded broker.

One partition holds a backlog the consumer has fetched and not consumed; the other is empty.
aiokafka then fetches the empty one alone, and a request that holds only caught-up partitions
is held by the broker for ``fetch_max_wait_ms``: the backlog's next fetch waited behind it.
Every request sent while behind must wait at most ``BEHIND_FETCH_WAIT_MS``; once caught up,
the consumer's own ``fetch_max_wait_ms`` again (an idle worker polls as rarely as before).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.protocol.fetch import FetchRequest

from stream_dp.kafka_client.fetched import (
    BEHIND_FETCH_WAIT_MS,
    CAUGHT_UP_FETCH_MIN_BYTES,
    fetch_options,
    record_columns_installed,
)

pytestmark = pytest.mark.skipif(
    not record_columns_installed(), reason="the fetch adapter is pinned to aiokafka 0.14.0"
)

CONFIGURED_WAIT_MS = 500
BACKLOG = 2_000
#: Generous bound for a condition to become true on a loaded machine (never a pace).
DEADLINE_S = 60.0


class _Requests:
    """The fetch requests a consumer's client sends: (max wait ms, partitions asked for), and
    each one's minimum bytes in ``min_bytes``."""

    def __init__(self, consumer: AIOKafkaConsumer) -> None:
        self.sent: list[tuple[int, set[int]]] = []
        self.min_bytes: list[int] = []
        client = consumer._client
        original = client.send

        async def send(node_id: int, request: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(request, FetchRequest):
                asked = {p[0] for _, parts in request.topics for p in parts}
                self.sent.append((request._max_wait_ms, asked))
                self.min_bytes.append(request._min_bytes)
            return await original(node_id, request, *args, **kwargs)

        client.send = send


async def _until(condition: Callable[[], bool], step: Callable[[], Awaitable[Any]]) -> None:
    """Run ``step`` until ``condition`` holds (fails past DEADLINE_S)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while not condition():
        assert loop.time() < deadline, "the condition never held"
        await step()


async def test_no_long_poll_while_a_partition_is_behind(
    kafka_bootstrap: str, topic_factory: Any
) -> None:
    topic = await topic_factory(2)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        for _ in range(BACKLOG):  # a backlog on partition 0; partition 1 stays empty
            await producer.send(topic, b"x" * 100, partition=0)
        await producer.flush()
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        bootstrap_servers=kafka_bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        fetch_max_wait_ms=CONFIGURED_WAIT_MS,
        **fetch_options(),
    )
    await consumer.start()
    try:
        backlog, empty = TopicPartition(topic, 0), TopicPartition(topic, 1)
        consumer.assign([backlog, empty])
        requests = _Requests(consumer)
        first = await consumer.getmany(backlog, timeout_ms=int(DEADLINE_S * 1000), max_records=1)
        assert [len(r) for r in first.values()] == [1]
        # Partition 0's records are buffered (not consumed): the fetcher asks for the empty
        # partition alone, while partition 0 is behind.
        alone = len(requests.sent)
        await _until(
            lambda: any(asked == {1} for _, asked in requests.sent[alone:]),
            lambda: asyncio.sleep(0.01),
        )
        behind = [wait for wait, asked in requests.sent[alone:] if asked == {1}]
        assert behind and all(wait <= BEHIND_FETCH_WAIT_MS for wait in behind), requests.sent
        # ... and answered at once, with whatever there is.
        asks = zip(requests.sent[alone:], requests.min_bytes[alone:], strict=True)
        behind_min = [m for (_, asked), m in asks if asked == {1}]
        assert behind_min and set(behind_min) == {1}, requests.min_bytes
        # Consumed to the end of both partitions: the configured long poll again.
        taken = 1

        async def take() -> None:
            nonlocal taken
            got = await consumer.getmany(timeout_ms=100, max_records=500)
            taken += sum(len(r) for r in got.values())

        await _until(lambda: taken >= BACKLOG, take)
        assert taken == BACKLOG
        caught_up = len(requests.sent)
        await _until(
            lambda: any(wait == CONFIGURED_WAIT_MS for wait, _ in requests.sent[caught_up:]),
            lambda: asyncio.sleep(0.01),
        )
        # Caught up: the long poll also waits for CAUGHT_UP_FETCH_MIN_BYTES (fewer, larger
        # fetches of a trickle).
        long_polls = [
            m
            for (wait, _), m in zip(
                requests.sent[caught_up:], requests.min_bytes[caught_up:], strict=True
            )
            if wait == CONFIGURED_WAIT_MS
        ]
        assert long_polls and set(long_polls) == {CAUGHT_UP_FETCH_MIN_BYTES}, long_polls
    finally:
        await consumer.stop()
