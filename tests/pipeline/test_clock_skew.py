"""The worker's clock against the record timestamps of a fetched batch."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.kafka.clock_skew import (
    FRESH_WITHIN_S,
    InputClockSkew,
    input_clock_skew_s,
    newest_record_timestamp_s,
)


def _record(topic: str, timestamp_ms: int, timestamp_type: int = 0) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord(
        topic=topic, partition=0, offset=0, timestamp=timestamp_ms,
        timestamp_type=timestamp_type, key=None, value=b"{}", checksum=None,
        serialized_key_size=-1, serialized_value_size=2, headers=(),
    )  # fmt: skip


def test_the_skew_is_the_newest_input_timestamp_minus_the_clock() -> None:
    batch = {
        TopicPartition("in", 0): [_record("in", 1_000_000), _record("in", 1_600_500)],
        TopicPartition("in", 1): [_record("in", 1_200_000, timestamp_type=1)],
        # another topic (the workers' own partials) does not count, however new
        TopicPartition("partials", 0): [_record("partials", 9_000_000)],
    }
    assert input_clock_skew_s(batch, "in", now_s=1_000.0) == 600.5
    assert input_clock_skew_s(batch, "in", now_s=1_700.0) == -99.5


def test_no_timestamp_no_skew() -> None:
    assert newest_record_timestamp_s([]) is None
    assert newest_record_timestamp_s([_record("in", -1)]) is None  # message format v0
    assert input_clock_skew_s({TopicPartition("x", 0): [_record("x", 5)]}, "in", 0.0) is None


def test_the_newest_is_the_largest_timestamp_not_the_last_record() -> None:
    # CreateTime is set by producers: within one partition it need not grow with the offset.
    batch = {
        TopicPartition("in", 0): [_record("in", 1_900_000), _record("in", 1_100_000)],
        TopicPartition("in", 1): [_record("in", 1_500_000), _record("in", 1_000_000)],
    }
    assert input_clock_skew_s(batch, "in", now_s=1_000.0) == 900.0


def test_records_without_a_usable_timestamp_are_skipped_not_fatal() -> None:
    # A record with no timestamp (None) or none at all, beside timestamped ones: the newest
    # of the timestamped ones, as when every record has one.
    mixed = [_record("in", 2_000), _record("in", None), object(), _record("in", 7_000)]  # type: ignore[arg-type]
    assert newest_record_timestamp_s(mixed) == 7.0
    assert newest_record_timestamp_s([_record("in", None), object()]) is None  # type: ignore[arg-type]
    assert newest_record_timestamp_s(iter([_record("in", -1), _record("in", 4_000)])) == 4.0
    assert newest_record_timestamp_s([_record("in", -5), _record("in", -1)]) is None


class _Consumer:
    """What :func:`~stream_dp.clients.read_to_end.read_to_end_at` reads of aiokafka's
    consumer: per partition, its position, high watermark and last fetch answer's time."""

    def __init__(self) -> None:
        self.states: dict[TopicPartition, SimpleNamespace] = {}
        self._subscription = SimpleNamespace(subscription=SimpleNamespace(assignment=self))

    def assignment(self) -> set[TopicPartition]:
        return set(self.states)

    def state_value(self, tp: TopicPartition) -> SimpleNamespace | None:
        return self.states.get(tp)

    def read(self, tp: TopicPartition, *, at_end: bool, answered_s: float) -> None:
        self.states[tp] = SimpleNamespace(
            has_valid_position=True,
            highwater=10,
            position=10 if at_end else 3,
            timestamp=answered_s * 1000,
        )


@pytest.mark.parametrize("error_s", [300.0, -300.0], ids=["fast", "slow"])
def test_only_fresh_records_measure_the_clock_in_both_directions(error_s: float) -> None:
    """Issue 39: a clock ``error_s`` fast (or slow). A backlog, or an idle input's last
    record a day old, says nothing of the clock (it would read as a clock a day fast);
    records appended after a fetch found the reader at the end do, either way."""
    metrics = Metrics()
    skew = InputClockSkew(metrics, "in")
    consumer, tp = _Consumer(), TopicPartition("in", 0)
    real = 2_000_000.0
    clock = real + error_s  # this worker's clock
    consumer.read(tp, at_end=True, answered_s=clock)  # the backlog read to its end
    skew.observe(consumer, {tp: [_record("in", int((real - 86_400) * 1000))]}, clock)
    assert metrics.input_clock_skew._value.get() == 0.0  # unset: a backlog is no clock
    consumer.read(tp, at_end=True, answered_s=clock + 1)
    skew.observe(consumer, {tp: [_record("in", int((real + 1.5) * 1000))]}, clock + 2)
    assert metrics.input_clock_skew._value.get() == pytest.approx(-error_s - 0.5)
    # Records fetched while the loop turns are buffered (the reader behind again): the last
    # proof still dates them, and they count.
    consumer.read(tp, at_end=True, answered_s=clock + 3)
    skew.observe(consumer, {}, clock + 3)
    consumer.read(tp, at_end=False, answered_s=clock + 4)
    skew.observe(consumer, {}, clock + 4)
    skew.observe(consumer, {tp: [_record("in", int((real + 4) * 1000))]}, clock + 5)
    assert metrics.input_clock_skew._value.get() == pytest.approx(-error_s - 1.0)
    # A proof older than FRESH_WITHIN_S (a stalled loop): its records may be old.
    later = clock + 3 + FRESH_WITHIN_S + 1
    consumer.read(tp, at_end=False, answered_s=later)
    skew.observe(consumer, {tp: [_record("in", int((later - error_s - 3_600) * 1000))]}, later)
    assert metrics.input_clock_skew._value.get() == pytest.approx(-error_s - 1.0)
