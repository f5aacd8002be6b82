"""The streaming worker on aiokafka: the Kafka transport around the two stages.

Every worker is one member of one consumer group subscribed to the input topic, the
partials topic and (for input not keyed by user) the repartition topic; Kafka spreads the
partitions of all of them over the members. One code path: a single worker runs every stage.

* Stage 0 (input partitions, ``input.keyed_by_user: false``): pseudonymize, re-key by
  pseudonym to the repartition topic; input offsets are committed once that is acknowledged.
* Stage 1 (partitions of the input, or of the repartition topic): window and bound
  (:class:`IngestStage`). When a partition's watermark passes a window's end, its bounded
  partial totals go to the window's partials partition; once they are acknowledged, the
  partition's watermark goes to every partials partition, and the window's input offsets
  may be committed. Watermarks are re-sent every second, so a restarted owner soon has them.
* Stage 2 (partials partitions, :class:`ReleaseStage`): merge one version per source
  partition; when every source partition has sealed a window, release it once:

1. compute the release once (noise drawn, budget charged) — in memory only;
2. write every ledger part and wait for the broker's acknowledgement;
3. write the output records; 4. write the ``published`` marker;
5. drop the window's state; commit partials offsets up to what open windows still need.

A crash before 2 completes leaves no complete ledger entry: nothing was published, the
window is rebuilt from the re-read partials and drawn then. A crash after 2 leaves a ledger
entry: it is read back (to the true end, behind fence records — end offsets are unreliable
on some brokers) at start and whenever partials partitions move here; its records are
republished unchanged and the window is never recomputed. Output keys are stable, so a
republished record is byte-identical.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
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
from stream_dp.pipeline.ingest import DeadLetter, IngestStage
from stream_dp.pipeline.ledger import (
    LedgerIndex,
    LedgerRelease,
    encode_fence,
    encode_published,
    encode_release,
)
from stream_dp.pipeline.partials import (
    encode_partial,
    encode_watermark,
    partials_partition,
)
from stream_dp.pipeline.records import dead_letter_record, dumps
from stream_dp.pipeline.release_stage import ExactTotalsObserver, ReleaseStage
from stream_dp.privacy.pseudonymize import KeyRing
from stream_dp.windows.tumbling import iso_utc

log = logging.getLogger(__name__)

#: Test-only fault injection: ``<point>:<n>`` kills the process (SIGKILL) the n-th time the
#: point is reached. Honoured only when the unsafe test mode is allowed by the environment.
CRASH_POINT_ENV = "STREAM_DP_TEST_CRASH_POINT"
CRASH_POINTS = ("after_ledger_write", "after_output_write", "after_ingest", "after_partials_write")

MAX_RECORDS_PER_FETCH = 10_000
FETCH_TIMEOUT_MS = 200
RETRY_BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)
LEDGER_LOAD_TIMEOUT_S = 60.0
BROKER_PROBE_INTERVAL_S = 1.0
BROKER_PROBE_TIMEOUT_S = 2.0
#: Source watermarks are re-sent at least this often (a restarted stage 2 needs fresh ones).
WATERMARK_INTERVAL_S = 1.0
#: Key of stage 0's progress marks on the repartition topic (events are keyed by pseudonym).
ROUTED_MARK_KEY = "__progress__"

#: (key, value, partition or None for the key's partition)
Outgoing = tuple[str | bytes | None, bytes, int | None]


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
        await self.worker.on_revoked(list(revoked))

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        await self.worker.on_assigned(list(assigned))


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
        self.ingest: IngestStage | None = None
        self.release: ReleaseStage | None = None
        self._lock = asyncio.Lock()
        self._crash = _CrashPoints()
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._common: dict[str, Any] = {}
        self._committed: dict[TopicPartition, int] = {}
        self._routed_positions: dict[int, int] = {}
        self._stopping = asyncio.Event()
        self._broker_ok = True
        self._partials_partitions: list[int] = []
        self._routed_to: list[int] = []
        self._marks_sent_mono = -math.inf
        self._silent: set[int] = set()
        self._progress_sent_mono = -math.inf
        out = config.output
        self._input_topic = config.input.topic
        self._keyed = config.input.keyed_by_user
        #: Where stage 1 reads: the input itself, or the repartition topic.
        self._stage1_topic = self._input_topic if self._keyed else out.repartition_topic
        self._partials_topic = out.partials_topic
        for q in config.queries:
            self.metrics.add_query(q.name)

    # -- lifecycle ------------------------------------------------------------------------
    def request_stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        """Run until :meth:`request_stop`; then stop fetching, flush, commit and close."""
        kafka = self.config.kafka
        common = self._common = client_kwargs(kafka, bootstrap_servers=self.bootstrap)
        self._producer = AIOKafkaProducer(acks="all", linger_ms=5, **common)
        await self._retry("start producer", self._producer.start)
        self.health.set("producer_connected", True)
        monitor = asyncio.create_task(self._monitor_broker())
        try:
            ledger = await self._load_ledger()
            self.release = ReleaseStage(
                self.config,
                ledger=ledger,
                metrics=self.metrics,
                exact_totals_observer=self._observe_exact,
            )
            self.ingest = IngestStage(
                self.config,
                self.keyring,
                released=self.release.released,
                released_earlier=self.release.released_earlier,
                metrics=self.metrics,
            )
            # Unpublished releases are republished by the owner of their partials partition,
            # once assigned (on_assigned re-reads the ledger then).
            self.metrics.ledger_windows_loaded.inc(len(ledger))
            self._partials_partitions = await self._retry(
                "partials topic metadata", lambda: self._producer_partitions(self._partials_topic)
            )
            if not self._keyed:
                self._routed_to = await self._retry(
                    "repartition topic metadata",
                    lambda: self._producer_partitions(self._stage1_topic),
                )
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
            topics = {self._input_topic, self._stage1_topic, self._partials_topic}
            self._consumer.subscribe(sorted(topics), listener=_Rebalance(self))
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
            if self._consumer is not None and self.ingest is not None:
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
                if ok and self.ingest is not None:
                    self.ingest.restart_idle_clocks(time.monotonic())
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
    async def _load_ledger(self) -> LedgerIndex:
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
            **self._common,
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

    async def _republish_unpublished(self, ledger: LedgerIndex, partials: set[int]) -> None:
        """Republish ledgered, unpublished releases of windows mapped to these partitions."""
        for rel in ledger.unpublished():
            if self._partials_partition_of(rel.window_start_s) not in partials:
                continue
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

    async def _send_many(self, topic: str, items: Sequence[Outgoing]) -> None:
        """Send a batch and wait for every acknowledgement (retried as a whole)."""
        assert self._producer is not None
        producer = self._producer

        async def once() -> None:
            futures = [
                await producer.send(
                    topic, v, key=k.encode() if isinstance(k, str) else k, partition=p
                )
                for k, v, p in items
            ]
            await asyncio.gather(*futures)

        await self._retry(f"produce to {topic}", once)
        self.health.set("producer_connected", True)

    async def _write_ledger(self, rel: LedgerRelease) -> None:
        items: list[Outgoing] = [(k, v, None) for k, v in encode_release(rel, now_s=time.time())]
        await self._send_many(self.config.output.ledger_topic, items)

    async def _publish(self, rel: LedgerRelease) -> None:
        """Output records, then the ``published`` marker in the ledger."""
        await self._send_many(
            self.config.output.topic, [(r.key, dumps(r.value), None) for r in rel.records]
        )
        self._crash.reached("after_output_write")
        key, value = encode_published(rel)
        await self._send_many(self.config.output.ledger_topic, [(key, value, None)])
        rel.published = True

    async def _publish_dead_letters(self, dead: Sequence[DeadLetter]) -> None:
        now = time.time()
        topic = self.config.input.topic
        items: list[Outgoing] = [
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
                None,
            )
            for d in dead
        ]
        await self._send_many(self.config.output.dead_letter_topic, items)

    def _partials_partition_of(self, window_start_s: int) -> int:
        """The partials partition that receives every partial of the window."""
        parts = self._partials_partitions
        return parts[partials_partition(window_start_s, self.config.window.size_s, len(parts))]

    async def _publish_partials(self, sealed: Sequence[tuple[int, int]]) -> None:
        """Stage 1: each sealed (partition, window)'s partials to the window's partition."""
        assert self.ingest is not None
        items: list[Outgoing] = []
        for p, ws in sealed:
            r = self._partials_partition_of(ws)
            for partial in self.ingest.seal(p, ws):
                items.extend((k, v, r) for k, v in encode_partial(partial))
        await self._send_many(self._partials_topic, items)
        for p, ws in sealed:
            self.ingest.drop(p, ws)
        self._crash.reached("after_partials_write")

    async def _publish_watermarks(self, now_mono: float) -> None:
        """Stage 1: each assigned partition's watermark to every partials partition."""
        assert self.ingest is not None
        items: list[Outgoing] = []
        # Partitions that hold windows back go first, so that no reader sees one partition
        # advance without the others' news from the same moment.
        marks = sorted(self.ingest.watermarks(now_mono), key=lambda m: m.quiet)
        for mark in marks:
            key, value = encode_watermark(mark)
            items.extend((key, value, r) for r in self._partials_partitions)
        if items:
            await self._send_many(self._partials_topic, items)
        self._marks_sent_mono = now_mono
        self._silent = {m.source_partition for m in marks if m.quiet}

    def _woke_up(self, now_mono: float) -> bool:
        """Whether a partition last reported idle with nothing open now has data."""
        assert self.ingest is not None
        if not self._silent:
            return False
        return any(
            not m.quiet
            for m in self.ingest.watermarks(now_mono)
            if m.source_partition in self._silent
        )

    async def _release_window(self, window_start_s: int) -> None:
        assert self.release is not None
        stage = self.release
        releases = stage.compute_release(window_start_s, now_s=time.time())
        for rel in releases:
            if stage.ledger.get(rel.query, rel.window_start_s) is not rel:
                await self._write_ledger(rel)
                stage.record_ledgered(rel)
                self._crash.reached("after_ledger_write")
            if not rel.published:
                await self._publish(rel)
        stage.finish_window(window_start_s, releases, time.time())
        log.info(
            "window released",
            extra={"window": iso_utc(window_start_s), "query": ",".join(r.query for r in releases)},
        )

    # -- consuming ------------------------------------------------------------------------
    def _split(self, tps: Sequence[TopicPartition]) -> tuple[list[int], list[int], list[int]]:
        """(stage-1 partitions, partials partitions, input partitions routed by stage 0)."""
        stage1 = sorted(tp.partition for tp in tps if tp.topic == self._stage1_topic)
        partials = sorted(tp.partition for tp in tps if tp.topic == self._partials_topic)
        routed = (
            []
            if self._keyed
            else sorted(tp.partition for tp in tps if tp.topic == self._input_topic)
        )
        return stage1, partials, routed

    async def on_assigned(self, assigned: list[TopicPartition]) -> None:
        async with self._lock:
            stage1, partials, routed = self._split(assigned)
            if self.ingest is not None and self.release is not None:
                # Stage 2 waits for every stage-1 partition, and a repartition partition for
                # every input partition: both counts must be right, never guessed.
                self.ingest.source_partitions = len(
                    await self._retry(
                        "stage-1 topic metadata",
                        lambda: self._producer_partitions(self._stage1_topic),
                    )
                )
                if not self._keyed:
                    self.ingest.input_partitions = len(
                        await self._retry(
                            "input topic metadata",
                            lambda: self._producer_partitions(self._input_topic),
                        )
                    )
                self.ingest.assign(stage1, time.monotonic(), routed=not self._keyed)
                self.ingest.assign_routed(routed, time.monotonic())
                if partials:
                    # Another worker may have released windows of these partitions: read
                    # the ledger to its end before taking any of their partials.
                    ledger = await self._load_ledger()
                    self.release.adopt_ledger(ledger)
                    await self._republish_unpublished(ledger, set(partials))
                    self.release.assign(partials)
            self.health.set("partitions_assigned", bool(assigned))
            log.info(
                "partitions assigned: %s",
                ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(assigned)),
            )

    async def on_revoked(self, revoked: list[TopicPartition]) -> None:
        async with self._lock:
            if self.ingest is not None and self.release is not None:
                if self._consumer is not None:
                    with contextlib.suppress(KafkaError):
                        await self._commit(only=set(revoked))
                stage1, partials, routed = self._split(revoked)
                self.ingest.revoke(stage1)
                self.release.revoke(partials)
                self.ingest.forget_routed(routed)
                for p in routed:
                    self._routed_positions.pop(p, None)
                for tp in revoked:
                    self._committed.pop(tp, None)
                # Lag is tracked per input partition (whichever stage reads it).
                for tp in revoked:
                    if tp.topic == self._input_topic:
                        self.metrics.forget_partition(tp.partition)
            self.health.set("partitions_assigned", False)
            log.info(
                "partitions revoked: %s",
                ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(revoked)),
            )

    def _safe_offsets(self) -> dict[TopicPartition, int]:
        assert self.ingest is not None and self.release is not None
        out = {
            TopicPartition(self._stage1_topic, p): off
            for p, off in self.ingest.safe_offsets().items()
        }
        out.update(
            (TopicPartition(self._partials_topic, r), off)
            for r, off in self.release.safe_offsets().items()
        )
        out.update(
            (TopicPartition(self._input_topic, p), off) for p, off in self._routed_positions.items()
        )
        return out

    async def _commit(self, only: set[TopicPartition] | None = None) -> None:
        assert self._consumer is not None
        offsets = {
            tp: off
            for tp, off in self._safe_offsets().items()
            if (only is None or tp in only) and self._committed.get(tp) != off
        }
        if offsets:
            await self._consumer.commit(offsets)
            self._committed.update(offsets)

    async def _loop(self) -> None:
        assert self._consumer is not None
        assert self.ingest is not None and self.release is not None
        consumer, ingest, release = self._consumer, self.ingest, self.release
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
                routed: list[Outgoing] = []
                for tp, msgs in batch.items():
                    if not msgs:
                        continue
                    if tp.topic == self._partials_topic:
                        release.ingest(tp.partition, [(m.offset, m.value) for m in msgs])
                        continue
                    records = [(m.offset, m.key, m.value) for m in msgs]
                    if tp.topic == self._stage1_topic:
                        dead.extend(
                            ingest.ingest(
                                tp.partition,
                                records,
                                now_s=now,
                                now_mono_s=mono,
                                routed=not self._keyed,
                            )
                        )
                    elif tp.topic == self._input_topic:
                        out, bad = ingest.route(tp.partition, records, now_s=now, now_mono_s=mono)
                        routed.extend((k, v, None) for k, v in out)
                        dead.extend(bad)
                        self._routed_positions[tp.partition] = msgs[-1].offset + 1
                    else:
                        continue
                    if tp.topic == self._input_topic:
                        high = consumer.highwater(tp)
                        if high is not None:
                            self.metrics.set_consumer_lag(
                                tp.partition, max(0, high - msgs[-1].offset - 1)
                            )
                if sum(len(msgs) for msgs in batch.values()) >= MAX_RECORDS_PER_FETCH:
                    # A full fetch: the worker is behind, so a partition that delivered
                    # nothing may just not have had its turn. Nothing is idle while behind.
                    ingest.restart_idle_clocks(mono)
                if batch:
                    self._crash.reached("after_ingest")
                if dead:
                    await self._publish_dead_letters(dead)
                if not self._keyed and (
                    routed or mono - self._progress_sent_mono >= WATERMARK_INTERVAL_S
                ):
                    # Progress marks follow the records they cover on every partition.
                    routed.extend(
                        (ROUTED_MARK_KEY, mark, r)
                        for mark in ingest.progress_marks(mono)
                        for r in self._routed_to
                    )
                    await self._send_many(self._stage1_topic, routed)
                    self._progress_sent_mono = mono
                # During an outage nothing can be published, and silence is not idleness.
                if self._broker_ok:
                    if self._woke_up(mono):
                        # A partition stage 2 may think idle has data again: say so before
                        # any other partition's partials and watermarks can close a window.
                        await self._publish_watermarks(mono)
                    sealed = ingest.due(mono)
                    if sealed:
                        await self._publish_partials(sealed)
                    if sealed or mono - self._marks_sent_mono >= WATERMARK_INTERVAL_S:
                        await self._publish_watermarks(mono)
                    for ws in release.due_windows():
                        await self._release_window(ws)
                    watermark = release.watermark_s()
                    if watermark is not None:
                        self.metrics.watermark.set(watermark)
                await self._commit()
                if batch:
                    self.metrics.batch_processing.observe(time.perf_counter() - started)
            self.health.beat()
