"""Where the sink starts reading a partition: never a silent jump over lost records.

The sink's consumer runs with ``auto_offset_reset="none"`` (like the worker's), and the
positioning is :mod:`stream_dp.clients.offset_range`'s:

* **no committed offset** (a new sink group, a partition never committed): read from the
  log start — the whole topic is stored;
* **a committed offset (or, while running, the fetch position) out of the log's range**:
  the records from it up to the log start were deleted before the sink stored them (it was
  down longer than the output topic's ``retention.ms``, or someone ran DeleteRecords), or
  the topic was deleted and recreated with fewer records than the sink had read. The sink
  logs an ERROR naming the topic, partition, committed offset and the log's range (and how
  many records were lost when it can tell), counts
  ``stream_dp_sink_offset_out_of_range_total{topic}`` and
  ``stream_dp_sink_records_skipped_total{topic}``, and **reads on from the log start**.
  The broker says so on fetch (Apache Kafka does, below the log start and past the high
  watermark; the embedded broker answers a fetch past its end with no records, so there a
  recreated topic is read only once it grows past the committed offset).

Why reading on rather than holding (as the worker does): the worker holds because releasing
past lost records would publish a wrong count; the sink publishes nothing. The lost records
are gone from Kafka and a stopped sink cannot bring them back, while a held sink would also
keep every later window out of the database; re-reading records already stored changes
nothing (the tables' idempotent upsert). So the loss is made loud — log, counter, the
StreamDPSinkOffsetOutOfRange alert — and the sink keeps the database as complete as the
topic still allows.
"""

from __future__ import annotations

import logging

from stream_dp.clients.offset_range import (
    OutOfRange,
    out_of_range,
    position_uncommitted,
    skip_to_log_start,
)
from stream_dp.kafka_client import AIOKafkaConsumer
from stream_dp.kafka_client.errors import NoOffsetForPartitionError, OffsetOutOfRangeError
from stream_dp.sink.metrics import SinkMetrics

log = logging.getLogger("stream_dp.sink.service")  # the sink's one logger


class SinkOffsets:
    """Positions the sink's partitions without a valid offset (see the module)."""

    def __init__(self, topic: str, metrics: SinkMetrics) -> None:
        self.metrics = metrics
        metrics.offset_out_of_range.labels(topic=topic)  # the series from the start, at zero
        metrics.records_skipped.labels(topic=topic)

    async def resolve(
        self, consumer: AIOKafkaConsumer, exc: NoOffsetForPartitionError | OffsetOutOfRangeError
    ) -> None:
        """What the fetch raised for partitions without a valid offset."""
        if isinstance(exc, NoOffsetForPartitionError):
            await position_uncommitted(consumer, exc)
            return
        for lost in await out_of_range(consumer, exc):
            await self._read_on(consumer, lost)

    async def _read_on(self, consumer: AIOKafkaConsumer, lost: OutOfRange) -> None:
        skipped = lost.records_skipped
        self.metrics.offset_out_of_range.labels(topic=lost.topic).inc()
        self.metrics.records_skipped.labels(topic=lost.topic).inc(skipped or 0)
        if skipped is not None:
            what = (
                f"{skipped} records (offsets {lost.position} to {lost.position + skipped - 1}) "
                "were deleted before the sink stored them — the sink was down longer than the "
                "output topic's retention.ms, or records were deleted — and their releases are "
                "not in the database"
            )
        else:
            what = (
                "the topic holds fewer records than the sink had read: it was deleted and "
                "recreated (or truncated); what the old topic held after the committed "
                "offset is not in the database unless the sink had stored it"
            )
        log.error(
            "output records lost before the sink stored them: offset out of range on %s. "
            "%s. Reading on from the log start (records already stored change nothing); the "
            "lost records cannot be read again from this topic. Keep the output topic's "
            "retention.ms above the sink's longest outage (runbook: "
            "StreamDPSinkOffsetOutOfRange)",
            lost.describe(),
            what,
            extra={"topic": lost.topic, "partition": lost.partition, "offset": lost.position},
        )
        await skip_to_log_start(consumer, lost)
