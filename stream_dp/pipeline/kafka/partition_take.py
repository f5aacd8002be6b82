"""Taking partitions the group assigned: what must hold before their first record is processed.

The membership pauses a new assignment in aiokafka's callback and the loop takes it
(:meth:`stream_dp.pipeline.kafka.membership.Membership.take_assigned`, which keeps the
bookkeeping: what is owned, what waits, when fetching resumes). What taking means is here:

- the stage-1 topic's and (on the default path) the input topic's partition counts checked,
  never guessed: stage 2 waits for every stage-1 partition, and a repartition partition for
  every input partition (:mod:`stream_dp.pipeline.kafka.topology_watch`);
- with keyed input, the per-window partition counts committed with the offsets restored
  before any replayed record is checked;
- the state of the stage-1 and routed input partitions built, ``input.start_from: latest``
  applied to input partitions the group never committed;
- for partials partitions, the ledger read to fresh fences (another worker may have released
  windows of them) and its unpublished winners republished unchanged.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from stream_dp.kafka_client import AIOKafkaConsumer, TopicPartition
from stream_dp.pipeline.kafka.context import WorkerContext, WorkerPart
from stream_dp.pipeline.kafka.erasure.erasure_worker import WorkerErasure
from stream_dp.pipeline.kafka.ledger_log import LedgerReadError
from stream_dp.pipeline.kafka.ledger_reader import LedgerReader
from stream_dp.pipeline.kafka.topology_watch import TopologyWatch, restore_layout
from stream_dp.pipeline.release_driver import ReleaseDriver
from stream_dp.pipeline.stages.ingest import IngestStage
from stream_dp.pipeline.stages.release_stage import ReleaseStage
from stream_dp.windows.tumbling import iso_utc

log = logging.getLogger(__name__)


@dataclass
class Stages:
    """What the worker built at start, that taking and dropping partitions changes."""

    ingest: IngestStage
    release: ReleaseStage
    driver: ReleaseDriver
    reader: LedgerReader
    topology: TopologyWatch
    erasure: WorkerErasure | None = None


@dataclass(frozen=True)
class Taken:
    """The partitions of one take, by what reads them (:meth:`Membership.split`)."""

    stage1: list[int]
    partials: list[int]
    routed: list[int]
    #: the input topic's partitions among them (``input.start_from``)
    input: list[TopicPartition]


class PartitionTake(WorkerPart):
    """Builds the state of partitions the loop takes (module docstring); the topics it reads
    are fixed at construction."""

    def __init__(
        self, context: WorkerContext, *, input_topic: str, stage1_topic: str, keyed: bool
    ) -> None:
        super().__init__(context)
        self.input_topic = input_topic
        self.stage1_topic = stage1_topic
        self.keyed = keyed

    async def take(self, stages: Stages, consumer: AIOKafkaConsumer | None, taken: Taken) -> None:
        """Take these partitions: raises, leaving them to a later take, if any step fails."""
        ingest, release, topology = stages.ingest, stages.release, stages.topology
        watermark = release.watermark_s()
        topology.keyed_topic = self.stage1_topic if self.keyed else None
        source_partitions = await topology.partitions(
            self.stage1_topic, watermark_s=watermark, ingest=ingest
        )
        ingest.learn_partitions(source_partitions)
        if self.keyed:  # before any record is checked: the counts of the windows replayed
            tps = [TopicPartition(self.stage1_topic, p) for p in taken.stage1]
            await restore_layout(consumer, tps, ingest)
        if not self.keyed:
            input_partitions = await topology.partitions(self.input_topic, watermark_s=watermark)
            ingest.learn_partitions(source_partitions, input_partitions=input_partitions)
        for topic in sorted(topology.fixed):
            await topology.partitions(topic, watermark_s=watermark)
        now, now_mono = time.time(), time.monotonic()
        # With the wall clock, event time catches up with it once the input is proven idle
        # (a restart while idle releases the due windows, not one second per second).
        ingest.assign(taken.stage1, now_mono, routed=not self.keyed, now_s=now)
        ingest.assign_routed(taken.routed, now_mono, now_s=now)
        if self.config.input.start_from == "latest" and consumer is not None:
            await start_from_latest(consumer, taken.input)
        if taken.partials:
            # Another worker may have released windows of these partitions: read the
            # ledger to fresh fences before taking any of their partials.
            if self._faults.take_fails():
                raise LedgerReadError("test fault: the ledger read failed")
            await stages.reader.catch_up_ledger(None, bounded=True)
            release.adopt_ledger()
            await self._republish_unpublished(stages, set(taken.partials))
            release.assign(taken.partials)

    async def _republish_unpublished(self, stages: Stages, partials: set[int]) -> None:
        """Republish, unchanged, the ledger's unpublished winners of these partitions."""
        driver = stages.driver
        for rel in stages.reader.ledger.unpublished():
            if driver.partials_partition_of(rel.window_start_s) not in partials:
                continue
            log.info(
                "republishing a ledgered release unchanged",
                extra={"query": rel.query, "window": iso_utc(rel.window_start_s)},
            )
            await driver.publish(rel)
            self.metrics.ledger_republished.inc()


async def start_from_latest(consumer: AIOKafkaConsumer, taken: list[TopicPartition]) -> None:
    """``input.start_from: latest``: input partitions this group never committed start at
    their end."""
    for tp in taken:
        if await consumer.committed(tp) is None:
            await consumer.seek_to_end(tp)
