"""The user placement on real workers (issue 37, item 2): during a murmur2 → crc32 change of
``input.partitioner`` (keyed input) a second worker under crc32 would accept a user's
records on the user's CRC-32 partition while the first accepts them on the murmur2 one —
the user bounded once on each (2 users, 2k events released). The partitioner is in the
deployment fingerprint: the second worker is refused, naming it, and the user is released
as one user bounded once.

Noise is switched off (test mode, ε = 1e6) so released values equal the bounded counts.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from stream_dp.pipeline.stages.placement import crc32_partition, murmur2_partition
from stream_dp.windows.tumbling import iso_utc
from tests.helpers import ConfigFactory, TopicFactory
from tests.integration.support import (
    WorkerProcess,
    decode_values,
    read_topic,
    start_worker,
    topics_of,
    wait_for_group,
    windows_done,
)
from tests.integration.test_fingerprint_worker import (
    QUERIES,
    T0,
    _assert_refused,
    _prepare,
    _refused_or_joined,
    _variant,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

K = 5
EVENTS = 10  # of the one user on each of its two home partitions
USER = "heavy"


async def _produce_to(bootstrap: str, topic: str, partition: int, n: int) -> None:
    """``n`` events of USER, keyed by the user id, on ``partition`` (as a producer with
    that partition's partitioner would put them)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        sends = [
            await producer.send(
                topic,
                orjson.dumps(
                    {"user_id": USER, "timestamp": T0 + 1 + i / 100, "domain": "a.example"}
                ),
                key=USER.encode(),
                partition=partition,
            )
            for i in range(n)
        ]
        await asyncio.gather(*sends)
    finally:
        await producer.stop()


async def test_a_worker_under_another_partitioner_is_refused_and_the_user_bounded_once(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    config_factory: ConfigFactory,
    workers: list[WorkerProcess],
    tmp_path: Path,
) -> None:
    murmur = murmur2_partition(USER.encode(), 2)
    crc = crc32_partition(USER.encode(), 2)
    assert murmur != crc  # the user has a home of each
    path, shared = await _prepare(kafka_bootstrap, topic_factory, config_factory, K)
    crc_config = _variant(path, "crc32", {"input": {"partitioner": "crc32"}})
    workers.append(start_worker(path, tmp_path / "murmur2.log"))
    await wait_for_group(workers, shared)
    workers.append(start_worker(crc_config, tmp_path / "crc32.log"))
    assert await _refused_or_joined(workers) == [workers[1]]
    _assert_refused(workers[1], "input.partitioner")

    topics = topics_of(path)
    await _produce_to(kafka_bootstrap, topics["input"], murmur, EVENTS)
    await _produce_to(kafka_bootstrap, topics["input"], crc, EVENTS)
    out = await read_topic(
        kafka_bootstrap, topics["output"], until=windows_done(QUERIES, 1), settle_s=1.0
    )
    dead = decode_values(
        await read_topic(kafka_bootstrap, topics["dead_letter"], until=lambda r: len(r) >= EVENTS)
    )
    assert workers[0].terminate() == 0, workers[0].log()
    released = {
        v["query"]: v["value"]
        for _, v in decode_values(out)
        if v["kind"] == "release" and v["window_start"] == iso_utc(T0)
    }
    assert released == {"visits": K, "users": 1}  # one user, bounded once: never 2, 2k
    assert Counter(v["reason"] for _, v in dead) == {"misplaced_key": EVENTS}
    assert {v["source_partition"] for _, v in dead} == {crc}
