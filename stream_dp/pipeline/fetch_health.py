"""The worker's fetches: a failed one classified, counted and logged; a stalled partition's
fetch age; readiness while the input cannot be read.

A fetch error that retrying cannot clear (a record batch compressed with a codec this
process lacks, one that fails its checksum, a record larger than the fetch size, the broker
refusing the principal Read) comes back on every fetch of the same bytes: the worker then
reads nothing of that partition, for ever. So a failed fetch is classified
(:func:`stream_dp.kafka_client.fetch_errors.classify_fetch_error`) and counted by cause
(``stream_dp_fetch_errors_total{reason}``); a cause that cannot clear, or any failure that
has lasted :data:`FAILING_AFTER_S`, is an ERROR naming the cause, the partitions and the fix
(repeated every :data:`REPEAT_ERROR_S` while it lasts, not at every retry) and makes the
worker not ready (``input_readable``). Health is kept per partition: a partition that
failed stays failing until a fetch makes progress on it, so one broken partition keeps the
worker not ready (and the ERROR steady) while the others flow. The loop still turns, so
the worker stays live: restarting it would fetch the same bytes; an authorization failure
is retried, and a grant clears it without a restart. A principal refused while the group's
consumer starts (the join: Read denied on the group, Describe on a topic) is the same
failure (:func:`start_group_consumer`).

The fetch age of an input partition (``stream_dp_fetch_age_seconds``) counts from the last
fetch that made progress on it: one that moved its position or found it at the log's end.
A broker that answers every fetch with bytes the client cannot read is no progress, so the
age grows and StreamDPInputFetchStalled fires.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Final

from stream_dp.clients.connect import stop_client
from stream_dp.kafka_client import TopicPartition
from stream_dp.kafka_client.codecs import codecs_problem
from stream_dp.kafka_client.fetch_errors import (
    AUTHORIZATION_ERRORS,
    FetchErrorCause,
    classify_fetch_error,
    describe_fetch_error,
    principal_of,
)
from stream_dp.ops.health import Health
from stream_dp.ops.metrics import Metrics

log = logging.getLogger(__name__)

#: The wait after a fetch failed, before the next fetch.
FETCH_RETRY_S: Final = 0.5
#: A failure of any cause that has lasted this long is reported as one that does not clear.
FAILING_AFTER_S: Final = 30.0
#: While fetches keep failing, the ERROR is repeated this often (and when the cause changes).
REPEAT_ERROR_S: Final = 60.0
#: The health component this reports.
COMPONENT: Final = "input_readable"


def _assignment(consumer: Any) -> set[TopicPartition]:
    """The partitions ``consumer`` is assigned (empty when it cannot tell)."""
    try:
        return set(consumer.assignment()) if consumer is not None else set()
    except Exception:  # noqa: BLE001 - a stopped consumer: nothing is assigned
        return set()


def _fetch_state(consumer: Any, tp: TopicPartition) -> tuple[int | None, int | None, float | None]:
    """(position, high watermark, wall time s of the last fetch answer) of ``tp``, from
    aiokafka's assignment state (no public accessor); Nones where it cannot tell."""
    try:
        state = consumer._subscription.subscription.assignment.state_value(tp)
        if state is None or not state.has_valid_position:
            return None, None, None
        stamp_ms = state.timestamp
        return state.position, state.highwater, None if stamp_ms is None else stamp_ms / 1000
    except AttributeError:
        return None, None, None


class FetchAges:
    """Per input partition, when a fetch last made progress on it; exported as
    ``stream_dp_fetch_age_seconds``."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        #: tp → (position last seen, wall time s of the last progress).
        self._seen: dict[TopicPartition, tuple[int | None, float]] = {}

    def observe(self, consumer: Any, tp: TopicPartition, taken_s: float, now_s: float) -> None:
        """Update ``tp``'s fetch age (``taken_s``: when this worker took it, wall clock)."""
        position, highwater, answered_s = _fetch_state(consumer, tp)
        answered = max(taken_s, answered_s) if answered_s is not None else taken_s
        seen = self._seen.get(tp)
        at_end = position is not None and highwater is not None and position >= highwater
        if seen is None or seen[1] < taken_s or position != seen[0] or at_end:
            progress_s = answered
        else:
            progress_s = seen[1]  # answered, but the position did not move: no progress
        self._seen[tp] = (position, progress_s)
        self._metrics.fetch_age.labels(topic=tp.topic, partition=str(tp.partition)).set(
            max(0.0, now_s - progress_s)
        )


@dataclass
class _Failure:
    """A cause of failed fetches that has not cleared: of one partition, or of the consumer."""

    cause: FetchErrorCause
    #: Monotonic s of the first failure (kept while the same partition keeps failing).
    since: float
    #: The partition's position at its last failure (None: no valid position).
    position: int | None = None


class FetchHealth:
    """What a failed fetch does, and what undoes it: health per partition.

    A failure is placed on the partitions it came from when the fetch can tell
    (:meth:`~stream_dp.clients.partition_drain.PartitionDrain.partitions_of`). Such a
    partition stays failing until a fetch makes progress on it (its position moves past
    where it failed, or it is found at its log's end) or it is no longer assigned: the
    successful fetches of the other partitions do not clear it, so the ERROR, the
    readiness and the metric stay steady while one partition stays broken and the others
    flow. A failure not placed on a partition (the group join refused, an error of the
    consumer as a whole) clears with the next fetch that returns.

    ``membership`` is the worker's (:class:`~stream_dp.pipeline.kafka.membership.Membership`:
    its ``consumer``, ``owned``, ``to_take``, ``fetch_ages`` and the topic stage 1 reads):
    the fetch ages of the input partitions it has taken are updated on every failure too.
    ``principal`` (``User:NAME``) and ``group_id`` name the grant an authorization error asks
    (``kafka``: the worker's settings, to take both from). A failure's partitions are those
    given, else those ``membership.drain`` (the worker's PartitionDrain) says it came from.
    """

    def __init__(
        self,
        metrics: Metrics,
        health: Health,
        membership: Any,
        *,
        clock: Callable[[], float] = time.monotonic,
        principal: str | None = None,
        group_id: str | None = None,
        kafka: Any = None,
    ) -> None:
        self._metrics = metrics
        self._health = health
        self._membership = membership
        self._clock = clock
        self._principal = principal if kafka is None else principal_of(kafka)
        self._group_id = group_id if kafka is None else kafka.group_id
        #: Failing partitions, and the failure of the consumer as a whole (not placed).
        self._partitions: dict[TopicPartition, _Failure] = {}
        self._whole: _Failure | None = None
        self._failing_since: float | None = None
        self._loud_at: float | None = None
        self._loud_about: tuple[str, ...] = ()
        #: Every reason a fetch failed with since the worker last read everything.
        self._reasons_seen: set[str] = set()
        self.errors_logged = 0
        health.set(COMPONENT, True)
        problem = codecs_problem()
        if problem is not None:  # said at start, before the first compressed batch stalls it
            log.error("%s", problem)

    @property
    def failing(self) -> bool:
        return self._failing_since is not None

    @property
    def failing_partitions(self) -> dict[TopicPartition, str]:
        """Each partition failing now, with its reason."""
        return {tp: f.cause.reason for tp, f in self._partitions.items()}

    async def failed(self, exc: BaseException, partitions: Collection[TopicPartition] = ()) -> None:
        """A fetch raised ``exc`` (of ``partitions``, when known): count, classify, log,
        update readiness and fetch ages, beat (the loop turns), then wait
        :data:`FETCH_RETRY_S`."""
        drain = getattr(self._membership, "drain", None)
        if not partitions and drain is not None:  # where the worker's fetch says it came from
            partitions = drain.partitions_of(exc)
        cause = classify_fetch_error(exc, principal=self._principal, group_id=self._group_id)
        self._metrics.broker_errors.inc()
        self._metrics.fetch_errors.labels(reason=cause.reason).inc()
        now = self._clock()
        if self._failing_since is None:
            self._failing_since = now
        self._reasons_seen.add(cause.reason)
        if cause.reason not in self._reasons():
            log.warning("fetch failed (%s: %s); retrying", cause.reason, type(exc).__name__)
        consumer = self._membership.consumer
        for tp in partitions:
            before = self._partitions.get(tp)
            since = now if before is None or before.cause.reason != cause.reason else before.since
            position = _fetch_state(consumer, tp)[0] if consumer is not None else None
            self._partitions[tp] = _Failure(cause, since, position)
        if not partitions:
            before_whole = self._whole
            same = before_whole is not None and before_whole.cause.reason == cause.reason
            self._whole = _Failure(cause, before_whole.since if same and before_whole else now)
        self._judge(now)
        self.observe_ages()
        self._health.beat()  # not a hang: restarting would fetch the same bytes
        await asyncio.sleep(FETCH_RETRY_S)

    def succeeded(self) -> None:
        """A fetch returned: the failure of the consumer as a whole clears, and each failing
        partition that made progress (or is no longer assigned); readable again once none
        is left (logged once)."""
        if self._failing_since is None:
            return
        now = self._clock()
        self._whole = None
        consumer = self._membership.consumer
        assigned = _assignment(consumer)
        for tp, failure in list(self._partitions.items()):
            position, highwater, _ = _fetch_state(consumer, tp) if consumer else (None,) * 3
            at_end = position is not None and highwater is not None and position >= highwater
            moved = position is not None and position != failure.position
            if tp not in assigned or moved or at_end:
                del self._partitions[tp]
                if self._partitions:  # the others still fail: say this one reads again
                    log.warning(
                        "fetching %s[%d] again after %.1f s of failed fetches (%s)",
                        tp.topic, tp.partition, now - failure.since, failure.cause.reason,
                    )  # fmt: skip
        if self._partitions:
            self._judge(now)
            return
        log.warning(
            "fetching again after %.1f s of failed fetches (%s)",
            now - self._failing_since,
            ", ".join(sorted(self._reasons_seen)),
        )
        self._failing_since = self._loud_at = None
        self._loud_about = ()
        self._reasons_seen.clear()
        self._health.set(COMPONENT, True)

    def _reasons(self) -> set[str]:
        failures = [*self._partitions.values(), *([self._whole] if self._whole else [])]
        return {f.cause.reason for f in failures}

    def _judge(self, now: float) -> None:
        """Readiness and the ERROR from the failures that have not cleared: a cause that
        cannot clear is loud at once, any other once it has lasted :data:`FAILING_AFTER_S`;
        the ERROR again every :data:`REPEAT_ERROR_S`, or when what fails changes."""
        lasting: list[tuple[str, _Failure]] = [
            (f"{tp.topic}[{tp.partition}]", f) for tp, f in sorted(self._partitions.items())
        ]
        if self._whole is not None:
            lasting.append(("the consumer", self._whole))
        lasting = [
            (where, f) for where, f in lasting
            if f.cause.persistent or now - f.since >= FAILING_AFTER_S
        ]  # fmt: skip
        self._health.set(COMPONENT, not lasting)
        if not lasting:
            return
        about = tuple(sorted({f.cause.reason for _, f in lasting}))
        due = self._loud_at is None or now - self._loud_at >= REPEAT_ERROR_S
        if not due and about == self._loud_about:
            return
        self._loud_at, self._loud_about = now, about
        for reason in about:
            failures = [(where, f) for where, f in lasting if f.cause.reason == reason]
            first = min(f.since for _, f in failures)
            self.errors_logged += 1
            log.error(
                "the input cannot be read (fetch error %s, failing for %.0f s on %s): %s "
                "(runbook: StreamDPFetchFailing)",
                reason,
                now - first,
                ", ".join(where for where, _ in failures),
                describe_fetch_error(failures[-1][1].cause),
            )

    def observe_ages(self) -> None:
        """The fetch age of every input partition taken (stage 1's own in keyed mode)."""
        m = self._membership
        if m.consumer is None:
            return
        read_topic = m.input_topic if not m.keyed else m.stage1_topic
        now_s = time.time()
        for tp, taken_s in list(m.owned.items()):
            if tp.topic == read_topic and tp not in m.to_take:
                m.fetch_ages.observe(m.consumer, tp, taken_s, now_s)


async def start_group_consumer(
    membership: Any,
    client_options: dict[str, Any],
    publisher: Any,
    fetches: FetchHealth,
    stopping: asyncio.Event,
) -> bool:
    """Start the group's consumer (``membership.subscribe``; aiokafka's start joins the
    group and waits for the first assignment), retried with ``publisher.retry`` as any
    broker operation, on a fresh consumer each attempt (aiokafka's cannot be started twice).

    The broker refusing the principal (GroupAuthorizationFailed, TopicAuthorizationFailed)
    does not clear by retrying: it is a failed fetch to ``fetches`` (classified
    ``authorization_failed``, counted, an ERROR naming the grant to add, not ready), then
    tried again until a grant clears it. True once started; False when the worker was
    asked to stop first."""
    started: list[Any] = []

    async def start_fresh() -> None:
        if started:
            await stop_client(started.pop())
        consumer = membership.subscribe(client_options)
        started.append(consumer)
        await consumer.start()

    while not stopping.is_set():
        try:
            await publisher.retry(
                "start consumer", start_fresh, bounded=False, never_retry=AUTHORIZATION_ERRORS
            )
            return True
        except AUTHORIZATION_ERRORS as exc:
            await stop_client(started.pop())
            await fetches.failed(exc)
    return False
