"""A worker clock that is slow shows as clock skew against the broker's record timestamps.

An event stamped more than ``input.max_future_s`` ahead of the worker's clock is dead-lettered
(``timestamp_out_of_range``), so a worker whose clock is 10 minutes slow dead-letters every
live event. To the worker that looks exactly like live records whose timestamps are 10
minutes ahead of its clock: that is what this test produces (the record timestamp set by the
producer, as CreateTime). The worker exports the skew, and an alert fires on it
(``StreamDPClockSkew``) long before the cap is reached.
"""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from stream_dp.pipeline.kafka.worker import Worker
from tests.helpers import ConfigFactory
from tests.integration.support import HANG_GUARD_S, wait_in_task
from tests.pipeline.support import KEYRING

pytestmark = pytest.mark.kafka

SLOW_S = 600.0  # the worker's clock is this much behind the producers' and the broker's


async def _produce_live(bootstrap: str, topic: str, ahead_s: float, n: int) -> None:
    """n live events, stamped (event and record) ``ahead_s`` ahead of this process' clock."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(n):
            now_s = time.time() + ahead_s
            event = {"user_id": f"u{i}", "timestamp": now_s, "domain": "a"}
            await producer.send_and_wait(topic, orjson.dumps(event), timestamp_ms=int(now_s * 1000))
    finally:
        await producer.stop()


def _read_to_end(worker: Worker) -> bool:
    """Whether the worker's loop has noted, for every input partition it has, a fetch answer
    that found it at the end (what makes the next records fresh)."""
    consumer = worker.membership.consumer
    if consumer is None:
        return False
    mine = [tp for tp in consumer.assignment() if tp.topic == worker.config.input.topic]
    noted = worker._clock_skew._at_end_s  # the worker's own record of those answers
    return bool(mine) and all(tp in noted for tp in mine)


async def test_a_slow_worker_clock_shows_as_skew_before_every_event_is_refused(
    kafka_bootstrap: str, config_factory: ConfigFactory
) -> None:
    config = load_config(config_factory({"input": {"keyed_by_user": False}}))
    await apply_topics(config, kafka_bootstrap, include_input=True)
    worker = Worker(config, KEYRING, bootstrap_servers=kafka_bootstrap)
    skew = worker.metrics.input_clock_skew
    refused = worker.metrics.bad_records.labels(reason="timestamp_out_of_range")
    assert worker.metrics.config_input_max_future._value.get() == config.input.max_future_s
    task = asyncio.create_task(worker.run())
    try:
        await wait_in_task(worker.health.ready, task, "the worker ready")
        # Only fresh records measure the clock (appended after a fetch found the reader at
        # the end): live input, as an operator's is, not a first fetch of a backlog.
        await wait_in_task(lambda: _read_to_end(worker), task, "the input read to its end")
        await _produce_live(kafka_bootstrap, config.input.topic, SLOW_S, 3)
        await wait_in_task(lambda: refused._value.get() >= 3, task, "the events refused")
        # what the operator sees: the worker's clock ~10 minutes behind the records'
        assert SLOW_S - 60 <= skew._value.get() <= SLOW_S + 60
        assert skew._value.get() > config.input.max_future_s / 2  # StreamDPClockSkew's rule

        await _produce_live(kafka_bootstrap, config.input.topic, 0.0, 2)
        await wait_in_task(lambda: skew._value.get() < 30, task, "the skew of live records")
        assert skew._value.get() > -60
        assert refused._value.get() == 3  # events on time are kept
    finally:
        worker.request_stop()
        await asyncio.wait_for(task, timeout=HANG_GUARD_S)
