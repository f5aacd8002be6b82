"""The worker's fetches: a failed one classified, counted and logged; a stalled partition's
fetch age; readiness while the input cannot be read.

A fetch error that retrying cannot clear (a record batch compressed with a codec this
process lacks, one that fails its checksum, a record larger than the fetch size) comes back
on every fetch of the same bytes: the worker then reads nothing, for ever. So a failed
fetch is classified (:func:`stream_dp.kafka_client.fetch_errors.classify_fetch_error`) and
counted by cause (``stream_dp_fetch_errors_total{reason}``); a cause that cannot clear, or
any failure that has lasted :data:`FAILING_AFTER_S`, is an ERROR naming the cause and the
fix (repeated every :data:`REPEAT_ERROR_S` while it lasts, not at every retry) and makes the
worker not ready (``input_readable``) until a fetch succeeds again. The loop still turns,
so the worker stays live: restarting it would fetch the same bytes. A principal refused
while the group's consumer starts (the join: Read denied on the group, Describe on a topic)
is the same failure (:func:`start_group_consumer`).

The fetch age of an input partition (``stream_dp_fetch_age_seconds``) counts from the last
fetch that made progress on it: one that moved its position or found it at the log's end.
A broker that answers every fetch with bytes the client cannot read is no progress, so the
age grows and StreamDPInputFetchStalled fires.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Final

from stream_dp.clients.connect import stop_client
from stream_dp.kafka_client import TopicPartition
from stream_dp.kafka_client.codecs import codecs_problem
from stream_dp.kafka_client.fetch_errors import (
    AUTHORIZATION_ERRORS,
    classify_fetch_error,
    describe_fetch_error,
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


class FetchHealth:
    """What a failed fetch does, and what the next successful one undoes.

    ``membership`` is the worker's (:class:`~stream_dp.pipeline.kafka.membership.Membership`:
    its ``consumer``, ``owned``, ``to_take``, ``fetch_ages`` and the topic stage 1 reads):
    the fetch ages of the input partitions it has taken are updated on every failure too.
    """

    def __init__(
        self,
        metrics: Metrics,
        health: Health,
        membership: Any,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._metrics = metrics
        self._health = health
        self._membership = membership
        self._clock = clock
        self._failing_since: float | None = None
        self._last_reason: str | None = None
        self._loud_at: float | None = None
        self.errors_logged = 0
        health.set(COMPONENT, True)
        problem = codecs_problem()
        if problem is not None:  # said at start, before the first compressed batch stalls it
            log.error("%s", problem)

    @property
    def failing(self) -> bool:
        return self._failing_since is not None

    async def failed(self, exc: BaseException) -> None:
        """A fetch raised ``exc``: count, classify, log, update readiness and fetch ages,
        beat (the loop turns), then wait :data:`FETCH_RETRY_S`."""
        cause = classify_fetch_error(exc)
        self._metrics.broker_errors.inc()
        self._metrics.fetch_errors.labels(reason=cause.reason).inc()
        now = self._clock()
        if self._failing_since is None:
            self._failing_since = now
        changed = cause.reason != self._last_reason
        if changed:
            log.warning("fetch failed (%s: %s); retrying", cause.reason, type(exc).__name__)
        self._last_reason = cause.reason
        lasting = cause.persistent or now - self._failing_since >= FAILING_AFTER_S
        due = self._loud_at is None or now - self._loud_at >= REPEAT_ERROR_S or changed
        if lasting and due:
            self._loud_at = now
            self.errors_logged += 1
            log.error(
                "the input cannot be read (fetch error %s, failing for %.0f s): %s "
                "(runbook: StreamDPFetchFailing)",
                cause.reason,
                now - self._failing_since,
                describe_fetch_error(cause),
            )
        if lasting:
            self._health.set(COMPONENT, False)
        self.observe_ages()
        self._health.beat()  # not a hang: restarting would fetch the same bytes
        await asyncio.sleep(FETCH_RETRY_S)

    def succeeded(self) -> None:
        """A fetch returned: readable again (logged once if it had been failing)."""
        if self._failing_since is not None:
            log.warning(
                "fetching again after %.1f s of failed fetches (%s)",
                self._clock() - self._failing_since,
                self._last_reason,
            )
        self._failing_since = self._last_reason = self._loud_at = None
        self._health.set(COMPONENT, True)

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
