"""A fetch error in one partition loses no record of another: the worker's fetch
(``Membership.fetch``) on a real broker, one input partition holding a record batch this
process cannot decompress (snappy, with the codec library hidden from aiokafka as on an
install without cramjam), the others ordinary records fetched in the same call.

aiokafka 0.14's ``getmany`` takes the records it holds partition after partition, moving
each one's position as it takes them, and parses a partition's batches only then: the
snappy batch raised out of ``getmany`` after the partitions before it were taken, and their
records went with the exception, positions already past them. The worker never saw those
events, and the next commit on those partitions would have counted them done. Here the
buffered fetches are put in that order on purpose (the good partitions' fetches held before
the broken one's is let in), so that the old path loses every good record, deterministically.

The accounting checked is exact, per partition: the records the worker got are the offsets
0 .. position-1, each once (nothing behind a position was skipped), every good partition is
read to its end, and the broken one is reported (its error raised to the loop) without
moving past its first record not returned.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiokafka.codec
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError, UnsupportedCodecError

from stream_dp.clients.fetched import fetch_options
from stream_dp.config import load_config
from stream_dp.pipeline.kafka.worker import Worker
from tests.helpers import TopicFactory
from tests.integration.support import HANG_GUARD_S
from tests.integration.test_compressed_input import produce_compressed
from tests.pipeline.support import KEYRING

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

#: Plain records per good partition (distinct counts: one partition cannot pass for another).
GOOD = {0: 41, 1: 43, 2: 47}
#: The broken partition: plain records first, then one snappy batch.
BROKEN = 3
BROKEN_PLAIN = 5
BROKEN_SNAPPY = 20


def _buffered(consumer: AIOKafkaConsumer) -> list[TopicPartition]:
    """The partitions whose fetched records aiokafka holds, in the order ``getmany`` takes
    them (its fetcher's buffer: no public accessor)."""
    return list(consumer._fetcher._records)


async def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + HANG_GUARD_S  # a hang guard only
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def _produce_plain(bootstrap: str, topic: str, partition: int, n: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        sent = [
            await producer.send(topic, f"p{partition}-{i}".encode(), partition=partition)
            for i in range(n)
        ]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


async def test_a_partition_that_cannot_be_decompressed_loses_no_record_of_the_others(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    config_factory: Callable[[dict[str, Any] | None], Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    topic = await topic_factory(partitions=4)
    for partition, n in GOOD.items():
        await _produce_plain(kafka_bootstrap, topic, partition, n)
    await _produce_plain(kafka_bootstrap, topic, BROKEN, BROKEN_PLAIN)
    # BROKEN_SNAPPY events and a marker, in one snappy batch (librdkafka's producer).
    await asyncio.to_thread(
        produce_compressed, kafka_bootstrap, topic, "snappy", BROKEN, BROKEN_SNAPPY
    )
    monkeypatch.setattr(aiokafka.codec, "cramjam", None)  # no snappy, lz4, zstd here

    worker = Worker(load_config(config_factory(None)), KEYRING, bootstrap_servers=kafka_bootstrap)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=kafka_bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **fetch_options(),  # the worker's consumer options (fetched.py)
    )
    await consumer.start()
    good = [TopicPartition(topic, p) for p in GOOD]
    broken = TopicPartition(topic, BROKEN)
    worker.membership.consumer = consumer
    got: dict[TopicPartition, list[Any]] = {tp: [] for tp in [*good, broken]}
    errors: list[KafkaError] = []
    try:
        consumer.assign([*good, broken])
        consumer.pause(broken)
        await _until(lambda: set(_buffered(consumer)) >= set(good), "the good partitions' fetch")
        consumer.resume(broken)
        await _until(lambda: broken in _buffered(consumer), "the broken partition's fetch")
        # The old path took the good partitions, then raised in the broken one: all lost.
        assert _buffered(consumer)[-1] == broken, _buffered(consumer)

        async def read_to_end() -> bool:
            ends = await consumer.end_offsets(good)
            return all([await consumer.position(tp) >= ends[tp] for tp in good])

        deadline = time.monotonic() + HANG_GUARD_S  # a hang guard only
        while not (errors and await read_to_end()):
            assert time.monotonic() < deadline, (
                f"not read to the end: {({tp.partition: len(r) for tp, r in got.items()})}"
            )
            try:
                batch = await worker.membership.fetch()
            except KafkaError as exc:
                errors.append(exc)
                continue
            assert batch is not None
            for tp, records in batch.items():
                got[tp].extend(records)
        positions = {tp: await consumer.position(tp) for tp in got}
    finally:
        await consumer.stop()

    # Every error reaching the loop is the broken partition's codec, said at least once.
    assert errors and all(isinstance(e, UnsupportedCodecError) for e in errors), errors
    # Per partition, exactly the records below its position, each once, in order.
    delivered = {tp.partition: [r.offset for r in records] for tp, records in got.items()}
    expected = {tp.partition: list(range(positions[tp])) for tp in got}
    assert delivered == expected, (delivered, positions)
    # Every good partition was read to its end, every record as written.
    assert {tp.partition: positions[tp] for tp in good} == GOOD
    for tp in good:
        values = [r.value for r in got[tp]]
        assert values == [f"p{tp.partition}-{i}".encode() for i in range(GOOD[tp.partition])]
    # The broken partition never moved past a record it did not return.
    assert positions[broken] <= BROKEN_PLAIN
