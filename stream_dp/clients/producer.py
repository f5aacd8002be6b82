"""Produce records to a topic: batched sends, every acknowledgement awaited, optional rate.

Records are sent in chunks; a chunk's acknowledgements are awaited before the next one is
started, so the report counts only what the broker acknowledged (``acks=all``). A rate limit
paces the chunks so that after ``n`` records at least ``n / rate`` seconds have passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from stream_dp.clients.connect import start_client
from stream_dp.config import KafkaConfig
from stream_dp.errors import BrokerError
from stream_dp.kafka_client import AIOKafkaProducer
from stream_dp.kafka_client.client_options import client_kwargs
from stream_dp.kafka_client.errors import KafkaError

#: (key, value) of one record.
KeyValue = tuple[bytes | None, bytes]
#: ``progress(records_sent, bytes_sent, seconds_elapsed)``, called after every chunk.
ProgressFn = Callable[[int, int, float], None]

DEFAULT_CHUNK = 5_000


@dataclass(frozen=True)
class ProduceReport:
    """What was sent and acknowledged."""

    topic: str
    records: int
    bytes: int  #: value bytes (keys not counted)
    seconds: float

    @property
    def rate(self) -> float:
        """Records per second."""
        return self.records / self.seconds if self.seconds > 0 else 0.0

    def describe(self) -> dict[str, object]:
        return {
            "kind": "produce_report",
            "topic": self.topic,
            "records": self.records,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
            "records_per_s": round(self.rate, 1),
        }


def _chunk_size(rate: float | None, chunk: int) -> int:
    # Throttled: small chunks (~20 per second) so pacing is smooth.
    return chunk if rate is None else max(1, min(chunk, int(rate / 20)))


async def produce_records(
    kafka: KafkaConfig,
    topic: str,
    records: Iterable[KeyValue],
    *,
    bootstrap_servers: str | None = None,
    rate: float | None = None,
    limit: int | None = None,
    progress: ProgressFn | None = None,
    stop: asyncio.Event | None = None,
    chunk: int = DEFAULT_CHUNK,
) -> ProduceReport:
    """Send ``records`` (at most ``limit``) to ``topic``; returns what was acknowledged.

    ``stop`` ends the load early (after the chunk in flight is acknowledged). Raises
    BrokerError when the broker cannot be reached or refuses a record.
    """
    if rate is not None and rate <= 0:
        raise ValueError("rate must be positive")
    kwargs = client_kwargs(kafka, bootstrap_servers=bootstrap_servers)
    producer = AIOKafkaProducer(acks="all", linger_ms=20, max_batch_size=262_144, **kwargs)
    await start_client(producer, kwargs["bootstrap_servers"])
    try:
        await _require_topic(producer, topic, kwargs["bootstrap_servers"])
    except BaseException:
        await producer.stop()
        raise
    size = _chunk_size(rate, chunk)
    sent = sent_bytes = 0
    started = time.monotonic()
    try:
        iterator = iter(records)
        while limit is None or sent < limit:
            if stop is not None and stop.is_set():
                break
            want = size if limit is None else min(size, limit - sent)
            batch: list[asyncio.Future[object]] = []
            batch_bytes = 0
            for key, value in iterator:
                batch.append(await producer.send(topic, value, key=key))
                batch_bytes += len(value)
                if len(batch) >= want:
                    break
            if not batch:
                break
            await asyncio.gather(*batch)
            sent += len(batch)
            sent_bytes += batch_bytes
            elapsed = time.monotonic() - started
            if progress is not None:
                progress(sent, sent_bytes, elapsed)
            if rate is not None:
                ahead = sent / rate - elapsed
                if ahead > 0:
                    await _pause(ahead, stop)
    except KafkaError as exc:
        raise BrokerError(
            f"producing to {topic} failed after {sent} records: {type(exc).__name__}: {exc}"
        ) from None
    finally:
        await producer.stop()
    return ProduceReport(topic, sent, sent_bytes, time.monotonic() - started)


async def _require_topic(producer: AIOKafkaProducer, topic: str, bootstrap: str) -> None:
    """Refuse a missing topic: brokers that auto-create topics would make it with their
    default partition count instead of the one in ``topics/``."""
    try:
        metadata = await producer.client.fetch_all_metadata()
    except KafkaError as exc:
        raise BrokerError(
            f"cannot read the topic list from {bootstrap}: {type(exc).__name__}: {exc}"
        ) from None
    if topic not in metadata.topics():
        error = BrokerError(
            f"topic {topic} does not exist on {bootstrap}; create it with "
            "`stream-dp topics apply --config FILE`"
        )
        error.retriable = False
        raise error


async def _pause(seconds: float, stop: asyncio.Event | None) -> None:
    """Wait ``seconds``, or less if ``stop`` is set meanwhile."""
    if stop is None:
        await asyncio.sleep(seconds)
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
