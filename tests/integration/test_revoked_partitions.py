"""Records of a partition revoked at the start of a rejoin are not processed.

aiokafka calls the revocation callback when a rejoin begins but keeps listing the old
assignment until the new one arrives; a fetch answered in between still holds records of
the revoked partitions. The chaos soak caught a worker processing them: it rebuilt state
for a partition it no longer owned and, once the new assignment came, crashed committing
an offset of an unassigned partition (IllegalStateError) — a second, stale owner until
then. The worker now processes only partitions it has taken and not seen revoked.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer, TopicPartition

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from stream_dp.pipeline.kafka.worker import Worker
from tests.helpers import ConfigFactory
from tests.integration.support import HANG_GUARD_S, wait_in_task
from tests.pipeline.support import KEYRING

pytestmark = pytest.mark.kafka

T0 = 1_596_240_000  # the factory's start_at


async def _produce(bootstrap: str, topic: str, partition: int, n: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(n):
            event = {"user_id": f"u{partition}-{i}", "timestamp": T0 + 1, "domain": "a"}
            await producer.send_and_wait(topic, orjson.dumps(event), partition=partition)
    finally:
        await producer.stop()


async def _default_path_worker(bootstrap: str, config_factory: ConfigFactory) -> Worker:
    """An in-process worker on unkeyed input (topics created), not started."""
    config = load_config(config_factory({"input": {"keyed_by_user": False}}))
    await apply_topics(config, bootstrap, include_input=True)
    return Worker(config, KEYRING, bootstrap_servers=bootstrap)


async def test_records_of_a_partition_revoked_mid_rejoin_rebuild_no_state(
    kafka_bootstrap: str, config_factory: ConfigFactory
) -> None:
    worker = await _default_path_worker(kafka_bootstrap, config_factory)
    config = worker.config
    iterations = 0
    iterate = worker._iteration

    async def counted(batch: dict[TopicPartition, list[Any]], waiting: set[TopicPartition]) -> None:
        nonlocal iterations
        await iterate(batch, waiting)
        iterations += 1

    worker._iteration = counted  # type: ignore[method-assign]
    task = asyncio.create_task(worker.run())
    revoked, kept = TopicPartition(config.input.topic, 0), TopicPartition(config.input.topic, 1)
    try:
        await wait_in_task(
            lambda: {revoked, kept} <= worker.membership.owned.keys(), task, "the partitions taken"
        )
        # The start of a rejoin, as aiokafka runs it: the callback, assignment unchanged.
        await worker.membership.on_revoked([revoked])
        consumer = worker.membership.consumer
        assert consumer is not None and revoked in consumer.assignment()
        await _produce(kafka_bootstrap, config.input.topic, revoked.partition, 5)
        await _produce(kafka_bootstrap, config.input.topic, kept.partition, 5)
        # Both batches fetched (positions move when getmany returns them), and two more
        # iterations done: the one that got the revoked partition's records has run.
        await wait_in_task(
            lambda: (
                consumer.highwater(revoked) is not None
                and consumer._subscription.subscription.assignment.state_value(revoked).position
                >= 5
            ),
            task,
            "the revoked partition's records fetched",
        )
        seen = iterations
        await wait_in_task(lambda: iterations >= seen + 2, task, "two more iterations")
        # The kept partition's routed events are acknowledged by the iteration after the one
        # that sent them (stage_output): only then is its input committable.
        await wait_in_task(
            lambda: kept in worker.membership.safe_offsets(), task, "the kept batch acknowledged"
        )
        assert worker.metrics.events_repartitioned._value.get() == 5  # the kept partition's
        assert revoked not in worker.membership.safe_offsets()
        assert revoked.partition not in worker.ingest.router._routed_activity  # type: ignore[union-attr]
        series = {tuple(labels) for labels in worker.metrics.fetch_age._metrics}
        assert (revoked.topic, str(revoked.partition)) not in series  # its series went with it
        assert (kept.topic, str(kept.partition)) in series
    finally:
        worker.request_stop()
        await asyncio.wait_for(task, timeout=HANG_GUARD_S)


async def test_a_partition_without_fetch_answers_shows_a_growing_fetch_age(
    kafka_bootstrap: str, config_factory: ConfigFactory
) -> None:
    """Its windows wait for it (silence there is not idleness): /metrics must say why."""
    worker = await _default_path_worker(kafka_bootstrap, config_factory)
    task = asyncio.create_task(worker.run())
    stalled = TopicPartition(worker.config.input.topic, 0)

    def age() -> float:
        labels = (stalled.topic, str(stalled.partition))
        child = worker.metrics.fetch_age._metrics.get(labels)
        return -1.0 if child is None else float(child._value.get())

    try:
        await wait_in_task(
            lambda: stalled in worker.membership.owned and age() >= 0, task, "a fetch age"
        )
        consumer = worker.membership.consumer
        assert consumer is not None
        consumer.pause(stalled)  # no more fetch answers for it
        await wait_in_task(lambda: age() >= 2.0, task, "the age to grow past 2 s")
        grown = age()
        consumer.resume(stalled)
        await wait_in_task(lambda: age() < grown, task, "a fresh fetch answer")
    finally:
        worker.request_stop()
        await asyncio.wait_for(task, timeout=HANG_GUARD_S)
