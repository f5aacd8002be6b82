"""Reading the ledger topic (or the continual topic) to a known point, on any
Kafka-protocol broker, with :class:`~stream_dp.clients.compacted.CompactedTopicReader`.

A catch-up writes a fence record with a fresh id (under the reader's one fence key, so that
compaction keeps one fence per reader) to each partition it must be current on and
reads until that fence comes back: everything written to that partition before the fence has
then been fed to the index, in log order. One reader lives as long as the worker (manual
assignment of every ledger partition, no group): a catch-up costs what was written since the
last one. A catch-up that makes no progress for ``stall_timeout_s`` fails (and is retried by
the caller while it keeps the affected partitions paused); a large ledger that keeps arriving
never times out. A log that went backwards is a :class:`LogRewoundError`; a topic gone from
the broker, found when a fence cannot be written, is one too (``TopicDeletedError``).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

import orjson

from stream_dp.clients.compacted import (
    DEFAULT_STALL_TIMEOUT_S,
    FencedLog,
    LogRewoundError,
)
from stream_dp.errors import StreamDPError
from stream_dp.kafka_client.errors import KafkaError
from stream_dp.ops.progress import report_progress
from stream_dp.pipeline.formats.ledger import (
    FENCE_PREFIX,
    MAX_SWEEP_KEYS,
    PROGRESS_PREFIX,
    LedgerIndex,
    encode_fence,
)

__all__ = ["LedgerLog", "LedgerReadError", "LogIndex", "LogRewoundError", "SendOne"]

#: Writes one record (key, value) to one partition of the ledger topic, acknowledged; returns
#: the record's offset (None if the writer cannot tell).
SendOne = Callable[[str, bytes, int], Awaitable[int | None]]

#: A long ledger read reports progress (liveness) after each this many records fed.
PROGRESS_EVERY_RECORDS = 1_000


class LogIndex(Protocol):
    """What a read log feeds: the ledger's index, or the continual topic's store."""

    def feed(self, key: str, value: bytes | None) -> None: ...


class LedgerReadError(StreamDPError):
    """The ledger could not be read to its fences (retriable: the broker may come back)."""

    retriable = True


class LedgerLog(FencedLog):
    def __init__(
        self,
        topic: str,
        index: LogIndex,
        *,
        client_options: dict[str, Any],
        send: SendOne,
        stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
        note_legacy_fences: bool = False,
    ) -> None:
        super().__init__(topic, client_options=client_options, stall_timeout_s=stall_timeout_s)
        self._note_legacy_fences = note_legacy_fences
        self.index = index
        #: This reader's fences share one key (``__fence__|<writer id>``): compaction keeps
        #: one per reader, however many catch-ups it makes.
        self.writer_id = _fresh_id()
        #: (partition, key) of fences keyed by their own fence id (earlier versions' fences,
        #: one key each, never compacted away): what a start-up tombstones.
        self.legacy_fences: list[tuple[int, str]] = []
        self._send = send

    @property
    def partitions(self) -> list[int]:
        return self.reader.partitions

    async def start(self, partitions: Iterable[int]) -> None:
        """Assign every ledger partition from the beginning (no records read yet)."""
        await self.reader.start(partitions)

    async def catch_up(self, partitions: Iterable[int] | None = None) -> int:
        """Fence ``partitions`` (default: all) and read until every fence is back; returns
        the number of records fed. Raises :class:`LedgerReadError` when reading stalls."""
        targets = sorted(self.partitions if partitions is None else set(partitions))
        key, value = encode_fence(_fresh_id(), self.writer_id)
        # All fences at once: a slow ledger partition delays a catch-up once, not per partition.
        try:
            offsets = await asyncio.gather(*(self._send(key, value, p) for p in targets))
        except KafkaError:
            # a topic deleted under the worker stays deleted (no client creates it again):
            # TopicDeletedError, which is not retried; anything else is the caller's to retry
            await self.reader.check_exists()
            raise
        for p, offset in zip(targets, offsets, strict=True):
            self.reader.check_forward(p, offset)
        fence = key.encode()
        fed = 0

        def feed(partition: int, m: Any) -> None:
            nonlocal fed
            if m.key != fence:
                self._feed(partition, m)
                fed += 1
                if fed % PROGRESS_EVERY_RECORDS == 0:
                    report_progress("ledger read")  # a long read is moving, not hung

        await self.reader.read_to_fences(targets, fence, feed, fence_value=value)
        return fed

    def _feed(self, partition: int, m: Any) -> None:
        key = m.key.decode() if m.key else ""
        if key.startswith(FENCE_PREFIX):
            noting = self._note_legacy_fences and len(self.legacy_fences) < MAX_SWEEP_KEYS
            if noting and _legacy_fence(key, m.value):
                self.legacy_fences.append((partition, key))
            return
        self.index.feed(key, m.value)
        if isinstance(self.index, LedgerIndex) and key.startswith(PROGRESS_PREFIX):
            self.index.note_progress_time(getattr(m, "timestamp", None) if m.value else None)

    async def poll(self, timeout_ms: int = 100) -> int:
        """Read what has arrived on every partition, without a fence (no promise of having
        read everything): enough to learn, soon, of windows other workers released.
        Returns the number of records fed."""
        fed = 0

        def feed(partition: int, m: Any) -> None:
            nonlocal fed
            self._feed(partition, m)
            fed += 1

        await self.reader.read_available(timeout_ms, feed)
        return fed

    def _stalled(self, pending: list[int]) -> StreamDPError:
        return LedgerReadError(
            f"ledger topic {self.topic}: no record for {self._stall_timeout_s:g} s while "
            f"waiting for fences on partitions {pending}; is the broker (or that "
            "partition's leader) down?"
        )


def _fresh_id() -> str:
    return uuid.uuid4().hex


def _legacy_fence(key: str, value: bytes | None) -> bool:
    """A fence keyed by its own fence id (as every fence was before fences were keyed by
    their reader): unique, so compaction never removes it."""
    if value is None:
        return False
    try:
        fence_id = orjson.loads(value).get("fence_id")
    except orjson.JSONDecodeError:
        return False
    return key == FENCE_PREFIX + str(fence_id)
