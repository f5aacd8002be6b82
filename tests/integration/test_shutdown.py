"""A stop request ends the worker's fetch at once, even while the group is rebalancing.

aiokafka's ``getmany`` ignores its timeout while the member has no assignment. In the chaos
run a worker got SIGTERM while the members being stopped one after another kept the group
rebalancing: its loop sat in ``getmany`` past the service's 30 s shutdown timeout and the
process exited 1 instead of 0.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer

from stream_dp.config import load_config
from stream_dp.pipeline.kafka.worker import Worker
from tests.pipeline.support import KEYRING

pytestmark = pytest.mark.kafka
MakeConfig = Callable[[dict[str, Any] | None], Path]


async def test_a_stop_does_not_wait_for_the_group_to_assign_partitions(
    kafka_bootstrap: str,
    config_factory: MakeConfig,
    topic_factory: Callable[..., Any],
    group_id_factory: Callable[[], str],
) -> None:
    topic = await topic_factory(partitions=2)
    config = load_config(config_factory({"input": {"topic": topic}}))
    worker = Worker(config, KEYRING, bootstrap_servers=kafka_bootstrap)
    # The embedded broker holds a JoinGroup for half the session timeout: with 20 s the
    # member waits ~10 s for its assignment after subscribing, and getmany with it.
    consumer = AIOKafkaConsumer(
        bootstrap_servers=kafka_bootstrap,
        group_id=group_id_factory(),
        session_timeout_ms=20_000,
        heartbeat_interval_ms=3_000,
    )
    await consumer.start()
    consumer.subscribe([topic])
    worker.membership.consumer = consumer
    try:
        fetch = asyncio.create_task(worker.membership.fetch())
        await asyncio.sleep(0)  # the fetch is waiting
        worker.request_stop()
        # Far below the ~10 s the join is held and far above the milliseconds a stop takes:
        # the fetch ends because of the stop (None), not because the group assigned ({}).
        assert await asyncio.wait_for(fetch, timeout=8) is None
        assert not consumer.assignment(), "the group assigned first: the test proved nothing"
    finally:
        await asyncio.wait_for(consumer.stop(), timeout=60)
