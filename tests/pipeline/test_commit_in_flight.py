"""The loop's offset commit is awaited by the next commit, not at once
(stream_dp/pipeline/commit_flight.py, kafka/membership.py): one commit in flight, every
commit — the loop's next, a revocation's, the graceful stop's — sent only once the one in
flight is answered, what it committed recorded only then, and a revocation that waits for
its answer. No broker: a consumer whose commits the test answers."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
from aiokafka import TopicPartition

from stream_dp.kafka_client.errors import CommitFailedError, KafkaError
from stream_dp.ops.health import Health
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.commit_flight import COMMIT_INTERVAL_S
from stream_dp.pipeline.faults import NO_FAULTS
from stream_dp.pipeline.kafka.context import WorkerContext
from stream_dp.pipeline.kafka.membership import Membership
from tests.pipeline.support import config

CFG = config(keyed_by_user=False)
TP0 = TopicPartition(CFG.output.partials_topic, 0)
TP1 = TopicPartition(CFG.output.partials_topic, 1)


class AnsweredByHand:
    """A consumer whose every commit returns once the test answers it (or fails it)."""

    def __init__(self) -> None:
        self.assigned = {TP0, TP1}
        self.sent: list[dict[TopicPartition, Any]] = []
        self.answers: list[asyncio.Future[None]] = []

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    async def commit(self, offsets: dict[TopicPartition, Any]) -> None:
        self.sent.append(dict(offsets))
        answer: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.answers.append(answer)
        await answer


def _membership() -> tuple[Membership, AnsweredByHand, dict[TopicPartition, int]]:
    """A membership whose safe offsets are the returned dict (the test moves them)."""
    context = WorkerContext(CFG, Metrics(process=False), Health(), asyncio.Event(), NO_FAULTS)
    membership = Membership(context)
    consumer = AnsweredByHand()
    membership.consumer = consumer  # type: ignore[assignment]
    membership.stages = object()  # type: ignore[assignment]  # taken: a revocation commits
    membership.drop = lambda revoked: None  # type: ignore[method-assign]
    safe: dict[TopicPartition, int] = {}
    membership.safe_offsets = lambda: dict(safe)  # type: ignore[method-assign]
    return membership, consumer, safe


async def _turns(n: int = 5) -> None:
    """Let every ready task run (no clock involved)."""
    for _ in range(n):
        await asyncio.sleep(0)


#: The iterations' clock: each loop commit a cadence interval after the one before, so due.
_CLOCK = itertools.count(0.0, COMMIT_INTERVAL_S)


async def _loop_commit(membership: Membership) -> None:
    """The loop's commit, which must return without waiting for any answer of this one."""
    commit = asyncio.ensure_future(membership.commit_in_loop(next(_CLOCK)))
    await _turns()
    assert commit.done(), "the loop waits for its commit's answer"
    commit.result()


async def test_the_loop_s_commit_is_sent_and_awaited_by_the_next_one() -> None:
    membership, consumer, safe = _membership()
    safe.update({TP0: 10, TP1: 20})
    await _loop_commit(membership)
    # Sent; the loop goes on before the coordinator answers.
    assert consumer.sent == [{TP0: 10, TP1: 20}] and not consumer.answers[0].done()
    safe[TP0] = 11
    second = asyncio.ensure_future(membership.commit_in_loop(next(_CLOCK)))
    await _turns()
    # The next commit waits for the answer to the one in flight: one at a time, in order.
    assert not second.done() and len(consumer.sent) == 1
    consumer.answers[0].set_result(None)
    await _turns()
    assert second.done()
    # Only what moved since the answered commit is sent.
    assert consumer.sent[1] == {TP0: 11}
    # A graceful stop's commit waits for the loop's commit in flight, then commits the rest.
    safe[TP1] = 21
    stop = asyncio.ensure_future(membership.commit())
    await _turns()
    assert not stop.done() and len(consumer.sent) == 2
    consumer.answers[1].set_result(None)
    await _turns()
    assert consumer.sent[2] == {TP1: 21}
    consumer.answers[2].set_result(None)
    await stop


async def test_a_failed_commit_raises_from_the_next_one_and_its_offsets_are_sent_again() -> None:
    membership, consumer, safe = _membership()
    safe.update({TP0: 10})
    await _loop_commit(membership)
    consumer.answers[0].set_exception(KafkaError("test: the commit failed"))
    with pytest.raises(KafkaError, match="the commit failed"):
        await _loop_commit(membership)
    assert len(consumer.sent) == 1  # nothing sent after the failure: the worker stops
    # A lost membership is counted and the loop goes on; the offsets were not recorded as
    # committed, so they are sent again.
    await _loop_commit(membership)
    consumer.answers[1].set_exception(CommitFailedError("test: rebalanced"))
    await _loop_commit(membership)
    assert membership.metrics.membership_lost._value.get() == 1
    assert consumer.sent == [{TP0: 10}, {TP0: 10}, {TP0: 10}]


async def test_a_revocation_waits_for_the_commit_in_flight() -> None:
    membership, consumer, safe = _membership()
    safe.update({TP0: 10, TP1: 20})
    await _loop_commit(membership)
    # Between iterations: the revocation's own commit goes out only once the loop's is
    # answered, so the committed offsets never go back and the next owner reads them.
    safe[TP0] = 12
    revoked = asyncio.ensure_future(membership.on_revoked([TP0]))
    await _turns()
    assert not revoked.done() and len(consumer.sent) == 1
    consumer.answers[0].set_result(None)
    await _turns()
    assert consumer.sent[1] == {TP0: 12}
    consumer.answers[1].set_result(None)
    await revoked
    # During an iteration (the lock held): the revocation returns only once the loop's
    # commit in flight is answered, and no later commit carries the revoked partition.
    safe[TP1] = 21
    await _loop_commit(membership)
    async with membership.lock:
        revoked = asyncio.ensure_future(membership.on_revoked([TP1]))
        await _turns()
        assert not revoked.done()
        consumer.answers[2].set_result(None)
        await _turns()
        assert revoked.done()
        safe[TP1] = 22
        await _loop_commit(membership)
    assert consumer.sent == [{TP0: 10, TP1: 20}, {TP0: 12}, {TP1: 21}]


async def test_an_abandoned_commit_is_cancelled() -> None:
    membership, consumer, safe = _membership()
    safe.update({TP0: 10})
    await _loop_commit(membership)
    await membership.commits.abandon()
    assert consumer.answers[0].cancelled()
    await membership.commits.settle()
    assert membership.commits.committed == {}  # nothing recorded as committed


async def test_a_commit_stuck_on_a_deleted_topic_stops_the_loop_naming_it() -> None:
    """aiokafka retries a commit of a deleted topic's offsets for ever, and no client of
    stream-dp creates the topic again: the next iteration waits the request timeout, asks
    for the broker's topics, cancels the commit and raises TopicGoneError naming the topic
    (not a hung loop). A commit merely slow, of topics that exist, is awaited as before."""
    from stream_dp.clients.connect import TopicGoneError
    from stream_dp.pipeline.commit_flight import CommitInFlight

    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    commits = CommitInFlight()
    commits.send(never, {TopicPartition("repartition", 1): 4, TopicPartition("in", 0): 2}, 0.0)
    asked: list[str] = []

    async def gone(topic: str) -> bool:
        asked.append(topic)
        return topic == "repartition"

    with pytest.raises(TopicGoneError, match="topic repartition no longer exists"):
        await commits.settle_unless_gone(0.01, gone)
    assert never.cancelled() and asked == ["in", "repartition"]
    assert commits.committed == {}

    slow = asyncio.get_running_loop().create_future()
    commits.send(slow, {TopicPartition("in", 0): 3}, 1.0)
    asyncio.get_running_loop().call_later(0.05, slow.set_result, None)
    await commits.settle_unless_gone(0.01, gone)
    assert commits.committed == {TopicPartition("in", 0): 3}
