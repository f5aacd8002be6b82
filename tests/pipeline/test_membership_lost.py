"""``stream_dp_membership_lost_total`` counts every lost membership once
(stream_dp/pipeline/kafka/membership.py). A member paused past its session timeout learns it
only from aiokafka's heartbeat, which forgets the member id and rejoins: no commit of the
worker fails, and the count stayed 0 while the group re-read that member's records (the
bench's backlog runs found it). A commit refused for the same loss must not count it twice.
No broker: a consumer whose coordinator's member id the test sets, as aiokafka does."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition

from stream_dp.kafka_client.errors import CommitFailedError, RebalanceInProgressError
from stream_dp.ops.health import Health
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.faults import NO_FAULTS
from stream_dp.pipeline.kafka.context import WorkerContext
from stream_dp.pipeline.kafka.membership import Membership
from tests.pipeline.support import config

CFG = config(keyed_by_user=False)
TP0 = TopicPartition(CFG.output.partials_topic, 0)


class Consumer:
    """aiokafka's consumer as the membership sees it: a coordinator with a member id, and
    commits that fail with the error the test sets."""

    def __init__(self) -> None:
        self._coordinator = SimpleNamespace(member_id="member-1")
        self.refuse: Exception | None = None

    def assignment(self) -> set[TopicPartition]:
        return {TP0}

    def pause(self, *tps: TopicPartition) -> None:
        pass

    async def commit(self, offsets: dict[TopicPartition, Any]) -> None:
        if self.refuse is not None:
            raise self.refuse


def _membership() -> tuple[Membership, Consumer, Any]:
    """A membership, its consumer, and the rebalance listener aiokafka calls back."""
    context = WorkerContext(CFG, Metrics(process=False), Health(), asyncio.Event(), NO_FAULTS)
    membership = Membership(context)
    consumer = Consumer()
    membership.consumer = consumer  # type: ignore[assignment]
    membership.safe_offsets = lambda: {TP0: 10}  # type: ignore[method-assign]
    return membership, consumer, membership.listener()


def _lost(membership: Membership) -> float:
    return float(membership.metrics.membership_lost._value.get())


async def test_a_loss_only_the_heartbeat_saw_is_counted_and_logged_at_the_revocation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    membership, consumer, listener = _membership()
    await listener.on_partitions_assigned([TP0])
    consumer._coordinator.member_id = ""  # aiokafka: "member_id was not recognized"
    with caplog.at_level(logging.WARNING, logger="stream_dp"):
        await listener.on_partitions_revoked([TP0])
    assert _lost(membership) == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "a pause past the session timeout" in warnings[0]


async def test_neither_a_rebalance_nor_the_first_join_is_a_loss() -> None:
    membership, consumer, listener = _membership()
    consumer._coordinator.member_id = ""  # before the first join: no id yet
    await listener.on_partitions_revoked([])
    consumer._coordinator.member_id = "member-1"
    await listener.on_partitions_assigned([TP0])
    await listener.on_partitions_revoked([TP0])  # another member joined: the id is kept
    assert _lost(membership) == 0


@pytest.mark.parametrize(
    ("refused", "id_forgotten"),
    [(CommitFailedError("test: fenced"), True), (RebalanceInProgressError(), False)],
    ids=["id-forgotten", "id-kept"],
)
async def test_a_refused_commit_and_the_revocation_after_it_count_one_loss(
    refused: Exception, id_forgotten: bool
) -> None:
    membership, consumer, listener = _membership()
    await listener.on_partitions_assigned([TP0])
    consumer.refuse = refused
    if id_forgotten:  # aiokafka forgets the id before the error reaches the worker
        consumer._coordinator.member_id = ""
    await membership.commit_in_loop(0.0)  # sent; its failure is seen by the next commit
    await membership.commit_in_loop(1e9)
    await listener.on_partitions_revoked([TP0])
    assert _lost(membership) == 1


async def test_a_second_subscription_keeps_the_listener_that_knows_the_member_joined() -> None:
    """aiokafka calls back the listener given at subscribe: a membership that subscribes again
    hands it the same one, so a loss right after that is still counted (a new listener would
    take the revocation for a first join)."""
    membership, consumer, listener = _membership()
    await listener.on_partitions_assigned([TP0])
    again = membership.listener()
    assert again is listener
    consumer._coordinator.member_id = ""
    await again.on_partitions_revoked([TP0])
    assert _lost(membership) == 1


async def test_a_refused_commit_read_after_the_rejoin_is_the_loss_the_revocation_counted() -> None:
    """A revocation during an iteration only waits for the commit in flight; its error is read
    by the loop's next commit, after the rejoin gave the member a new id. The revocation
    counted that loss (the id was forgotten then); the commit sent under the old id is not
    counted again."""
    membership, consumer, listener = _membership()
    await listener.on_partitions_assigned([TP0])
    consumer.refuse = CommitFailedError("test: fenced")
    await membership.commit_in_loop(0.0)  # sent under member-1, refused
    consumer._coordinator.member_id = ""  # aiokafka forgets the id and rejoins
    async with membership.lock:  # an iteration is running
        await listener.on_partitions_revoked([TP0])
    assert _lost(membership) == 1
    consumer._coordinator.member_id = "member-2"  # the rejoin's new id
    await listener.on_partitions_assigned([TP0])
    consumer.refuse = None
    await membership.commit_in_loop(1e9)  # the old commit's error is read now
    assert _lost(membership) == 1
