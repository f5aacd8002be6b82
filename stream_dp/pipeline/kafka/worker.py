"""The streaming worker on aiokafka: the Kafka transport around the two stages.

Every worker is one member of one consumer group subscribed to the input topic, the
partials topic and (for input not keyed by user) the repartition topic; Kafka spreads the
partitions of all of them over the members. One code path: a single worker runs every stage.

* Stage 0 (input partitions, ``input.keyed_by_user: false``): pseudonymize, re-key by
  pseudonym to the repartition topic (packed records: one per fetched batch and repartition
  partition); input offsets are committed once that is acknowledged.
* Stage 1 (partitions of the input, or of the repartition topic): window and bound
  (:class:`IngestStage`); due windows' partials, then watermarks, go to the partials topic
  by :class:`~stream_dp.pipeline.handoff.Handoff` (re-sent every second, so a restarted
  owner soon has them); a window's input offsets may be committed once its partials are
  acknowledged.
* Stage 2 (partials partitions, :class:`ReleaseStage`): merge one version per source
  partition; every covered window, once every source has passed it, is released once by
  :class:`~stream_dp.pipeline.release_driver.ReleaseDriver` (the release protocol, its
  steps listed there); then the loop commits.

Both are written once, here on the Kafka transport (:mod:`.kafka_transport`); ``stream-dp
replay`` runs them in memory (:mod:`.local`). Where each topic's fetched records go is one
dispatch table (:func:`.stage_output.batch_routes`).

The worker keeps the lifecycle and the loop; its collaborators are named parts:
:class:`~.membership.Membership` (group membership, taking and dropping partitions, safe
commits; the loop reaches it through methods), :class:`~.hold_guards.HoldGuards` (lost
offsets, the maximum hold, the memory cap, around fetching),
:class:`~.publisher.Publisher` (every write, under the one retry policy),
:class:`~.ledger_reader.LedgerReader` (the ledger and continual topics, read to fences),
:class:`~.topology_watch.TopologyWatch` (partition counts), :class:`~.deployment.Deployment`
(the records a deployment's first start writes and every start checks), :func:`shut_down`
(the stop's steps under one deadline) and :class:`~.faults.Faults` (test-only fault
injection, off by default). Each turn of the loop runs with the cyclic garbage collector
paused (:mod:`stream_dp.pipeline.gc_pause`): a fetch's records are two tracked objects each.

Sealing (stage 1) and the draw with its ledger encoding run in a thread
(:mod:`stream_dp.pipeline.stages.offload`) while the iteration waits for them: the event loop keeps
fetching, answering the group coordinator and serving /metrics during a large window.

The ledger's first complete draw of each (query, window) is the one published, so two
members racing for one window (one paused past the session timeout, then resumed) publish
the same values (:mod:`stream_dp.pipeline.formats.ledger`). A crash
before the ledger write is acknowledged leaves no complete draw: nothing was published, the
window is rebuilt from the re-read partials and drawn then. A crash after it leaves a draw in
the ledger: it is read back at start and whenever partials partitions move here,
republished unchanged, never recomputed.

Erasure (docs/erasure.md; ``erasure.enabled``): :class:`WorkerErasure` reads requests and
the erasure log; before the draw the releaser writes the window's ``cut`` and draws only once
the window's partials applied the erasures recorded before it.

Failures: a member told it lost its membership or generation (commit, heartbeat) counts it,
keeps running and lets the group's rejoin hand it its partitions again (their state is
dropped and rebuilt). A broker write that keeps failing for ``kafka.give_up_after_s`` stops
the worker *without committing* (a supervisor restarts it): nothing is retried for ever
while holding the lock the rebalance callbacks need. A ledger read that fails when
partitions arrive pauses those partials partitions until it succeeds. A ledger found lost
(at start, or going backwards under the worker) is an outage, never a re-release
(:mod:`stream_dp.pipeline.kafka.ledger_guard`): nothing more is released until it is rebuilt.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from stream_dp.broker.probe import KeptProbe, watch_broker
from stream_dp.clients.connect import partitions_without_leader
from stream_dp.config.fingerprint import Fingerprint, Topology, deployment_fingerprint
from stream_dp.config.model import Config
from stream_dp.kafka_client import TopicPartition
from stream_dp.kafka_client.client_options import client_kwargs
from stream_dp.kafka_client.errors import KafkaError
from stream_dp.ops.health import Health, beating
from stream_dp.ops.metrics import Metrics
from stream_dp.ops.progress import reporting_progress
from stream_dp.pipeline.backlog import DueBacklog
from stream_dp.pipeline.faults import Faults
from stream_dp.pipeline.fetch_health import FetchHealth, start_group_consumer
from stream_dp.pipeline.formats.continual_state import ContinualStore
from stream_dp.pipeline.formats.decode import REASONS
from stream_dp.pipeline.formats.ledger import MAX_SPENT_WINDOWS, LedgerIndex
from stream_dp.pipeline.formats.partials import RecordTooLargeError
from stream_dp.pipeline.gc_pause import gc_paused
from stream_dp.pipeline.handoff import Handoff
from stream_dp.pipeline.kafka.clock_skew import InputClockSkew
from stream_dp.pipeline.kafka.context import WorkerContext
from stream_dp.pipeline.kafka.deployment import Deployment
from stream_dp.pipeline.kafka.erasure.erasure_worker import WorkerErasure
from stream_dp.pipeline.kafka.hold_guards import HOLDS, HoldGuards
from stream_dp.pipeline.kafka.kafka_transport import KafkaTransport
from stream_dp.pipeline.kafka.ledger_guard import LedgerGuard
from stream_dp.pipeline.kafka.ledger_log import LedgerLog
from stream_dp.pipeline.kafka.ledger_reader import LedgerReader
from stream_dp.pipeline.kafka.membership import (
    MAX_RECORDS_PER_FETCH,
    Membership,
    membership_lost,
    routed_sent,
)
from stream_dp.pipeline.kafka.partition_take import Stages
from stream_dp.pipeline.kafka.publisher import MEMBERSHIP_ERRORS, Publisher
from stream_dp.pipeline.kafka.stage_output import Fetched, Route, StageOutput, batch_routes
from stream_dp.pipeline.kafka.topology_watch import TopologyError, TopologyWatch
from stream_dp.pipeline.release_driver import ReleaseDriver
from stream_dp.pipeline.stages.ingest import IngestSettings, IngestStage
from stream_dp.pipeline.stages.late_events import LateEventsNotice
from stream_dp.pipeline.stages.release_stage import ExactTotalsObserver, ReleaseStage
from stream_dp.privacy.pseudonymize import KeyRing
from stream_dp.windows import TumblingWindows
from stream_dp.windows.tumbling import iso_utc

log = logging.getLogger(__name__)

#: Windows released per loop iteration at most (a backlog of empty windows after a long
#: outage must not keep the loop from fetching, committing and heartbeating).
MAX_RELEASES_PER_ITERATION = 32
#: A graceful stop (flush, commit, leave the group, close) takes at most this long in all,
#: below the service's SHUTDOWN_TIMEOUT_S, even when the broker does not answer.
SHUTDOWN_BUDGET_S = 20.0

__all__ = ["TopologyError", "Worker"]


def export_settings(metrics: Metrics, config: Config) -> None:
    """What the alert rules and dashboards read of the configuration: the window settings,
    the future cap and the deployment's group id; and every query's series from the start."""
    w = config.window
    metrics.set_config(
        w.size_s,
        w.grace_s,
        w.idle_close_s,
        config.input.max_future_s,
        group_id=config.kafka.group_id,
    )
    for q in config.queries:
        metrics.add_query(q.name)


def stage1_settings(
    fingerprint: str, erasure: WorkerErasure | None, *, routed_partitions: int
) -> IngestSettings:
    """Stage 1 as the worker runs it."""
    return IngestSettings(
        fingerprint=fingerprint,
        # Silence is idleness only where a fetch found the reader at the log's end.
        require_read_proof=True,
        # With erasure on, stage 1 applies the erasure log's erasures and keeps sealed
        # windows until their release is known (an erasure in between re-seals them).
        erasures=erasure.erasures if erasure is not None else None,
        keep_sealed=erasure is not None,
        routed_partitions=routed_partitions,
    )


async def shut_down(
    *,
    commit: bool,
    publisher: Publisher,
    membership: Membership,
    readers: Sequence[LedgerLog],
    erasure: WorkerErasure | None,
    health: Health,
) -> None:
    """The worker's stop: flush the producer, commit what is safe (``commit``: a graceful
    stop with its stages built), abandon the loop's commit in flight, stop the consumer
    (leaving the group), the ledger readers, the erasure clients and the producer. Open
    windows are NOT released. Every step shares one deadline (:data:`SHUTDOWN_BUDGET_S`),
    so an unreachable broker cannot make the stop outlast the service's patience; a step
    that fails or runs out of time is left, and the next one runs."""
    deadline = time.monotonic() + SHUTDOWN_BUDGET_S

    async def step(op: Callable[[], Awaitable[Any]]) -> None:
        remaining = deadline - time.monotonic()
        with contextlib.suppress(KafkaError, asyncio.TimeoutError):
            await asyncio.wait_for(op(), timeout=max(0.1, remaining))

    consumer = membership.consumer
    try:
        await step(publisher.flush)
        if commit and consumer is not None:
            await step(membership.commit)
    finally:
        # The loop's commit still in flight (an error exit, or a commit step out of
        # time) is cancelled: it carried safe offsets, and nothing waits for it now.
        await step(membership.commits.abandon)
        if consumer is not None:
            await step(consumer.stop)
        for reader in readers:
            await step(reader.stop)
        if erasure is not None:
            await step(erasure.stop)
        await step(publisher.stop)
        health.set("partitions_assigned", False)
        health.set("producer_connected", False)


class Worker:
    """One member of the consumer group: the lifecycle and the loop; the rest is delegated
    to the named collaborators of the module docstring."""

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
        export_settings(self.metrics, config)
        self.health = health if health is not None else Health(metrics=self.metrics)
        self.health.set("topology_stable", True)
        self.ingest: IngestStage | None = None
        self.release: ReleaseStage | None = None
        self.driver: ReleaseDriver | None = None
        # Read as a stream that forgets released windows: memory bounded by the open ones.
        kept_windows = min(2 * config.privacy.horizon_windows, MAX_SPENT_WINDOWS)
        size_s = config.window.size_s
        self.ledger = LedgerIndex(forget_released=True, spent_kept_s=kept_windows * size_s)
        #: Cumulative queries' running-total state (the continual topic), when there are any.
        self.continual_store = ContinualStore()
        self._stopping = asyncio.Event()
        self._faults = Faults.from_environment()
        metrics, health = self.metrics, self.health
        context = WorkerContext(config, metrics, health, self._stopping, self._faults)
        self.publisher = Publisher(context)
        self.membership = Membership(context)
        #: Lost offsets, the maximum hold and the memory cap (hold_guards), around fetching.
        self.guards = HoldGuards(context, self.membership)
        self.fetches = FetchHealth(metrics, health, self.membership, kafka=config.kafka)
        self.topology = TopologyWatch(
            self.publisher, metrics=metrics, health=health, window_size_s=size_s
        )
        self.output = StageOutput(config, self.publisher, keyring=keyring)
        self.guards.count_held(self.output.exports.held_bytes)  # exports: in the held state
        self.handoff: Handoff | None = None  # stage 1's partials and watermarks
        self._routes: dict[str, Route] = {}  # each topic's records' stage (set at start)
        self._reader: LedgerReader | None = None
        self._common: dict[str, Any] = {}
        self._broker_ok = True
        self._leaderless: set[TopicPartition] = set()
        self._partials_partitions: list[int] = []
        self._ledger_partitions: list[int] = []
        self._continual_partitions: list[int] = []
        #: A lost ledger (deleted, recreated, renamed) is an outage: see ledger_guard.
        self._ledger_guard: LedgerGuard | None = None
        #: What its partials and releases mean (set at start: config and partition counts).
        self.fingerprint: Fingerprint | None = None
        self.windows = TumblingWindows(config.window.size_s, config.window.grace_s)
        out = config.output
        self._input_topic, self._keyed = config.input.topic, config.input.keyed_by_user
        self._partials_topic = out.partials_topic
        self._ledger_topic = out.ledger_topic
        self._continual_topic = out.continual_topic
        self._max_bytes = config.kafka.max_message_bytes
        #: Erasure requests, log and release gate (docs/erasure.md); None when off.
        self._erasure: WorkerErasure | None = None
        self._late_notice = LateEventsNotice(self.metrics, config.window.start_at, config.queries)
        self._clock_skew = InputClockSkew(self.metrics, self._input_topic)
        self._backlog = DueBacklog(self.metrics, MAX_RELEASES_PER_ITERATION)

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
        await self.publisher.start(common)
        guard = self._ledger_guard = LedgerGuard(
            self.config, metrics=self.metrics, health=self.health, client_options=common
        )
        monitor = asyncio.create_task(self._monitor_broker())
        graceful = False
        membership = self.membership
        # Long steps (a draw, a ledger read) beat for liveness, from threads too.
        with reporting_progress(self.health.progress):
            try:
                async with beating(self.health):  # live while the ledger is read; not ready
                    await self._start_stages()
                fetches, stopping, publisher = self.fetches, self._stopping, self.publisher
                if await start_group_consumer(membership, common, publisher, fetches, stopping):
                    await self._loop()
                    graceful = True
            except RecordTooLargeError:
                self.metrics.records_too_large.inc()
                raise
            except HOLDS as exc:  # a lost ledger, lost offsets, a hold past its bounds
                await self.guards.hold(exc, guard, membership.consumer, self._stopping)
            finally:
                monitor.cancel()
                if self.release is not None:  # the last second's drops said too
                    self._late_notice.observe(
                        self.release.coverage_start_s, time.monotonic(), final=True
                    )
                await shut_down(
                    commit=graceful and self.ingest is not None,
                    publisher=self.publisher,
                    membership=membership,
                    readers=self._reader.readers() if self._reader is not None else [],
                    erasure=self._erasure,
                    health=self.health,
                )

    async def _internal_topics(self) -> None:
        """The internal topics' partitions (retried until known), recorded to watch."""
        partitions = self.publisher.partitions
        self._ledger_partitions = await partitions(self._ledger_topic)
        self._partials_partitions = await partitions(self._partials_topic)
        self.publisher.output_partitions = await partitions(self.config.output.topic)
        if not self._keyed:
            self.output.routed_to = await partitions(self.config.output.repartition_topic)
        self.topology.record(self._ledger_topic, len(self._ledger_partitions), fixed=True)
        self.topology.record(self._partials_topic, len(self._partials_partitions), fixed=True)
        if any(q.cumulative for q in self.config.queries):
            self._continual_partitions = await partitions(self._continual_topic)
            count = len(self._continual_partitions)
            self.topology.record(self._continual_topic, count, fixed=True)

    async def _start_stages(self) -> None:
        """Read the ledger, fix the first covered window, check a key rotation, build stages."""
        await self._internal_topics()
        reader = self._reader = LedgerReader(
            self._ledger_topic, self.ledger, publisher=self.publisher, client_options=self._common
        )
        await reader.start_ledger(self._ledger_partitions)
        fingerprint = self.fingerprint = deployment_fingerprint(
            self.config,
            Topology(
                partials_partitions=len(self._partials_partitions),
                ledger_partitions=len(self._ledger_partitions),
                continual_partitions=len(self._continual_partitions),
            ),
        )
        assert self._ledger_guard is not None
        deployment = Deployment(
            self.config,
            self.ledger,
            fingerprint,
            keyring=self.keyring,
            publisher=self.publisher,
            reader=reader,
            guard=self._ledger_guard,
            ledger_partition=self._ledger_partitions[0],
            group_topics=self.membership.group_topics(),
        )
        coverage = await deployment.coverage()
        await deployment.settle_fingerprint()
        await deployment.settle_keys()
        release = self.release = ReleaseStage(
            self.config,
            partials_partitions=len(self._partials_partitions),
            ledger=self.ledger,
            metrics=self.metrics,
            exact_totals_observer=self._observe_exact,
            key_id_of=lambda ws: self.keyring.for_window(ws).key_id,
            key_check_of=lambda ws: self.keyring.for_window(ws).key_check,
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
        release.set_coverage(coverage)
        release.adopt_ledger()
        if self._continual_partitions:
            # Horizons whose every window is released are skipped while reading.
            release.forget_finished_horizons()
            await reader.start_continual(
                self._continual_topic, self.continual_store, self._continual_partitions
            )
        if self.config.erasure.enabled:
            self._erasure = WorkerErasure(
                self.config,
                self.keyring,
                metrics=self.metrics,
                client_options=self._common,
                send_many=self.publisher.send_many,
                retry=lambda what, op, bounded: self.publisher.retry(what, op, bounded=bounded),
            )
        routed = max(1, len(self.output.routed_to))
        settings = stage1_settings(fingerprint.digest, self._erasure, routed_partitions=routed)
        ingest = self.ingest = IngestStage(
            self.config, self.keyring, released=release, metrics=self.metrics, settings=settings
        )
        if self._erasure is not None:
            await self._erasure.start(ingest, release)
        self.output.exports.start(coverage, self._erasure)  # partner exports (docs/exports.md)
        self._routes = batch_routes(self.config, ingest, release, routed_to=self.output.routed_to)
        driver, self.handoff = self._protocols(ingest, release, reader)
        self.driver = driver
        self.membership.stages = Stages(
            ingest, release, driver, reader, self.topology, self._erasure
        )
        self.metrics.ledger_windows_loaded.inc(len(self.ledger))
        # After every check above: only then are released windows' records tombstoned.
        await reader.sweep(self.config.window.size_s)
        self.health.set("ledger_loaded", True)
        log.info(
            "ledger loaded: %d records; first covered window %s",
            self.ledger.records_read,
            iso_utc(coverage),
        )

    def _protocols(
        self, ingest: IngestStage, release: ReleaseStage, reader: LedgerReader
    ) -> tuple[ReleaseDriver, Handoff]:
        """The release protocol and stage 1's hand-off, on one Kafka transport."""
        transport = KafkaTransport(
            self.publisher,
            reader,
            ledger_topic=self._ledger_topic,
            continual_topic=self._continual_topic,
            partials_topic=self._partials_topic,
            owns=self.membership.owns_partials,
        )
        driver = ReleaseDriver(
            release,
            transport,
            partials_partitions=self._partials_partitions,
            ledger_partitions=self._ledger_partitions,
            continual_partitions=self._continual_partitions,
            max_bytes=self._max_bytes,
            metrics=self.metrics,
            erasure=self._erasure,
            faults=self._faults,
        )
        return driver, Handoff.beside(driver, ingest, transport, export=self.output.exports.publish)

    async def _monitor_broker(self) -> None:
        """Watch the broker (:func:`~stream_dp.broker.probe.watch_broker`: not ready while it
        does not answer; liveness is unaffected) and, with each check, the leaders of
        assigned partitions (a leaderless partition is an outage)."""
        probe = KeptProbe(self.bootstrap, kafka=self.config.kafka)
        await watch_broker(probe, on_result=self._broker_checked, stopping=self._stopping.is_set)

    def _broker_checked(self, ok: bool) -> None:
        if ok and not self._broker_ok and self.ingest is not None:
            # Back after an outage: silence during it was no idleness.
            self.ingest.restart_idle_clocks(time.monotonic())
        self._broker_ok = ok
        self.health.set("producer_connected", ok)
        self._leaderless = partitions_without_leader(self.membership.consumer)

    # -- the loop ---------------------------------------------------------------------------
    async def _loop(self) -> None:
        try:
            await self._turn()
            # A graceful stop: the last routed events acknowledged, their input committable;
            # the last partials write acknowledged, its windows' input committable.
            self.membership.routed_acknowledged(await self.output.settle())
            if self.handoff is not None:
                await self.handoff.settle()
        finally:
            await self.output.abandon()
            if self.handoff is not None:
                self.handoff.abandon()

    async def _turn(self) -> None:
        membership = self.membership
        while not self._stopping.is_set():
            # A fetch's records (two tracked objects each: a batch of 10,000 is 20,000) and
            # what is built from them are acyclic and freed when the iteration ends. Left
            # on, the cyclic collector ran about 80 times per batch and, every tenth of those,
            # walked everything alive, this batch's records among them: about a tenth of the
            # worker's CPU (bench/RESULTS.md). Paused for one iteration (gc_pause), it runs
            # once between iterations, on what outlived them.
            with gc_paused():
                try:
                    batch = await self.guards.fetch()  # held-window guards (hold_guards)
                    if batch is None:
                        break
                except MEMBERSHIP_ERRORS as exc:
                    membership_lost(self.metrics, exc, self.membership.consumer)
                    continue
                except KafkaError as exc:  # classified, counted, logged; the loop turns
                    await self.fetches.failed(exc)
                    continue
                self.fetches.succeeded()
                async with membership.iteration() as waiting:
                    await self._iteration(batch, waiting)
                del batch  # freed before the collector runs again
            membership.raise_fatal()
            self.health.beat()

    async def _iteration(
        self, batch: dict[TopicPartition, list[Any]], waiting: set[TopicPartition]
    ) -> None:
        """One batch through the stages; ``waiting``: partitions taken only now (their
        records were fetched before: read again from the committed offset)."""
        membership = self.membership
        consumer, ingest, release = membership.consumer, self.ingest, self.release
        assert consumer is not None and ingest is not None and release is not None
        if self._erasure is not None:
            await self._erasure.follow()
        started = time.perf_counter()
        now, mono = time.time(), time.monotonic()
        self._clock_skew.observe(consumer, batch, now)
        fetched = Fetched(now, mono)
        owned = membership.readable()
        self.output.exports.observe(batch, owned - waiting, now)  # keyed input: stage 1's records
        for tp, msgs in batch.items():
            if not msgs or tp not in owned or tp in waiting:
                continue  # revoked while fetched (its new owner reads it), or not taken yet
            high = consumer.highwater(tp)
            if high is not None:  # every topic read: input, repartition and partials
                self.metrics.set_consumer_lag(tp.topic, tp.partition, high - msgs[-1].offset - 1)
            self._routes[tp.topic](tp.partition, msgs, fetched)
        dead, requests, routed_positions = fetched.dead, fetched.requests, fetched.routed_positions
        membership.prove_read_to_end(owned, waiting, now, mono)
        if sum(len(msgs) for msgs in batch.values()) >= MAX_RECORDS_PER_FETCH or self._leaderless:
            # A full fetch: the worker is behind, so a partition that delivered nothing may
            # just not have had its turn; a partition without a leader is an outage. Nothing
            # is idle then.
            ingest.restart_idle_clocks(mono)
        if batch:
            self._faults.reached("after_ingest")
        if requests and self._erasure is not None:
            reader = self._reader
            assert reader is not None
            dead.extend(
                await self._erasure.handle_requests(
                    requests,
                    release=release,
                    read_ledger=lambda: reader.catch_up_ledger(None, bounded=True),
                    include_payload=self.config.output.dead_letter_include_payload,
                )
            )
        if dead:
            await self.publisher.publish_dead_letters(dead)
        # This batch's routed events are sent; the last batch's are acknowledged: only
        # their input may be committed (stage_output).
        sent = routed_sent(membership, routed_positions)
        acknowledged = await self.output.route(ingest, fetched.routed, sent, mono)
        membership.routed_acknowledged(acknowledged)
        # During an outage nothing can be published, and silence is not idleness.
        if self._broker_ok:
            await self._seal_and_release(mono)
        self._late_notice.observe(release.coverage_start_s, mono)
        await membership.commit_in_loop(mono)  # when due; awaited by the next (commit_flight)
        if batch:
            self.metrics.batch_processing.observe(time.perf_counter() - started)

    async def _seal_and_release(self, mono: float) -> None:
        """The last partials write settled (its windows' state gone before a release builds
        its own: docs/operations.md#memory-at-release); stage 2 releases due windows; stage 1
        seals and sends watermarks, the write left in flight (stream_dp/pipeline/handoff.py)
        after the releases, whose writes would queue behind it (one produce request in
        flight per broker). A window sealed here is released in a later iteration anyway."""
        ingest, release, driver, handoff = self.ingest, self.release, self.driver, self.handoff
        assert ingest is not None and release is not None and driver is not None
        assert handoff is not None
        await handoff.settle()
        for ws in release.due_windows(limit=MAX_RELEASES_PER_ITERATION):
            if await driver.release_window(ws) is None:
                break
        await handoff.step(mono)
        self._backlog.note(release.windows_due_count())
        reader = self._reader
        assert reader is not None
        if self._erasure is not None:
            await self._erasure.housekeeping(ingest, release, reader.poll, mono)
        await reader.read_awaited_bounds(ingest, release, driver.ledger_partition_of, mono)
        watermark = release.watermark_s()
        if watermark is not None:
            self.metrics.watermark.set(watermark)
        await self.topology.tick(watermark, ingest)
