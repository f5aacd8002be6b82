"""A consumer's fetched records taken one partition at a time, so that a fetch error in one
partition loses no record of another (aiokafka 0.14).

aiokafka's ``getmany`` takes the records it holds partition after partition, moving each
partition's position past the records it takes (``FetchResult.getall``). A partition's
records are parsed only then, as they are taken: a record batch compressed with a codec this
process cannot decompress, or one that fails its checksum, raises out of ``getmany`` in the
middle of that loop, and the records already taken from the partitions before it go with the
exception, their positions moved past them. Nobody ever sees those events, and the next
offset committed on those partitions counts them as done: events silently missing from the
releases, every time the broken partition's error comes back (on every fetch of its bytes).
aiokafka returns the records taken first only for errors it stored before (``FetchError``:
an authorization error, an offset out of range), not for one raised while parsing.

:class:`PartitionDrain` takes them apart. One ``getmany`` waits for data and takes at most
one record, so nothing is taken before an error it raises; then one ``getmany(tp)`` per
assigned partition, whose error can only come from that partition: what the others gave is
kept and returned, and the error is raised by the next call, before anything is taken. The
failing partition itself loses nothing: its position moves only when its records are
returned, and aiokafka discards a buffered fetch whose start is no longer the partition's
position, so the partition is fetched again from its first record not returned (and fails
again there, loudly, until the cause is fixed). Its records before the unreadable batch are
returned first (:mod:`stream_dp.kafka_client.fetched`, on the pinned aiokafka; without it they
come one per call, through the waiting ``getmany``).

:meth:`PartitionDrain.partitions_of` says which partition an error it raised came from, so
that a reader tracks the health of each partition: one broken partition keeps failing while
the others flow, and is not taken for cleared by their successful fetches. The waiting
``getmany`` reads every partition: its error is placed by the partition the fetched-records
adapter marks on a parse error, or what aiokafka says in it (the partition a bad checksum
names, the topic an authorization error names), else not placed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from stream_dp.kafka_client import AIOKafkaConsumer, TopicPartition
from stream_dp.kafka_client.errors import KafkaError, TopicAuthorizationFailedError
from stream_dp.kafka_client.fetched import failed_partition

__all__ = ["PartitionDrain", "named_partitions"]


class PartitionDrain:
    """``getmany`` of one consumer, one partition at a time (see the module)."""

    def __init__(self, consumer: AIOKafkaConsumer) -> None:
        self.consumer = consumer
        #: An error a partition raised after others had given records: raised next call.
        self._deferred: tuple[KafkaError, TopicPartition] | None = None
        #: The error last raised, and the partitions it came from (empty: not known).
        self._raised: tuple[KafkaError, tuple[TopicPartition, ...]] | None = None
        #: Which assigned partition is drained first: turns, so none waits for the others.
        self._turn = 0

    async def getmany(
        self, *, timeout_ms: int, max_records: int
    ) -> dict[TopicPartition, list[Any]]:
        """Up to ``max_records`` records, waiting up to ``timeout_ms`` for the first; every
        record taken is returned. Raises the error a partition's fetch raised (aiokafka's
        ``KafkaError``): at once if nothing was taken before it, else on the next call."""
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            self._raised = (deferred[0], (deferred[1],))
            raise deferred[0]
        consumer = self.consumer
        try:
            batch: dict[TopicPartition, list[Any]] = dict(
                await consumer.getmany(timeout_ms=timeout_ms, max_records=1)
            )
        except KafkaError as exc:
            self._raised = (exc, named_partitions(exc, consumer.assignment()))
            raise
        if not batch:
            return batch
        taken = sum(len(records) for records in batch.values())
        order = sorted(consumer.assignment())
        start = self._turn % len(order) if order else 0
        self._turn += 1
        for tp in order[start:] + order[:start]:
            if taken >= max_records:
                break
            try:
                more = await consumer.getmany(tp, timeout_ms=0, max_records=max_records - taken)
            except KafkaError as exc:  # this partition's alone: the records taken are kept
                if self._deferred is None:
                    self._deferred = (exc, tp)
                continue
            for got_tp, records in more.items():
                batch.setdefault(got_tp, []).extend(records)
                taken += len(records)
        return batch

    def partitions_of(self, exc: BaseException) -> tuple[TopicPartition, ...]:
        """The partitions ``exc`` came from, when this drain raised it last and can tell;
        else empty (a failure of the consumer as a whole, or of a partition not known)."""
        raised = self._raised
        return raised[1] if raised is not None and raised[0] is exc else ()


def named_partitions(
    exc: BaseException, assigned: Iterable[TopicPartition]
) -> tuple[TopicPartition, ...]:
    """The assigned partitions ``exc`` came from: the one whose batch failed to parse
    (:func:`~stream_dp.kafka_client.fetched.failed_partition`, or the partition a checksum error
    names), every partition of the topic an authorization error names; empty when none."""
    assigned = sorted(assigned)
    marked = failed_partition(exc)
    if marked is not None:
        return (marked,) if marked in assigned else ()
    if isinstance(exc, TopicAuthorizationFailedError) and exc.args:
        return tuple(tp for tp in assigned if tp.topic == str(exc.args[0]))
    text = str(exc)
    return tuple(tp for tp in assigned if str(tp) in text)
