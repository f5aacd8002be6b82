"""The worker's fetch adapter (stream_dp/kafka_client/fetched.py) on a real broker: a consumer
made with its options gets aiokafka's parsed records instead of ``ConsumerRecord`` objects,
with the same offsets, keys, values and timestamps and the same positions after every
``getmany``; every other consumer in the process still gets ``ConsumerRecord``."""

from __future__ import annotations

from typing import Any

import aiokafka
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import ConsumerRecord

from stream_dp.kafka_client.fetched import PINNED_VERSIONS, fetch_options
from tests.helpers import TopicFactory
from tests.integration.support import HANG_GUARD_S

pytestmark = pytest.mark.kafka

N_RECORDS = 53
#: Small, so that one fetched batch is handed out over several ``getmany`` calls (aiokafka
#: moves the position after each one).
MAX_RECORDS = 7


def test_the_installed_aiokafka_is_one_the_adapter_was_checked_against() -> None:
    """Upgrading aiokafka must make someone re-read fetched.py against the new fetcher."""
    assert aiokafka.__version__ in PINNED_VERSIONS, (
        f"aiokafka {aiokafka.__version__}: check PartitionRecords._consumer_record and the "
        "fetcher's positions against stream_dp/kafka_client/fetched.py, then pin it there"
    )
    assert fetch_options(), "the adapter is not installed on a pinned aiokafka"


async def _read_all(
    bootstrap: str, tp: TopicPartition, options: dict[str, Any]
) -> tuple[list[Any], list[int], list[int]]:
    """Every record of ``tp`` read in getmany calls of MAX_RECORDS, the consumer's position
    after each call, and the offset just past each call's last record. (Where a call ends
    depends on how the broker's answers cut the log, which is timing.)"""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, **options)
    await consumer.start()
    records: list[Any] = []
    positions: list[int] = []
    ends: list[int] = []
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        for _ in range(int(HANG_GUARD_S / 0.2)):
            batch = await consumer.getmany(tp, timeout_ms=200, max_records=MAX_RECORDS)
            got = batch.get(tp, [])
            records.extend(got)
            if got:
                positions.append(await consumer.position(tp))
                ends.append(got[-1].offset + 1)
            if len(records) >= N_RECORDS:
                break
    finally:
        await consumer.stop()
    return records, positions, ends


async def test_parsed_records_carry_what_consumer_records_do(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = await topic_factory(1)
    tp = TopicPartition(topic, 0)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", linger_ms=20)
    await producer.start()
    try:
        sent = []
        for i in range(N_RECORDS):
            tombstone = i % 11 == 3  # (a record needs a key or a value)
            key = None if i % 5 == 0 and not tombstone else b"user-%d" % i
            value = None if tombstone else b'{"user_id":"u%d","timestamp":%d}' % (i, i)
            sent.append(producer.send(topic, value, key=key, timestamp_ms=1_700_000_000_000 + i))
        for future in sent:
            await (await future)
    finally:
        await producer.stop()

    parsed, parsed_positions, parsed_ends = await _read_all(kafka_bootstrap, tp, fetch_options())
    plain, plain_positions, plain_ends = await _read_all(kafka_bootstrap, tp, {})

    assert len(plain) == N_RECORDS
    assert all(type(r) is ConsumerRecord for r in plain), "other consumers keep ConsumerRecord"
    assert not any(isinstance(r, ConsumerRecord) for r in parsed), "no ConsumerRecord built"

    def fields(records: list[Any]) -> list[tuple[Any, ...]]:
        return [(r.offset, r.key, r.value, r.timestamp) for r in records]

    assert fields(parsed) == fields(plain)
    assert [r.offset for r in parsed] == list(range(N_RECORDS))
    # After each call the position is just past the records it handed out, as aiokafka's own
    # consumer moves it (compared call by call, not with the other consumer's calls: where
    # a call ends depends on the broker's answers).
    assert parsed_positions == parsed_ends
    assert plain_positions == plain_ends
    assert parsed_positions[-1] == plain_positions[-1] == N_RECORDS


async def test_the_worker_consumer_is_made_with_the_fetch_options() -> None:
    """The worker's one consumer (membership) gets the parsed records."""
    import asyncio

    from stream_dp.kafka_client.fetched import raw_value
    from stream_dp.ops.health import Health
    from stream_dp.ops.metrics import Metrics
    from stream_dp.pipeline.faults import NO_FAULTS
    from stream_dp.pipeline.kafka.context import WorkerContext
    from stream_dp.pipeline.kafka.membership import Membership
    from tests.pipeline.support import config

    context = WorkerContext(config(), Metrics(process=False), Health(), asyncio.Event(), NO_FAULTS)
    consumer = Membership(context).subscribe({"bootstrap_servers": "127.0.0.1:9"})
    try:
        # (aiokafka keeps it here; the fetcher gets it at start)
        assert consumer._value_deserializer is raw_value
        assert consumer._key_deserializer is None
    finally:
        await consumer.stop()
