"""The internal and input topics' partition counts, watched while the worker runs.

A change of the partials, ledger or continual topic's count is fatal (each window must keep
one owner and one ledger partition); a change of the input or repartition topic is loud
(log, metric) and makes the worker not ready until the windows open then are out. An input
or repartition topic deleted under the worker is not created again by its clients
(stream_dp/kafka_client/metadata.py): the watch says so (ERROR, metric) and the worker is not
ready until the topic is back.

Counts are asked of the broker (never read from the producer's metadata, which can be five
minutes old) when partitions are taken, and every :data:`WATCH_INTERVAL_S` by :meth:`tick`
for the topics read without a fixed count: a change is seen within seconds, not at the next
rebalance. When the stage-1 topic of keyed input grows, the windows begun so far keep the
count before (:class:`~stream_dp.pipeline.stages.placement.SourceLayout`), later ones
take the new.

That layout is kept with the committed offsets (:func:`with_layout`,
:func:`restore_layout`): it lived only in the memory of the worker that saw the change, so a
worker restarted while a window begun before it was open replayed that window's records from
the committed offsets and checked them against the count it found at start, dead-lettering
correctly placed records as ``misplaced_key`` (48 of 80 in a 4 → 6 change on Apache Kafka).
Now it is the metadata of every commit of a stage-1 partition, read back (the group's
committed offsets, as aiokafka's own ``committed`` reads them, metadata included) before a
taken partition's first record is checked.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any

from stream_dp.errors import StreamDPError
from stream_dp.kafka_client import TopicPartition
from stream_dp.kafka_client.errors import KafkaError, UnknownTopicOrPartitionError
from stream_dp.ops.health import Health
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.kafka.publisher import Publisher
from stream_dp.pipeline.stages.ingest import IngestStage
from stream_dp.windows.tumbling import iso_utc

log = logging.getLogger(__name__)

#: How often the counts of the topics read without a fixed count are asked of the broker.
WATCH_INTERVAL_S = 2.0
#: How long one watch lookup may take before the watch tries again at the next interval.
WATCH_TIMEOUT_S = 5.0


class TopologyError(StreamDPError):
    """A topic the release protocol depends on changed shape while the worker ran."""


class TopologyWatch:
    """Partition counts seen at start per topic, and when a change stops settling."""

    def __init__(
        self,
        publisher: Publisher,
        *,
        metrics: Metrics,
        health: Health,
        window_size_s: int,
    ) -> None:
        self._publisher = publisher
        self._metrics = metrics
        self._health = health
        self._window_size_s = window_size_s
        self.counts: dict[str, int] = {}
        #: topics whose count may never change (partials, ledger, continual)
        self.fixed: set[str] = set()
        self._unsettled_until_s: float | None = None
        #: The stage-1 topic when the input is keyed by user (its placement is checked).
        self.keyed_topic: str | None = None
        #: watched topics the broker says it has no longer (deleted): not ready meanwhile
        self.gone: set[str] = set()
        self._watched_at_s = time.monotonic()
        #: (topic or "*" for the whole request, error type) of the failed lookups said so far
        self._unread: set[tuple[str, str]] = set()

    def record(self, topic: str, count: int, *, fixed: bool) -> None:
        """The count seen at start."""
        self.counts[topic] = count
        if fixed:
            self.fixed.add(topic)

    async def partitions(
        self, topic: str, *, watermark_s: float | None, ingest: IngestStage | None = None
    ) -> int:
        """The topic's partition count now (asked of the broker); a change since start is
        loud (log, metric, readiness) — fatal for the partials, ledger and continual topics.
        ``ingest``: the stage whose placement checks follow the keyed stage-1 topic."""
        count = len(await self._publisher.partitions(topic, bounded=True, fresh=True))
        self._compare(topic, count, watermark_s, ingest)
        return count

    async def tick(self, watermark_s: float | None, ingest: IngestStage) -> None:
        """Each loop iteration: readiness back once settled (:meth:`settle`); every
        :data:`WATCH_INTERVAL_S`, the counts of the topics without a fixed one, asked of
        the broker (a lookup that fails or hangs is tried again at the next interval; a
        topic the answer has no count for is, and the others' counts are compared)."""
        if watermark_s is not None:
            self.settle(watermark_s)
        now = time.monotonic()
        if now - self._watched_at_s < WATCH_INTERVAL_S:
            return
        self._watched_at_s = now
        topics = sorted(self.counts.keys() - self.fixed)
        if not topics:
            return
        lookup = self._publisher.fresh_partitions(topics, bounded=True)  # one request
        try:
            found = await asyncio.wait_for(lookup, WATCH_TIMEOUT_S)
        except (KafkaError, StreamDPError, TimeoutError) as exc:
            self._unread_once("*", topics, exc)
            return
        self._read_again("*")
        for topic in topics:  # one topic that fails (deleted?) hides no other's change
            partitions = found[topic]
            if isinstance(partitions, UnknownTopicOrPartitionError):
                self._gone(topic)
                continue
            if isinstance(partitions, KafkaError):
                self._unread_once(topic, [topic], partitions)
                continue
            self._read_again(topic)
            self._back(topic, len(partitions))
            self._compare(topic, len(partitions), watermark_s, ingest)

    def _unread_once(self, key: str, topics: list[str], exc: BaseException) -> None:
        """A failed lookup, said at INFO once per kind until the counts read again: an outage
        or a refused Describe lasts, and the fetch path and the broker check report those
        loudly; said every :data:`WATCH_INTERVAL_S`, it was 1,800 lines an hour."""
        kind = (key, type(exc).__name__)
        if kind not in self._unread:
            self._unread.add(kind)
            log.info(
                "the partition counts of %s could not be read (%r); said once until they "
                "are read again",
                topics,
                exc,
            )

    def _read_again(self, key: str) -> None:
        """``key``'s counts read: its failures are said again if they come back."""
        if self._unread:
            self._unread = {kind for kind in self._unread if kind[0] != key}

    def _gone(self, topic: str) -> None:
        """The broker has no ``topic`` (deleted under the worker; no client of stream-dp
        creates it again: stream_dp/kafka_client/metadata.py): counted, an ERROR once, not
        ready until it is back."""
        if topic in self.gone:
            return
        self.gone.add(topic)
        self._metrics.topology_changes.labels(topic=topic).inc()
        self._health.set("topology_stable", False)
        log.error(
            "topic %s, which the worker reads, no longer exists on the broker (deleted while "
            "the worker ran): nothing more is read from it, and the worker does not create it "
            "again. Create it again with its %d partitions and its configuration (`stream-dp "
            "topics apply --config FILE`; the records it held are lost), or set the config to "
            "the topic the producers write to and restart. The worker is not ready until the "
            "topic is back",
            topic,
            self.counts.get(topic, 0),
        )

    def _back(self, topic: str, count: int) -> None:
        """A topic :meth:`_gone` answers again (with ``count`` partitions)."""
        if topic not in self.gone:
            return
        self.gone.discard(topic)
        log.warning("topic %s exists again, with %d partitions", topic, count)
        if not self.gone and self._unsettled_until_s is None:
            self._health.set("topology_stable", True)

    def _compare(
        self, topic: str, count: int, watermark_s: float | None, ingest: IngestStage | None
    ) -> None:
        before = self.counts.setdefault(topic, count)
        if count != before:
            self._metrics.topology_changes.labels(topic=topic).inc()
            (log.error if topic in self.fixed else log.warning)(
                "topic %s changed from %d to %d partitions while the worker ran",
                topic,
                before,
                count,
            )
            self.counts[topic] = count
            if topic == self.keyed_topic and ingest is not None and count > before:
                first_new = ingest.layout.grow(before, time.time())
                ingest.learn_partitions(count)
                log.warning(
                    "keyed input: windows from %s on are checked against the %d partitions "
                    "of %s, earlier ones against the %d before (one count per window)",
                    iso_utc(first_new),
                    count,
                    topic,
                    before,
                )
            if topic in self.fixed:
                raise TopologyError(
                    f"the partition count of {topic} changed from {before} to {count}: each "
                    "window must keep one owner and one ledger partition. Restore the count, "
                    "or start a new deployment (a new kafka.group_id) with window.start_at "
                    "after the last released window"
                )
            # A user may now sit on a partition of each layout: stage 2 merges one layout
            # per window, and the worker is not ready until the windows open now are out.
            self._health.set("topology_stable", False)
            self._unsettled_until_s = (watermark_s or 0.0) + 2 * self._window_size_s

    def settle(self, watermark_s: float) -> None:
        """Ready again once the release watermark passed the windows open at the change."""
        if self._unsettled_until_s is not None and watermark_s >= self._unsettled_until_s:
            self._unsettled_until_s = None
            self._health.set("topology_stable", not self.gone)


def with_layout(
    offsets: dict[TopicPartition, int], stage1_topic: str, ingest: IngestStage
) -> dict[TopicPartition, Any]:
    """``offsets`` to commit, those of ``stage1_topic`` as (offset, the layout)."""
    metadata = ingest.layout.to_metadata(ingest.source_partitions)
    return {tp: (off, metadata) if tp.topic == stage1_topic else off for tp, off in offsets.items()}


async def restore_layout(
    consumer: Any, partitions: Iterable[TopicPartition], ingest: IngestStage
) -> None:
    """Before any record of ``partitions`` (stage-1 partitions just taken) is checked: the
    layout committed with their offsets, merged into ``ingest``'s."""
    taken = sorted(partitions)
    if not taken:
        return
    # aiokafka's consumer.committed() drops the metadata; this is the call it makes.
    committed = await consumer._coordinator.fetch_committed_offsets(taken)
    added = ingest.layout.restore(
        (meta.metadata for meta in committed.values() if meta.offset >= 0),
        ingest.source_partitions,
    )
    for until, count in added:
        log.warning(
            "keyed input: windows before %s are checked against the %d partitions they "
            "began under (the layout committed with the offsets replayed from)",
            iso_utc(until),
            count,
        )
