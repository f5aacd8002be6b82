"""The maximum hold counts the time the worker could read the log: its clock starts at the
first check and starts again after an outage — a loop blocked longer than OUTAGE_GAP_S (a
broker that does not answer) or an assigned partition without a leader (no broker: a fake
consumer with the cluster metadata the guard reads)."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import TopicPartition

from stream_dp.ops.health import Health
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.faults import NO_FAULTS
from stream_dp.pipeline.kafka.context import WorkerContext
from stream_dp.pipeline.kafka.hold_guards import OUTAGE_GAP_S, HoldGuards
from stream_dp.pipeline.kafka.membership import Membership
from stream_dp.pipeline.stages.hold import MaxHoldExceededError
from tests.pipeline.support import config

NOW = 1_800_000_000.0


class Cluster:
    def __init__(self) -> None:
        self.leaderless: set[TopicPartition] = set()

    def leader_for_partition(self, tp: TopicPartition) -> int | None:
        return None if tp in self.leaderless else 1


class Client:
    def __init__(self) -> None:
        self.cluster = Cluster()


class Consumer:
    def __init__(self, assigned: set[TopicPartition]) -> None:
        self.assigned = assigned
        self._client = Client()

    def assignment(self) -> set[TopicPartition]:
        return self.assigned


def _guards() -> tuple[HoldGuards, Membership, Consumer]:
    context = WorkerContext(config(), Metrics(process=False), Health(), asyncio.Event(), NO_FAULTS)
    membership = Membership(context)
    tps = {TopicPartition(t, 0) for t in membership.group_topics()}
    consumer = Consumer(tps)
    membership.consumer = consumer  # type: ignore[assignment]
    return HoldGuards(context, membership), membership, consumer


def test_the_clock_starts_at_the_first_check_and_again_after_a_blocked_loop() -> None:
    guards, _, _ = _guards()
    guards._note_outage(NOW, 0.0)
    assert guards.held_age.reading_since_s == NOW
    guards._note_outage(NOW + OUTAGE_GAP_S, OUTAGE_GAP_S)  # a gap of exactly the limit
    assert guards.held_age.reading_since_s == NOW
    guards._note_outage(NOW + 100, 100.0)  # blocked 90 s: an outage
    assert guards.held_age.reading_since_s == NOW + 100


def test_a_partition_without_a_leader_is_an_outage() -> None:
    guards, membership, consumer = _guards()
    guards._note_outage(NOW, 0.0)
    lost = TopicPartition(membership.stage1_topic, 0)
    consumer._client.cluster.leaderless.add(lost)
    guards._note_outage(NOW + 1, 1.0)
    assert guards.held_age.reading_since_s == NOW + 1
    consumer._client.cluster.leaderless.clear()
    guards._note_outage(NOW + 2, 2.0)
    assert guards.held_age.reading_since_s == NOW + 1  # read again: the clock runs


def test_a_window_stuck_while_everything_is_readable_still_stops() -> None:
    """Checks every second, leaders known: the pinned record's time held counts from the
    first check, and the stop comes once it passes the maximum."""
    guards, membership, _ = _guards()
    held = guards.held_age
    topic = membership.stage1_topic
    held.observe(topic, 0, [(0, NOW - 5000), (1, NOW - 4999)])  # pinned long before
    limit = int(held.max_hold_s)
    for second in range(limit + 1):
        guards._note_outage(NOW + second, float(second))
        held.check({(topic, 0): 0}, NOW + second)
    guards._note_outage(NOW + limit + 1, limit + 1.0)
    with pytest.raises(MaxHoldExceededError):
        held.check({(topic, 0): 0}, NOW + limit + 1)
