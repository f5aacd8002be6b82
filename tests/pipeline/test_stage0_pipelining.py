"""Stage 0's sends are awaited by the next iteration (stream_dp/pipeline/kafka/stage_output.py):
one batch is acknowledged while the next is fetched and processed, one send in flight at a
time, and a batch's input positions are committable only once its send is acknowledged
(stream_dp/pipeline/kafka/membership.py: and only on partitions owned since it was sent).
No broker: a publisher whose acknowledgements the test hands out."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka import TopicPartition

from stream_dp.ops.health import Health
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.faults import NO_FAULTS
from stream_dp.pipeline.kafka.context import WorkerContext
from stream_dp.pipeline.kafka.membership import Membership, routed_sent
from stream_dp.pipeline.kafka.stage_output import StageOutput
from tests.pipeline.support import KEYRING, config


class AckedByHand:
    """``send_many`` that returns once the test acknowledges that send (or fails it)."""

    def __init__(self) -> None:
        self.metrics = Metrics(process=False)
        self.sent: list[list[Any]] = []
        self.acks: list[asyncio.Future[None]] = []

    async def send_many(self, topic: str, items: list[Any]) -> None:
        self.sent.append(list(items))
        ack: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.acks.append(ack)
        await ack


class NoMarks:
    def progress_marks(self, now_mono: float) -> list[bytes]:
        return []


def _output() -> tuple[StageOutput, AckedByHand]:
    publisher = AckedByHand()
    output = StageOutput(config(keyed_by_user=False), publisher, keyring=KEYRING)  # type: ignore[arg-type]
    output.routed_to = [0]
    return output, publisher


async def _turns(n: int = 5) -> None:
    """Let every ready task run (no clock involved)."""
    for _ in range(n):
        await asyncio.sleep(0)


async def test_a_batch_is_sent_without_waiting_and_its_positions_come_with_its_ack() -> None:
    output, publisher = _output()
    ingest = NoMarks()
    first = asyncio.ensure_future(output.route(ingest, [(b"k", b"1", 0)], {0: 10}, 0.0))  # type: ignore[arg-type]
    await _turns()
    # Batch 1 is being sent and the iteration goes on: nothing acknowledged yet.
    assert len(publisher.sent) == 1 and not publisher.acks[0].done()
    assert first.done() and first.result() == {}
    second = asyncio.ensure_future(output.route(ingest, [(b"k", b"2", 0)], {0: 20}, 0.0))  # type: ignore[arg-type]
    await _turns()
    # Batch 2 waits for batch 1's acknowledgement before it is sent: one send at a time.
    assert not second.done() and len(publisher.sent) == 1
    publisher.acks[0].set_result(None)
    await _turns()
    assert second.done() and second.result() == {0: 10}  # batch 1's input, now committable
    assert [items[0][1] for items in publisher.sent] == [b"1", b"2"]
    # A graceful stop settles the last send: its positions, once acknowledged.
    settle = asyncio.ensure_future(output.settle())
    await _turns()
    assert not settle.done()
    publisher.acks[1].set_result(None)
    assert await settle == {0: 20}
    assert await output.settle() == {}


async def test_a_failed_send_raises_from_the_next_iteration_and_its_positions_never_return() -> (
    None
):
    output, publisher = _output()
    ingest = NoMarks()
    assert await output.route(ingest, [(b"k", b"1", 0)], {0: 10}, 0.0) == {}  # type: ignore[arg-type]
    await _turns()
    publisher.acks[0].set_exception(RuntimeError("gave up"))
    with pytest.raises(RuntimeError, match="gave up"):
        await output.route(ingest, [(b"k", b"2", 0)], {0: 20}, 0.0)  # type: ignore[arg-type]
    assert len(publisher.sent) == 1  # batch 2 was never sent
    assert await output.settle() == {}


async def test_abandon_cancels_the_send_in_flight() -> None:
    output, publisher = _output()
    await output.route(NoMarks(), [(b"k", b"1", 0)], {0: 10}, 0.0)  # type: ignore[arg-type]
    await _turns()
    await output.abandon()
    assert publisher.acks[0].cancelled()
    assert await output.settle() == {}


def _membership() -> Membership:
    cfg = config(keyed_by_user=False)
    context = WorkerContext(cfg, Metrics(process=False), Health(), asyncio.Event(), NO_FAULTS)
    membership = Membership(context)
    membership.owned = {TopicPartition(cfg.input.topic, p): 1.0 for p in (0, 1, 2)}
    return membership


async def test_an_ack_moves_only_partitions_owned_since_the_send() -> None:
    membership = _membership()
    topic = membership.input_topic
    sent = routed_sent(membership, {0: 10, 1: 11, 2: 12})
    # While the send was in flight: partition 1 revoked, partition 2 revoked and taken again
    # (its position is its committed offset again), partition 0 kept.
    del membership.owned[TopicPartition(topic, 1)]
    membership.owned[TopicPartition(topic, 2)] = 2.0
    membership.routed_acknowledged(sent)
    assert membership.routed_positions == {0: 10}
    # Revoked during the iteration that settles the send: not moved either.
    membership.revoked_later.add(TopicPartition(topic, 0))
    membership.routed_acknowledged(routed_sent(membership, {0: 30}))
    assert membership.routed_positions == {0: 10}
