"""Stage 0 writes the repartition topic through a producer of its own
(stream_dp/pipeline/kafka/publisher.py): aiokafka sends one produce request per broker and
producer at a time, so with one producer the hand-off's partials and the releases' ledger
parts waited behind stage 0's send in flight. No broker: producers the test stands in for."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from stream_dp.ops.health import Health
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.faults import NO_FAULTS
from stream_dp.pipeline.kafka import publisher as publisher_module
from stream_dp.pipeline.kafka.context import WorkerContext
from stream_dp.pipeline.kafka.publisher import Publisher
from tests.pipeline.support import config


class Producer:
    """A started producer, by name (which one a write went by)."""

    def __init__(self, name: str) -> None:
        self.name = name


def _publisher(monkeypatch: pytest.MonkeyPatch, *, keyed: bool) -> tuple[Publisher, list[Any]]:
    """A started publisher whose writes (topic, producer name, ack) are listed."""
    cfg = config(keyed_by_user=keyed)
    context = WorkerContext(cfg, Metrics(process=False), Health(), asyncio.Event(), NO_FAULTS)
    publisher = Publisher(context)
    started: list[str] = []

    async def start_producer(client: Any, options: Any) -> Producer:
        started.append(f"producer {len(started)}")
        return Producer(started[-1])

    writes: list[Any] = []

    async def send_all(producer: Producer, topic: str, items: Any, headers: Any = ()) -> None:
        ack: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        writes.append((topic, producer.name, ack))
        await ack

    monkeypatch.setattr(publisher_module, "start_producer", start_producer)
    monkeypatch.setattr(publisher_module, "send_all", send_all)
    return publisher, writes


async def test_stage_0_s_send_in_flight_does_not_hold_up_the_partials_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    publisher, writes = _publisher(monkeypatch, keyed=False)
    await publisher.start({})
    out = publisher.config.output
    routed = asyncio.ensure_future(publisher.send_many(out.repartition_topic, [("k", b"v", 0)]))
    partials = asyncio.ensure_future(publisher.send_many(out.partials_topic, [("k", b"v", 0)]))
    ledger = asyncio.ensure_future(publisher.send_many(out.ledger_topic, [("k", b"v", 0)]))
    await asyncio.sleep(0)
    # Stage 0's producer carries the repartition topic alone; every other write goes by the
    # other one, so its requests never queue behind stage 0's.
    by_topic = {topic: name for topic, name, _ in writes}
    assert by_topic[out.repartition_topic] != by_topic[out.partials_topic]
    assert by_topic[out.partials_topic] == by_topic[out.ledger_topic]
    for _, _, ack in writes[1:]:
        ack.set_result(None)
    await asyncio.gather(partials, ledger)
    assert not routed.done()
    writes[0][2].set_result(None)
    await routed


async def test_keyed_input_has_one_producer(monkeypatch: pytest.MonkeyPatch) -> None:
    publisher, writes = _publisher(monkeypatch, keyed=True)
    await publisher.start({})
    assert publisher.routed_producer is None
    out = publisher.config.output
    sent = asyncio.ensure_future(publisher.send_many(out.partials_topic, [("k", b"v", 0)]))
    await asyncio.sleep(0)
    assert [name for _, name, _ in writes] == ["producer 0"]
    writes[0][2].set_result(None)
    await sent
