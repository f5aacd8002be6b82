"""Group membership and commits: which partitions this worker owns, and what it commits.

aiokafka's rebalance callbacks only pause a new assignment and note it
(:meth:`Membership.on_assigned`): aiokafka sends no heartbeat while a callback runs, so
anything slow there — a ledger read behind a slow ledger partition, metadata during a broker
stall — gets the member evicted, and evicted again after every rejoin (a rebalance storm in
which no window is released). The worker's loop *takes* the partitions
(:meth:`Membership.take_assigned`: topic counts checked, the ledger read to fresh fences,
unpublished winners republished, state built) and only then resumes them. Revoked partitions
are committed (what is safe) and their state dropped; the new owner replays them from the
committed offsets. A revocation that arrives while an iteration runs (a long draw in a thread,
a slow ledger write) does not wait for it: aiokafka would not rejoin until the callback
returns, so a draw longer than the rebalance timeout got the member removed and started
another rebalance for the whole group. The partitions stop being *owned* at once (no new
window of theirs is drawn, nothing of theirs is committed) and their state is dropped when the
iteration ends (:meth:`Membership.drop_revoked_later`). A draw already running finishes and
goes through the ledger like any other: the first complete draw in log order wins, so the new
owner either reads this one back and publishes it, or ledgers its own first and this one is
discarded unseen.

Offsets committed are only *safe* ones (:meth:`Membership.safe_offsets`): what stage 1 has
sealed and published, what stage 2 has released, what stage 0 has routed and had
acknowledged. The loop's commit is awaited by the next commit, not at once
(:mod:`stream_dp.pipeline.commit_flight`): every commit awaits the one in flight first, and
a revocation waits for its answer. A member told it lost its membership or generation
counts it and keeps running: the group's rejoin hands it its partitions again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from stream_dp.clients.connect import TopicGoneError, TopicNotAuthorizedError, topic_gone
from stream_dp.clients.partition_drain import PartitionDrain
from stream_dp.clients.read_to_end import answered_at_mono, read_to_end_at
from stream_dp.config import KafkaConfig
from stream_dp.errors import StreamDPError
from stream_dp.kafka_client import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from stream_dp.kafka_client.client_options import FETCH_ROUTINE_WAKE_MS
from stream_dp.kafka_client.errors import IllegalStateError, KafkaError
from stream_dp.kafka_client.fetched import fetch_options
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.commit_flight import CommitInFlight, Offsets
from stream_dp.pipeline.fetch_health import FetchAges
from stream_dp.pipeline.handoff import marks_interval_s
from stream_dp.pipeline.idle_fetch import FetchTimeout, idle_fetch_timeout_ms
from stream_dp.pipeline.kafka.context import WorkerContext, WorkerPart
from stream_dp.pipeline.kafka.ledger_log import LogRewoundError
from stream_dp.pipeline.kafka.partition_take import PartitionTake, Stages, Taken
from stream_dp.pipeline.kafka.publisher import MEMBERSHIP_ERRORS
from stream_dp.pipeline.kafka.topology_watch import (
    TopologyError,
    with_layout,
)

log = logging.getLogger(__name__)

MAX_RECORDS_PER_FETCH = 40_000
#: Bytes fetched per partition and request: the consumer fetches a partition again only once
#: what it holds of it is consumed, so larger fetches mean fewer waits for the broker.
FETCH_PARTITION_BYTES = 4 * 1_048_576
#: Topic metadata is refreshed this often, so partition-count changes are seen soon.
METADATA_MAX_AGE_MS = 10_000


def group_consumer_options(kafka: KafkaConfig) -> dict[str, Any]:
    """The group consumer's own options (beside the client options every client takes)."""
    return dict(
        group_id=kafka.group_id,
        enable_auto_commit=False,
        # Never moved silently: a partition without a committed offset is read from its
        # beginning, one whose offset is out of range stops the worker (see hold_guards);
        # input.start_from is applied to input partitions without a committed offset
        # (on_assigned).
        auto_offset_reset="none",
        session_timeout_ms=kafka.session_timeout_ms,
        heartbeat_interval_ms=kafka.heartbeat_interval_ms,
        max_partition_fetch_bytes=max(FETCH_PARTITION_BYTES, kafka.max_message_bytes),
        metadata_max_age_ms=METADATA_MAX_AGE_MS,
        consumer_timeout_ms=FETCH_ROUTINE_WAKE_MS,
        # aiokafka's parsed records, no ConsumerRecord per record (fetched.py)
        **fetch_options(),
    )


class Membership(WorkerPart):
    """The consumer's group membership: assignments taken and dropped, safe commits."""

    def __init__(self, context: WorkerContext) -> None:
        super().__init__(context)
        config = context.config
        self.consumer: AIOKafkaConsumer | None = None
        self.drain: PartitionDrain | None = None  # the consumer's, one partition at a time
        # longer after an empty fetch (idle_fetch)
        self.fetch_timeout = FetchTimeout(
            idle_fetch_timeout_ms(marks_interval_s(config.window.idle_close_s))
        )
        self.stages: Stages | None = None
        #: Held by the loop's iteration and by a revocation: one touches the state at a time.
        self.lock = asyncio.Lock()
        out = config.output
        self.input_topic = config.input.topic
        self.keyed = config.input.keyed_by_user
        #: Where stage 1 reads: the input itself, or the repartition topic.
        self.stage1_topic = self.input_topic if self.keyed else out.repartition_topic
        self.partials_topic = out.partials_topic
        self.requests_topic = config.erasure.requests_topic if config.erasure.enabled else None
        self.commits = CommitInFlight()  # the loop's commit in flight; what was committed
        #: Input offsets stage 0 routed and had acknowledged: safe to commit.
        self.routed_positions: dict[int, int] = {}
        #: Partitions assigned but not taken yet (ledger read, state built): paused until
        #: the loop has taken them (see on_assigned).
        self.to_take: list[TopicPartition] = []
        #: Partitions taken and not revoked since, with when (wall clock: a partition's
        #: fetch age before any answer). During a rejoin aiokafka's assignment() still lists
        #: partitions already revoked: records fetched for them must not rebuild their
        #: state (a second, stale owner; a commit of an unassigned partition).
        self.owned: dict[TopicPartition, float] = {}
        #: Partitions revoked while an iteration held the lock: no longer owned, their state
        #: dropped once the iteration ends (on_revoked does not wait for it).
        self.revoked_later: set[TopicPartition] = set()
        #: An error found in a rebalance callback that must stop the worker (raised by the
        #: loop: aiokafka would swallow it in the callback).
        self.fatal: StreamDPError | None = None
        #: Per input partition, the last fetch that made progress (fetch_health).
        self.fetch_ages = FetchAges(context.metrics)
        self.taking = PartitionTake(
            context, input_topic=self.input_topic, stage1_topic=self.stage1_topic, keyed=self.keyed
        )
        #: One listener for the consumer's life: it knows whether this member has joined.
        self._listener = _Rebalance(self)

    def _stages(self) -> Stages:
        assert self.stages is not None, "the stages are built before partitions are taken"
        return self.stages

    def group_topics(self) -> list[str]:
        """The topics this worker's consumer group reads (and commits offsets on)."""
        topics = {self.input_topic, self.stage1_topic, self.partials_topic}
        if self.requests_topic is not None:
            topics.add(self.requests_topic)
        return sorted(topics)

    def listener(self) -> ConsumerRebalanceListener:
        return self._listener

    def subscribe(self, client_options: dict[str, Any]) -> AIOKafkaConsumer:
        """The group's consumer (not started yet), subscribed to :meth:`group_topics` with
        this membership as its rebalance listener."""
        options = {**group_consumer_options(self.config.kafka), **client_options}
        consumer = self.consumer = AIOKafkaConsumer(**options)
        consumer.subscribe(self.group_topics(), listener=self.listener())
        return consumer

    def owns(self, tp: TopicPartition) -> bool:
        """Whether this member owns ``tp`` in a generation it still belongs to."""
        consumer = self.consumer
        if consumer is None or tp not in consumer.assignment():
            return False
        # aiokafka keeps the old assignment until the rejoin revokes it; its coordinator
        # knows earlier that the membership is gone (no public accessor).
        coordinator = getattr(consumer, "_coordinator", None)
        subscription = getattr(getattr(consumer, "_subscription", None), "subscription", None)
        if coordinator is None or subscription is None:
            return True
        # (Generation ids start at 0 on some brokers: the member id is the better sign.)
        return not coordinator.need_rejoin(subscription) and not member_reset(consumer)

    def owns_partials(self, partition: int) -> bool:
        """Whether this member owns that partials partition now (the release's first step):
        assigned, taken, and not revoked since (a revocation during a long iteration)."""
        tp = TopicPartition(self.partials_topic, partition)
        return tp in self.owned and self.owns(tp)

    def readable(self) -> set[TopicPartition]:
        """The partitions whose fetched records may be processed now: assigned, and taken
        and not revoked since (aiokafka lists partitions revoked mid-rejoin as assigned)."""
        assert self.consumer is not None
        assigned: set[TopicPartition] = self.consumer.assignment()
        return assigned & self.owned.keys()

    @contextlib.asynccontextmanager
    async def iteration(self) -> AsyncIterator[set[TopicPartition]]:
        """One iteration of the worker's loop, under the lock: the partitions the last
        assignment brought are taken first (:meth:`take_assigned`) and yielded — records
        fetched for them before are not processed; partitions revoked during the iteration
        are dropped when it ends (:meth:`drop_revoked_later`)."""
        async with self.lock:
            waiting = set(self.to_take)
            if waiting:
                await self.take_assigned()
            yield waiting
            self.drop_revoked_later()

    def raise_fatal(self) -> None:
        """Raise the error a rebalance callback found that must stop the worker, if any."""
        if self.fatal is not None:
            raise self.fatal

    def routed_acknowledged(self, sent: dict[int, tuple[int, float]]) -> None:
        """Stage 0's routed events up to these input positions (:func:`routed_sent`) are
        acknowledged: safe to commit, on partitions owned since they were sent."""
        self.routed_positions.update(routed_still_owned(self, sent))

    def split(self, tps: Sequence[TopicPartition]) -> tuple[list[int], list[int], list[int]]:
        """(stage-1 partitions, partials partitions, input partitions routed by stage 0)."""
        stage1 = sorted(tp.partition for tp in tps if tp.topic == self.stage1_topic)
        partials = sorted(tp.partition for tp in tps if tp.topic == self.partials_topic)
        routed = (
            [] if self.keyed else sorted(tp.partition for tp in tps if tp.topic == self.input_topic)
        )
        return stage1, partials, routed

    # -- assignment ------------------------------------------------------------------------
    async def on_assigned(self, assigned: list[TopicPartition]) -> None:
        """Pause the new assignment and leave taking it to the loop (module docstring):
        paused partitions fetch nothing, so no record is processed before the loop has read
        the ledger and built their state (:meth:`take_assigned`)."""
        if self.consumer is not None and assigned:
            self.consumer.pause(*assigned)
        self.to_take = list(assigned)
        self.health.set("partitions_assigned", False)
        log.info(
            "partitions assigned: %s",
            ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(assigned)),
        )

    async def take_assigned(self) -> None:
        """Take the partitions the last assignment brought (in the loop, under the lock),
        then resume them. A failure keeps them paused until a later iteration succeeds; a
        topology error or a deleted topic of the deployment stops the worker."""
        assert self.consumer is not None
        current = self.consumer.assignment()
        stale = sorted(self.owned.keys() - current)
        if stale:  # gone without a revocation this worker saw: drop their state too
            self.drop(stale)
            for tp in stale:
                del self.owned[tp]
        generation = self.to_take
        pending = [tp for tp in generation if tp in current]
        try:
            await self._take(pending)
        except (TopologyError, LogRewoundError, TopicGoneError, TopicNotAuthorizedError) as exc:
            self.fatal = exc
            return
        except (KafkaError, StreamDPError) as exc:
            log.warning(
                "taking new partitions failed (%s); they stay paused until it succeeds",
                type(exc).__name__,
            )
            return
        if self.to_take is not generation:
            # A rebalance came while they were being taken (the callbacks do not wait on
            # this iteration): the new assignment is paused and taken on the next iteration;
            # resuming now could fetch for state a revocation dropped, or raise for a
            # partition no longer assigned.
            return
        self.to_take = []
        self.owned.update(dict.fromkeys(pending, time.time()))
        if pending:
            self.consumer.resume(*pending)
            log.info("partitions taken: ledger read, state built, fetching resumed")
            _stall_input_once(self, pending)
        self.health.set("partitions_assigned", bool(current))

    async def _take(self, assigned: list[TopicPartition]) -> None:
        stage1, partials, routed = self.split(assigned)
        input_ = [tp for tp in assigned if tp.topic == self.input_topic]
        taken = Taken(stage1=stage1, partials=partials, routed=routed, input=input_)
        await self.taking.take(self._stages(), self.consumer, taken)

    async def on_revoked(self, revoked: list[TopicPartition]) -> None:
        """Commit what is safe of the revoked partitions, then forget their state; while an
        iteration holds the lock, only wait for the loop's commit in flight (module docstring)."""
        if self.lock.locked():
            self._revoke_later(revoked)
            # The next owner reads all it committed (within half the session timeout).
            await self.commits.answered(self.config.kafka.session_timeout_ms / 2000)
            return
        async with self.lock:
            if self.stages is not None:
                if self.consumer is not None:
                    with contextlib.suppress(KafkaError):
                        try:
                            await self.commit(only=set(revoked))
                        except TopicGoneError as exc:  # the loop stops with it
                            self.fatal = exc
                self.drop(revoked)
            for tp in revoked:
                self.owned.pop(tp, None)
            self.health.set("partitions_assigned", False)
            log.info(
                "partitions revoked: %s",
                ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(revoked)),
            )

    def _revoke_later(self, revoked: list[TopicPartition]) -> None:
        """Revoked during an iteration: not owned from now on, state dropped after it."""
        for tp in revoked:
            self.owned.pop(tp, None)
        self.revoked_later.update(revoked)
        self.health.set("partitions_assigned", False)
        names = ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(revoked))
        log.info("partitions revoked: %s (mid-iteration: dropped when it ends)", names)

    def drop_revoked_later(self) -> None:
        """Drop the state of partitions revoked during the iteration that just ended (under
        the lock, before a new assignment is taken)."""
        if self.revoked_later and self.stages is not None:
            self.drop(sorted(self.revoked_later))
        self.revoked_later.clear()

    def drop(self, revoked: Sequence[TopicPartition]) -> None:
        """Forget the state of partitions this worker no longer owns (the new owner replays
        them from the committed offsets)."""
        stages = self._stages()
        stage1, partials, routed = self.split(revoked)
        stages.ingest.revoke(stage1)
        stages.release.revoke(partials)
        stages.ingest.forget_routed(routed)
        if stages.erasure is not None:
            requests = [tp.partition for tp in revoked if tp.topic == self.requests_topic]
            stages.erasure.revoke(requests)
        for p in routed:
            self.routed_positions.pop(p, None)
        for tp in revoked:
            self.commits.committed.pop(tp, None)
            self.metrics.forget_partition(tp.topic, tp.partition)

    # -- commits ---------------------------------------------------------------------------
    def safe_offsets(self) -> dict[TopicPartition, int]:
        """Per partition, the offset below which everything is safely done."""
        stages = self._stages()
        out = {
            TopicPartition(self.stage1_topic, p): off
            for p, off in stages.ingest.safe_offsets().items()
        }
        out.update(
            (TopicPartition(self.partials_topic, r), off)
            for r, off in stages.release.safe_offsets().items()
        )
        out.update(
            (TopicPartition(self.input_topic, p), off) for p, off in self.routed_positions.items()
        )
        if stages.erasure is not None and self.requests_topic is not None:
            out.update(
                (TopicPartition(self.requests_topic, p), off)
                for p, off in stages.erasure.safe_offsets().items()
            )
        return out

    async def commit(self, only: set[TopicPartition] | None = None) -> None:
        """Commit what moved (:meth:`_moved`) once the loop's commit in flight is answered."""
        assert self.consumer is not None
        try:
            await self._settle()
        except MEMBERSHIP_ERRORS as exc:
            membership_lost(self.metrics, exc, self.consumer, sent_by=self.commits.sent_by)
        offsets = self._moved(only)
        if offsets:
            await self.consumer.commit(offsets)
            self.commits.committed.update(offsets)

    async def _settle(self) -> None:
        """The commit in flight answered, or TopicGoneError if it names a deleted topic
        (aiokafka would retry it for ever: commit_flight)."""
        assert self.consumer is not None
        consumer, wait_s = self.consumer, self.config.kafka.request_timeout_ms / 1000
        await self.commits.settle_unless_gone(wait_s, lambda t: topic_gone(consumer._client, t))

    def _moved(self, only: set[TopicPartition] | None) -> Offsets:
        """:meth:`CommitInFlight.moved`, keyed input's layout as metadata (topology_watch)."""
        assert self.consumer is not None
        safe: dict[TopicPartition, Any] = self.safe_offsets()
        if self.keyed:  # the per-window counts go with the offsets replayed from
            safe = with_layout(safe, self.stage1_topic, self._stages().ingest)
        assigned, revoked = self.consumer.assignment(), self.revoked_later
        return self.commits.moved(safe, assigned=assigned, revoked=revoked, only=only)

    async def commit_in_loop(self, now_mono_s: float) -> None:
        """Await the last iteration's commit; send this one's if due (at most once per
        :data:`COMMIT_INTERVAL_S`). A lost membership is routine."""
        assert self.consumer is not None
        try:
            await self._settle()
        except (*MEMBERSHIP_ERRORS, IllegalStateError) as exc:
            membership_lost(self.metrics, exc, self.consumer, sent_by=self.commits.sent_by)
        offsets = self._moved(None) if self.commits.due(now_mono_s) else None
        if offsets:
            commit = self.consumer.commit(offsets)
            self.commits.send(commit, offsets, now_mono_s, member_id(self.consumer))

    # -- fetching --------------------------------------------------------------------------
    async def fetch(self) -> dict[TopicPartition, list[Any]] | None:
        """The next batch, or None once a stop is requested. aiokafka's ``getmany`` ignores
        its timeout while the member has no assignment (a rebalance that the members being
        stopped one by one keep restarting): a stop must not wait for the group. A fetch error
        in one partition loses no record of another (partition_drain)."""
        assert self.consumer is not None
        if self.drain is None or self.drain.consumer is not self.consumer:
            self.drain = PartitionDrain(self.consumer)
        fetch = asyncio.ensure_future(
            self.drain.getmany(timeout_ms=self.fetch_timeout.ms, max_records=MAX_RECORDS_PER_FETCH)
        )
        stop = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({fetch, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not fetch.done():
                # Records taken before a stop are dropped: only safe offsets are committed.
                fetch.cancel()
                with contextlib.suppress(asyncio.CancelledError, KafkaError):
                    await fetch
        batch = fetch.result() if not fetch.cancelled() else None
        self.fetch_timeout.fetched(batch)
        return batch

    def prove_read_to_end(
        self, owned: set[TopicPartition], waiting: set[TopicPartition], now: float, mono: float
    ) -> None:
        """Tell the ingest stage which partitions it reads (stage 0's input, stage 1's own
        in keyed mode) a fetch found at their end, and when: only that silence is idleness.
        Each one's fetch age goes to /metrics: a growing one is a partition that waits."""
        ingest, consumer = self._stages().ingest, self.consumer
        assert consumer is not None
        read_topic = self.input_topic if not self.keyed else self.stage1_topic
        for tp in owned:
            if tp.topic != read_topic or tp in waiting:
                continue
            self.fetch_ages.observe(consumer, tp, self.owned[tp], now)
            at = read_to_end_at(consumer, tp)
            at_mono = None if at is None else answered_at_mono(at, now, mono)
            if at_mono is not None:
                ingest.read_to_end(tp.partition, at_mono, input_topic=not self.keyed)


def member_id(consumer: Any) -> str | None:
    """This member's id in its group as aiokafka's coordinator holds it ("" once forgotten),
    or None without a coordinator (no public accessor)."""
    coordinator = getattr(consumer, "_coordinator", None)
    return None if coordinator is None else str(coordinator.member_id or "")


def member_reset(consumer: Any) -> bool:
    """Whether aiokafka has forgotten this member's id (a heartbeat or commit the group
    refused: a pause past the session timeout, a fenced generation); its rejoin revokes the
    old assignment next (:class:`_Rebalance`)."""
    return member_id(consumer) == ""


def membership_lost(
    metrics: Metrics, why: BaseException | str, consumer: Any = None, sent_by: str | None = None
) -> None:
    """A lost membership is routine (the rejoin redistributes the partitions and their state
    is rebuilt): counted and logged, never a reason to stop. Counted once per loss: an error
    after which ``consumer``'s member id is forgotten, or of a commit ``sent_by`` a member id
    the consumer has since replaced (it rejoined before the error was read), is left to the
    rejoin's revocation, which counts every such loss, also one only aiokafka's heartbeat
    saw."""
    if consumer is not None and member_reset(consumer):
        return
    if consumer is not None and sent_by is not None and member_id(consumer) != sent_by:
        return
    metrics.membership_lost.inc()
    log.warning(
        "the group says this worker lost its membership (%s): rejoining; its partitions' "
        "state is rebuilt from the committed offsets",
        why if isinstance(why, str) else type(why).__name__,
    )


def _stall_input_once(membership: Membership, taken: list[TopicPartition]) -> None:
    """The STREAM_DP_TEST_STALL_INPUT test fault: pause one input partition a while (a
    function of the membership, outside its class: test-only)."""
    stall, consumer = membership._faults.stall_input, membership.consumer
    assert consumer is not None
    if stall is None:
        return
    tp = TopicPartition(membership.input_topic, stall[0])
    if tp not in taken:
        return
    membership._faults.stall_input = None
    consumer.pause(tp)
    log.warning("test fault: input partition %d fetches nothing for %g s", *stall)

    def resume() -> None:
        if tp in consumer.assignment() and tp not in membership.to_take:
            consumer.resume(tp)
            log.warning("test fault: input partition %d fetches again", stall[0])

    asyncio.get_running_loop().call_later(stall[1], resume)


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    """aiokafka's rebalance callbacks. A revocation that finds the member id forgotten, once
    this member has been assigned partitions, follows a lost membership: counted here, once
    (:func:`membership_lost`), also when only aiokafka's heartbeat saw it."""

    def __init__(self, membership: Membership) -> None:
        self.membership = membership
        self.joined = False  # before the first assignment a revocation is the first join

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        membership = self.membership
        if self.joined and member_reset(membership.consumer):
            why = "its member id was refused: a pause past the session timeout, or a fence"
            membership_lost(membership.metrics, why)
        await membership.on_revoked(list(revoked))

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self.joined = True
        await self.membership.on_assigned(list(assigned))


def routed_sent(membership: Membership, positions: dict[int, int]) -> dict[int, tuple[int, float]]:
    """Stage 0's input positions whose routed events are being sent, each with when its
    partition was taken (:meth:`Membership.routed_acknowledged` takes them back)."""
    owned, topic = membership.owned, membership.input_topic
    return {
        p: (off, owned[tp])
        for p, off in positions.items()
        if (tp := TopicPartition(topic, p)) in owned
    }


def routed_still_owned(
    membership: Membership, sent: dict[int, tuple[int, float]]
) -> dict[int, int]:
    """Of :func:`routed_sent`'s positions, those of partitions owned since they were sent.
    The acknowledgement comes an iteration later (stage_output): a partition revoked, or
    revoked and taken again, in between has its position from its committed offset, never
    from what this member routed before."""
    out = {}
    for p, (off, taken_at) in sent.items():
        tp = TopicPartition(membership.input_topic, p)
        if membership.owned.get(tp) == taken_at and tp not in membership.revoked_later:
            out[p] = off
    return out
