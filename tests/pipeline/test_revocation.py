"""A revocation while an iteration runs (a long draw in a thread) does not wait for it.

aiokafka rejoins only once ``on_partitions_revoked`` returns; waiting there on the lock the
iteration holds made a draw longer than the rebalance timeout evict the member and start
another rebalance for the whole group (issue 28, failure 6). The revoked partitions stop
being owned at once (no new window of theirs is drawn) and their state is dropped when the
iteration ends. tests/integration/test_long_draws.py runs it against a broker."""

from __future__ import annotations

import asyncio

from aiokafka import TopicPartition

from stream_dp.clients.connect import TopicGoneError
from stream_dp.pipeline.kafka.worker import Worker
from tests.pipeline.support import KEYRING, config


def _membership() -> tuple[Worker, TopicPartition, TopicPartition]:
    worker = Worker(config(), KEYRING)
    m = worker.membership
    partials, other = TopicPartition(m.partials_topic, 0), TopicPartition(m.partials_topic, 1)
    m.owned = {partials: 0.0, other: 0.0}
    return worker, partials, other


async def test_on_revoked_returns_at_once_while_an_iteration_holds_the_lock() -> None:
    worker, partials, other = _membership()
    m = worker.membership
    async with m.lock:  # an iteration, waiting on its draw
        await asyncio.wait_for(m.on_revoked([partials]), timeout=5)
        assert partials not in m.owned and other in m.owned  # not ours from now on
        assert m.revoked_later == {partials}  # state kept until the iteration ends
    m.drop_revoked_later()
    assert m.revoked_later == set()


async def test_on_revoked_with_no_iteration_running_forgets_at_once() -> None:
    worker, partials, other = _membership()
    m = worker.membership
    await asyncio.wait_for(m.on_revoked([partials]), timeout=5)
    assert partials not in m.owned and other in m.owned
    assert m.revoked_later == set()


class _Consumer:
    """What take_assigned asks of the consumer: the assignment, and resume."""

    def __init__(self, assigned: set[TopicPartition]) -> None:
        self.assigned = assigned
        self.resumed: list[TopicPartition] = []

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    def pause(self, *tps: TopicPartition) -> None:
        pass

    def resume(self, *tps: TopicPartition) -> None:
        missing = [tp for tp in tps if tp not in self.assigned]
        assert not missing, f"No current assignment for partition {missing}"  # as aiokafka
        self.resumed.extend(tps)


def _assigned_to_take(worker: Worker, *assigned: TopicPartition) -> _Consumer:
    """An assignment of ``assigned``, none owned yet: what the next iteration takes."""
    m = worker.membership
    m.owned = {}
    consumer = _Consumer(set(assigned))
    m.consumer = consumer  # type: ignore[assignment]
    m.to_take = list(assigned)
    return consumer


async def test_a_rebalance_while_partitions_are_taken_leaves_the_new_assignment_to_take() -> None:
    # The callbacks do not wait on the iteration: a new assignment may arrive while the
    # loop is taking the last one. Resuming then would fetch for state the revocation
    # dropped, or raise for a partition no longer assigned (seen on a loaded machine).
    worker, partials, other = _membership()
    m, consumer = worker.membership, _assigned_to_take(worker, partials, other)

    async def take(pending: list[TopicPartition]) -> None:
        consumer.assigned = {other}  # the rebalance: partials went elsewhere
        await m.on_assigned([other])

    m._take = take  # type: ignore[method-assign]
    await m.take_assigned()
    assert consumer.resumed == [] and m.owned == {}
    assert m.to_take == [other]  # taken (its state built anew) on the next iteration

    async def took(pending: list[TopicPartition]) -> None:
        pass

    m._take = took  # type: ignore[method-assign]
    await m.take_assigned()
    assert consumer.resumed == [other] and set(m.owned) == {other} and m.to_take == []


async def test_a_deleted_topic_found_while_taking_partitions_stops_the_worker() -> None:
    # A rebalance after the repartition topic was deleted: the take asks for its partition
    # count, the broker no longer lists it. Kept paused and tried again every iteration, the
    # worker retried for ever without a word to the operator (seen on Apache Kafka in CI).
    worker, partials, other = _membership()
    m, consumer = worker.membership, _assigned_to_take(worker, partials, other)
    gone = TopicGoneError(m.partials_topic)

    async def take(pending: list[TopicPartition]) -> None:
        raise gone

    m._take = take  # type: ignore[method-assign]
    await m.take_assigned()
    assert m.fatal is gone
    assert consumer.resumed == [] and m.owned == {}
