"""The worker's fetched records without a ``ConsumerRecord`` per record (aiokafka 0.14).

aiokafka's fetcher parses each fetched record batch into records (its C extension's
``DefaultRecord``: ``offset``, ``timestamp``, ``timestamp_type``, ``key``, ``value``,
``headers``), then builds a Python ``ConsumerRecord`` dataclass from each one (topic and
partition repeated, sizes, headers copied to a tuple). That second step was the largest single
item in the worker's profile (bench/RESULTS.md, section 7), and the worker reads none of what
it adds: it takes the topic and partition from the batch's keys and only ``offset``, ``key``,
``value`` and ``timestamp`` from the records.

:func:`fetch_options` are the options of a consumer whose fetcher hands out aiokafka's parsed
records themselves. Everything else — group membership, rebalance callbacks, positions
(``next_fetch_offset`` after every record handed out, control and aborted batches skipped),
commits, ``max_records`` — is aiokafka's own code, unchanged: the adapter replaces
``PartitionRecords._consumer_record`` alone, and only for consumers made with these options
(their value deserializer is :func:`raw_value`); every other consumer in the process builds
its ``ConsumerRecord`` as before. The adapter is installed only on the aiokafka versions it
was written against (:data:`PINNED_VERSIONS`); on another version :func:`fetch_options` is
empty and the worker gets ``ConsumerRecord`` objects, which have the same four attributes.

The same class keeps, for every consumer, the records of a partition read before a batch
that fails to parse (a codec this process lacks, a bad checksum): aiokafka raised the error
with them still in hand, and fetched the same bytes again from the position they had not
moved, so the readable records before an unreadable batch were never returned (the
partition, and every window it closes, stalled behind them). Now the partition's records end
there: they are returned, the position moves to the first record not returned, and the
next fetch, which starts with the unreadable batch, raises the error before any record.
That error carries the partition it came from (:func:`failed_partition`): aiokafka's codec
error does not name it, and a reader tracks each partition's health by it.
"""

from __future__ import annotations

from typing import Any, Final

import aiokafka
from aiokafka.consumer import fetcher as _fetcher
from aiokafka.errors import KafkaError

__all__ = [
    "PINNED_VERSIONS",
    "failed_partition",
    "fetch_options",
    "raw_value",
    "record_columns_installed",
]

#: aiokafka versions whose ``PartitionRecords`` this adapter was checked against.
PINNED_VERSIONS: Final = frozenset({"0.14.0"})
#: Where a parse error raised by a fetch keeps the partition it came from.
_PARTITION_ATTRIBUTE: Final = "stream_dp_partition"


def failed_partition(exc: BaseException) -> Any | None:
    """The ``TopicPartition`` whose record batch failed to parse with ``exc`` (a codec this
    process lacks, a bad checksum), when the adapter raised it; else None."""
    return getattr(exc, _PARTITION_ATTRIBUTE, None)


def raw_value(value: bytes | None) -> bytes | None:
    """The value unchanged: the marker of consumers that get aiokafka's parsed records (an
    identity deserializer, so a consumer made with it behaves alike without the adapter)."""
    return value


class _RecordColumns(_fetcher.PartitionRecords):  # type: ignore[misc]
    """aiokafka's ``PartitionRecords``; for consumers made with :func:`fetch_options`, the
    parsed record itself instead of a ``ConsumerRecord`` built from it; for every consumer,
    the records read before a batch that fails to parse returned, the error raised by the
    fetch that starts at that batch (module docstring)."""

    _handed_out = False

    def __next__(self) -> Any:
        try:
            record = super().__next__()
        except KafkaError as exc:
            if not self._handed_out:
                # nothing of this fetch returned: the error is the caller's now, naming the
                # partition it came from (aiokafka's codec error does not say)
                setattr(exc, _PARTITION_ATTRIBUTE, self._tp)
                raise
            # End this fetch's records here: the position moves to next_fetch_offset, the
            # first record not returned, and the next fetch raises the error before any.
            self._records_iterator = None
            raise StopIteration from None
        self._handed_out = True
        return record

    def _consumer_record(self, tp: Any, record: Any) -> Any:
        if self._value_deserializer is raw_value and self._key_deserializer is None:
            return record
        return super()._consumer_record(tp, record)


def _install() -> bool:
    if aiokafka.__version__ not in PINNED_VERSIONS:
        return False
    original = getattr(_fetcher, "PartitionRecords", None)
    if original is _RecordColumns:
        return True
    if original is not _RecordColumns.__mro__[1]:  # another patch: leave it alone
        return False
    _fetcher.PartitionRecords = _RecordColumns
    return True


_INSTALLED: Final = _install()


def record_columns_installed() -> bool:
    """Whether this process's aiokafka hands :func:`fetch_options` consumers parsed records."""
    return _INSTALLED


def fetch_options() -> dict[str, Any]:
    """Consumer options for the worker's input: aiokafka's parsed records, no
    ``ConsumerRecord`` per record (empty on an aiokafka version the adapter was not checked
    against)."""
    return {"value_deserializer": raw_value} if _INSTALLED else {}
