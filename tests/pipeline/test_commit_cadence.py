"""The loop commits at most once per COMMIT_INTERVAL_S (stream_dp/pipeline/commit_flight.py):
a worker fed a trickle turns its loop several times a second and each commit is a request the
loop awaits. What is committed is still only the safe offsets, all that moved in one commit;
a revocation commits at once whatever the time. No broker: a consumer that records each
commit, the iteration's clock passed by hand."""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import IllegalGenerationError

from stream_dp.ops.health import Health
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.commit_flight import COMMIT_INTERVAL_S
from stream_dp.pipeline.faults import NO_FAULTS
from stream_dp.pipeline.kafka.context import WorkerContext
from stream_dp.pipeline.kafka.membership import Membership, Stages
from tests.pipeline.support import config


class RecordingConsumer:
    """Every partition of the test assigned; each commit recorded (or failed, once)."""

    def __init__(self, assigned: set[TopicPartition]) -> None:
        self.assigned = assigned
        self.commits: list[dict[TopicPartition, Any]] = []
        self.fail_next = False

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    async def commit(self, offsets: dict[TopicPartition, Any]) -> None:
        if self.fail_next:
            self.fail_next = False
            raise IllegalGenerationError()
        self.commits.append(dict(offsets))


class StageStub:
    """A stage with the given safe offsets; every other call (revoke, forget) does nothing."""

    def __init__(self, safe: dict[int, int] | None = None) -> None:
        self.safe = safe if safe is not None else {}

    def safe_offsets(self) -> dict[int, int]:
        return dict(self.safe)

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def _membership() -> tuple[Membership, RecordingConsumer, StageStub, TopicPartition]:
    cfg = config(keyed_by_user=False)
    context = WorkerContext(cfg, Metrics(process=False), Health(), asyncio.Event(), NO_FAULTS)
    membership = Membership(context)
    tp = TopicPartition(cfg.input.topic, 0)
    stage1 = TopicPartition(membership.stage1_topic, 0)
    consumer = RecordingConsumer({tp, stage1})
    membership.consumer = consumer  # type: ignore[assignment]
    ingest = StageStub({0: 5})
    membership.stages = Stages(
        ingest=ingest,  # type: ignore[arg-type]
        release=StageStub(),  # type: ignore[arg-type]
        driver=None,  # type: ignore[arg-type]
        reader=None,  # type: ignore[arg-type]
        topology=None,  # type: ignore[arg-type]
    )
    membership.owned = {tp: 0.0, stage1: 0.0}
    return membership, consumer, ingest, tp


def test_the_loop_commits_at_most_once_per_interval_while_records_flow() -> None:
    membership, consumer, ingest, tp = _membership()
    stage1 = TopicPartition(membership.stage1_topic, 0)

    async def iterations() -> None:
        # Iterations 0.25 s apart, the input's safe offset moving at each.
        for i in range(9):
            membership.routed_positions[0] = 10 * (i + 1)
            ingest.safe[0] = 5 + i
            await membership.commit_in_loop(100.0 + 0.25 * i)
        await membership.commits.settle()  # the last commit sent is answered

    asyncio.run(iterations())
    per_interval = int(COMMIT_INTERVAL_S / 0.25)
    assert per_interval > 1  # the test's iterations come faster than the cadence
    sent_at = list(range(0, 9, per_interval))
    # Each commit carries that moment's safe offsets, of every partition that moved.
    assert consumer.commits == [{tp: 10 * (i + 1), stage1: 5 + i} for i in sent_at]


def test_nothing_to_commit_does_not_delay_the_next_commit() -> None:
    membership, consumer, ingest, tp = _membership()
    ingest.safe.clear()

    async def run() -> None:
        await membership.commit_in_loop(0.0)  # nothing safe yet: no commit, no interval
        membership.routed_positions[0] = 7
        await membership.commit_in_loop(0.0 + COMMIT_INTERVAL_S / 2)
        await membership.commits.settle()

    asyncio.run(run())
    assert consumer.commits == [{tp: 7}]


def test_a_failed_commit_is_retried_by_the_next_iteration() -> None:
    membership, consumer, _, tp = _membership()
    membership.routed_positions[0] = 3
    consumer.fail_next = True

    async def run() -> None:
        await membership.commit_in_loop(0.0)  # sent; fails (membership lost)
        await membership.commit_in_loop(0.1)  # the failure counted, not raised; sent again
        await membership.commits.settle()

    asyncio.run(run())
    assert consumer.commits == [{tp: 3, _s1(membership): 5}]


def test_a_revocation_commits_at_once_within_the_interval() -> None:
    membership, consumer, _, tp = _membership()

    async def run() -> None:
        membership.routed_positions[0] = 10
        await membership.commit_in_loop(0.0)
        membership.routed_positions[0] = 20
        await membership.commit_in_loop(0.1)  # within the interval: not sent
        assert consumer.commits == [{tp: 10, _s1(membership): 5}]
        await membership.on_revoked([tp])

    asyncio.run(run())
    assert consumer.commits[1:] == [{tp: 20}]


def _s1(membership: Membership) -> TopicPartition:
    return TopicPartition(membership.stage1_topic, 0)
