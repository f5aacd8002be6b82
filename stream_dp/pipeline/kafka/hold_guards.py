"""The worker's guards on held windows, in one place (the worker calls them at three points).

* :class:`OffsetRangeGuard`: a partition without a valid offset is read from its start, or
  (out of range) stops the worker — below;
* :class:`~stream_dp.pipeline.stages.hold.HeldRecordAge`: a window pinning an internal record
  past ``output.max_hold_s`` *while the worker could read the log* stops the worker (an
  outage does not count: a restarted worker catches up first);
* :class:`~stream_dp.pipeline.stages.hold.HeldStateCap` with :class:`Backpressure`: above
  ``window.max_held_state_bytes`` fetching pauses, and stays paused at most
  ``window.max_backpressure_s`` before the worker stops. The held state is stage 1's
  (:meth:`IngestStage.held_bytes`) and what the worker holds beside it for the same windows
  (:meth:`HoldGuards.count_held`: the partner exports' buffers).

Each stop is a hold (:meth:`OffsetRangeGuard.hold`): ERROR, out of the group, not ready, live.

**Offsets out of range.** The group consumer runs with ``auto_offset_reset="none"``, so the
client never moves a position on its own; this module decides instead (the positioning and
the log range are :mod:`stream_dp.clients.offset_range`'s, shared with the sink):

* **No committed offset** (a new group, or a partition never committed): read from the
  log start, as before — input partitions from their end with ``input.start_from: latest``.
* **A position out of range** — after a restart, the committed offset; while running, the
  fetch position — means records this deployment still needs are gone: retention
  (``output.internal_retention_s``) deleted the records of a window held back longer than
  that, or someone deleted records or recreated the topic. Skipping them would release an
  under-count (stage 2 would take a missing partial for "no events") or drop input events
  silently. The worker stops releasing (:meth:`OffsetRangeGuard.hold`): ERROR log naming the
  topic, partition, offset and log range, ``stream_dp_offset_out_of_range_total{topic}``,
  not ready. Only for the *input* topic, and only when ``input.on_offset_out_of_range:
  skip_to_log_start`` says so, are the lost input records skipped (WARNING, same metric):
  the operator accepted that those events are not counted.

**Backpressure.** When :class:`~stream_dp.pipeline.stages.hold.HeldStateCap` says the open
windows hold more than ``window.max_held_state_bytes``, the partitions that add events to
them — the input topic and the stage-1 topic — are paused (the consumer keeps heartbeating,
so the group keeps this member); the partials and erasure topics go on, so windows already
due are still released. Once the state is back under the cap, exactly the partitions paused
here are resumed (a partition taken meanwhile is paused again on the next iteration).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

from stream_dp.clients.connect import partitions_without_leader
from stream_dp.clients.offset_range import (
    OFFSET_ERRORS,
    OutOfRange,
    out_of_range,
    position_uncommitted,
    skip_to_log_start,
)
from stream_dp.config.model import Config
from stream_dp.errors import StreamDPError
from stream_dp.kafka_client import AIOKafkaConsumer, TopicPartition
from stream_dp.kafka_client.errors import (
    KafkaError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
)
from stream_dp.ops.health import Health
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.kafka.context import WorkerContext
from stream_dp.pipeline.kafka.ledger_guard import LedgerGuard, LedgerLostError
from stream_dp.pipeline.kafka.ledger_log import LogRewoundError
from stream_dp.pipeline.kafka.membership import Membership
from stream_dp.pipeline.stages.hold import (
    HeldRecordAge,
    HeldStateCap,
    HeldStateTooLargeError,
    MaxHoldExceededError,
)
from stream_dp.pipeline.stages.ingest import IngestStage
from stream_dp.windows.tumbling import iso_utc

log = logging.getLogger(__name__)

#: How often a stopped worker beats (liveness) while it waits for SIGTERM.
HOLD_BEAT_S = 1.0
#: Two checks of the held age further apart than this: the loop was blocked (a broker that
#: does not answer), an outage after which the maximum hold counts again from zero.
OUTAGE_GAP_S = 10.0
Action = Literal["stop", "skip"]


class OffsetOutOfRangeStop(StreamDPError):
    """A partition's committed offset (or fetch position) is out of its log's range."""

    def __init__(self, lost: OutOfRange, what_to_do: str) -> None:
        self.lost = lost
        super().__init__(f"offset out of range on {lost.describe()}. {what_to_do}")


def out_of_range_action(
    lost: OutOfRange,
    *,
    input_topic: str,
    input_policy: str,
    internal_retention_s: int,
    first_unreleased_s: int | None = None,
) -> tuple[Action, str]:
    """Stop or skip, and what the operator should do. Only the input topic may skip, only
    when configured to, and only records below the log start (records deleted by retention
    or DeleteRecords); a position past the log end (a recreated topic) always stops. For an
    internal topic, the windows affected: every one not released yet, from
    ``first_unreleased_s`` (when known) on."""
    if lost.topic == input_topic:
        if input_policy == "skip_to_log_start" and lost.below_start:
            return "skip", (
                f"input.on_offset_out_of_range is skip_to_log_start: the input records from "
                f"offset {lost.position} to {lost.log_start} are skipped, their events are "
                "not counted"
            )
        return "stop", (
            "Input records this group had not processed are gone (retention, DeleteRecords, "
            "or a recreated topic). Nothing more is released. Raise the input topic's "
            "retention, then either restore the records, or accept losing them: set "
            "input.on_offset_out_of_range: skip_to_log_start (or reset the group's offset "
            "with kafka-consumer-groups --reset-offsets --to-earliest) and restart"
        )
    if first_unreleased_s is None:
        windows, start_at = "every window this deployment has not released yet", "<the first"
        start_at += " window not released (the ledger's last release + window.size_s)>"
    else:
        start_at = iso_utc(first_unreleased_s)
        windows = f"every window not released yet, from {start_at} on"
    return "stop", (
        f"Records of an internal topic that unreleased windows still need are gone: the "
        f"broker deleted them (the topic's own retention.ms passed while a window was held "
        f"back — `stream-dp topics apply` sets it to output.internal_retention_s = "
        f"{internal_retention_s} s — or the topic was truncated or recreated). Affected: "
        f"{windows}; released now they would count the missing records as no events, so "
        "nothing more is released. To go on: restore the topic's records, or start a new "
        f"deployment (a new kafka.group_id) with window.start_at: {start_at}, which counts "
        "those windows again from the input topic while it still holds their events. See "
        "the runbook (StreamDPOffsetOutOfRange)"
    )


class OffsetRangeGuard:
    """Positions partitions the consumer reports without a valid offset (see module)."""

    def __init__(
        self, config: Config, *, metrics: Metrics, health: Health, topics: list[str]
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.health = health
        for topic in topics:  # every series from the start, at zero
            metrics.offset_out_of_range.labels(topic=topic)

    async def resolve(
        self,
        exc: NoOffsetForPartitionError | OffsetOutOfRangeError,
        consumer: AIOKafkaConsumer,
        first_unreleased_s: int | None = None,
    ) -> None:
        """Read uncommitted partitions from their log start; skip or stop on one out of
        range (raises :class:`OffsetOutOfRangeStop`, naming the windows from
        ``first_unreleased_s`` on)."""
        if isinstance(exc, NoOffsetForPartitionError):
            # input.start_from: latest applies here too (the error may come after the
            # partition was taken and moved to its end).
            latest = self.config.input.start_from == "latest"
            input_topic = self.config.input.topic
            await position_uncommitted(
                consumer, exc, from_end=lambda tp: latest and tp.topic == input_topic
            )
            return
        for lost in await out_of_range(consumer, exc):
            action, what_to_do = out_of_range_action(
                lost,
                input_topic=self.config.input.topic,
                input_policy=self.config.input.on_offset_out_of_range,
                internal_retention_s=self.config.output.internal_retention_s,
                first_unreleased_s=first_unreleased_s,
            )
            self.metrics.offset_out_of_range.labels(topic=lost.topic).inc()
            if action == "stop":
                raise OffsetOutOfRangeStop(lost, what_to_do)
            log.warning(
                "offset out of range on %s. %s",
                lost.describe(),
                what_to_do,
                extra={"topic": lost.topic, "partition": lost.partition, "offset": lost.position},
            )
            await skip_to_log_start(consumer, lost)

    async def hold(
        self, exc: StreamDPError, consumer: AIOKafkaConsumer | None, stopping: asyncio.Event
    ) -> None:
        """Stop releasing (an offset out of range, or a window held past
        ``output.max_hold_s``): ERROR, leave the group without committing, not ready; keep
        beating and serving /metrics until ``stopping`` is set (a restart meets the same
        state again, so a crash loop would only hide the metric)."""
        lost = exc.lost if isinstance(exc, OffsetOutOfRangeStop) else None
        where = (
            {}
            if lost is None
            else {"topic": lost.topic, "partition": lost.partition, "offset": lost.position}
        )
        log.error("%s", exc, extra=where)
        self.health.set("partitions_assigned", False)
        if consumer is not None:
            with contextlib.suppress(KafkaError, asyncio.TimeoutError):
                await asyncio.wait_for(consumer.stop(), timeout=HOLD_BEAT_S * 10)
        while not stopping.is_set():
            self.health.beat()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stopping.wait(), timeout=HOLD_BEAT_S)


#: The errors after which the worker holds (stops releasing, stays live): these guards' own,
#: and the ledger guard's (a lost ledger).
STOPS = (OffsetOutOfRangeStop, MaxHoldExceededError, HeldStateTooLargeError)
HOLDS = (LedgerLostError, LogRewoundError, *STOPS)


class Backpressure:
    """Pauses and resumes the partitions that feed the open windows (module docstring)."""

    def __init__(self, membership: Membership) -> None:
        self._membership = membership
        self._topics = {membership.input_topic, membership.stage1_topic}
        self.paused: set[TopicPartition] = set()

    def apply(self, on: bool) -> None:
        membership, consumer = self._membership, self._membership.consumer
        if consumer is None:
            return
        assigned = consumer.assignment()
        if on:
            more = {
                tp
                for tp in assigned
                if tp.topic in self._topics and tp in membership.owned and tp not in self.paused
            }
            if more:
                consumer.pause(*more)
                self.paused |= more
            return
        if self.paused:
            resume = [tp for tp in self.paused if tp in assigned and tp not in membership.to_take]
            if resume:
                consumer.resume(*resume)
            self.paused = set()


class HoldGuards:
    """The guards of the module docstring, built from the configuration."""

    def __init__(self, context: WorkerContext, membership: Membership) -> None:
        config, metrics, health = context.config, context.metrics, context.health
        out = config.output
        self.offsets = OffsetRangeGuard(
            config, metrics=metrics, health=health, topics=membership.group_topics()
        )
        internal = {out.partials_topic}
        if not config.input.keyed_by_user:
            internal.add(out.repartition_topic)
        self.held_age = HeldRecordAge(
            internal,
            max_hold_s=out.max_hold_s or out.internal_retention_s // 2,
            metrics=metrics,
        )
        self.cap = HeldStateCap(
            config.window.max_held_state_bytes,
            max_backpressure_s=config.window.max_backpressure_s,
            metrics=metrics,
        )
        self.backpressure = Backpressure(membership)
        self._membership = membership
        self._last_check_mono_s: float | None = None
        #: Held state kept beside stage 1's, counted with it (:meth:`count_held`).
        self._held_beside: list[Callable[[], int]] = []

    def count_held(self, held_bytes: Callable[[], int]) -> None:
        """Count ``held_bytes()`` in the held state too — the gauge and the cap — at every
        check (the partner exports' buffers of the open windows)."""
        self._held_beside.append(held_bytes)

    def held_bytes(self, ingest: IngestStage) -> int:
        """The held state: stage 1's and what is held beside it."""
        return ingest.held_bytes() + sum(held() for held in self._held_beside)

    async def fetch(self) -> dict[TopicPartition, list[Any]] | None:
        """The maximum hold and the memory cap checked on the state the last iteration left
        (:meth:`check`), then the membership's next batch (None once stopping), its records'
        Kafka timestamps noted for the maximum hold. A partition without a valid offset is
        positioned here (from its start, or a stop: :meth:`OffsetRangeGuard.resolve`) and the
        batch is empty; records of partitions not owned are noted too, and ignored (only the safe
        offsets' partitions are measured; a partition read again restarts its samples)."""
        membership = self._membership
        if membership.stages is not None:  # the last iteration's state, committed
            self.check(membership.stages.ingest, time.time(), time.monotonic())
        try:
            batch = await membership.fetch()
        except OFFSET_ERRORS as exc:
            assert membership.consumer is not None
            stages = membership.stages
            first = None if stages is None else stages.release.first_unreleased_s
            await self.offsets.resolve(exc, membership.consumer, first)
            return {}
        for tp, msgs in (batch or {}).items():
            self.held_age.observe(
                tp.topic, tp.partition, ((m.offset, m.timestamp / 1e3) for m in msgs)
            )
        return batch

    def check(self, ingest: IngestStage, now_s: float, now_mono_s: float) -> None:
        """After the iteration's commit: the maximum hold, then the memory cap (both raise
        one of :data:`STOPS`)."""
        safe: Mapping[tuple[str, int], int] = {
            (tp.topic, tp.partition): o for tp, o in self._membership.safe_offsets().items()
        }
        self._note_outage(now_s, now_mono_s)
        self.held_age.check(safe, now_s)
        self.backpressure.apply(self.cap.backpressure(self.held_bytes(ingest), now_mono_s))

    def _note_outage(self, now_s: float, now_mono_s: float) -> None:
        """The maximum hold counts the time this worker could read the log: from its first
        check, and again from the end of an outage — a loop blocked longer than
        :data:`OUTAGE_GAP_S`, or an assigned partition without a leader (module docstring
        of :mod:`~stream_dp.pipeline.stages.hold`, :class:`HeldRecordAge`)."""
        last, self._last_check_mono_s = self._last_check_mono_s, now_mono_s
        if last is None:
            self.held_age.resume_reading(now_s)
            return
        gap_s = now_mono_s - last
        if gap_s > OUTAGE_GAP_S or partitions_without_leader(self._membership.consumer):
            if gap_s > OUTAGE_GAP_S:
                log.info(
                    "the loop was blocked %.0f s (the broker did not answer): the maximum "
                    "hold counts again from now",
                    gap_s,
                )
            self.held_age.resume_reading(now_s)

    async def hold(
        self,
        exc: StreamDPError,
        ledger_guard: LedgerGuard,
        consumer: AIOKafkaConsumer | None,
        stopping: asyncio.Event,
    ) -> None:
        """Hold on one of :data:`HOLDS`: a lost ledger is the ledger guard's."""
        if isinstance(exc, STOPS):
            await self.offsets.hold(exc, consumer, stopping)
        else:
            await ledger_guard.hold(exc, consumer, stopping)
