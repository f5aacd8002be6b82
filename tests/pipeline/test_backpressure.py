"""Backpressure pauses exactly the partitions that add to the open windows, and resumes
exactly those (no broker: a recording consumer)."""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import TopicPartition

from stream_dp.ops.health import Health
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.faults import NO_FAULTS
from stream_dp.pipeline.kafka.context import WorkerContext
from stream_dp.pipeline.kafka.hold_guards import Backpressure
from stream_dp.pipeline.kafka.membership import Membership
from tests.pipeline.support import config


class RecordingConsumer:
    def __init__(self, assigned: set[TopicPartition]) -> None:
        self.assigned = assigned
        self.paused: set[TopicPartition] = set()

    def assignment(self) -> set[TopicPartition]:
        return self.assigned

    def pause(self, *tps: TopicPartition) -> None:
        self.paused |= set(tps)

    def resume(self, *tps: TopicPartition) -> None:
        self.paused -= set(tps)


def _membership(**input_section: Any) -> tuple[Membership, RecordingConsumer]:
    cfg = config()
    cfg = cfg.model_copy(update={"input": cfg.input.model_copy(update=input_section)})
    context = WorkerContext(cfg, Metrics(process=False), Health(), asyncio.Event(), NO_FAULTS)
    membership = Membership(context)
    tps = {TopicPartition(t, p) for t in membership.group_topics() for p in (0, 1)}
    consumer = RecordingConsumer(tps)
    membership.consumer = consumer  # type: ignore[assignment]
    membership.owned = dict.fromkeys(tps, 0.0)
    return membership, consumer


def test_only_the_input_and_stage_1_partitions_pause_and_the_same_resume() -> None:
    membership, consumer = _membership()  # unkeyed: input (stage 0) and repartition (stage 1)
    feeding = {membership.input_topic, membership.stage1_topic}
    assert membership.stage1_topic != membership.input_topic
    backpressure = Backpressure(membership)
    backpressure.apply(True)
    assert consumer.paused == {tp for tp in consumer.assigned if tp.topic in feeding}
    assert not any(tp.topic == membership.partials_topic for tp in consumer.paused)
    backpressure.apply(True)  # idempotent
    other = TopicPartition(membership.partials_topic, 0)
    consumer.paused.add(other)  # paused by someone else (a partition not taken yet)
    backpressure.apply(False)
    assert consumer.paused == {other}


def test_a_partition_not_taken_yet_stays_paused_on_resume() -> None:
    membership, consumer = _membership(keyed_by_user=True)
    backpressure = Backpressure(membership)
    backpressure.apply(True)
    waiting = TopicPartition(membership.input_topic, 1)
    membership.to_take = [waiting]
    backpressure.apply(False)
    assert consumer.paused == {waiting}
