"""How the sink reports a partition out of range (no broker here; the broker behaviour is
tests/sink/test_sink_offset_range.py)."""

from __future__ import annotations

import logging

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import NoOffsetForPartitionError, OffsetOutOfRangeError

from stream_dp.sink.metrics import SinkMetrics
from stream_dp.sink.offsets import SinkOffsets
from tests.pipeline.test_offset_range import FakeConsumer

TOPIC = "stream-dp.releases"


def _values(metrics: SinkMetrics) -> tuple[float, float]:
    return (
        float(metrics.offset_out_of_range.labels(topic=TOPIC)._value.get()),
        float(metrics.records_skipped.labels(topic=TOPIC)._value.get()),
    )


def test_the_series_exist_from_the_start_at_zero() -> None:
    metrics = SinkMetrics()
    SinkOffsets(TOPIC, metrics)
    text = metrics.exposition().decode()
    assert f'stream_dp_sink_offset_out_of_range_total{{topic="{TOPIC}"}} 0.0' in text
    assert f'stream_dp_sink_records_skipped_total{{topic="{TOPIC}"}} 0.0' in text


async def test_a_partition_never_committed_is_read_from_its_log_start_silently(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = SinkMetrics()
    tp = TopicPartition(TOPIC, 0)
    consumer = FakeConsumer({tp})
    await SinkOffsets(TOPIC, metrics).resolve(consumer, NoOffsetForPartitionError(tp))
    assert (consumer.to_beginning, consumer.to_end) == ([tp], [])
    assert _values(metrics) == (0, 0)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_records_deleted_below_the_position_are_an_error_then_read_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Owned partition 0 at offset 1, log [5, 9): 4 records lost; partition 1 was revoked
    meanwhile (its new owner meets it)."""
    metrics = SinkMetrics()
    owned, revoked = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)
    consumer = FakeConsumer({owned}, start=5, end=9)
    exc = OffsetOutOfRangeError({owned: 1, revoked: 1})
    await SinkOffsets(TOPIC, metrics).resolve(consumer, exc)
    assert consumer.to_beginning == [owned]
    assert _values(metrics) == (1, 4)
    (error,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    text = error.getMessage()
    assert f"{TOPIC}[0]: position 1 (committed 1) is outside the log [5, 9)" in text
    assert "4 records (offsets 1 to 4) were deleted" in text
    assert "StreamDPSinkOffsetOutOfRange" in text


async def test_a_position_past_the_log_end_is_an_error_with_no_count_of_records(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = SinkMetrics()
    tp = TopicPartition(TOPIC, 0)
    consumer = FakeConsumer({tp}, start=0, end=9)
    await SinkOffsets(TOPIC, metrics).resolve(consumer, OffsetOutOfRangeError({tp: 20}))
    assert consumer.to_beginning == [tp]
    assert _values(metrics) == (1, 0)
    (error,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "recreated" in error.getMessage() and "[0, 9)" in error.getMessage()
