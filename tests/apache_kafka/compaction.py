"""Watching Apache Kafka's log cleaner compact a topic, in a test's time.

A topic is created with :data:`COMPACT_LATER` (compacted, kept forever, segments of Kafka's
default week: nothing is cleaned while the test writes, so a first read shows the log as
written). :func:`compact` then sets :data:`COMPACT_QUICKLY` (a segment rolls 100 ms after it
was opened and is cleanable as soon as anything in it is superseded), writes a probe key twice
on each partition, then a "roll" record every 200 ms (a segment rolls only when a record
arrives after ``segment.ms``) until the first probe is gone: the cleaner has then compacted
every record written before the second probe. The waits are conditions with a hard timeout;
the 200 ms is the pace of the roll records, not a guess at how long compaction takes.

Probe and roll records are fence records (``__fence__|…``, kind ``fence``): the ledger and the
erasure log readers skip them, as they skip the fences the workers write.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterable, Sequence

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from tests.integration.support import HANG_GUARD_S

#: A compacted topic as stream-dp defines the ledger: nothing cleaned within a test's time.
COMPACT_LATER = {"cleanup.policy": "compact", "retention.ms": "-1"}
#: Topic settings under which the cleaner compacts within a second or two of a roll.
COMPACT_QUICKLY = {
    "cleanup.policy": "compact",
    "retention.ms": "-1",
    "segment.ms": "100",
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "0",
    "delete.retention.ms": "100",
}
PROBE_KEY = b"__fence__|compaction-probe"
ROLL_KEY = b"__fence__|compaction-roll"
#: (offset, key, value) of one record as the broker holds it.
Stored = tuple[int, str, bytes | None]


def _fence(fence_id: str) -> bytes:
    return orjson.dumps({"schema_version": 1, "kind": "fence", "fence_id": fence_id})


async def read_partition(bootstrap: str, topic: str, partition: int) -> list[Stored]:
    """Every record of one partition, from its log start to its end offset at the call."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    tp = TopicPartition(topic, partition)
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        out: list[Stored] = []
        deadline = time.monotonic() + HANG_GUARD_S
        while await consumer.position(tp) < end:
            assert time.monotonic() < deadline, f"{topic}[{partition}]: no end in {HANG_GUARD_S} s"
            batch = await consumer.getmany(tp, timeout_ms=500)
            for m in batch.get(tp, []):
                out.append((m.offset, (m.key or b"").decode(), m.value))
        return out
    finally:
        await consumer.stop()


async def read_all(bootstrap: str, topic: str, partitions: Iterable[int]) -> list[Stored]:
    """:func:`read_partition` of each partition, one after the other (log order within each)."""
    out: list[Stored] = []
    for p in partitions:
        out += await read_partition(bootstrap, topic, p)
    return out


def is_probe(key: str) -> bool:
    return key.encode() in (PROBE_KEY, ROLL_KEY)


async def compact(bootstrap: str, topic: str, partitions: Sequence[int]) -> None:
    """Block until the cleaner has compacted what each partition held before the call."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        settings = {**COMPACT_QUICKLY, **_delete_policy_kept(await _policy(admin, topic))}
        (response,) = await admin.alter_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic, configs=settings)]
        )
        assert all(r[0] == 0 for r in response.resources), response
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for p in partitions:
            await producer.send_and_wait(topic, _fence("probe-1"), key=PROBE_KEY, partition=p)
            await producer.send_and_wait(topic, _fence("probe-2"), key=PROBE_KEY, partition=p)
        pending = set(partitions)
        deadline = time.monotonic() + HANG_GUARD_S
        while pending:
            assert time.monotonic() < deadline, (
                f"the log cleaner compacted no segment of {topic} {sorted(pending)} within "
                f"{HANG_GUARD_S} s"
            )
            for p in sorted(pending):
                await producer.send_and_wait(topic, _fence("roll"), key=ROLL_KEY, partition=p)
                held = await read_partition(bootstrap, topic, p)
                if not any(v == _fence("probe-1") for _, k, v in held if k.encode() == PROBE_KEY):
                    pending.discard(p)
            await asyncio.sleep(0.2)
    finally:
        await producer.stop()


async def _policy(admin: AIOKafkaAdminClient, topic: str) -> str:
    (response,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    (resource,) = response.to_object()["resources"]
    entries = {e["config_names"]: e["config_value"] for e in resource["config_entries"]}
    return str(entries["cleanup.policy"])


def _delete_policy_kept(policy: str) -> dict[str, str]:
    """A topic that also deletes by time (the erasure log) keeps doing so."""
    return {"cleanup.policy": policy} if "delete" in policy else {}


def kinds(records: Iterable[Stored]) -> Counter[str]:
    """How many records of each ``kind`` (probes and rolls left out)."""
    return Counter(
        str(orjson.loads(v).get("kind")) if v is not None else "tombstone"
        for _, k, v in records
        if not is_probe(k)
    )
