"""The worker's producer is idempotent on Apache Kafka and plain on the embedded broker (which
refuses idempotent writes), and writes either way."""

from __future__ import annotations

import asyncio
import logging
import time

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from stream_dp.clients.idempotence import is_idempotent, start_producer
from tests.apache_kafka.tier import APACHE_KAFKA, ON_BOTH_BROKERS, broker_of
from tests.helpers import TopicFactory
from tests.integration.support import HANG_GUARD_S, read_topic

pytestmark = [pytest.mark.kafka, ON_BOTH_BROKERS]


async def _started(bootstrap: str) -> AIOKafkaProducer:
    """start_producer, retried while the broker says "try again" (a broker just started
    answers InitProducerId with COORDINATOR_LOAD_IN_PROGRESS until its first id block)."""
    deadline = time.monotonic() + HANG_GUARD_S
    while True:
        try:
            return await start_producer({"bootstrap_servers": bootstrap}, {"acks": "all"})
        except KafkaError as exc:
            if not exc.retriable or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def test_the_producer_is_idempotent_where_the_broker_takes_it(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    request: pytest.FixtureRequest,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = await topic_factory(1)
    with caplog.at_level(logging.INFO, logger="stream_dp.clients.idempotence"):
        producer = await _started(kafka_bootstrap)
    try:
        for i in range(3):
            await producer.send_and_wait(topic, orjson.dumps({"n": i}), key=b"k")
    finally:
        await producer.stop()
    on_apache_kafka = broker_of(request) == APACHE_KAFKA
    assert is_idempotent(producer) is on_apache_kafka
    refused = [r for r in caplog.records if "the broker refuses producer ids" in r.getMessage()]
    assert len(refused) == (0 if on_apache_kafka else 1)
    assert "UnknownError" in refused[0].getMessage() if refused else True
    kept = await read_topic(kafka_bootstrap, topic, until=lambda rs: len(rs) >= 3)
    assert [orjson.loads(v)["n"] for _, v in kept] == [0, 1, 2]
