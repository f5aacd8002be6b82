"""A revocation while an iteration runs (a long draw in a thread) does not wait for it.

aiokafka rejoins only once ``on_partitions_revoked`` returns; waiting there on the lock the
iteration holds made a draw longer than the rebalance timeout evict the member and start
another rebalance for the whole group (issue 28, failure 6). The revoked partitions stop
being owned at once (no new window of theirs is drawn) and their state is dropped when the
iteration ends. tests/integration/test_long_draws.py runs it against a broker."""

from __future__ import annotations

import asyncio

from aiokafka import TopicPartition

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
