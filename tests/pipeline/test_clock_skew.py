"""The worker's clock against the record timestamps of a fetched batch."""

from __future__ import annotations

from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from stream_dp.pipeline.kafka.clock_skew import input_clock_skew_s, newest_record_timestamp_s


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
