"""A write the worker leaves in flight (stage 1's partials, stream_dp/pipeline/handoff.py) on a
real broker: :meth:`Publisher.start_many` returns once the produce request is written, so the
broker has the records while the worker's loop is busy with its next batch (it does not
yield then); the returned task ends with their acknowledgement."""

from __future__ import annotations

import asyncio
import time

import pytest
from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as LibrdkafkaPartition

from stream_dp.ops.health import Health
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.faults import NO_FAULTS
from stream_dp.pipeline.kafka.context import WorkerContext
from stream_dp.pipeline.kafka.publisher import Publisher
from tests.apache_kafka.tier import ON_BOTH_BROKERS
from tests.helpers import TopicFactory
from tests.integration.support import HANG_GUARD_S
from tests.pipeline.support import config

pytestmark = [pytest.mark.kafka, ON_BOTH_BROKERS]

PARTITIONS = 2
RECORDS = 100
WRITES = 5
#: How long a blocked loop waits for records already sent: a hang guard far above the few
#: milliseconds they take (a request not yet written never arrives: the test fails then).
READ_GUARD_S = 60.0


def _read(consumer: Consumer, count: int, within_s: float) -> int:
    """Records read (up to ``count``) by a blocking librdkafka consumer in ``within_s``: the
    test's event loop does not run meanwhile."""
    seen = 0
    deadline = time.monotonic() + within_s
    while seen < count and time.monotonic() < deadline:
        message = consumer.poll(0.05)
        if message is not None and message.error() is None:
            seen += 1
    return seen


async def test_a_write_left_in_flight_reaches_the_broker_before_the_loop_runs_again(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = await topic_factory(PARTITIONS)
    context = WorkerContext(config(), Metrics(process=False), Health(), asyncio.Event(), NO_FAULTS)
    publisher = Publisher(context)
    await publisher.start({"bootstrap_servers": kafka_bootstrap})
    consumer = Consumer(
        {"bootstrap.servers": kafka_bootstrap, "group.id": topic, "enable.auto.commit": False}
    )
    try:
        await publisher.send_many(topic, [("warm", b"up", 0)])  # the producer knows the topic
        consumer.assign([LibrdkafkaPartition(topic, p, 0) for p in range(PARTITIONS)])
        assert _read(consumer, 1, HANG_GUARD_S) == 1
        for _ in range(WRITES):
            items = [(f"key{i}", b"value %d" % i, i % PARTITIONS) for i in range(RECORDS)]
            acknowledged = await publisher.start_many(topic, items)
            # The loop is blocked from here until the records are read: they were sent.
            assert _read(consumer, RECORDS, READ_GUARD_S) == RECORDS
            assert await asyncio.wait_for(acknowledged, HANG_GUARD_S) is None
        assert _read(consumer, 1, 0.5) == 0  # each record once, nothing else written
    finally:
        consumer.close()
        await publisher.stop()
