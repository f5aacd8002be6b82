"""The streaming worker on aiokafka: the Kafka transport around :class:`Engine`.

Order of effects for a closed window, and why it is safe after a crash at any point:

1. compute the release once (noise drawn, budget charged) — in memory only;
2. write every ledger part and wait for the broker's acknowledgement;
3. write the output records; 4. write the ``published`` marker;
5. drop the window's state; commit offsets up to what open windows still need.

A crash before 2 completes leaves no complete ledger entry: nothing was published, the
window is rebuilt from the replayed input and drawn then. A crash after 2 leaves a ledger
entry: on start it is read back (to the true end, behind fence records — end offsets are
unreliable on some brokers), its records are republished unchanged and the window is never
recomputed. Output keys are stable, so a republished record is byte-identical.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError

from stream_dp.broker.client_options import client_kwargs
from stream_dp.broker.probe import wait_for_broker
from stream_dp.config.model import UNSAFE_TEST_MODE_ENV, Config
from stream_dp.errors import BrokerError
from stream_dp.ops.health import Health
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.engine import DeadLetter, Engine, ExactTotalsObserver
from stream_dp.pipeline.ledger import (
    LedgerIndex,
    LedgerRelease,
    encode_fence,
    encode_published,
    encode_release,
)
from stream_dp.pipeline.records import dead_letter_record, dumps
from stream_dp.privacy.pseudonymize import KeyRing
from stream_dp.windows.tumbling import iso_utc

log = logging.getLogger(__name__)

#: Test-only fault injection: ``<point>:<n>`` kills the process (SIGKILL) the n-th time the
#: point is reached. Honoured only when the unsafe test mode is allowed by the environment.
CRASH_POINT_ENV = "STREAM_DP_TEST_CRASH_POINT"
CRASH_POINTS = ("after_ledger_write", "after_output_write", "after_ingest")

MAX_RECORDS_PER_FETCH = 10_000
FETCH_TIMEOUT_MS = 200
RETRY_BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)
LEDGER_LOAD_TIMEOUT_S = 60.0
BROKER_PROBE_INTERVAL_S = 1.0
BROKER_PROBE_TIMEOUT_S = 2.0


class _CrashPoints:
    def __init__(self) -> None:
        spec = os.environ.get(CRASH_POINT_ENV, "")
        self.point: str | None = None
        self.remaining = 0
        if spec and os.environ.get(UNSAFE_TEST_MODE_ENV) == "1":
            point, _, count = spec.partition(":")
            if point in CRASH_POINTS:
                self.point, self.remaining = point, int(count or "1")

    def reached(self, point: str) -> None:
        if point != self.point:
            return
        self.remaining -= 1
        if self.remaining <= 0:
            os.kill(os.getpid(), signal.SIGKILL)


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self.worker.on_revoked([tp.partition for tp in revoked])

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        await self.worker.on_assigned([tp.partition for tp in assigned])


class Worker:
    def __init__(
        self,
        config: Config,
        keyring: KeyRing,
        *,
        bootstrap_servers: str | None = None,
        metrics: Metrics | None = None,
        health: Health | None = None,
        exact_totals_observer: ExactTotalsObserver | None = None,
    ) -> None:
        self.config = config
        self._observe_exact = exact_totals_observer
        self.keyring = keyring
        self.bootstrap = bootstrap_servers or config.kafka.bootstrap_servers
        self.metrics = metrics if metrics is not None else Metrics()
        self.health = health if health is not None else Health(metrics=self.metrics)
        self.engine: Engine | None = None
        self._lock = asyncio.Lock()
        self._crash = _CrashPoints()
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._committed: dict[int, int] = {}
        self._stopping = asyncio.Event()
        self._broker_ok = True
        for q in config.queries:
            self.metrics.add_query(q.name)

    # -- lifecycle ------------------------------------------------------------------------
    def request_stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        """Run until :meth:`request_stop`; then stop fetching, flush, commit and close."""
        kafka = self.config.kafka
        common = client_kwargs(kafka, bootstrap_servers=self.bootstrap)
        self._producer = AIOKafkaProducer(acks="all", linger_ms=5, **common)
        await self._retry("start producer", self._producer.start)
        self.health.set("producer_connected", True)
        monitor = asyncio.create_task(self._monitor_broker())
        try:
            ledger = await self._load_ledger(common)
            self.engine = Engine(
                self.config,
                self.keyring,
                ledger=ledger,
                metrics=self.metrics,
                exact_totals_observer=self._observe_exact,
            )
            self.metrics.ledger_windows_loaded.inc(len(ledger))
            await self._republish_unpublished(ledger)
            self.health.set("ledger_loaded", True)
            self._consumer = AIOKafkaConsumer(
                group_id=kafka.group_id,
                enable_auto_commit=False,
                auto_offset_reset=self.config.input.start_from,
                session_timeout_ms=kafka.session_timeout_ms,
                heartbeat_interval_ms=kafka.heartbeat_interval_ms,
                max_partition_fetch_bytes=max(1_048_576, self.config.input.max_record_bytes * 2),
                **common,
            )
            self._consumer.subscribe([self.config.input.topic], listener=_Rebalance(self))
            await self._retry("start consumer", self._consumer.start)
            await self._loop()
        finally:
            monitor.cancel()
            await self._shutdown()

    async def _shutdown(self) -> None:
        """Flush, commit what is safe, leave the group. Open windows are NOT released."""
        try:
            if self._producer is not None:
                with contextlib.suppress(KafkaError, asyncio.TimeoutError):
                    await asyncio.wait_for(self._producer.flush(), timeout=10)
            if self._consumer is not None and self.engine is not None:
                with contextlib.suppress(KafkaError, asyncio.TimeoutError):
                    await asyncio.wait_for(self._commit(), timeout=10)
        finally:
            if self._consumer is not None:
                with contextlib.suppress(KafkaError, asyncio.TimeoutError):
                    await asyncio.wait_for(self._consumer.stop(), timeout=10)
            if self._producer is not None:
                with contextlib.suppress(KafkaError, asyncio.TimeoutError):
                    await asyncio.wait_for(self._producer.stop(), timeout=10)
            self.health.set("partitions_assigned", False)
            self.health.set("producer_connected", False)

    async def _monitor_broker(self) -> None:
        """Probe the broker: not ready while it does not answer (liveness is unaffected)."""
        while True:
            try:
                await wait_for_broker(
                    self.bootstrap, BROKER_PROBE_TIMEOUT_S, kafka=self.config.kafka
                )
                ok = True
            except BrokerError:
                ok = False
            if ok != self._broker_ok:
                log.warning("broker %s", "reachable again" if ok else "unreachable")
                if ok and self.engine is not None:
                    self.engine.tracker.restart_idle_clocks(time.monotonic())
            self._broker_ok = ok
            self.health.set("producer_connected", ok)
            await asyncio.sleep(BROKER_PROBE_INTERVAL_S)

    async def _retry(self, what: str, op: Callable[[], Awaitable[Any]]) -> Any:
        """Retry a broker operation with backoff until it succeeds or the worker stops."""
        attempt = 0
        while True:
            try:
                return await op()
            except KafkaError as exc:
                self.metrics.broker_errors.inc()
                self.health.set("producer_connected", False)
                if self._stopping.is_set() and attempt >= 2:
                    raise
                delay = RETRY_BACKOFF_S[min(attempt, len(RETRY_BACKOFF_S) - 1)]
                log.warning("%s failed (%s); retrying in %.1f s", what, type(exc).__name__, delay)
                attempt += 1
                await asyncio.sleep(delay)

    # -- ledger ---------------------------------------------------------------------------
    async def _load_ledger(self, common: dict[str, Any]) -> LedgerIndex:
        """Read the ledger to its true end: a fence per partition, read until each returns."""
        assert self._producer is not None
        topic = self.config.output.ledger_topic
        partitions = await self._retry("ledger metadata", lambda: self._producer_partitions(topic))
        fence_id = uuid.uuid4().hex
        key, value = encode_fence(fence_id)
        for p in partitions:
            await self._retry(
                "write ledger fence",
                lambda p=p: self._send(topic, key, value, partition=p),  # type: ignore[misc]
            )
        reader = AIOKafkaConsumer(
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            **common,
        )
        await self._retry("start ledger reader", reader.start)
        records: list[tuple[str, bytes | None]] = []
        pending = set(partitions)
        fence_key = key.encode()
        try:
            reader.assign([TopicPartition(topic, p) for p in partitions])
            await reader.seek_to_beginning()
            deadline = time.monotonic() + LEDGER_LOAD_TIMEOUT_S
            while pending:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"ledger topic {topic}: fences did not come back")
                batch = await reader.getmany(timeout_ms=500)
                for tp, msgs in batch.items():
                    if tp.partition not in pending:
                        continue
                    for m in msgs:
                        if m.key == fence_key:
                            pending.discard(tp.partition)
                            break
                        records.append((m.key.decode() if m.key else "", m.value))
        finally:
            await reader.stop()
        index = LedgerIndex()
        index.load(records)
        log.info("ledger loaded: %d releases", len(index))
        return index

    async def _producer_partitions(self, topic: str) -> list[int]:
        assert self._producer is not None
        parts = await self._producer.partitions_for(topic)
        return sorted(parts)

    async def _republish_unpublished(self, ledger: LedgerIndex) -> None:
        for rel in ledger.unpublished():
            log.info(
                "republishing a ledgered release unchanged",
                extra={"query": rel.query, "window": iso_utc(rel.window_start_s)},
            )
            await self._publish(rel)
            self.metrics.ledger_republished.inc()

    # -- producing ------------------------------------------------------------------------
    async def _send(
        self, topic: str, key: str | None, value: bytes, *, partition: int | None = None
    ) -> None:
        assert self._producer is not None
        await self._producer.send_and_wait(
            topic, value, key=None if key is None else key.encode(), partition=partition
        )

    async def _send_many(self, topic: str, items: Sequence[tuple[str | None, bytes]]) -> None:
        """Send a batch and wait for every acknowledgement (retried as a whole)."""
        assert self._producer is not None
        producer = self._producer

        async def once() -> None:
            futures = [
                await producer.send(topic, v, key=None if k is None else k.encode())
                for k, v in items
            ]
            await asyncio.gather(*futures)

        await self._retry(f"produce to {topic}", once)
        self.health.set("producer_connected", True)

    async def _write_ledger(self, rel: LedgerRelease) -> None:
        items: list[tuple[str | None, bytes]] = list(encode_release(rel, now_s=time.time()))
        await self._send_many(self.config.output.ledger_topic, items)

    async def _publish(self, rel: LedgerRelease) -> None:
        """Output records, then the ``published`` marker in the ledger."""
        await self._send_many(
            self.config.output.topic, [(r.key, dumps(r.value)) for r in rel.records]
        )
        self._crash.reached("after_output_write")
        await self._send_many(self.config.output.ledger_topic, [encode_published(rel)])
        rel.published = True

    async def _publish_dead_letters(self, dead: Sequence[DeadLetter]) -> None:
        now = time.time()
        topic = self.config.input.topic
        items: list[tuple[str | None, bytes]] = [
            (
                f"{topic}|{d.partition}|{d.offset}",
                dumps(
                    dead_letter_record(
                        reason=d.reason,
                        detail=d.detail,
                        source_topic=topic,
                        source_partition=d.partition,
                        source_offset=d.offset,
                        payload=d.payload,
                        now_s=now,
                    )
                ),
            )
            for d in dead
        ]
        await self._send_many(self.config.output.dead_letter_topic, items)

    async def _release_window(self, window_start_s: int) -> None:
        assert self.engine is not None
        engine = self.engine
        releases = engine.compute_release(window_start_s, now_s=time.time())
        for rel in releases:
            if engine.ledger.get(rel.query, rel.window_start_s) is not rel:
                await self._write_ledger(rel)
                engine.record_ledgered(rel)
                self._crash.reached("after_ledger_write")
            if not rel.published:
                await self._publish(rel)
        engine.finish_window(window_start_s, releases, time.time())
        log.info(
            "window released",
            extra={"window": iso_utc(window_start_s), "query": ",".join(r.query for r in releases)},
        )

    # -- consuming ------------------------------------------------------------------------
    async def on_assigned(self, partitions: list[int]) -> None:
        async with self._lock:
            if self.engine is not None:
                self.engine.assign(partitions, time.monotonic())
            self.health.set("partitions_assigned", bool(partitions))
            log.info("partitions assigned: %s", partitions)

    async def on_revoked(self, partitions: list[int]) -> None:
        async with self._lock:
            if self.engine is not None and self._consumer is not None:
                with contextlib.suppress(KafkaError):
                    await self._commit(only=partitions)
                self.engine.revoke(partitions)
                for p in partitions:
                    self._committed.pop(p, None)
                    self.metrics.forget_partition(p)
            self.health.set("partitions_assigned", False)
            log.info("partitions revoked: %s", partitions)

    async def _commit(self, only: Sequence[int] | None = None) -> None:
        assert self.engine is not None and self._consumer is not None
        topic = self.config.input.topic
        offsets = {
            TopicPartition(topic, p): off
            for p, off in self.engine.safe_offsets().items()
            if (only is None or p in only) and self._committed.get(p) != off
        }
        if offsets:
            await self._consumer.commit(offsets)
            for tp, off in offsets.items():
                self._committed[tp.partition] = off

    async def _loop(self) -> None:
        assert self._consumer is not None and self.engine is not None
        consumer, engine = self._consumer, self.engine
        while not self._stopping.is_set():
            try:
                batch = await consumer.getmany(
                    timeout_ms=FETCH_TIMEOUT_MS, max_records=MAX_RECORDS_PER_FETCH
                )
            except KafkaError as exc:
                self.metrics.broker_errors.inc()
                log.warning("fetch failed (%s); retrying", type(exc).__name__)
                await asyncio.sleep(RETRY_BACKOFF_S[1])
                continue
            async with self._lock:
                started = time.perf_counter()
                now, mono = time.time(), time.monotonic()
                dead: list[DeadLetter] = []
                for tp, msgs in batch.items():
                    dead.extend(
                        engine.ingest(
                            tp.partition,
                            [(m.offset, m.value) for m in msgs],
                            now_s=now,
                            now_mono_s=mono,
                        )
                    )
                    high = consumer.highwater(tp)
                    if high is not None and msgs:
                        self.metrics.set_consumer_lag(
                            tp.partition, max(0, high - msgs[-1].offset - 1)
                        )
                if batch:
                    self._crash.reached("after_ingest")
                if dead:
                    await self._publish_dead_letters(dead)
                # During an outage nothing can be published, and silence is not idleness.
                due = engine.due_windows(mono) if self._broker_ok else []
                for ws in due:
                    await self._release_window(ws)
                await self._commit()
                if batch:
                    self.metrics.batch_processing.observe(time.perf_counter() - started)
            self.health.beat()
