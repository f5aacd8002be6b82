"""The streaming worker on aiokafka: the Kafka transport around the two stages.

Every worker is one member of one consumer group subscribed to the input topic, the
partials topic and (for input not keyed by user) the repartition topic; Kafka spreads the
partitions of all of them over the members. One code path: a single worker runs every stage.

* Stage 0 (input partitions, ``input.keyed_by_user: false``): pseudonymize, re-key by
  pseudonym to the repartition topic (packed records: one per fetched batch and repartition
  partition); input offsets are committed once that is acknowledged.
* Stage 1 (partitions of the input, or of the repartition topic): window and bound
  (:class:`IngestStage`). When a partition's watermark passes a window's end, its bounded
  partial totals go to the window's partials partition; once they are acknowledged, the
  partition's watermark goes to every partials partition, and the window's input offsets
  may be committed. Watermarks are re-sent every second, so a restarted owner soon has them.
* Stage 2 (partials partitions, :class:`ReleaseStage`): merge one version per source
  partition; every covered window, once every source has passed it, is released once:

1. check this member still owns the window's partials partition; for cumulative queries,
   continue their running totals' state (:mod:`stream_dp.pipeline.cumulative`: read the
   continual partition to a fence, draw the window's step once, write it, read it back —
   or wait while the previous window's state is not durable); then draw the release
   (noise, budget charged) — in memory only;
2. write every ledger part to the window's ledger partition and wait for the broker's
   acknowledgement; 3. write a fence behind them and read that partition back to it;
4. publish the ledger's *winner* of each (query, window) — the first complete draw in log
   order, ours or an earlier one — then its ``published`` marker;
5. drop the window's state, write the partition's ``progress`` record, commit.

Sealing (stage 1) and the draw of step 1 with its ledger encoding run in a thread
(:mod:`stream_dp.pipeline.offload`) while the iteration waits for them: the event loop keeps
fetching, answering the group coordinator and serving /metrics during a large window.

Two members racing for one window (one paused past the session timeout, then resumed)
therefore publish the same values (:mod:`stream_dp.pipeline.ledger`). A crash before 2 leaves
no complete draw: nothing was published, the window is rebuilt from the re-read partials and
drawn then. A crash after 2 leaves a draw in the ledger: it is read back at start and
whenever partials partitions move here, republished unchanged, never recomputed.

Erasure (docs/erasure.md; ``erasure.enabled``): :class:`WorkerErasure` reads requests and
the erasure log; before step 1 the releaser writes the window's ``cut`` and draws only once
the window's partials applied the erasures recorded before it.

Failures: a member told it lost its membership or generation (commit, heartbeat) counts it,
keeps running and lets the group's rejoin hand it its partitions again (their state is
dropped and rebuilt). A broker write that keeps failing for ``kafka.give_up_after_s`` stops
the worker *without committing* (a supervisor restarts it): nothing is retried for ever
while holding the lock the rebalance callbacks need. A ledger read that fails when
partitions arrive pauses those partials partitions until it succeeds. A ledger found lost
(at start, or going backwards under the worker) is an outage, never a re-release
(:mod:`stream_dp.pipeline.ledger_guard`): nothing more is released until it is rebuilt.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import (
    CommitFailedError,
    IllegalGenerationError,
    KafkaError,
    RebalanceInProgressError,
    UnknownMemberIdError,
)

from stream_dp.broker.client_options import client_kwargs
from stream_dp.broker.probe import wait_for_broker
from stream_dp.clients.idempotence import start_producer
from stream_dp.clients.read_to_end import answered_at_mono, read_to_end_at
from stream_dp.config.fingerprint import Fingerprint, Topology, deployment_fingerprint
from stream_dp.config.model import UNSAFE_TEST_MODE_ENV, Config
from stream_dp.errors import BrokerError, ConfigError, StreamDPError
from stream_dp.ops.health import Health
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.continual_state import ContinualStore, encode_state
from stream_dp.pipeline.decode import REASONS
from stream_dp.pipeline.erasure_worker import WorkerErasure
from stream_dp.pipeline.fingerprint_gate import settle_fingerprint, worker_refusal
from stream_dp.pipeline.ingest import DeadLetter, IngestStage
from stream_dp.pipeline.ingest_columns import FetchedRecords
from stream_dp.pipeline.late_events import LateEventsNotice
from stream_dp.pipeline.ledger import (
    LedgerIndex,
    LedgerRelease,
    encode_coverage,
    encode_cut,
    encode_progress,
    encode_published,
    encode_rotation,
)
from stream_dp.pipeline.ledger_guard import LedgerGuard, LedgerLostError
from stream_dp.pipeline.ledger_log import LedgerLog, LedgerReadError, LogRewoundError
from stream_dp.pipeline.offload import draw_window, output_values, run_off_loop, seal_windows
from stream_dp.pipeline.partials import RecordTooLargeError, encode_watermark
from stream_dp.pipeline.producing import Headers, Outgoing, send_all
from stream_dp.pipeline.records import (
    OUTPUT_HEADERS,
    dead_letter_record,
    dumps,
    output_partition,
)
from stream_dp.pipeline.release_stage import ExactTotalsObserver, ReleaseStage
from stream_dp.privacy.pseudonymize import KeyRing
from stream_dp.retry import retry
from stream_dp.windows import TumblingWindows
from stream_dp.windows.tumbling import iso_utc

log = logging.getLogger(__name__)

#: Test-only fault injection: ``<point>:<n>`` kills the process (SIGKILL) the n-th time the
#: point is reached. Honoured only when the unsafe test mode is allowed by the environment.
CRASH_POINT_ENV = "STREAM_DP_TEST_CRASH_POINT"
CRASH_POINTS = (
    "after_ledger_write",
    "after_output_write",
    "after_ingest",
    "after_partials_write",
    "before_draw",
    "after_ledger_readback",
    "after_continual_write",
)
#: Test-only: ``<point>:<n>:<seconds>`` freezes the whole process (SIGSTOP to itself, then a
#: helper sends SIGCONT after the pause) at the n-th visit of a point — a GC pause or VM
#: stall at the worst moment. Same switch as the crash points.
PAUSE_POINT_ENV = "STREAM_DP_TEST_PAUSE_POINT"
#: Test-only: every write to the ledger topic waits this many seconds first (a slow ledger
#: partition, for the chaos run). Same switch as the crash points.
LEDGER_DELAY_ENV = "STREAM_DP_TEST_LEDGER_DELAY_S"
#: Test-only: the first N ledger reads when partitions arrive fail (a broker hiccup while
#: taking partitions). Same switch as the crash points.
TAKE_FAILURES_ENV = "STREAM_DP_TEST_TAKE_FAILURES"
#: Test-only: ``<partition>:<seconds>`` — once taken, that partition of the topic the worker
#: reads events from (the input) fetches nothing for that long: a reader that cannot fetch
#: (a stalled connection, a slow rejoin) while events wait. Same switch as the crash points.
STALL_INPUT_ENV = "STREAM_DP_TEST_STALL_INPUT"

MAX_RECORDS_PER_FETCH = 40_000
#: Bytes fetched per partition and request: the consumer fetches a partition again only once
#: what it holds of it is consumed, so larger fetches mean fewer waits for the broker.
FETCH_PARTITION_BYTES = 4 * 1_048_576
FETCH_TIMEOUT_MS = 200
RETRY_BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)
BROKER_PROBE_INTERVAL_S = 1.0
BROKER_PROBE_TIMEOUT_S = 2.0
#: Source watermarks are re-sent at least this often (a restarted stage 2 needs fresh ones).
WATERMARK_INTERVAL_S = 1.0
#: Key of stage 0's progress marks on the repartition topic (events are keyed by pseudonym).
ROUTED_MARK_KEY = "__progress__"
#: Windows released per loop iteration at most (a backlog of empty windows after a long
#: outage must not keep the loop from fetching, committing and heartbeating).
MAX_RELEASES_PER_ITERATION = 32
#: A window waiting for its predecessor's running-total state is looked at again after
#: this long (each look writes fences to the continual and ledger topics).
CONTINUAL_WAIT_RETRY_S = 0.5
#: Largest record batch the producer builds (fewer, larger produce requests).
MAX_BATCH_BYTES = 512 * 1024
#: A release with more records than this is encoded for the output topic off the loop.
OFF_LOOP_RECORDS = 2_000
#: A graceful stop (flush, commit, leave the group, close) takes at most this long in all,
#: below the service's SHUTDOWN_TIMEOUT_S, even when the broker does not answer.
SHUTDOWN_BUDGET_S = 20.0
#: bounds: auto — how often the ledger is read again for bounds still awaited (the same set)
BOUNDS_READ_INTERVAL_S = 1.0
#: Topic metadata is refreshed this often, so partition-count changes are seen soon.
METADATA_MAX_AGE_MS = 10_000

#: What the group coordinator says when this member is no longer who it thinks it is.
MEMBERSHIP_ERRORS = (
    CommitFailedError,
    IllegalGenerationError,
    UnknownMemberIdError,
    RebalanceInProgressError,
)


class BrokerUnavailableError(StreamDPError):
    """A broker write kept failing for ``kafka.give_up_after_s``: the worker stops without
    committing, and its supervisor restarts it."""


class TopologyError(StreamDPError):
    """A topic the release protocol depends on changed shape while the worker ran."""


class _TestFaults:
    """Crash and pause points for fault-injection tests (off unless the test switch is set)."""

    def __init__(self) -> None:
        allowed = os.environ.get(UNSAFE_TEST_MODE_ENV) == "1"
        self.crash = self._parse(os.environ.get(CRASH_POINT_ENV, "") if allowed else "")
        self.pause = self._parse(os.environ.get(PAUSE_POINT_ENV, "") if allowed else "")
        self.ledger_delay_s = float(os.environ.get(LEDGER_DELAY_ENV, "0") or 0) if allowed else 0.0
        self.take_failures = int(os.environ.get(TAKE_FAILURES_ENV, "0") or 0) if allowed else 0
        stall = os.environ.get(STALL_INPUT_ENV, "") if allowed else ""
        partition, _, seconds = stall.partition(":")
        try:
            self.stall_input: tuple[int, float] | None = (
                (int(partition), float(seconds or "0")) if partition else None
            )
        except ValueError:
            raise ConfigError(
                f"{STALL_INPUT_ENV} = {stall!r}: write <partition>:<seconds>, e.g. 1:25"
            ) from None

    @staticmethod
    def _parse(spec: str) -> list[Any] | None:
        if not spec:
            return None
        point, _, rest = spec.partition(":")
        if point not in CRASH_POINTS:
            return None
        count, _, seconds = rest.partition(":")
        return [point, int(count or "1"), float(seconds or "0")]

    def reached(self, point: str) -> None:
        for spec, act in ((self.crash, self._kill), (self.pause, self._freeze)):
            if spec is None or spec[0] != point:
                continue
            spec[1] -= 1
            if spec[1] == 0:
                log.warning("test fault point %s reached", point)
                act(spec[2])

    @staticmethod
    def _kill(_seconds: float) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    @staticmethod
    def _freeze(seconds: float) -> None:
        # A child wakes us after the pause: the whole process (every task) stops meanwhile.
        pid = os.getpid()
        if os.fork() == 0:  # pragma: no cover - runs in the child
            time.sleep(seconds)
            os.kill(pid, signal.SIGCONT)
            os._exit(0)
        os.kill(pid, signal.SIGSTOP)


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
        self.metrics = metrics if metrics is not None else Metrics(reasons=REASONS)
        window = config.window
        self.metrics.set_window_config(window.size_s, window.grace_s, window.idle_close_s)
        self.health = health if health is not None else Health(metrics=self.metrics)
        self.health.set("topology_stable", True)
        self.ingest: IngestStage | None = None
        self.release: ReleaseStage | None = None
        self.ledger = LedgerIndex()
        self._ledger_log: LedgerLog | None = None
        #: Cumulative queries' running-total state (the continual topic), when there are any.
        self.continual_store = ContinualStore()
        self._continual_log: LedgerLog | None = None
        self._continual_topic = config.output.continual_topic
        self._continual_partitions: list[int] = []
        #: window start → monotonic time before which a waiting window is not looked at again
        self._continual_retry_at: dict[int, float] = {}
        self._lock = asyncio.Lock()
        self._faults = _TestFaults()
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._common: dict[str, Any] = {}
        self._committed: dict[TopicPartition, int] = {}
        self._routed_positions: dict[int, int] = {}
        self._stopping = asyncio.Event()
        self._broker_ok = True
        self._leaderless: set[TopicPartition] = set()
        self._partials_partitions: list[int] = []
        self._ledger_partitions: list[int] = []
        self._output_partitions: list[int] = [0]
        self._routed_to: list[int] = []
        #: Partitions assigned but not taken yet (ledger read, state built): paused until
        #: the loop has taken them (see on_assigned).
        self._to_take: list[TopicPartition] = []
        #: Partitions taken and not revoked since, with when (wall clock: a partition's
        #: fetch age before any answer). During a rejoin aiokafka's assignment() still lists
        #: partitions already revoked: records fetched for them must not rebuild their
        #: state (a second, stale owner; a commit of an unassigned partition).
        self._owned: dict[TopicPartition, float] = {}
        #: An error found in a rebalance callback that must stop the worker (raised by the
        #: loop: aiokafka would swallow it in the callback).
        self._fatal: StreamDPError | None = None
        #: A lost ledger (deleted, recreated, renamed) is an outage: see ledger_guard.
        self._ledger_guard: LedgerGuard | None = None
        #: What this worker's partials and releases mean (set at start, from the
        #: configuration and the internal topics' partition counts).
        self.fingerprint: Fingerprint | None = None
        self._marks_sent_mono = -math.inf
        #: bounds: auto — the windows last read for, and when (see _read_awaited_bounds)
        self._bounds_read: tuple[frozenset[int], float] = (frozenset(), -math.inf)
        self._silent: set[int] = set()
        self._progress_sent_mono = -math.inf
        #: Partition counts seen at start per topic, and when a change stops settling.
        self._topology: dict[str, int] = {}
        self._unsettled_until_s: float | None = None
        self.windows = TumblingWindows(config.window.size_s, config.window.grace_s)
        out = config.output
        self._input_topic = config.input.topic
        self._keyed = config.input.keyed_by_user
        #: Where stage 1 reads: the input itself, or the repartition topic.
        self._stage1_topic = self._input_topic if self._keyed else out.repartition_topic
        self._partials_topic = out.partials_topic
        self._ledger_topic = out.ledger_topic
        self._max_bytes = config.kafka.max_message_bytes
        #: Stage 0's progress marks are re-sent this often: at least every second, and twice
        #: per idle_close_s, so that an input partition going idle is seen soon after.
        self._marks_interval_s = min(WATERMARK_INTERVAL_S, config.window.idle_close_s / 2)
        #: Erasure requests, log and release gate (docs/erasure.md); None when off.
        self._erasure: WorkerErasure | None = None
        self._requests_topic = config.erasure.requests_topic if config.erasure.enabled else None
        for q in config.queries:
            self.metrics.add_query(q.name)
        self._late_notice = LateEventsNotice(self.metrics, config.window.start_at)

    # -- lifecycle ------------------------------------------------------------------------
    def request_stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        """Run until :meth:`request_stop`; then stop fetching, flush, commit and close.

        Any other way out (an error) closes the clients *without committing*: what was
        not safely done is redone by whoever takes the partitions next.
        """
        kafka = self.config.kafka
        common = self._common = client_kwargs(kafka, bootstrap_servers=self.bootstrap)
        options = {
            "acks": "all",
            "linger_ms": 5,
            "max_request_size": self._max_bytes,
            "max_batch_size": min(self._max_bytes, MAX_BATCH_BYTES),
        }
        # Idempotent where the broker gives producer ids (not the embedded broker).
        self._producer = await self._retry(
            "start producer", lambda: start_producer(common, options), bounded=False
        )
        self.health.set("producer_connected", True)
        guard = self._ledger_guard = LedgerGuard(
            self.config, metrics=self.metrics, health=self.health, client_options=common
        )
        monitor = asyncio.create_task(self._monitor_broker())
        graceful = False
        try:
            await self._start_stages()
            self._consumer = AIOKafkaConsumer(
                group_id=kafka.group_id,
                enable_auto_commit=False,
                # Internal topics are always read from their beginning; input.start_from
                # is applied to input partitions without a committed offset (on_assigned).
                auto_offset_reset="earliest",
                session_timeout_ms=kafka.session_timeout_ms,
                heartbeat_interval_ms=kafka.heartbeat_interval_ms,
                max_partition_fetch_bytes=max(FETCH_PARTITION_BYTES, self._max_bytes),
                metadata_max_age_ms=METADATA_MAX_AGE_MS,
                **common,
            )
            self._consumer.subscribe(self._group_topics(), listener=_Rebalance(self))
            await self._retry("start consumer", self._consumer.start, bounded=False)
            await self._loop()
            graceful = True
        except RecordTooLargeError:
            self.metrics.records_too_large.inc()
            raise
        except (LedgerLostError, LogRewoundError) as exc:
            await guard.hold(exc, self._consumer, self._stopping)
        finally:
            monitor.cancel()
            await self._shutdown(commit=graceful)

    async def _start_stages(self) -> None:
        """Read the ledger, fix the first covered window, check a key rotation, build stages."""
        self._ledger_partitions = await self._retry(
            "ledger metadata", lambda: self._producer_partitions(self._ledger_topic), bounded=False
        )
        self._partials_partitions = await self._retry(
            "partials topic metadata",
            lambda: self._producer_partitions(self._partials_topic),
            bounded=False,
        )
        self._output_partitions = await self._retry(
            "output topic metadata",
            lambda: self._producer_partitions(self.config.output.topic),
            bounded=False,
        )
        if not self._keyed:
            self._routed_to = await self._retry(
                "repartition topic metadata",
                lambda: self._producer_partitions(self._stage1_topic),
                bounded=False,
            )
        self._topology = {
            self._ledger_topic: len(self._ledger_partitions),
            self._partials_topic: len(self._partials_partitions),
        }
        if any(q.cumulative for q in self.config.queries):
            self._continual_partitions = await self._retry(
                "continual topic metadata",
                lambda: self._producer_partitions(self._continual_topic),
                bounded=False,
            )
            self._topology[self._continual_topic] = len(self._continual_partitions)
            self._continual_log = LedgerLog(
                self._continual_topic,
                self.continual_store,
                client_options=self._common,
                send=lambda k, v, p: self._send(self._continual_topic, k, v, partition=p),
            )
        self._ledger_log = LedgerLog(
            self._ledger_topic,
            self.ledger,
            client_options=self._common,
            send=lambda k, v, p: self._send(self._ledger_topic, k, v, partition=p),
        )
        await self._retry(
            "start ledger reader",
            lambda: self._ledger_log.start(self._ledger_partitions),  # type: ignore[union-attr]
            bounded=False,
        )
        await self._catch_up_ledger(None, bounded=False)
        fingerprint = self.fingerprint = deployment_fingerprint(
            self.config,
            Topology(
                partials_partitions=len(self._partials_partitions),
                ledger_partitions=len(self._ledger_partitions),
                continual_partitions=len(self._continual_partitions),
            ),
        )
        coverage = await self._coverage()
        await self._settle_fingerprint(fingerprint)
        await self._check_rotation()
        self.release = ReleaseStage(
            self.config,
            partials_partitions=len(self._partials_partitions),
            ledger=self.ledger,
            metrics=self.metrics,
            exact_totals_observer=self._observe_exact,
            key_id_of=lambda ws: self.keyring.for_window(ws).key_id,
            continual_store=self.continual_store,
            continual_partitions=max(1, len(self._continual_partitions)),
            fingerprint=fingerprint.digest,
        )
        if self.ledger.partials_partitions not in (None, len(self._partials_partitions)):
            raise TopologyError(
                f"the partials topic {self._partials_topic} has "
                f"{len(self._partials_partitions)} partitions but this deployment's ledger was "
                f"written with {self.ledger.partials_partitions}: windows would be released by "
                "two owners. Restore the partition count, or start a new deployment (a new "
                "kafka.group_id) with window.start_at after its last released window"
            )
        self.release.set_coverage(coverage)
        self.release.adopt_ledger()
        if self._continual_log is not None:
            # Horizons whose every window is released are skipped while reading.
            self.release.forget_finished_horizons()
            continual_log = self._continual_log
            await self._retry(
                "start continual reader",
                lambda: continual_log.start(self._continual_partitions),
                bounded=False,
            )
            await self._catch_up_continual(None, bounded=False)
        self.ingest = IngestStage(
            self.config, self.keyring, released=self.release, metrics=self.metrics
        )
        # Silence is idleness only where a fetch found the reader at the log's end.
        self.ingest.require_read_proof = True
        self.ingest.routed_partitions = max(1, len(self._routed_to))
        self.ingest.fingerprint = fingerprint.digest
        if self.config.erasure.enabled:
            self._erasure = WorkerErasure(
                self.config,
                self.keyring,
                metrics=self.metrics,
                client_options=self._common,
                send_many=self._send_many,
                retry=lambda what, op, bounded: self._retry(what, op, bounded=bounded),
            )
            await self._erasure.start(self.ingest, self.release)
        self.metrics.ledger_windows_loaded.inc(len(self.ledger))
        self.health.set("ledger_loaded", True)
        log.info(
            "ledger loaded: %d records; first covered window %s",
            self.ledger.records_read,
            iso_utc(coverage),
        )

    async def _coverage(self) -> int:
        """The first covered window: configured, else recorded, else now's. A deployment's
        first start records it (the first coverage record in log order wins if workers
        race), so a ledger without one is new — or lost: then LedgerLostError, before
        anything is recorded, so that every restart finds the same loss."""
        configured = self.config.window.first_window_start()
        recorded = self.ledger.coverage_start_s
        start = configured if configured is not None else self.windows.start_of(time.time())
        if recorded is None:
            assert self._ledger_guard is not None
            recorded = await self._ledger_guard.check_new_ledger(
                start, self._group_topics(), reread=self._reread_coverage
            )
        if recorded is None:
            key, value = encode_coverage(start, self.windows.size_s, self.fingerprint)
            partition = self._ledger_partitions[0]
            await self._retry(
                "record the first covered window",
                lambda: self._send(self._ledger_topic, key, value, partition=partition),
                bounded=False,
            )
            await self._catch_up_ledger([partition], bounded=False)
            recorded = self.ledger.coverage_start_s
            assert recorded is not None
        if configured is None:
            return recorded
        if recorded != configured:
            log.warning(
                "window.start_at (%s) differs from the first window this deployment "
                "recorded (%s); the configured one applies",
                iso_utc(configured),
                iso_utc(recorded),
            )
        return configured

    async def _reread_coverage(self) -> int | None:
        """The coverage record, after reading the whole ledger to fresh fences again."""
        await self._catch_up_ledger(None, bounded=False)
        return self.ledger.coverage_start_s

    def _group_topics(self) -> list[str]:
        """The topics this worker's consumer group reads (and commits offsets on)."""
        topics = {self._input_topic, self._stage1_topic, self._partials_topic}
        if self._requests_topic is not None:
            topics.add(self._requests_topic)
        return sorted(topics)

    async def _settle_fingerprint(self, fingerprint: Fingerprint) -> None:
        """Refuse to start under other meaning-bearing settings than the deployment's
        (:mod:`stream_dp.pipeline.fingerprint_gate`); record this configuration's
        fingerprint for a deployment from before fingerprints existed."""
        where, way_out = worker_refusal(self.config, self.ledger, self._ledger_topic)
        for _ in range(2):
            record = settle_fingerprint(
                self.ledger, fingerprint, self.config, where=where, way_out=way_out
            )
            if record is None:
                return
            log.warning(
                "the deployment was recorded without a fingerprint (an earlier version); "
                "recording this configuration's — its window size matches, its other "
                "settings cannot be checked"
            )
            partition = self._ledger_partitions[0]
            send = functools.partial(self._send, self._ledger_topic, *record, partition=partition)
            await self._retry("record the deployment fingerprint", send, bounded=False)
            await self._catch_up_ledger([partition], bounded=False)
        raise StreamDPError("the deployment fingerprint written was not read back")

    async def _check_rotation(self) -> None:
        """Refuse a new key rotation that would split a window already begun."""
        p = self.config.pseudonymization
        if p.rotate_at is None:
            return
        assert p.previous_key_id is not None
        rotate_at_s = int(p.rotate_at.timestamp())
        if (p.previous_key_id, p.key_id, rotate_at_s) in self.ledger.rotations:
            return
        next_start = self.windows.start_of(time.time()) + self.windows.size_s
        if rotate_at_s < next_start:
            raise ConfigError(
                f"pseudonymization.rotate_at = {iso_utc(rotate_at_s)} is before the next "
                f"window start ({iso_utc(next_start)}): windows already begun would see their "
                "users under two pseudonyms and bound them twice. Set rotate_at at or after "
                f"{iso_utc(next_start)}"
            )
        key, value = encode_rotation(p.key_id, p.previous_key_id, rotate_at_s)
        partition = self._ledger_partitions[0]
        await self._retry(
            "record the key rotation",
            lambda: self._send(self._ledger_topic, key, value, partition=partition),
            bounded=False,
        )

    async def _shutdown(self, *, commit: bool) -> None:
        """Flush, commit what is safe (only on a graceful stop), leave the group. Open
        windows are NOT released. Every step shares one deadline (SHUTDOWN_BUDGET_S), so an
        unreachable broker cannot make the stop outlast the service's patience."""
        deadline = time.monotonic() + SHUTDOWN_BUDGET_S

        async def step(op: Callable[[], Awaitable[Any]]) -> None:
            remaining = deadline - time.monotonic()
            with contextlib.suppress(KafkaError, asyncio.TimeoutError):
                await asyncio.wait_for(op(), timeout=max(0.1, remaining))

        try:
            if self._producer is not None:
                await step(self._producer.flush)
            if commit and self._consumer is not None and self.ingest is not None:
                await step(self._commit)
        finally:
            if self._consumer is not None:
                await step(self._consumer.stop)
            for reader in (self._ledger_log, self._continual_log):
                if reader is not None:
                    await step(reader.stop)
            if self._erasure is not None:
                await step(self._erasure.stop)
            if self._producer is not None:
                await step(self._producer.stop)
            self.health.set("partitions_assigned", False)
            self.health.set("producer_connected", False)

    async def _monitor_broker(self) -> None:
        """Probe the broker (not ready while it does not answer; liveness is unaffected) and
        the leaders of assigned partitions (a leaderless partition is an outage)."""
        while not self._stopping.is_set():
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
            self._leaderless = self._partitions_without_leader()
            await asyncio.sleep(BROKER_PROBE_INTERVAL_S)

    def _partitions_without_leader(self) -> set[TopicPartition]:
        consumer = self._consumer
        if consumer is None:
            return set()
        cluster = consumer._client.cluster  # aiokafka has no public accessor for leaders
        out = set()
        for tp in consumer.assignment():
            leader = cluster.leader_for_partition(tp)
            if leader is None or leader < 0:
                out.add(tp)
        return out

    async def _retry(
        self, what: str, op: Callable[[], Awaitable[Any]], *, bounded: bool = True
    ) -> Any:
        """Retry a broker operation (:func:`~stream_dp.retry.retry`: exponential
        back-off with full jitter). ``bounded``: give up after
        ``kafka.give_up_after_s`` (BrokerUnavailableError — the caller holds state that must
        not wait for ever); otherwise until it succeeds or the worker stops."""
        give_up_after_s = self.config.kafka.give_up_after_s

        def failed(exc: BaseException) -> None:
            self.metrics.broker_errors.inc()
            self.health.set("producer_connected", False)

        def exhausted(exc: BaseException) -> BaseException:
            return BrokerUnavailableError(
                f"{what} kept failing for {give_up_after_s:g} s ({type(exc).__name__}); "
                "stopping without committing so that a restart redoes what was not safely "
                "done (raise kafka.give_up_after_s to wait longer)"
            )

        return await retry(
            what,
            op,
            retry_on=(KafkaError,),
            never_retry=MEMBERSHIP_ERRORS,
            deadline_s=give_up_after_s if bounded else None,
            exhausted=exhausted,
            give_up=lambda failures: self._stopping.is_set() and failures > 2,
            on_failure=failed,
        )

    # -- ledger ---------------------------------------------------------------------------
    async def _catch_up_ledger(self, partitions: Sequence[int] | None, *, bounded: bool) -> None:
        """Read the ledger to fresh fences on ``partitions`` (None: all)."""
        assert self._ledger_log is not None
        ledger_log = self._ledger_log
        await self._retry(
            "read the ledger", lambda: ledger_log.catch_up(partitions), bounded=bounded
        )

    async def _catch_up_continual(
        self, partitions: Sequence[int] | None, *, bounded: bool = True
    ) -> None:
        """Read the continual topic to fresh fences on ``partitions`` (None: all)."""
        assert self._continual_log is not None
        reader = self._continual_log
        await self._retry(
            "read the continual topic", lambda: reader.catch_up(partitions), bounded=bounded
        )

    async def _producer_partitions(self, topic: str) -> list[int]:
        assert self._producer is not None
        parts = await self._producer.partitions_for(topic)
        return sorted(parts)

    async def _republish_unpublished(self, partials: set[int]) -> None:
        """Republish, unchanged, the ledger's unpublished winners of these partitions."""
        for rel in self.ledger.unpublished():
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
    ) -> int:
        """Send one record and wait for its acknowledgement; returns its offset."""
        assert self._producer is not None
        if topic == self._ledger_topic and self._faults.ledger_delay_s:
            await asyncio.sleep(self._faults.ledger_delay_s)
        sent = await self._producer.send_and_wait(
            topic, value, key=None if key is None else key.encode(), partition=partition
        )
        return int(sent.offset)

    async def _send_many(
        self, topic: str, items: Sequence[Outgoing], headers: Headers = ()
    ) -> None:
        """Send a batch and wait for every acknowledgement (retried as a whole, bounded)."""
        assert self._producer is not None
        producer = self._producer
        if topic == self._ledger_topic and self._faults.ledger_delay_s:
            await asyncio.sleep(self._faults.ledger_delay_s)

        await self._retry(f"produce to {topic}", lambda: send_all(producer, topic, items, headers))
        self.health.set("producer_connected", True)

    async def _publish(self, rel: LedgerRelease) -> None:
        """Output records — all on the (query, window)'s partition, the window record last —
        then the ``published`` marker in the ledger."""
        parts = self._output_partitions
        target = parts[output_partition(rel.query, rel.window_start_s, len(parts))]
        if len(rel.records) > OFF_LOOP_RECORDS:
            values = await run_off_loop(output_values, rel)
        else:
            values = output_values(rel)
        items = [(k, v, target) for k, v in values]
        await self._send_many(self.config.output.topic, items, OUTPUT_HEADERS)
        self._faults.reached("after_output_write")
        key, value = encode_published(rel)
        await self._send_many(
            self._ledger_topic, [(key, value, self._ledger_partition_of(rel.window_start_s))]
        )
        rel.published = True

    async def _publish_dead_letters(self, dead: Sequence[DeadLetter]) -> None:
        now = time.time()
        items: list[Outgoing] = []
        for d in dead:
            topic = d.topic or self._input_topic
            record = dead_letter_record(
                reason=d.reason,
                detail=d.detail,
                source_topic=topic,
                source_partition=d.partition,
                source_offset=d.offset,
                payload=d.payload,
                now_s=now,
            )
            items.append((f"{topic}|{d.partition}|{d.offset}", dumps(record), None))
        await self._send_many(self.config.output.dead_letter_topic, items)

    def _partials_partition_of(self, window_start_s: int) -> int:
        """The partials partition that receives every partial of the window."""
        parts = self._partials_partitions
        return parts[self.windows.partition_of(window_start_s, len(parts))]

    def _ledger_partition_of(self, window_start_s: int) -> int:
        """The ledger partition that holds every record of the window's releases."""
        parts = self._ledger_partitions
        return parts[self.windows.partition_of(window_start_s, len(parts))]

    async def _publish_partials(self, sealed: Sequence[tuple[int, int]]) -> None:
        """Stage 1: each sealed (partition, window)'s partials to the window's partition
        (sealed and encoded off the event loop)."""
        assert self.ingest is not None
        encoded = await run_off_loop(
            seal_windows,
            self.ingest,
            sealed,
            self._partials_partition_of,
            max_bytes=self._max_bytes,
        )
        items: list[Outgoing] = [(k, v, r) for r, records in encoded for k, v in records]
        await self._send_many(self._partials_topic, items)
        for p, ws in sealed:
            self.ingest.drop(p, ws)
        self._faults.reached("after_partials_write")

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

    def _owns(self, tp: TopicPartition) -> bool:
        """Whether this member owns ``tp`` in a generation it still belongs to."""
        consumer = self._consumer
        if consumer is None or tp not in consumer.assignment():
            return False
        # aiokafka keeps the old assignment until the rejoin revokes it; its coordinator
        # knows earlier that the membership is gone (no public accessor).
        coordinator = getattr(consumer, "_coordinator", None)
        subscription = getattr(getattr(consumer, "_subscription", None), "subscription", None)
        if coordinator is None or subscription is None:
            return True
        # (Generation ids start at 0 on some brokers: the member id is the better sign.)
        return not coordinator.need_rejoin(subscription) and bool(coordinator.member_id)

    async def _release_window(self, window_start_s: int) -> bool:
        """Release one due window (see the module docstring); False if no longer owned."""
        assert self.release is not None
        stage = self.release
        r = self._partials_partition_of(window_start_s)
        if not self._owns(TopicPartition(self._partials_topic, r)):
            return False
        if self._erasure is not None and not await self._erasure.ready_to_draw(
            window_start_s, stage, self._write_cut
        ):
            return False  # a partial must first apply an erasure (stage 1 re-seals it)
        self._faults.reached("before_draw")
        if not await self._continue_running_totals(window_start_s):
            return False
        # The draw (merge, selection, noise, records, their ledger encoding) runs off the
        # event loop: fetching, commits' heartbeats and /metrics go on meanwhile.
        drawn_records = await run_off_loop(
            draw_window, stage, window_start_s, now_s=time.time(), max_bytes=self._max_bytes
        )
        drawn = [rel for rel, _ in drawn_records]
        ledger_partition = self._ledger_partition_of(window_start_s)
        for _, records in drawn_records:
            await self._send_many(
                self._ledger_topic, [(k, v, ledger_partition) for k, v in records]
            )
            self._faults.reached("after_ledger_write")
        # Everything before our fence on that partition is now known: if another owner's
        # draw completed earlier, it is the one that counts (and ours is never shown).
        await self._catch_up_ledger([ledger_partition], bounded=True)
        self._faults.reached("after_ledger_readback")
        winners = stage.winners(window_start_s)
        decision = stage.bounds_decision(window_start_s)
        if decision is not None:  # bounds: auto — the next window's bounds, from the winners
            key, value = decision
            await self._send_many(self._ledger_topic, [(key, value, ledger_partition)])
        won = {w.release_id for w in winners}
        lost = [rel for rel in drawn if rel.release_id not in won]
        if lost:
            self.metrics.ledger_draws_discarded.inc(len(lost))
            log.warning(
                "another owner ledgered this window first: publishing its values, not ours",
                extra={"window": iso_utc(window_start_s)},
            )
        for rel in winners:
            if not rel.published:
                await self._publish(rel)
        cursor = stage.finish_window(window_start_s, winners, time.time())
        if self._erasure is not None:
            self._erasure.released(window_start_s)
        key, value = encode_progress(r, len(self._partials_partitions), cursor)
        await self._send_many(self._ledger_topic, [(key, value, ledger_partition)])
        log.info(
            "window released",
            extra={
                "window": iso_utc(window_start_s),
                "query": ",".join(w.query for w in winners),
                "drawn_here": any(rel.release_id in won for rel in drawn),
            },
        )
        return True

    async def _continue_running_totals(self, window_start_s: int) -> bool:
        """Cumulative queries of a due window: read their state to a fence, draw the
        window's step on the previous window's winning draw, write it and read it back —
        so that compute_release takes the winning draw (stream_dp.pipeline.cumulative).
        False when the previous window's state is not durable yet: the window waits."""
        assert self.release is not None
        stage = self.release
        if not stage.continual_pending(window_start_s):
            return True
        if time.monotonic() < self._continual_retry_at.get(window_start_s, -math.inf):
            return False
        parts = self._continual_partitions
        targets = [parts[i] for i in stage.continual_partitions(window_start_s)]
        await self._catch_up_continual(targets)
        prepared = stage.prepare_continual(window_start_s)
        if prepared.waiting:
            # Released meanwhile by its owner? Its ledger partition says (its state, if
            # any, was written before its ledger records and is read again after them).
            previous = window_start_s - self.windows.size_s
            await self._catch_up_ledger([self._ledger_partition_of(previous)], bounded=True)
            stage.adopt_ledger()
            await self._catch_up_continual(targets)
            prepared = stage.prepare_continual(window_start_s)
            if prepared.waiting:
                self._continual_retry_at = {
                    window_start_s: time.monotonic() + CONTINUAL_WAIT_RETRY_S
                }
                return False
        self._continual_retry_at.pop(window_start_s, None)
        if prepared.to_write:
            items: list[Outgoing] = []
            for draw in prepared.to_write:
                target = parts[stage.cumulative.partition_of(draw.query, draw.window_start_s)]
                items.extend(
                    (k, v, target) for k, v in encode_state(draw, max_bytes=self._max_bytes)
                )
            await self._send_many(self._continual_topic, items)
            self._faults.reached("after_continual_write")
            # The first complete draw in log order is now final: ours, or an earlier one.
            await self._catch_up_continual(targets)
            lost = [
                d
                for d in prepared.to_write
                if getattr(self.continual_store.winner(d.query, d.window_start_s), "draw_id", None)
                != d.draw_id
            ]
            if lost:
                self.metrics.ledger_draws_discarded.inc(len(lost))
                log.warning(
                    "another owner wrote this window's running-total state first: its draw "
                    "is used, not ours",
                    extra={"window": iso_utc(window_start_s)},
                )
        return True

    async def _write_cut(self, window_start_s: int) -> None:
        """The window's ``cut`` (erasure on): acknowledged before the erasure log is read."""
        key, value = encode_cut(window_start_s)
        await self._send_many(
            self._ledger_topic, [(key, value, self._ledger_partition_of(window_start_s))]
        )

    async def _read_awaited_bounds(self, now_mono: float) -> None:
        """bounds: auto — windows due in either stage wait for their bounds, which the
        releaser of the window before writes to that window's ledger partition: read those
        partitions (when the set of awaited windows changed, else at most once a second)."""
        assert self.ingest is not None and self.release is not None
        awaited = self.ingest.awaiting_bounds | self.release.awaiting_bounds
        awaited = {ws for ws in awaited if self.release.bounds_for(ws) is None}
        if not awaited:
            self._bounds_read = (frozenset(), -math.inf)
            return
        last_set, last_mono = self._bounds_read
        if awaited == last_set and now_mono - last_mono < BOUNDS_READ_INTERVAL_S:
            return
        self._bounds_read = (frozenset(awaited), now_mono)
        size = self.windows.size_s
        partitions = sorted({self._ledger_partition_of(ws - size) for ws in awaited})
        await self._catch_up_ledger(partitions, bounded=True)

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

    async def _topic_partitions(self, topic: str) -> int:
        """The topic's partition count now; a change since start is loud (log, metric,
        readiness) — fatal for the partials and ledger topics."""
        count = len(
            await self._retry(f"{topic} metadata", lambda: self._producer_partitions(topic))
        )
        before = self._topology.setdefault(topic, count)
        if count != before:
            self.metrics.topology_changes.labels(topic=topic).inc()
            log.error(
                "topic %s changed from %d to %d partitions while the worker ran",
                topic,
                before,
                count,
            )
            self._topology[topic] = count
            if topic in (self._partials_topic, self._ledger_topic, self._continual_topic):
                raise TopologyError(
                    f"the partition count of {topic} changed from {before} to {count}: each "
                    "window must keep one owner and one ledger partition. Restore the count, "
                    "or start a new deployment (a new kafka.group_id) with window.start_at "
                    "after the last released window"
                )
            # A user may now sit on a partition of each layout: stage 2 merges one layout
            # per window, and the worker is not ready until the windows open now are out.
            self.health.set("topology_stable", False)
            watermark = self.release.watermark_s() if self.release is not None else None
            self._unsettled_until_s = (watermark or 0.0) + 2 * self.windows.size_s
        return count

    async def on_assigned(self, assigned: list[TopicPartition]) -> None:
        """Pause the new assignment and leave taking it to the loop.

        aiokafka sends no heartbeat while this callback runs (it stops its heartbeat task
        for the whole rejoin), so anything slow here — a ledger read behind a slow ledger
        partition, metadata during a broker stall — gets the member evicted, and evicted
        again after every rejoin: a rebalance storm in which no window is released. Paused
        partitions fetch nothing, so no record is processed before the loop has read the
        ledger and built their state (:meth:`_take_assigned`).
        """
        if self._consumer is not None and assigned:
            self._consumer.pause(*assigned)
        self._to_take = list(assigned)
        self.health.set("partitions_assigned", False)
        log.info(
            "partitions assigned: %s",
            ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(assigned)),
        )

    async def _take_assigned(self) -> None:
        """Take the partitions the last assignment brought (in the loop, under the lock),
        then resume them. A failure keeps them paused until a later iteration succeeds; a
        topology error stops the worker."""
        assert self._consumer is not None
        current = self._consumer.assignment()
        stale = sorted(self._owned.keys() - current)
        if stale:  # gone without a revocation this worker saw: drop their state too
            self._drop(stale)
            for tp in stale:
                del self._owned[tp]
        pending = [tp for tp in self._to_take if tp in current]
        try:
            await self._take(pending)
        except (TopologyError, LogRewoundError) as exc:
            self._fatal = exc
            return
        except (KafkaError, StreamDPError) as exc:
            log.warning(
                "taking new partitions failed (%s); they stay paused until it succeeds",
                type(exc).__name__,
            )
            return
        self._to_take = []
        self._owned.update(dict.fromkeys(pending, time.time()))
        if pending:
            self._consumer.resume(*pending)
            log.info("partitions taken: ledger read, state built, fetching resumed")
            self._stall_input_once(pending)
        self.health.set("partitions_assigned", bool(current))

    def _stall_input_once(self, taken: list[TopicPartition]) -> None:
        """The STALL_INPUT_ENV test fault: pause one input partition for a while."""
        stall, consumer = self._faults.stall_input, self._consumer
        assert consumer is not None
        if stall is None:
            return
        tp = TopicPartition(self._input_topic, stall[0])
        if tp not in taken:
            return
        self._faults.stall_input = None
        consumer.pause(tp)
        log.warning("test fault: input partition %d fetches nothing for %g s", *stall)

        def resume() -> None:
            if tp in consumer.assignment() and tp not in self._to_take:
                consumer.resume(tp)
                log.warning("test fault: input partition %d fetches again", stall[0])

        asyncio.get_running_loop().call_later(stall[1], resume)

    async def _take(self, assigned: list[TopicPartition]) -> None:
        assert self.ingest is not None and self.release is not None
        assert self._consumer is not None
        stage1, partials, routed = self._split(assigned)
        # Stage 2 waits for every stage-1 partition, and a repartition partition for every
        # input partition: both counts must be right, never guessed.
        self.ingest.source_partitions = await self._topic_partitions(self._stage1_topic)
        if not self._keyed:
            self.ingest.input_partitions = await self._topic_partitions(self._input_topic)
            self.ingest.routed_partitions = self.ingest.source_partitions
        await self._topic_partitions(self._partials_topic)
        await self._topic_partitions(self._ledger_topic)
        if self._continual_log is not None:
            await self._topic_partitions(self._continual_topic)
        now_mono = time.monotonic()
        self.ingest.assign(stage1, now_mono, routed=not self._keyed)
        self.ingest.assign_routed(routed, now_mono)
        await self._apply_start_from(assigned)
        if partials:
            # Another worker may have released windows of these partitions: read the
            # ledger to fresh fences before taking any of their partials.
            if self._faults.take_failures > 0:
                self._faults.take_failures -= 1
                raise LedgerReadError("test fault: the ledger read failed")
            await self._catch_up_ledger(None, bounded=True)
            self.release.adopt_ledger()
            await self._republish_unpublished(set(partials))
            self.release.assign(partials)

    async def _apply_start_from(self, assigned: list[TopicPartition]) -> None:
        """``input.start_from: latest`` for input partitions this group never committed."""
        if self.config.input.start_from != "latest":
            return
        assert self._consumer is not None
        for tp in assigned:
            if tp.topic != self._input_topic:
                continue
            if await self._consumer.committed(tp) is None:
                await self._consumer.seek_to_end(tp)

    async def on_revoked(self, revoked: list[TopicPartition]) -> None:
        async with self._lock:
            if self.ingest is not None and self.release is not None:
                if self._consumer is not None:
                    with contextlib.suppress(KafkaError):
                        await self._commit(only=set(revoked))
                self._drop(revoked)
            for tp in revoked:
                self._owned.pop(tp, None)
            self.health.set("partitions_assigned", False)
            log.info(
                "partitions revoked: %s",
                ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(revoked)),
            )

    def _drop(self, revoked: Sequence[TopicPartition]) -> None:
        """Forget the state of partitions this worker no longer owns (the new owner replays
        them from the committed offsets)."""
        assert self.ingest is not None and self.release is not None
        stage1, partials, routed = self._split(revoked)
        self.ingest.revoke(stage1)
        self.release.revoke(partials)
        self.ingest.forget_routed(routed)
        if self._erasure is not None:
            requests = [tp.partition for tp in revoked if tp.topic == self._requests_topic]
            self._erasure.revoke(requests)
        for p in routed:
            self._routed_positions.pop(p, None)
        for tp in revoked:
            self._committed.pop(tp, None)
            self.metrics.forget_partition(tp.topic, tp.partition)

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
        if self._erasure is not None and self._requests_topic is not None:
            out.update(
                (TopicPartition(self._requests_topic, p), off)
                for p, off in self._erasure.safe_offsets().items()
            )
        return out

    async def _commit(self, only: set[TopicPartition] | None = None) -> None:
        assert self._consumer is not None
        assigned = self._consumer.assignment()
        offsets = {
            tp: off
            for tp, off in self._safe_offsets().items()
            if (only is None or tp in only) and self._committed.get(tp) != off and tp in assigned
        }
        if offsets:
            await self._consumer.commit(offsets)
            self._committed.update(offsets)

    async def _commit_in_loop(self) -> None:
        """Commit; a lost membership is routine (the rejoin redistributes the partitions
        and their state is rebuilt), never a reason to stop."""
        try:
            await self._commit()
        except MEMBERSHIP_ERRORS as exc:
            self._membership_lost(exc)

    def _membership_lost(self, exc: BaseException) -> None:
        self.metrics.membership_lost.inc()
        log.warning(
            "the group says this worker lost its membership (%s): rejoining; its partitions' "
            "state is rebuilt from the committed offsets",
            type(exc).__name__,
        )

    async def _fetch(self) -> dict[TopicPartition, list[Any]] | None:
        """The next batch, or None once a stop is requested. aiokafka's ``getmany`` ignores
        its timeout while the member has no assignment (a rebalance that the members being
        stopped one by one keep restarting): a stop must not wait for the group."""
        assert self._consumer is not None
        fetch = asyncio.ensure_future(
            self._consumer.getmany(timeout_ms=FETCH_TIMEOUT_MS, max_records=MAX_RECORDS_PER_FETCH)
        )
        stop = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({fetch, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not fetch.done():
                # Nothing fetched is lost: positions move only when getmany returns records.
                fetch.cancel()
                with contextlib.suppress(asyncio.CancelledError, KafkaError):
                    await fetch
        return fetch.result() if not fetch.cancelled() else None

    def _prove_read_to_end(
        self, owned: set[TopicPartition], waiting: set[TopicPartition], now: float, mono: float
    ) -> None:
        """Tell the ingest stage which partitions it reads (stage 0's input, stage 1's own
        in keyed mode) a fetch found at their end, and when: only that silence is idleness.
        Each one's fetch age goes to /metrics: a growing one is a partition that waits."""
        ingest, consumer = self.ingest, self._consumer
        assert consumer is not None and ingest is not None
        read_topic = self._input_topic if not self._keyed else self._stage1_topic
        for tp in owned:
            if tp.topic != read_topic or tp in waiting:
                continue
            answered_ms = consumer.last_poll_timestamp(tp)
            since = answered_ms / 1000 if answered_ms is not None else self._owned[tp]
            self.metrics.fetch_age.labels(topic=tp.topic, partition=str(tp.partition)).set(
                max(0.0, now - since)
            )
            at = read_to_end_at(consumer, tp)
            at_mono = None if at is None else answered_at_mono(at, now, mono)
            if at_mono is not None:
                ingest.read_to_end(tp.partition, at_mono, input_topic=not self._keyed)

    async def _loop(self) -> None:
        assert self._consumer is not None
        while not self._stopping.is_set():
            try:
                batch = await self._fetch()
                if batch is None:
                    break
            except MEMBERSHIP_ERRORS as exc:
                self._membership_lost(exc)
                continue
            except KafkaError as exc:
                self.metrics.broker_errors.inc()
                log.warning("fetch failed (%s); retrying", type(exc).__name__)
                await asyncio.sleep(RETRY_BACKOFF_S[1])
                continue
            async with self._lock:
                await self._iteration(batch)
            if self._fatal is not None:
                raise self._fatal
            self.health.beat()

    async def _iteration(self, batch: dict[TopicPartition, list[Any]]) -> None:
        consumer, ingest, release = self._consumer, self.ingest, self.release
        assert consumer is not None and ingest is not None and release is not None
        # Records of partitions not taken yet were fetched before they were assigned again:
        # they are read again from the committed offset once taken.
        waiting = set(self._to_take)
        if waiting:
            await self._take_assigned()
        if self._erasure is not None:
            await self._erasure.follow()
        requests: list[tuple[int, list[tuple[int, bytes | None]]]] = []
        started = time.perf_counter()
        now, mono = time.time(), time.monotonic()
        dead: list[DeadLetter] = []
        routed: list[Outgoing] = []
        routed_positions: dict[int, int] = {}
        owned = consumer.assignment() & self._owned.keys()
        for tp, msgs in batch.items():
            if not msgs or tp not in owned or tp in waiting:
                continue  # revoked while fetched (its new owner reads it), or not taken yet
            high = consumer.highwater(tp)
            if high is not None:  # every topic read: input, repartition and partials
                self.metrics.set_consumer_lag(tp.topic, tp.partition, high - msgs[-1].offset - 1)
            if tp.topic == self._partials_topic:
                release.ingest(tp.partition, [(m.offset, m.value) for m in msgs])
                continue
            if tp.topic == self._requests_topic:
                requests.append((tp.partition, [(m.offset, m.value) for m in msgs]))
                continue
            records = FetchedRecords(msgs)
            if tp.topic == self._stage1_topic:
                dead.extend(
                    ingest.ingest(
                        tp.partition,
                        records,
                        now_s=now,
                        now_mono_s=mono,
                        routed=not self._keyed,
                        topic=self._stage1_topic,
                    )
                )
            elif tp.topic == self._input_topic:
                out, bad = ingest.route_packed(tp.partition, records, now_s=now, now_mono_s=mono)
                routed.extend((k, v, self._routed_to[target]) for k, v, target in out)
                dead.extend(bad)
                routed_positions[tp.partition] = msgs[-1].offset + 1
            else:
                continue
        self._prove_read_to_end(owned, waiting, now, mono)
        if sum(len(msgs) for msgs in batch.values()) >= MAX_RECORDS_PER_FETCH or self._leaderless:
            # A full fetch: the worker is behind, so a partition that delivered nothing may
            # just not have had its turn; a partition without a leader is an outage. Nothing
            # is idle then.
            ingest.restart_idle_clocks(mono)
        if batch:
            self._faults.reached("after_ingest")
        if requests and self._erasure is not None:
            dead.extend(
                await self._erasure.handle_requests(
                    requests,
                    release=release,
                    read_ledger=lambda: self._catch_up_ledger(None, bounded=True),
                    include_payload=self.config.output.dead_letter_include_payload,
                )
            )
        if dead:
            await self._publish_dead_letters(dead)
        if not self._keyed and (
            routed or routed_positions or mono - self._progress_sent_mono >= self._marks_interval_s
        ):
            # Progress marks follow the records they cover on every partition.
            routed.extend(
                (ROUTED_MARK_KEY, mark, r)
                for mark in ingest.progress_marks(mono)
                for r in self._routed_to
            )
            await self._send_many(self._stage1_topic, routed)
            self._progress_sent_mono = mono
        # Only now are the routed events acknowledged: their input may be committed.
        self._routed_positions.update(routed_positions)
        # During an outage nothing can be published, and silence is not idleness.
        if self._broker_ok:
            if self._woke_up(mono):
                # A partition stage 2 may think idle has data again: say so before any
                # other partition's partials and watermarks can close a window.
                await self._publish_watermarks(mono)
            sealed = ingest.due(mono)
            if sealed:
                await self._publish_partials(sealed)
            resealed = ingest.reseal_due()  # erasures reached sealed, unreleased windows
            if resealed:
                await self._publish_partials(resealed)
            if sealed or mono - self._marks_sent_mono >= WATERMARK_INTERVAL_S:
                await self._publish_watermarks(mono)
            for ws in release.due_windows(limit=MAX_RELEASES_PER_ITERATION):
                if not await self._release_window(ws):
                    break
            if self._erasure is not None:
                ledger_log = self._ledger_log
                assert ledger_log is not None
                await self._erasure.housekeeping(ingest, release, ledger_log.poll, mono)
            await self._read_awaited_bounds(mono)
            watermark = release.watermark_s()
            if watermark is not None:
                self.metrics.watermark.set(watermark)
                if self._unsettled_until_s is not None and watermark >= self._unsettled_until_s:
                    self._unsettled_until_s = None
                    self.health.set("topology_stable", True)
        self._late_notice.observe(release.coverage_start_s, mono)
        await self._commit_in_loop()
        if batch:
            self.metrics.batch_processing.observe(time.perf_counter() - started)
