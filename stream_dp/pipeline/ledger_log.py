"""Reading the ledger topic (or the continual topic) to a known point, on any
Kafka-protocol broker.

End offsets cannot be trusted to say "everything is read" (docs/architecture.md#embedded-broker:
the embedded broker reports the last batch's base offset + 1). So a reader writes a fence record
with a fresh id to each partition it must be current on, and reads until each fence comes back:
everything written to that partition before the fence has then been fed to the index, in log
order.

One reader lives as long as the worker (manual assignment of every ledger partition, no
group): the first catch-up reads from the beginning, later ones continue from where the
last stopped, so a catch-up costs what was written since, not the whole ledger again. A
catch-up that makes no progress for ``stall_timeout_s`` fails (and is retried by the caller
while it keeps the affected partitions paused); a large ledger that keeps arriving never
times out.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, TopicPartition

from stream_dp.errors import StreamDPError
from stream_dp.pipeline.ledger import encode_fence

log = logging.getLogger(__name__)

#: A catch-up fails after this long without a single record arriving while fences are due.
DEFAULT_STALL_TIMEOUT_S = 60.0
#: How long the broker may hold a fetch of the ledger open waiting for data: a fence just
#: written must come back fast (every release waits for one).
FETCH_MAX_WAIT_MS = 20

#: Writes one record (key, value) to one partition of the ledger topic, acknowledged; returns
#: the record's offset (None if the writer cannot tell).
SendOne = Callable[[str, bytes, int], Awaitable[int | None]]


#: After feeding a ledger record larger than this, the reader yields to the event loop.
YIELD_AFTER_BYTES = 64 * 1024


class LogIndex(Protocol):
    """What a read log feeds: the ledger's index, or the continual topic's store."""

    def feed(self, key: str, value: bytes | None) -> None: ...


class LedgerReadError(StreamDPError):
    """The ledger could not be read to its fences (retriable: the broker may come back)."""

    retriable = True


class LogRewoundError(StreamDPError):
    """The topic's log went backwards under a running reader: it was deleted or recreated.

    Not retriable: the records read before are gone from the topic. The worker stops
    releasing (see :mod:`stream_dp.pipeline.ledger_guard`)."""

    def __init__(self, topic: str, partition: int, offset: int, read_to: int) -> None:
        super().__init__(
            f"topic {topic} partition {partition}: offset {offset} is below {read_to}, "
            "where this reader already was; the topic was deleted or recreated while the "
            "worker ran"
        )
        self.topic = topic


class LedgerLog:
    def __init__(
        self,
        topic: str,
        index: LogIndex,
        *,
        client_options: dict[str, Any],
        send: SendOne,
        stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
    ) -> None:
        self.topic = topic
        self.index = index
        self._options = client_options
        self._send = send
        self._stall_timeout_s = stall_timeout_s
        self._reader: AIOKafkaConsumer | None = None
        self.partitions: list[int] = []
        #: Per partition, the offset after the last record read (the log only grows).
        self._read_to: dict[int, int] = {}

    async def start(self, partitions: Iterable[int]) -> None:
        """Assign every ledger partition from the beginning (no records read yet)."""
        self.partitions = sorted(partitions)
        reader = AIOKafkaConsumer(
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
            **self._options,
        )
        await reader.start()
        self._reader = reader
        tps = [TopicPartition(self.topic, p) for p in self.partitions]
        reader.assign(tps)
        await reader.seek_to_beginning()
        reader.pause(*tps)  # no background fetching between catch-ups

    async def stop(self) -> None:
        if self._reader is not None:
            reader, self._reader = self._reader, None
            await reader.stop()

    async def catch_up(self, partitions: Iterable[int] | None = None) -> int:
        """Fence ``partitions`` (default: all) and read until every fence is back; returns
        the number of records fed. Raises :class:`LedgerReadError` when reading stalls."""
        assert self._reader is not None, "start() first"
        reader = self._reader
        targets = sorted(self.partitions if partitions is None else set(partitions))
        fence_id = uuid.uuid4().hex
        key, value = encode_fence(fence_id)
        # All fences at once: a slow ledger partition delays a catch-up once, not per partition.
        offsets = await asyncio.gather(*(self._send(key, value, p) for p in targets))
        for p, offset in zip(targets, offsets, strict=True):
            self._check_forward(p, offset)
        tps = [TopicPartition(self.topic, p) for p in targets]
        reader.resume(*tps)
        try:
            return await self._read_to_fences(set(targets), key.encode())
        finally:
            reader.pause(*tps)

    async def poll(self, timeout_ms: int = 100) -> int:
        """Read what has arrived on every partition, without a fence (no promise of having
        read everything): enough to learn, soon, of windows other workers released.
        Returns the number of records fed."""
        assert self._reader is not None, "start() first"
        reader = self._reader
        tps = [TopicPartition(self.topic, p) for p in self.partitions]
        reader.resume(*tps)
        try:
            batch = await reader.getmany(timeout_ms=timeout_ms, max_records=10_000)
        finally:
            reader.pause(*tps)
        fed = 0
        for tp, messages in batch.items():
            for m in messages:
                self._advance(tp.partition, m.offset)
                self.index.feed(m.key.decode() if m.key else "", m.value)
                fed += 1
                if len(m.value or b"") > YIELD_AFTER_BYTES:
                    await asyncio.sleep(0)
        return fed

    async def _read_to_fences(self, pending: set[int], fence_key: bytes) -> int:
        assert self._reader is not None
        fed = 0
        last_progress = time.monotonic()
        while pending:
            batch = await self._reader.getmany(timeout_ms=500, max_records=10_000)
            if batch:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > self._stall_timeout_s:
                raise LedgerReadError(
                    f"ledger topic {self.topic}: no record for {self._stall_timeout_s:g} s while "
                    f"waiting for fences on partitions {sorted(pending)}; is the broker (or that "
                    "partition's leader) down?"
                )
            for tp, messages in batch.items():
                for m in messages:
                    self._advance(tp.partition, m.offset)
                    if m.key == fence_key:
                        pending.discard(tp.partition)
                        continue
                    self.index.feed(m.key.decode() if m.key else "", m.value)
                    fed += 1
                    if len(m.value or b"") > YIELD_AFTER_BYTES:
                        # A large release's parts: let the loop's other tasks (heartbeats)
                        # run between them.
                        await asyncio.sleep(0)
        return fed

    def _check_forward(self, partition: int, offset: int | None) -> None:
        """A record just written lands at or after every offset already read."""
        read_to = self._read_to.get(partition, 0)
        if offset is not None and offset < read_to:
            raise LogRewoundError(self.topic, partition, offset, read_to)

    def _advance(self, partition: int, offset: int) -> None:
        self._check_forward(partition, offset)
        self._read_to[partition] = offset + 1
