"""Reading the erasure log (``erasure.log_topic``) into an :class:`ErasureSet`.

Every worker reads the whole log — partition 0, the only one (one order of erasures: a
position says "everything before it is applied") — by manual assignment, from the beginning
at start. :meth:`ErasureLog.catch_up` writes a fence and reads until it comes back (end
offsets are unreliable on some brokers, docs/architecture.md#embedded-broker), so
afterwards every erasure recorded before the call is known; :meth:`ErasureLog.poll` takes
whatever has arrived, without waiting. Both return the erasures new to the set, in log order,
for the caller to apply — also those a failed earlier call read but could not hand over.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from stream_dp.errors import StreamDPError
from stream_dp.pipeline.erasure_records import (
    FENCE_KEY_PREFIX,
    ErasureLogFormatError,
    decode_log_record,
    encode_fence,
)
from stream_dp.privacy.erasure import Erasure, ErasureSet

log = logging.getLogger(__name__)

#: The erasure log's one partition.
LOG_PARTITION = 0
#: A catch-up fails after this long without a record while its fence is due.
DEFAULT_STALL_TIMEOUT_S = 60.0
FETCH_MAX_WAIT_MS = 20

#: Writes one record (key, value) to the log partition, acknowledged.
SendOne = Callable[[str, bytes], Awaitable[None]]


class ErasureLogReadError(StreamDPError):
    """The erasure log could not be read to its fence (retriable: the broker may return)."""

    retriable = True


class ErasureLog:
    def __init__(
        self,
        topic: str,
        erasures: ErasureSet,
        *,
        client_options: dict[str, Any],
        send: SendOne,
        stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
    ) -> None:
        self.topic = topic
        self.erasures = erasures
        self._options = client_options
        self._send = send
        self._stall_timeout_s = stall_timeout_s
        self._reader: AIOKafkaConsumer | None = None
        #: Malformed records skipped (a writer other than stream-dp): counted, never fatal.
        self.malformed = 0
        #: Erasures read into the set but not yet returned to the caller.
        self._unapplied: list[Erasure] = []

    async def start(self) -> None:
        reader = AIOKafkaConsumer(
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
            **self._options,
        )
        await reader.start()
        self._reader = reader
        tp = TopicPartition(self.topic, LOG_PARTITION)
        reader.assign([tp])
        await reader.seek_to_beginning(tp)

    async def stop(self) -> None:
        if self._reader is not None:
            reader, self._reader = self._reader, None
            await reader.stop()

    async def catch_up(self) -> list[Erasure]:
        """Fence the log and read until the fence is back: every erasure recorded before
        this call is then in the set. Raises :class:`ErasureLogReadError` when stalled."""
        assert self._reader is not None, "start() first"
        fence_id = uuid.uuid4().hex
        key, value = encode_fence(fence_id)
        await self._send(key, value)
        fence = key.encode()
        last_progress = time.monotonic()
        while True:
            batch = await self._reader.getmany(timeout_ms=500, max_records=10_000)
            if batch:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > self._stall_timeout_s:
                raise ErasureLogReadError(
                    f"erasure log {self.topic}: no record for {self._stall_timeout_s:g} s while "
                    "waiting for a fence; is the broker (or the partition's leader) down?"
                )
            done = False
            for messages in batch.values():
                self._feed(messages)
                done = done or any(m.key == fence for m in messages)
            if done:
                return self._hand_over()

    async def poll(self) -> list[Erasure]:
        """Whatever arrived since the last read, without waiting."""
        assert self._reader is not None, "start() first"
        batch = await self._reader.getmany(timeout_ms=0, max_records=10_000)
        for messages in batch.values():
            self._feed(messages)
        return self._hand_over()

    def _hand_over(self) -> list[Erasure]:
        new, self._unapplied = self._unapplied, []
        return new

    def _feed(self, messages: Sequence[Any]) -> None:
        for m in messages:
            if m.key is not None and m.key.startswith(FENCE_KEY_PREFIX.encode()):
                self.erasures.advance(m.offset + 1)
                continue
            try:
                erasure = decode_log_record(m.value, m.offset)
            except ErasureLogFormatError:
                self.malformed += 1
                log.error(
                    "erasure log %s: a record that is not an erasure was skipped (offset %d)",
                    self.topic,
                    m.offset,
                )
                self.erasures.advance(m.offset + 1)
                continue
            if erasure is None:
                self.erasures.advance(m.offset + 1)
                continue
            self.erasures.add(erasure)
            self._unapplied.append(erasure)
