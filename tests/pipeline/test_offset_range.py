"""What the worker does with a partition the consumer cannot position (no broker here; the
broker behaviour is tests/apache_kafka/test_offset_out_of_range.py)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import NoOffsetForPartitionError, OffsetOutOfRangeError

from stream_dp.ops.health import Health
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.kafka.hold_guards import (
    OffsetOutOfRangeStop,
    OffsetRangeGuard,
    OutOfRange,
    out_of_range_action,
)
from tests.pipeline.support import config

INPUT, PARTIALS = "events", "stream-dp.partials"


def _lost(topic: str, position: int = 1, start: int | None = 5, end: int | None = 9) -> OutOfRange:
    return OutOfRange(topic, 0, position, position, start, end)


def _action(lost: OutOfRange, policy: str = "stop") -> str:
    return out_of_range_action(
        lost, input_topic=INPUT, input_policy=policy, internal_retention_s=21_600
    )[0]


def test_internal_topics_always_stop_whatever_the_input_policy() -> None:
    assert _action(_lost(PARTIALS), "skip_to_log_start") == "stop"
    assert _action(_lost("stream-dp.repartition"), "skip_to_log_start") == "stop"


def test_the_input_stops_by_default_and_skips_only_when_configured() -> None:
    assert _action(_lost(INPUT)) == "stop"
    assert _action(_lost(INPUT), "skip_to_log_start") == "skip"


def test_the_input_never_skips_past_the_log_end_or_an_unknown_start() -> None:
    # A position past the end is a recreated topic, not retention: always a stop.
    assert _action(_lost(INPUT, position=20, start=0, end=9), "skip_to_log_start") == "stop"
    assert _action(_lost(INPUT, start=None), "skip_to_log_start") == "stop"


def test_the_stop_names_partition_offsets_and_what_to_do() -> None:
    lost = _lost(PARTIALS)
    _, what = out_of_range_action(
        lost, input_topic=INPUT, input_policy="stop", internal_retention_s=21_600
    )
    text = str(OffsetOutOfRangeStop(lost, what))
    assert "stream-dp.partials[0]: position 1 (committed 1) is outside the log [5, 9)" in text
    assert "internal_retention_s = 21600" in text and "runbook" in text
    assert "every window this deployment has not released yet" in text


def test_the_stop_names_the_windows_affected_and_where_a_new_deployment_starts() -> None:
    _, what = out_of_range_action(
        _lost(PARTIALS),
        input_topic=INPUT,
        input_policy="stop",
        internal_retention_s=21_600,
        first_unreleased_s=1_596_240_010,
    )
    assert "every window not released yet, from 2020-08-01T00:00:10Z on" in what
    assert "window.start_at: 2020-08-01T00:00:10Z" in what
    assert "the topic's own retention.ms passed" in what


class FakeConsumer:
    """What OffsetRangeGuard uses of AIOKafkaConsumer."""

    def __init__(self, assigned: set[TopicPartition], start: int = 5, end: int = 9) -> None:
        self._assigned = assigned
        self._start, self._end = start, end
        self.to_beginning: list[TopicPartition] = []
        self.to_end: list[TopicPartition] = []

    def assignment(self) -> set[TopicPartition]:
        return self._assigned

    async def committed(self, tp: TopicPartition) -> int:
        return 1

    async def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return dict.fromkeys(tps, self._start)

    async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return dict.fromkeys(tps, self._end)

    async def seek_to_beginning(self, *tps: TopicPartition) -> None:
        self.to_beginning.extend(tps)

    async def seek_to_end(self, *tps: TopicPartition) -> None:
        self.to_end.extend(tps)


def _guard(**input_section: Any) -> tuple[OffsetRangeGuard, Metrics]:
    cfg = config()
    cfg = cfg.model_copy(update={"input": cfg.input.model_copy(update=input_section)})
    metrics = Metrics(process=False)
    topics = [cfg.input.topic, cfg.output.partials_topic]
    return OffsetRangeGuard(cfg, metrics=metrics, health=Health(), topics=topics), metrics


def _count(metrics: Metrics, topic: str) -> float:
    return float(metrics.offset_out_of_range.labels(topic=topic)._value.get())


async def test_a_partition_never_committed_is_read_from_its_log_start() -> None:
    guard, metrics = _guard()
    tp = TopicPartition(guard.config.output.partials_topic, 0)
    consumer = FakeConsumer({tp})
    await guard.resolve(NoOffsetForPartitionError(tp), consumer)  # type: ignore[arg-type]
    assert consumer.to_beginning == [tp]
    assert _count(metrics, tp.topic) == 0


async def test_start_from_latest_moves_uncommitted_input_partitions_to_their_end() -> None:
    guard, _ = _guard(start_from="latest")
    inp = TopicPartition(guard.config.input.topic, 0)
    internal = TopicPartition(guard.config.output.partials_topic, 0)
    consumer = FakeConsumer({inp, internal})
    await guard.resolve(NoOffsetForPartitionError(inp), consumer)  # type: ignore[arg-type]
    await guard.resolve(NoOffsetForPartitionError(internal), consumer)  # type: ignore[arg-type]
    assert (consumer.to_end, consumer.to_beginning) == ([inp], [internal])


async def test_an_internal_offset_out_of_range_raises_the_stop_and_counts() -> None:
    guard, metrics = _guard(on_offset_out_of_range="skip_to_log_start")
    tp = TopicPartition(guard.config.output.partials_topic, 0)
    consumer = FakeConsumer({tp})
    with pytest.raises(OffsetOutOfRangeStop, match=r"position 1 \(committed 1\)"):
        await guard.resolve(OffsetOutOfRangeError({tp: 1}), consumer)  # type: ignore[arg-type]
    assert consumer.to_beginning == []
    assert _count(metrics, tp.topic) == 1


async def test_input_skip_seeks_to_the_log_start_and_counts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="stream_dp")
    guard, metrics = _guard(on_offset_out_of_range="skip_to_log_start")
    tp = TopicPartition(guard.config.input.topic, 0)
    consumer = FakeConsumer({tp})
    await guard.resolve(OffsetOutOfRangeError({tp: 1}), consumer)  # type: ignore[arg-type]
    assert consumer.to_beginning == [tp]
    assert _count(metrics, tp.topic) == 1
    assert any(
        r.levelname == "WARNING" and "from offset 1 to 5" in r.message for r in caplog.records
    )


async def test_a_partition_revoked_meanwhile_is_left_to_its_new_owner() -> None:
    guard, metrics = _guard()
    tp = TopicPartition(guard.config.output.partials_topic, 0)
    consumer = FakeConsumer(set())
    await guard.resolve(OffsetOutOfRangeError({tp: 1}), consumer)  # type: ignore[arg-type]
    assert _count(metrics, tp.topic) == 0
