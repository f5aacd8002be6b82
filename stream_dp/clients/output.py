"""Reading the output topic: records grouped into one release per (query, window).

The worker writes a window's release records and then its ``window`` record, but the output
topic has several partitions and records are keyed by group, so a reader may see the window
record before some of its releases. :class:`OutputAssembler` therefore holds records until a
(query, window) is complete — its window record plus ``released_keys`` distinct releases —
and hands each group out once. Records republished after a crash are byte-identical and
keyed alike: duplicates are dropped by key.

:class:`OutputReader` reads with manual partition assignment (no consumer group: no join
delay, no committed offsets), from the beginning or from the end.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

import orjson

from stream_dp.clients.connect import start_client, stop_client, topic_partitions
from stream_dp.config import KafkaConfig
from stream_dp.errors import BrokerError
from stream_dp.kafka_client import AIOKafkaConsumer, TopicPartition
from stream_dp.kafka_client.client_options import client_kwargs
from stream_dp.kafka_client.errors import KafkaError
from stream_dp.kafka_client.fetch_errors import classify_fetch_error, describe_fetch_error

#: (key, value) as read from the topic.
RawRecord = tuple[str | None, bytes]
GroupId = tuple[str, str]  # (query, window_start)


@dataclass
class WindowGroup:
    """One (query, window) of the output topic: its releases and its window record."""

    query: str
    window_start: str
    window_end: str | None = None
    #: The window record's value (None until it arrives).
    window: dict[str, Any] | None = None
    window_raw: bytes | None = None
    #: Output key → release record value / raw bytes.
    releases: dict[str, dict[str, Any]] = field(default_factory=dict)
    releases_raw: dict[str, bytes] = field(default_factory=dict)
    #: Monotonic time the window record arrived.
    window_seen_at: float | None = None

    @property
    def complete(self) -> bool:
        return self.window is not None and len(self.releases) >= int(self.window["released_keys"])

    @property
    def missing(self) -> int:
        """Releases announced by the window record but not read (reader started mid-window)."""
        if self.window is None:
            return 0
        return max(0, int(self.window["released_keys"]) - len(self.releases))

    def release_values(self) -> list[dict[str, Any]]:
        """Release records ordered by their key (query, window, canonical group)."""
        return [self.releases[k] for k in sorted(self.releases)]

    def raw_lines(self) -> list[bytes]:
        """The records as stored: releases (ordered by key), then the window record."""
        lines = [self.releases_raw[k] for k in sorted(self.releases_raw)]
        if self.window_raw is not None:
            lines.append(self.window_raw)
        return lines


class OutputAssembler:
    """Groups output records by (query, window); pure, no I/O."""

    def __init__(self) -> None:
        self._pending: dict[GroupId, WindowGroup] = {}
        self._done: set[GroupId] = set()
        #: Records that were not JSON objects of a known kind.
        self.unreadable = 0
        #: Records of a group already handed out (republished after a crash).
        self.duplicates = 0

    def add(self, key: str | None, value: bytes, *, now: float) -> WindowGroup | None:
        """Take one record; returns its group if that group is now complete."""
        try:
            record = orjson.loads(value)
            kind = record.get("kind")
            group_id: GroupId = (str(record["query"]), str(record["window_start"]))
        except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError):
            self.unreadable += 1
            return None
        if kind not in ("release", "window"):
            self.unreadable += 1
            return None
        if group_id in self._done:
            self.duplicates += 1
            return None
        group = self._pending.get(group_id)
        if group is None:
            group = self._pending[group_id] = WindowGroup(*group_id)
        group.window_end = record.get("window_end", group.window_end)
        if kind == "window":
            group.window, group.window_raw, group.window_seen_at = record, value, now
        else:
            release_key = key if key is not None else orjson.dumps(record["group"]).decode()
            group.releases[release_key] = record
            group.releases_raw[release_key] = value
        if group.complete:
            return self._finish(group_id)
        return None

    def stale(self, *, now: float, wait_s: float) -> list[WindowGroup]:
        """Groups whose window record came ``wait_s`` ago without all their releases (the
        reader started mid-window): handed out incomplete (see :attr:`WindowGroup.missing`)."""
        ids = [
            gid
            for gid, g in self._pending.items()
            if g.window_seen_at is not None and now - g.window_seen_at >= wait_s
        ]
        return [self._finish(gid) for gid in sorted(ids, key=self._order)]

    def flush(self) -> list[WindowGroup]:
        """Every group that has its window record, complete or not (at exit)."""
        ids = [gid for gid, g in self._pending.items() if g.window is not None]
        return [self._finish(gid) for gid in sorted(ids, key=self._order)]

    @property
    def pending(self) -> int:
        return len(self._pending)

    def _order(self, gid: GroupId) -> tuple[str, str]:
        return (gid[1], gid[0])

    def _finish(self, gid: GroupId) -> WindowGroup:
        self._done.add(gid)
        return self._pending.pop(gid)


class OutputReader:
    """Reads a topic with manual assignment of all its partitions (no consumer group).

    >>> async with OutputReader(kafka, "dp-releases", from_beginning=True) as r:  # doctest: +SKIP
    ...     await r.wait_for_topic(timeout_s=10)
    ...     records = await r.poll(0.5)
    """

    def __init__(
        self,
        kafka: KafkaConfig,
        topic: str,
        *,
        bootstrap_servers: str | None = None,
        from_beginning: bool = True,
    ) -> None:
        self.topic = topic
        self._kwargs = client_kwargs(kafka, bootstrap_servers=bootstrap_servers)
        self._from_beginning = from_beginning
        self._consumer: AIOKafkaConsumer | None = None
        self._assigned = False

    @property
    def bootstrap_servers(self) -> str:
        return str(self._kwargs["bootstrap_servers"])

    @property
    def from_beginning(self) -> bool:
        return self._from_beginning

    async def __aenter__(self) -> Self:
        consumer = AIOKafkaConsumer(enable_auto_commit=False, **self._kwargs)
        await start_client(consumer, self.bootstrap_servers)
        self._consumer = consumer
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            await stop_client(consumer)

    async def try_assign(self) -> bool:
        """Assign every partition of the topic if it exists (never creates it: only the
        full topic list is asked for, which brokers do not answer by auto-creating)."""
        if self._assigned:
            return True
        consumer = self._require()
        try:
            partitions = await topic_partitions(consumer, self.topic)
        except KafkaError as exc:
            raise BrokerError(f"cannot list topics: {type(exc).__name__}: {exc}") from None
        if not partitions:
            return False
        consumer.assign([TopicPartition(self.topic, p) for p in sorted(partitions)])
        if self._from_beginning:
            await consumer.seek_to_beginning()
        else:
            await consumer.seek_to_end()
        self._assigned = True
        return True

    async def wait_for_topic(self, timeout_s: float | None, *, poll_s: float = 0.2) -> bool:
        """Wait until the topic exists and is assigned; False after ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not await self.try_assign():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            await asyncio.sleep(poll_s)
        return True

    async def poll(self, timeout_s: float) -> list[RawRecord]:
        """Records that arrive within ``timeout_s`` (possibly none)."""
        consumer = self._require()
        if not self._assigned:
            await asyncio.sleep(timeout_s)
            return []
        try:
            batch = await consumer.getmany(timeout_ms=int(timeout_s * 1000))
        except KafkaError as exc:
            cause = describe_fetch_error(classify_fetch_error(exc))
            raise BrokerError(f"reading {self.topic} failed: {cause}") from None
        out: list[RawRecord] = []
        for tp in sorted(batch, key=lambda t: t.partition):
            for m in batch[tp]:
                out.append((m.key.decode("utf-8", "replace") if m.key else None, m.value))
        return out

    def _require(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            raise BrokerError("the output reader is not open; use `async with OutputReader(...)`")
        return self._consumer
