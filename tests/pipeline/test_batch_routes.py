"""The worker's dispatch table (stream_dp/pipeline/kafka/stage_output.py::batch_routes): each
topic's fetched records reach their stage — keyed by user, the input is stage 1's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stream_dp.pipeline.kafka.stage_output import Fetched, batch_routes
from tests.pipeline.support import config


@dataclass
class Msg:
    offset: int
    value: bytes


class Stages:
    """Stage 0, 1 and 2 that note which of them took a partition's records."""

    def __init__(self) -> None:
        self.took: list[tuple[str, int]] = []

    def ingest(self, partition: int, records: Any, **_: Any) -> list[Any]:
        if isinstance(records, list):  # stage 2: (offset, value) pairs
            self.took.append(("stage 2", partition))
        else:
            self.took.append(("stage 1", partition))
        return []

    def route_packed(self, partition: int, records: Any, **_: Any) -> tuple[list[Any], list[Any]]:
        self.took.append(("stage 0", partition))
        return [(b"k", b"v", 1)], []


def _route(keyed: bool) -> tuple[Stages, Fetched, list[str]]:
    cfg = config(keyed_by_user=keyed)
    stages = Stages()
    routes = batch_routes(cfg, stages, stages, routed_to=[7, 8])  # type: ignore[arg-type]
    fetched = Fetched(0.0, 0.0)
    topics = [cfg.input.topic, cfg.output.partials_topic]
    if not keyed:
        topics.insert(1, cfg.output.repartition_topic)
    for i, topic in enumerate(topics):
        routes[topic](i, [Msg(41, b"x")], fetched)
    return stages, fetched, sorted(routes)


def test_unkeyed_input_goes_to_stage_0_the_repartition_topic_to_stage_1_partials_to_stage_2() -> (
    None
):
    stages, fetched, topics = _route(keyed=False)
    assert stages.took == [("stage 0", 0), ("stage 1", 1), ("stage 2", 2)]
    assert fetched.routed == [(b"k", b"v", 8)]  # to the repartition topic's partition
    assert fetched.routed_positions == {0: 42}  # committed once the routed events are acked
    assert len(topics) == 3


def test_keyed_input_is_stage_1s_and_nothing_is_routed() -> None:
    stages, fetched, topics = _route(keyed=True)
    assert stages.took == [("stage 1", 0), ("stage 2", 1)]
    assert fetched.routed == [] and fetched.routed_positions == {}
    assert len(topics) == 2
