"""A partition's start position when the consumer may not choose one itself.

Every consumer of stream-dp that keeps committed offsets (the worker's group consumer, the
sink's) runs with ``auto_offset_reset="none"``: the client never moves a position on its own.
When its ``getmany`` raises one of :data:`OFFSET_ERRORS`, the caller hands the error here:

* :func:`position_uncommitted` — no committed offset (a new group, a partition never
  committed): the owned partitions are read from their log start, or from their end where
  the caller says so (the worker's ``input.start_from: latest``);
* :func:`out_of_range` — a position (after a restart the committed offset, while running the
  fetch position) outside its partition's log: each owned partition described with its
  committed offset and the log's range (:class:`OutOfRange`), for the caller to decide —
  the worker stops or skips (stream_dp.pipeline.kafka.hold_guards), the sink reports and
  goes on from the log start (stream_dp.sink.service) — and then, if it goes on, to call
  :func:`skip_to_log_start`.

The broker says what is out of range (Apache Kafka answers a fetch below the log start or
past the high watermark with OFFSET_OUT_OF_RANGE). The log range in :class:`OutOfRange` is
for the message only: the embedded broker's end offset is the last batch's base offset + 1,
so comparing a committed offset with it would take a normal position for a lost one — and
that broker answers a fetch past its end with no records, not an error (a recreated topic
goes unnoticed there until it grows past the committed offset).

A partition revoked meanwhile is left alone: its new owner meets the same error.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass

from stream_dp.kafka_client import AIOKafkaConsumer, TopicPartition
from stream_dp.kafka_client.errors import (
    IllegalStateError,
    KafkaError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
)

#: What a consumer with ``auto_offset_reset="none"`` raises for a partition it cannot position.
OFFSET_ERRORS = (NoOffsetForPartitionError, OffsetOutOfRangeError)
#: How long asking the broker for a partition's committed offset or log range may take.
RANGE_QUERY_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class OutOfRange:
    """A partition whose position the broker says is out of range, with its log range."""

    topic: str
    partition: int
    position: int
    committed: int | None
    log_start: int | None
    log_end: int | None

    @property
    def below_start(self) -> bool:
        """The records from ``position`` up to the log start were deleted (retention,
        DeleteRecords); otherwise the position is past the log end (a recreated topic)."""
        return self.log_start is not None and self.position < self.log_start

    @property
    def records_skipped(self) -> int | None:
        """Records between the position and the log start, which reading on from the log
        start never sees; None when the position is not below a known log start (past the
        end of a recreated topic: how many the old topic held after it is unknowable)."""
        if self.log_start is None or not self.below_start:
            return None
        return self.log_start - self.position

    def describe(self) -> str:
        committed = "none" if self.committed is None else str(self.committed)
        start = "unknown" if self.log_start is None else str(self.log_start)
        end = "unknown" if self.log_end is None else str(self.log_end)
        return (
            f"{self.topic}[{self.partition}]: position {self.position} (committed "
            f"{committed}) is outside the log [{start}, {end})"
        )


async def position_uncommitted(
    consumer: AIOKafkaConsumer,
    exc: NoOffsetForPartitionError,
    *,
    from_end: Callable[[TopicPartition], bool] = lambda tp: False,
) -> None:
    """The owned partitions of ``exc`` read from their log start (or end: ``from_end``)."""
    tps = [tp for tp in exc.args if isinstance(tp, TopicPartition)]
    owned = [tp for tp in tps if tp in consumer.assignment()]
    to_end = [tp for tp in owned if from_end(tp)]
    to_start = [tp for tp in owned if tp not in to_end]
    # (A rebalance may revoke them meanwhile: their new owner positions them.)
    with contextlib.suppress(IllegalStateError):
        if to_end:
            await consumer.seek_to_end(*to_end)
        if to_start:
            await consumer.seek_to_beginning(*to_start)


async def out_of_range(consumer: AIOKafkaConsumer, exc: OffsetOutOfRangeError) -> list[OutOfRange]:
    """The owned partitions of ``exc``, described (in partition order)."""
    positions = exc.args[0] if exc.args and isinstance(exc.args[0], dict) else {}
    return [
        await describe(consumer, tp, int(position))
        for tp, position in sorted(positions.items())
        if tp in consumer.assignment()
    ]


async def skip_to_log_start(consumer: AIOKafkaConsumer, lost: OutOfRange) -> None:
    """Read ``lost``'s partition on from its log start (unless revoked meanwhile)."""
    with contextlib.suppress(IllegalStateError):
        await consumer.seek_to_beginning(TopicPartition(lost.topic, lost.partition))


async def describe(consumer: AIOKafkaConsumer, tp: TopicPartition, position: int) -> OutOfRange:
    """``tp`` at ``position`` with its committed offset and log range (each None when the
    broker does not answer in time: the description is for a message, never a decision's
    only input)."""
    committed = start = end = None
    with contextlib.suppress(KafkaError, asyncio.TimeoutError):
        committed = await asyncio.wait_for(consumer.committed(tp), RANGE_QUERY_TIMEOUT_S)
    with contextlib.suppress(KafkaError, asyncio.TimeoutError):
        start = (
            await asyncio.wait_for(consumer.beginning_offsets([tp]), RANGE_QUERY_TIMEOUT_S)
        ).get(tp)
    with contextlib.suppress(KafkaError, asyncio.TimeoutError):
        end = (await asyncio.wait_for(consumer.end_offsets([tp]), RANGE_QUERY_TIMEOUT_S)).get(tp)
    return OutOfRange(tp.topic, tp.partition, position, committed, start, end)
