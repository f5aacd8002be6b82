"""Reading the erasure log (``erasure.log_topic``) into an :class:`ErasureSet`.

Every worker reads the whole log — partition 0, the only one (one order of erasures: a
position says "everything before it is applied") — from the beginning at start, with the
compacted-topic reader (:mod:`stream_dp.clients.compacted`). :meth:`ErasureLog.catch_up`
writes a fence and reads until it comes back (end offsets are unreliable on some brokers,
docs/architecture.md#embedded-broker), so afterwards every erasure recorded before the call
is known; :meth:`ErasureLog.poll` takes whatever has arrived, without waiting. Both return
the erasures new to the set, in log order, for the caller to apply — also those a failed
earlier call read but could not hand over. A log that went backwards (deleted or recreated)
is a :class:`~stream_dp.clients.compacted.LogRewoundError`, and so is a log gone from the
broker when its fence cannot be written (``TopicDeletedError``).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from stream_dp.clients.compacted import DEFAULT_STALL_TIMEOUT_S, FencedLog
from stream_dp.errors import StreamDPError
from stream_dp.kafka_client.errors import KafkaError
from stream_dp.pipeline.formats.erasure_records import (
    FENCE_KEY_PREFIX,
    ErasureLogFormatError,
    decode_log_record,
    encode_fence,
)
from stream_dp.privacy.erasure import Erasure, ErasureSet

log = logging.getLogger(__name__)

#: The erasure log's one partition.
LOG_PARTITION = 0

#: Writes one record (key, value) to the log partition, acknowledged.
SendOne = Callable[[str, bytes], Awaitable[None]]


class ErasureLogReadError(StreamDPError):
    """The erasure log could not be read to its fence (retriable: the broker may return)."""

    retriable = True


class ErasureLog(FencedLog):
    def __init__(
        self,
        topic: str,
        erasures: ErasureSet,
        *,
        client_options: dict[str, Any],
        send: SendOne,
        stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
    ) -> None:
        # Not paused between reads: the client keeps fetching, so poll() sees new erasures.
        super().__init__(
            topic,
            client_options=client_options,
            stall_timeout_s=stall_timeout_s,
            pause_between_reads=False,
        )
        self.erasures = erasures
        self._send = send
        #: Malformed records skipped (a writer other than stream-dp): counted, never fatal.
        self.malformed = 0
        #: Erasures read into the set but not yet returned to the caller.
        self._unapplied: list[Erasure] = []

    async def start(self) -> None:
        await self.reader.start([LOG_PARTITION])

    async def catch_up(self) -> list[Erasure]:
        """Fence the log and read until the fence is back: every erasure recorded before
        this call is then in the set. Raises :class:`ErasureLogReadError` when stalled, and
        :class:`~stream_dp.clients.compacted.LogRewoundError` when the log went backwards."""
        key, value = encode_fence(uuid.uuid4().hex)
        try:
            await self._send(key, value)
        except (KafkaError, StreamDPError):
            # a log deleted under the worker stays deleted (no client creates it again):
            # TopicDeletedError, a LogRewoundError; anything else is the caller's to handle
            await self.reader.check_exists()
            raise
        await self.reader.read_to_fences([LOG_PARTITION], key.encode(), self._feed)
        return self._hand_over()

    async def poll(self) -> list[Erasure]:
        """Whatever arrived since the last read, without waiting."""
        await self.reader.read_available(0, self._feed)
        return self._hand_over()

    def _stalled(self, pending: list[int]) -> StreamDPError:
        return ErasureLogReadError(
            f"erasure log {self.topic}: no record for {self._stall_timeout_s:g} s while "
            "waiting for a fence; is the broker (or the partition's leader) down?"
        )

    def _hand_over(self) -> list[Erasure]:
        new, self._unapplied = self._unapplied, []
        return new

    def _feed(self, partition: int, m: Any) -> None:
        if m.key is not None and m.key.startswith(FENCE_KEY_PREFIX.encode()):
            self.erasures.advance(m.offset + 1)
            return
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
            return
        if erasure is None:
            self.erasures.advance(m.offset + 1)
            return
        self.erasures.add(erasure)
        self._unapplied.append(erasure)
