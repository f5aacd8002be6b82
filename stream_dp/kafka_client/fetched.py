"""The worker's fetched records without a ``ConsumerRecord`` per record (aiokafka 0.14).

aiokafka's fetcher parses each fetched record batch into records (its C extension's
``DefaultRecord``: ``offset``, ``timestamp``, ``timestamp_type``, ``key``, ``value``,
``headers``), then builds a Python ``ConsumerRecord`` dataclass from each one (topic and
partition repeated, sizes, headers copied to a tuple). That second step was the largest single
item in the worker's profile (bench/RESULTS.md, section 7), and the worker reads none of what
it adds: it takes the topic and partition from the batch's keys and only ``offset``, ``key``,
``value`` and ``timestamp`` from the records.

:func:`fetch_options` are the options of a consumer whose fetcher hands out aiokafka's parsed
records themselves, a record batch at a time: ``FetchResult.getall`` takes each batch's
records as one list (built by the C extension) and hands them out by slices
(:meth:`_RecordColumns.take`) instead of resuming a generator per record — the largest item
of the worker's profile on issue 43's stream (bench/RESULTS.md, section 12). The position
moves exactly as aiokafka's generator moves it (``next_fetch_offset`` after the last record
handed out, past a batch — its compacted tail included — once the record after it is asked
for, control batches skipped; ``tests/clients/test_fetched_take.py`` compares the two), and
only for uncommitted reads (a read-committed consumer's aborted transactions go through
aiokafka's generator). Everything else — group membership, rebalance callbacks, commits,
``max_records`` — is aiokafka's own code, unchanged, and only consumers made with these
options (their value deserializer is :func:`raw_value`) take this path; every other consumer
in the process builds its ``ConsumerRecord`` as before. The adapter is installed only on the
aiokafka versions it was written against (:data:`PINNED_VERSIONS`); on another version
:func:`fetch_options` is empty and the worker gets ``ConsumerRecord`` objects, which have the
same four attributes.

The same class keeps, for every consumer, the records of a partition read before a batch
that fails to parse (a codec this process lacks, a bad checksum): aiokafka raised the error
with them still in hand, and fetched the same bytes again from the position they had not
moved, so the readable records before an unreadable batch were never returned (the
partition, and every window it closes, stalled behind them). Now the partition's records end
there: they are returned, the position moves to the first record not returned, and the
next fetch, which starts with the unreadable batch, raises the error before any record.
That error carries the partition it came from (:func:`failed_partition`): aiokafka's codec
error does not name it, and a reader tracks each partition's health by it.

A :func:`fetch_options` consumer's fetcher also never long-polls while it is behind
(:func:`_actions_per_node`). aiokafka keeps one fetch request in flight per broker, for the
partitions it holds no records of; a request whose partitions all sit at their log's end is
held by the broker for ``fetch_max_wait_ms`` (500 ms by default). While the worker works
through a partition with a backlog (its records buffered, so not in the request) the other
partitions of that broker — caught-up input partitions, the partials topic — are in such a
request, and when the backlog's buffer runs out its next fetch waits behind that long poll:
the worker sat idle for up to half a second with records waiting at the broker (issue 43's
stream on keyed input, bench/RESULTS.md section 12, ``idle``: 23–25% of the wall time idle in
the loop's fetch wait, one or two such long polls per run). Now a request
built while any fetchable partition of the consumer is behind its last known end of log (its
position below the high watermark, or the last stable offset for committed reads) waits at
most :data:`BEHIND_FETCH_WAIT_MS`; one built with every partition caught up waits the
consumer's ``fetch_max_wait_ms`` as before, so an idle worker polls as rarely as it did.

A request built with every partition caught up also asks the broker for at least
:data:`CAUGHT_UP_FETCH_MIN_BYTES` (the broker answers once that much has arrived, or when
``fetch_max_wait_ms`` ends, whichever comes first). Without it a worker holding a trickle —
the small partitions of a skewed stream, a live stream below the worker's pace — was answered
as soon as any record arrived: 3–10 fetches a second of a few hundred records each, and each
paid a whole iteration's fixed costs (a fetch answer, the hand-off, on the default path a
produce and its acknowledgement). A caught-up worker now gets its records in batches of
:data:`CAUGHT_UP_FETCH_MIN_BYTES` or every ``fetch_max_wait_ms`` (500 ms): a live record waits
at most that long more before the worker reads it; a backlog is fetched as before.
Which records are fetched, from where, and in what order is unchanged.
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
#: The longest a fetch request of a consumer that is behind may be held by the broker (see
#: the module docstring): the longest the worker can wait for a backlog's next records.
BEHIND_FETCH_WAIT_MS: Final = 5
#: The least a fetch request of a consumer with every partition caught up asks the broker
#: for (see the module docstring): held until that much arrived or ``fetch_max_wait_ms``.
CAUGHT_UP_FETCH_MIN_BYTES: Final = 1_048_576


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
    parsed record itself instead of a ``ConsumerRecord`` built from it, taken a record batch
    at a time (:meth:`take`); for every consumer, the records read before a batch that fails
    to parse returned, the error raised by the fetch that starts at that batch (module
    docstring)."""

    _handed_out = False
    #: Which way this fetch's records are handed out once the first one is: aiokafka's
    #: generator (``getone``, other consumers) or :meth:`take` (never both).
    _streamed = False
    _batch: Any = None
    _batch_records: list[Any] | None = None
    _batch_at = 0
    _exhausted = False

    def __iter__(self) -> Any:
        # aiokafka's getall loops ``for msg in partition_records``: handing it the records
        # generator itself makes that loop resume the generator from C, without a Python
        # ``__next__`` call per record. ``getone`` still calls ``__next__``.
        records = self._records_iterator
        return records if records is not None else iter(())

    def _unpack_records(self) -> Any:
        if self._batch is not None or self._exhausted:  # take() went first: go on with it
            while chunk := self.take(1)[0]:
                yield chunk[0]
            return
        self._streamed = True
        try:
            yield from super()._unpack_records()
        except KafkaError as exc:
            if not self._handed_out:
                # nothing of this fetch returned: the error is the caller's now, naming the
                # partition it came from (aiokafka's codec error does not say)
                setattr(exc, _PARTITION_ATTRIBUTE, self._tp)
                raise
            # End this fetch's records here: the position moves to next_fetch_offset, the
            # first record not returned, and the next fetch raises the error before any.

    def _consumer_record(self, tp: Any, record: Any) -> Any:
        # Called once per record, just before aiokafka's generator hands it out.
        self._handed_out = True
        if self._value_deserializer is raw_value and self._key_deserializer is None:
            return record
        return super()._consumer_record(tp, record)

    def takes_batches(self) -> bool:
        """Whether :meth:`take` serves this fetch: a :func:`fetch_options` consumer reading
        uncommitted records (no aborted transactions to skip), the generator not started."""
        return (
            not self._streamed
            and self._value_deserializer is raw_value
            and self._key_deserializer is None
            and self._isolation_level == _fetcher.READ_UNCOMMITTED
        )

    def take(self, max_records: int | None) -> tuple[list[Any], bool]:
        """Up to ``max_records`` parsed records (all if None) and whether the fetch is used
        up, ``next_fetch_offset`` moved exactly as aiokafka's generator moves it (after the
        last record handed out; past a batch once the record after it is asked for), a
        batch at a time: the records of a batch are a list built in C, handed out by
        slices."""
        out: list[Any] = []
        if self._exhausted:
            return out, True
        while max_records is None or len(out) < max_records:
            records = self._batch_records
            if records is None or self._batch_at >= len(records):
                if records is not None:  # past the batch's end (a compacted tail included)
                    self.next_fetch_offset = self._batch.next_offset
                if not self._next_batch(handed_out=bool(out)):
                    return out, True
                continue
            end = len(records) if max_records is None else self._batch_at + max_records - len(out)
            chunk = records[self._batch_at : end]
            self._batch_at += len(chunk)
            out += chunk
            self.next_fetch_offset = chunk[-1].offset + 1
            self._handed_out = True
        return out, False

    def _next_batch(self, *, handed_out: bool) -> bool:
        """Load the next data batch's records (those from ``next_fetch_offset`` on); False
        when there is none, or when a batch cannot be read after records were handed out
        (the error then comes with the next fetch, as in :meth:`_unpack_records`)."""
        self._batch = self._batch_records = None
        self._batch_at = 0
        batches = self._records
        try:
            while batches.has_next():
                batch = batches.next_batch()
                if self._check_crcs and not batch.validate_crc():
                    raise _fetcher.Errors.CorruptRecordException(f"Invalid CRC - {self._tp}")
                if batch.is_control_batch:  # skipped at any isolation level, as aiokafka
                    self.next_fetch_offset = batch.next_offset
                    continue
                records = list(batch)
                if records and records[0].offset < self.next_fetch_offset:
                    first = self.next_fetch_offset  # records before the position: skipped
                    records = [r for r in records if r.offset >= first]
                self._batch, self._batch_records = batch, records
                return True
        except KafkaError as exc:
            self._exhausted = True  # as a generator that raised: nothing more from this fetch
            if not (handed_out or self._handed_out):
                # nothing of this fetch returned: the error is the caller's now, naming the
                # partition it came from (as in _unpack_records)
                setattr(exc, _PARTITION_ATTRIBUTE, self._tp)
                raise
        self._exhausted = True
        return False


def _getall(self: Any, max_records: int | None = None) -> list[Any]:
    """aiokafka's ``FetchResult.getall``, taking a :func:`fetch_options` consumer's records
    a batch at a time (:meth:`_RecordColumns.take`); other fetches as before."""
    records = self._partition_records
    if not (isinstance(records, _RecordColumns) and records.takes_batches()):
        plain: list[Any] = _ORIGINAL_GETALL(self, max_records)
        return plain
    if not self.check_assignment(self._topic_partition) or not self.has_more():
        return []
    out, used_up = records.take(max_records)
    self._update_position()
    if used_up:
        self._partition_records = None
    return out


_ORIGINAL_GETALL: Final = _fetcher.FetchResult.getall


def behind(fetcher: Any, assignment: Any) -> bool:
    """Whether an assigned, unpaused partition of ``fetcher``'s consumer has records at the
    broker it has not consumed yet, as far as its last fetch told (position below the high
    watermark; below the last stable offset for committed reads)."""
    committed = fetcher._isolation_level == _fetcher.READ_COMMITTED
    for tp in assignment.tps:
        state = assignment.state_value(tp)
        end = state.lso if committed else state.highwater
        if end is None or state.paused or not state.has_valid_position:
            continue
        if state.position < end:
            return True
    return False


def _actions_per_node(self: Any, assignment: Any) -> Any:
    """aiokafka's ``Fetcher._get_actions_per_node``; for a :func:`fetch_options` consumer
    that is :func:`behind`, its requests held at most :data:`BEHIND_FETCH_WAIT_MS`; for one
    caught up, its requests ask for :data:`CAUGHT_UP_FETCH_MIN_BYTES` at least."""
    if self._value_deserializer is not raw_value:
        return _ORIGINAL_ACTIONS(self, assignment)
    wait_ms, min_bytes = self._fetch_max_wait_ms, self._fetch_min_bytes
    if behind(self, assignment):
        self._fetch_max_wait_ms = min(wait_ms, BEHIND_FETCH_WAIT_MS)
    else:
        self._fetch_min_bytes = max(min_bytes, CAUGHT_UP_FETCH_MIN_BYTES)
    try:
        return _ORIGINAL_ACTIONS(self, assignment)
    finally:
        self._fetch_max_wait_ms, self._fetch_min_bytes = wait_ms, min_bytes


_ORIGINAL_ACTIONS: Final = _fetcher.Fetcher._get_actions_per_node


def _install() -> bool:
    if aiokafka.__version__ not in PINNED_VERSIONS:
        return False
    original = getattr(_fetcher, "PartitionRecords", None)
    if original is _RecordColumns:
        return True
    if original is not _RecordColumns.__mro__[1]:  # another patch: leave it alone
        return False
    _fetcher.PartitionRecords = _RecordColumns
    _fetcher.FetchResult.getall = _getall
    _fetcher.Fetcher._get_actions_per_node = _actions_per_node
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
