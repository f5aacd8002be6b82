"""The worker's guards on held windows, in one place (the worker calls them at three points).

* :class:`~.offset_range.OffsetRangeGuard`: a partition without a valid offset is read from
  its start, or (out of range) stops the worker;
* :class:`~stream_dp.pipeline.stages.hold.HeldRecordAge`: a window pinning an internal record
  past ``output.max_hold_s`` stops the worker;
* :class:`~stream_dp.pipeline.stages.hold.HeldStateCap` with :class:`Backpressure`: above
  ``window.max_held_state_bytes`` fetching pauses, and stays paused at most
  ``window.max_backpressure_s`` before the worker stops.

Each stop is a hold (:meth:`~.offset_range.OffsetRangeGuard.hold`): ERROR, out of the group,
not ready, live.

Backpressure on held state: pause fetching what adds to the open windows, keep the group.

When :class:`~stream_dp.pipeline.stages.hold.HeldStateCap` says the open windows hold more
than ``window.max_held_state_bytes``, the partitions that add events to them — the input
topic and the stage-1 topic — are paused (the consumer keeps heartbeating, so the group
keeps this member); the partials and erasure topics go on, so windows already due are still
released. Once the state is back under the cap, exactly the partitions paused here are
resumed (a partition taken meanwhile is paused again on the next iteration).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from stream_dp.config.model import Config
from stream_dp.errors import StreamDPError
from stream_dp.ops.health import Health
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.kafka.membership import Membership
from stream_dp.pipeline.kafka.offset_range import (
    OFFSET_ERRORS,
    OffsetOutOfRangeStop,
    OffsetRangeGuard,
)
from stream_dp.pipeline.stages.hold import (
    HeldRecordAge,
    HeldStateCap,
    HeldStateTooLargeError,
    MaxHoldExceededError,
)
from stream_dp.pipeline.stages.ingest import IngestStage

__all__ = ["OFFSET_ERRORS", "STOPS", "Backpressure", "HoldGuards"]

#: The errors after which the worker holds (stops releasing, stays live).
STOPS = (OffsetOutOfRangeStop, MaxHoldExceededError, HeldStateTooLargeError)


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

    def __init__(
        self, config: Config, membership: Membership, *, metrics: Metrics, health: Health
    ) -> None:
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

    def observe(self, tp: TopicPartition, msgs: Sequence[Any]) -> None:
        """A fetched batch of an owned partition (its records' Kafka timestamps)."""
        self.held_age.observe(tp.topic, tp.partition, ((m.offset, m.timestamp / 1e3) for m in msgs))

    def check(self, ingest: IngestStage, now_s: float, now_mono_s: float) -> None:
        """After the iteration's commit: the maximum hold, then the memory cap (both raise
        one of :data:`STOPS`)."""
        safe: Mapping[tuple[str, int], int] = {
            (tp.topic, tp.partition): o for tp, o in self._membership.safe_offsets().items()
        }
        self.held_age.check(safe, now_s)
        self.backpressure.apply(self.cap.backpressure(ingest.held_bytes(), now_mono_s))

    async def resolve(self, exc: BaseException, consumer: AIOKafkaConsumer | None) -> None:
        assert isinstance(exc, OFFSET_ERRORS) and consumer is not None
        await self.offsets.resolve(exc, consumer)

    async def hold(
        self, exc: StreamDPError, consumer: AIOKafkaConsumer | None, stopping: asyncio.Event
    ) -> None:
        await self.offsets.hold(exc, consumer, stopping)
