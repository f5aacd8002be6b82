"""Reading a compacted topic to a known point, on any Kafka-protocol broker: the one reader
of the ledger, the continual topic and the erasure log.

End offsets cannot be trusted to say "everything is read" (docs/architecture.md#embedded-broker:
the embedded broker reports the last batch's base offset + 1). So the caller writes a fence
record with a fresh key to each partition it must be current on, and the reader reads until
each fence comes back: everything written to that partition before the fence has then been
handed over, in log order.

One reader lives as long as its owner (manual assignment, no group): the first read starts
at the beginning, later ones continue where the last stopped, so a catch-up costs what was
written since. A read to fences that makes no progress for ``stall_timeout_s`` fails with the
owner's retriable error; a large log that keeps arriving never times out.

The log only grows under a running reader. A record read, or a fence written, below an offset
already read means the topic was deleted or recreated: :class:`LogRewoundError`, not
retriable, because what was read before is gone from the topic. A topic deleted and not
created again (no client of stream-dp creates one: stream_dp/kafka_client/metadata.py) is
found by the owner when a fence cannot be written (:meth:`CompactedTopicReader.check_exists`):
:class:`TopicDeletedError`, a :class:`LogRewoundError` too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Any

from stream_dp.clients.connect import topic_gone
from stream_dp.errors import StreamDPError
from stream_dp.kafka_client import AIOKafkaConsumer, TopicPartition
from stream_dp.kafka_client.client_options import FETCH_ROUTINE_WAKE_MS

#: How long the broker may hold a fetch open waiting for data: a fence just written must
#: come back fast (every release waits for one).
FETCH_MAX_WAIT_MS = 20
#: A read to fences fails after this long without a single record while fences are due.
DEFAULT_STALL_TIMEOUT_S = 60.0
#: After handing over a record larger than this, the reader yields to the event loop.
YIELD_AFTER_BYTES = 64 * 1024
MAX_RECORDS_PER_READ = 10_000

#: Takes one record (partition, the aiokafka record with .offset, .key, .value).
Feed = Callable[[int, Any], None]


class LogRewoundError(StreamDPError):
    """The topic's log went backwards under a running reader: it was deleted or recreated.

    Not retriable: the records read before are gone from the topic. The worker stops
    releasing (see :mod:`stream_dp.pipeline.kafka.ledger_guard`)."""

    def __init__(self, topic: str, partition: int, offset: int, read_to: int) -> None:
        super().__init__(
            f"topic {topic} partition {partition}: offset {offset} is below {read_to}, "
            "where this reader already was; the topic was deleted or recreated while the "
            "worker ran"
        )
        self.topic = topic


class TopicDeletedError(LogRewoundError):
    """The topic is gone from the broker under a running reader (deleted, and not created
    again): what was read before is gone as well. Not retriable, as :class:`LogRewoundError`."""

    def __init__(self, topic: str) -> None:
        StreamDPError.__init__(
            self,
            f"topic {topic} no longer exists on the broker (its topic list has no such topic): "
            "it was deleted while the worker ran (or this principal may no longer Describe "
            "it), and the records read from it before are gone",
        )
        self.topic = topic


class CompactedTopicReader:
    """Reads ``partitions`` of ``topic`` from the beginning, to fences or to what arrived.

    ``stalled(pending partitions)`` builds the owner's retriable error for a read to fences
    that stopped making progress. ``pause_between_reads``: no background fetching between
    reads (the ledger: many partitions, read on demand); without it the client keeps
    fetching, so :meth:`read_available` with no wait hands over what arrived meanwhile (the
    erasure log, followed as it grows).
    """

    def __init__(
        self,
        topic: str,
        *,
        client_options: dict[str, Any],
        stalled: Callable[[list[int]], StreamDPError],
        stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
        pause_between_reads: bool = True,
    ) -> None:
        self.topic = topic
        self._options = client_options
        self._stalled = stalled
        self._stall_timeout_s = stall_timeout_s
        self._pause_between_reads = pause_between_reads
        self._consumer: AIOKafkaConsumer | None = None
        self.partitions: list[int] = []
        #: Per partition, the offset after the last record read (the log only grows).
        self._read_to: dict[int, int] = {}

    async def start(self, partitions: Iterable[int]) -> None:
        """Assign ``partitions`` from the beginning (no records read yet)."""
        self.partitions = sorted(partitions)
        consumer = AIOKafkaConsumer(
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
            consumer_timeout_ms=FETCH_ROUTINE_WAKE_MS,
            **self._options,
        )
        await consumer.start()
        self._consumer = consumer
        tps = self._tps(self.partitions)
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        if self._pause_between_reads:
            consumer.pause(*tps)

    async def stop(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            await consumer.stop()

    async def check_exists(self) -> None:
        """:class:`TopicDeletedError` when the broker's topic list has no ``topic`` (asked
        for every topic: a request naming it could create it again). Nothing when it has
        it, or does not answer: the caller's own error then stands."""
        if await topic_gone(self._started()._client, self.topic):
            raise TopicDeletedError(self.topic)

    def check_forward(self, partition: int, offset: int | None) -> None:
        """A record just written (a fence) lands at or after every offset already read;
        LogRewoundError if not. ``None``: the writer could not tell; nothing to check."""
        read_to = self._read_to.get(partition, 0)
        if offset is not None and offset < read_to:
            raise LogRewoundError(self.topic, partition, offset, read_to)

    def advance(self, partition: int, offset: int) -> None:
        """Note a record read at ``offset``; LogRewoundError if it is below one read before."""
        self.check_forward(partition, offset)
        self._read_to[partition] = offset + 1

    async def read_to_fences(
        self,
        partitions: Iterable[int],
        fence_key: bytes,
        feed: Feed,
        fence_value: bytes | None = None,
    ) -> None:
        """Hand every record of ``partitions`` to ``feed`` (the fences too) until the record
        keyed ``fence_key`` (with the value ``fence_value``, when given: a key a reader
        reuses for every fence) has come back on each of them."""
        consumer = self._started()
        pending = set(partitions)
        tps = self._tps(sorted(pending))
        self._resume(consumer, tps)
        try:
            last_progress = time.monotonic()
            while pending:
                batch = await consumer.getmany(timeout_ms=500, max_records=MAX_RECORDS_PER_READ)
                if batch:
                    last_progress = time.monotonic()
                elif time.monotonic() - last_progress > self._stall_timeout_s:
                    raise self._stalled(sorted(pending))
                for tp, messages in batch.items():
                    for m in messages:
                        if m.key == fence_key and fence_value in (None, m.value):
                            pending.discard(tp.partition)
                        await self._hand_over(tp.partition, m, feed)
        finally:
            self._pause(consumer, tps)

    async def read_available(self, timeout_ms: int, feed: Feed) -> None:
        """Hand over what has arrived on every partition, waiting at most ``timeout_ms`` for
        something (no promise of having read everything)."""
        consumer = self._started()
        tps = self._tps(self.partitions)
        self._resume(consumer, tps)
        try:
            batch = await consumer.getmany(timeout_ms=timeout_ms, max_records=MAX_RECORDS_PER_READ)
        finally:
            self._pause(consumer, tps)
        for tp, messages in batch.items():
            for m in messages:
                await self._hand_over(tp.partition, m, feed)

    async def _hand_over(self, partition: int, message: Any, feed: Feed) -> None:
        self.advance(partition, message.offset)
        feed(partition, message)
        if len(message.value or b"") > YIELD_AFTER_BYTES:
            # A large record (a release's parts): let the loop's other tasks (heartbeats) run.
            await asyncio.sleep(0)

    def _started(self) -> AIOKafkaConsumer:
        assert self._consumer is not None, "start() first"
        return self._consumer

    def _tps(self, partitions: Iterable[int]) -> list[TopicPartition]:
        return [TopicPartition(self.topic, p) for p in partitions]

    def _resume(self, consumer: AIOKafkaConsumer, tps: list[TopicPartition]) -> None:
        if self._pause_between_reads:
            consumer.resume(*tps)

    def _pause(self, consumer: AIOKafkaConsumer, tps: list[TopicPartition]) -> None:
        if self._pause_between_reads:
            consumer.pause(*tps)


class FencedLog:
    """What an owner of a reader shares (the ledger's and the erasure log's): its topic, its
    :class:`CompactedTopicReader` and stopping it. A subclass says, in :meth:`_stalled`,
    which retriable error a read to fences that stopped making progress raises."""

    def __init__(
        self,
        topic: str,
        *,
        client_options: dict[str, Any],
        stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
        pause_between_reads: bool = True,
    ) -> None:
        self.topic = topic
        self._stall_timeout_s = stall_timeout_s
        self.reader = CompactedTopicReader(
            topic,
            client_options=client_options,
            stalled=self._stalled,
            stall_timeout_s=stall_timeout_s,
            pause_between_reads=pause_between_reads,
        )

    async def stop(self) -> None:
        await self.reader.stop()

    def _stalled(self, pending: list[int]) -> StreamDPError:
        raise NotImplementedError
