"""How far the worker's clock is behind the broker's record timestamps.

An event is refused as ``timestamp_out_of_range`` when it is stamped more than
``input.max_future_s`` ahead of the worker's clock, so a worker clock that is that much *slow*
dead-letters every live event. The records of a fetched batch carry a timestamp the worker
does not set: the producer's ``CreateTime`` or the broker's ``LogAppendTime`` (per topic,
``message.timestamp.type``). For live input the newest of them is "now" on the producers' or
the broker's clock, a moment ago; so

    skew_s = newest record timestamp of the batch − the worker's clock

is about 0 on a healthy worker, positive by the amount its clock is slow and negative by the
amount it is fast. Only fresh records count (:class:`InputClockSkew`): those fetched right
after a fetch answer found the reader at the partition's end, so appended since — a backlog
or an idle input's last old record would look like a fast clock. It is exported as
``stream_dp_input_clock_skew_seconds`` and alerted on in both directions
(``StreamDPClockSkew``) well before it reaches ``input.max_future_s``: a slow clock
dead-letters live events past it, a fast one is trusted only within it (event time after a
take, :mod:`stream_dp.pipeline.stages.restart_clock`).

It is only measured and shown, never used as the clock: a ``CreateTime`` is set by whoever
produces to the input topic, so letting it move "now" forward would let one record stamped
ahead close the current window early (the threat the future cap exists for). A forged
timestamp can at most raise this gauge and a false alert.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from operator import attrgetter
from typing import Any

from stream_dp.clients.read_to_end import read_to_end_at
from stream_dp.kafka_client import TopicPartition
from stream_dp.ops.metrics import Metrics

#: Kafka's "no timestamp" (records of message format v0).
NO_TIMESTAMP_MS = -1
#: Records are fresh when the fetch answer that found their partition's reader at its end
#: is at most this old (s): they were appended since, so their stamps are about "now".
FRESH_WITHIN_S = 10.0
_timestamp_of = attrgetter("timestamp")


def newest_record_timestamp_s(records: Iterable[Any]) -> float | None:
    """The newest ``timestamp`` (ms, as aiokafka gives it) of the records, in seconds; None
    when no record has one."""
    newest_ms = _newest_timestamp_ms(records)
    return None if newest_ms is None else newest_ms / 1000.0


def _newest_timestamp_ms(records: Iterable[Any]) -> int | None:
    """The largest integer ``timestamp`` above :data:`NO_TIMESTAMP_MS` of the records, or
    None. It runs for every fetched record, so the usual case (every record has an int
    timestamp) is one ``max`` in C; a batch with anything else (a record without one, a
    ``None``) takes the per-record filter, with the same result."""
    listed = records if isinstance(records, Sequence) else list(records)
    try:
        newest = max(map(_timestamp_of, listed), default=None)
    except (AttributeError, TypeError):  # no timestamp, or one that is not a number
        newest = None
    else:
        # The overall maximum is an int: it is also the maximum of the int timestamps.
        if isinstance(newest, int):
            return newest if newest > NO_TIMESTAMP_MS else None
    return max(
        (
            t
            for t in (getattr(r, "timestamp", None) for r in listed)
            if isinstance(t, int) and t > NO_TIMESTAMP_MS
        ),
        default=None,
    )


def input_clock_skew_s(
    batch: Mapping[Any, Iterable[Any]], topic: str, now_s: float
) -> float | None:
    """Newest record timestamp of ``topic``'s records in ``batch`` (TopicPartition → records)
    minus ``now_s``; None when the batch holds no timestamped record of ``topic``."""
    newest_ms: int | None = None
    for tp, records in batch.items():  # per partition: one max each
        if tp.topic != topic:
            continue
        ms = _newest_timestamp_ms(records)
        if ms is not None and (newest_ms is None or ms > newest_ms):
            newest_ms = ms
    return None if newest_ms is None else newest_ms / 1000.0 - now_s


class InputClockSkew:
    """``stream_dp_input_clock_skew_seconds`` from fresh input records only.

    A partition's records are fresh when the last fetch answer before them found its
    reader at the log's end (:func:`~stream_dp.clients.read_to_end.read_to_end_at`), at
    most :data:`FRESH_WITHIN_S` ago: they were appended between that answer and now, so
    their newest stamp minus the clock is the clock's error (to within that interval) —
    never a backlog's or an idle input's age, which would read as a fast clock."""

    def __init__(self, metrics: Metrics, topic: str) -> None:
        self.metrics, self.topic = metrics, topic
        #: Per input partition, the wall time (s) of the last answer that found it read.
        self._at_end_s: dict[TopicPartition, float] = {}

    def fresh_skew_s(self, batch: Mapping[Any, Iterable[Any]], now_s: float) -> float | None:
        """Newest stamp of the batch's fresh records of the topic minus ``now_s``."""
        fresh = {
            tp: records
            for tp, records in batch.items()
            if tp.topic == self.topic
            and 0.0 <= now_s - self._at_end_s.get(tp, -math.inf) <= FRESH_WITHIN_S
        }
        return input_clock_skew_s(fresh, self.topic, now_s) if fresh else None

    def observe(self, consumer: Any, batch: Mapping[Any, Iterable[Any]], now_s: float) -> None:
        """Set the gauge from ``batch`` (unchanged without fresh records), then note which
        partitions ``consumer`` has read to their end, and when, for the next batches."""
        skew_s = self.fresh_skew_s(batch, now_s)
        if skew_s is not None:
            self.metrics.input_clock_skew.set(skew_s)
        assigned = consumer.assignment()
        for tp in [tp for tp in self._at_end_s if tp not in assigned]:
            del self._at_end_s[tp]  # revoked: its next owner's proofs are its own
        for tp in assigned:
            # The newest proof stands while the reader is behind again: whatever it reads
            # next was appended after it (fetched records may be buffered, not yet read).
            if tp.topic == self.topic and (at_s := read_to_end_at(consumer, tp)) is not None:
                self._at_end_s[tp] = max(at_s, self._at_end_s.get(tp, at_s))
