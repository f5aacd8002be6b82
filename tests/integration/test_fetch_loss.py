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

The broken partition's own plain records before its snappy batch were never returned either
(aiokafka raised with them in hand and fetched them again, for ever): now they come first,
then the error. End to end, a worker without snappy releases exactly the events written
plainly, on eight partitions one of which ends in the unreadable batch (that test checks the
whole path; it does not order the fetches, so it is not the guard of the loss).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiokafka.codec
import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError, UnsupportedCodecError

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from stream_dp.kafka_client.fetched import fetch_options
from stream_dp.pipeline.kafka.worker import Worker
from stream_dp.windows.tumbling import iso_utc
from tests.helpers import TopicFactory
from tests.integration.support import (
    HANG_GUARD_S,
    NOISE_FREE,
    WorkerProcess,
    decode_values,
    read_topic,
    topics_of,
    windows_done,
)
from tests.integration.test_compressed_input import T0, produce_compressed
from tests.integration.test_fetch_errors import WITHOUT_CODECS
from tests.pipeline.support import KEYRING

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

#: Plain records per good partition (distinct counts: one partition cannot pass for another).
GOOD = {0: 41, 1: 43, 2: 47}
#: The broken partition: one snappy batch from its first offset (its fetch raises before
#: any record, so aiokafka's loop raised with the good partitions' records in hand).
BROKEN = 3
BROKEN_SNAPPY = 20
#: Plain records before the snappy batch, in the test of one partition alone.
BROKEN_PLAIN = 5


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
    placed: list[tuple[TopicPartition, ...]] = []  # where each error came from, as told
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
                f"not read to the end: { ({tp.partition: len(r) for tp, r in got.items()}) }"
            )
            try:
                batch = await worker.membership.fetch()
            except KafkaError as exc:
                errors.append(exc)
                drain = worker.membership.drain
                placed.append(drain.partitions_of(exc) if drain is not None else ())
                continue
            assert batch is not None
            for tp, records in batch.items():
                got[tp].extend(records)
        positions = {tp: await consumer.position(tp) for tp in got}
    finally:
        await consumer.stop()

    # Every error reaching the loop is the broken partition's codec, said at least once.
    assert errors and all(isinstance(e, UnsupportedCodecError) for e in errors), errors
    # Each placed on the broken partition (fetch health is kept per partition by it).
    assert placed == [(broken,)] * len(errors), placed
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
    assert positions[broken] == 0


#: The worker end to end: plain input partitions 0-6 (window-0 events of one domain each,
#: distinct counts, then a window-1 marker), partition 7 plain events and its marker followed
#: by a snappy batch this worker cannot decompress, all written before it starts.
WORKER_GOOD = {p: 31 + 2 * p for p in range(7)}
WORKER_BROKEN = 7
WORKER_BROKEN_PLAIN = 3


def _event(partition: int, i: int) -> dict[str, Any]:
    return {
        "user_id": f"p{partition}-user-{i}",
        "timestamp": T0 + 1 + i / 100,
        "domain": f"p{partition}.example",
    }


async def _produce_events(bootstrap: str, topic: str, partition: int, n: int) -> None:
    """``n`` window-0 events of ``p{partition}.example`` (a user each), then a window-1
    marker of ``later.example``, plainly (aiokafka's producer, no compression)."""
    events = [_event(partition, i) for i in range(n)]
    events.append(
        {"user_id": f"p{partition}-marker", "timestamp": T0 + 15, "domain": "later.example"}
    )
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        sent = [
            await producer.send(
                topic, orjson.dumps(e), key=str(e["user_id"]).encode(), partition=partition
            )
            for e in events
        ]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


async def test_the_worker_releases_every_event_of_the_partitions_fetched_with_an_unreadable_one(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    config_factory: Callable[[dict[str, Any] | None], Path],
    tmp_path: Path,
) -> None:
    topic = await topic_factory(partitions=8)
    domains = [f"p{p}.example" for p in [*WORKER_GOOD, WORKER_BROKEN]]
    query = {"name": "visits", "group_by": ["domain"], "epsilon": 1e6, "keys": {"domain": domains}}
    cfg = config_factory({"input": {"topic": topic}, "privacy": NOISE_FREE, "queries": [query]})
    await apply_topics(load_config(cfg), kafka_bootstrap, include_input=False)
    for partition, n in WORKER_GOOD.items():
        await _produce_events(kafka_bootstrap, topic, partition, n)
    await _produce_events(kafka_bootstrap, topic, WORKER_BROKEN, WORKER_BROKEN_PLAIN)
    await asyncio.to_thread(produce_compressed, kafka_bootstrap, topic, "snappy", WORKER_BROKEN, 20)
    log_path = tmp_path / "worker.log"
    handle = log_path.open("ab")
    worker = WorkerProcess(
        subprocess.Popen(
            [sys.executable, "-c", WITHOUT_CODECS, "run", "--config", str(cfg)],
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=dict(os.environ),
        ),
        log_path,
    )
    handle.close()
    try:
        out = await read_topic(
            kafka_bootstrap, topics_of(cfg)["output"], until=windows_done(["visits"], 1)
        )
    finally:
        code = worker.terminate()
    assert code == 0, worker.log()[-4000:]
    released = {
        v["group"]["domain"]: v["value"]
        for _, v in decode_values(out)
        if v["kind"] == "release" and v["window_start"] == iso_utc(T0)
    }
    expected = {f"p{p}.example": n for p, n in WORKER_GOOD.items()}
    expected[f"p{WORKER_BROKEN}.example"] = WORKER_BROKEN_PLAIN
    assert released == expected
    # The snappy batch was reported, not read: its error reached the loop.
    assert "fetch failed (unsupported_codec: UnsupportedCodecError)" in worker.log()


@pytest.mark.parametrize("worker_options", [True, False], ids=["worker", "plain"])
async def test_the_records_before_an_unreadable_batch_are_returned_then_its_error(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    monkeypatch: pytest.MonkeyPatch,
    worker_options: bool,
) -> None:
    """One partition: plain records, then a snappy batch. aiokafka raised the error with the
    plain records in hand and fetched them again, for ever: they were never returned. Now
    they come in one call, the position moves to the batch, and the next call raises."""
    topic = await topic_factory(partitions=1)
    tp = TopicPartition(topic, 0)
    await _produce_plain(kafka_bootstrap, topic, 0, BROKEN_PLAIN)
    await asyncio.to_thread(produce_compressed, kafka_bootstrap, topic, "snappy", 0, 20)
    monkeypatch.setattr(aiokafka.codec, "cramjam", None)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=kafka_bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **(fetch_options() if worker_options else {}),
    )
    await consumer.start()
    outcomes: list[list[int] | str] = []
    positions: list[int] = []
    try:
        consumer.assign([tp])
        deadline = time.monotonic() + HANG_GUARD_S  # a hang guard only
        while len(outcomes) < 3:
            assert time.monotonic() < deadline, outcomes
            try:
                batch = await consumer.getmany(tp, timeout_ms=200, max_records=1000)
            except UnsupportedCodecError:
                outcomes.append("UnsupportedCodecError")
            else:
                if not batch:
                    continue
                outcomes.append([r.offset for r in batch[tp]])
            positions.append(await consumer.position(tp))
    finally:
        await consumer.stop()
    plain = list(range(BROKEN_PLAIN))
    assert outcomes == [plain, "UnsupportedCodecError", "UnsupportedCodecError"], outcomes
    assert positions == [BROKEN_PLAIN] * 3
