"""The release ledger: why a window's noise is drawn once, ever (docs/privacy.md#invariant-3).

A (query, window) release is computed once; its full noisy result is written to the ledger
topic *before* anything reaches the output topic. Large releases are split into parts by
encoded size, each keyed ``<query>|<window>|<release id>|part-<i>`` and carrying the release
id and the number of parts. Every record of one window goes to one ledger partition
(:meth:`TumblingWindows.partition_of`), so the window's draws have one log order.

**One value per (query, window), decided by the log itself.** A draw counts only once all
its parts are in the log, and of several complete draws of one (query, window) the *first
complete in log order* wins — for every reader, whenever it reads. A writer publishes only
after a fence record written behind its parts has come back on that partition: everything
before its fence is then known, so if its own draw completed first it has won for good, and
if another draw completed earlier it publishes that one instead (its own is never shown).
Two owners racing for one window (a paused worker that lost its partitions and resumed)
therefore publish the same values. Keys carry the release id, so compaction never removes a
winning draw's part in favour of a losing one's.

Other records: ``published`` markers (latest per key wins: which draw reached the output),
``progress`` (per partials partition, the next window its owner has not released — every
window before it was released and published), ``coverage`` (the first covered window and
the deployment fingerprint, :mod:`stream_dp.config.fingerprint`; the first such record in
log order wins, each under a key of its own so that no compaction drops the winner for a
later racer's record), ``fingerprint`` (of a deployment recorded before fingerprints
existed; keyed the same way), ``key_check`` (the check value of a pseudonym key id not
recorded yet, :mod:`stream_dp.pipeline.key_check_gate`; coverage and rotation records carry
them too, and the first one of a key id in log order counts), ``cut`` (with erasure on:
written before a window's releaser reads the erasure log, so an erasure recorded after it
may not apply to that window — :mod:`stream_dp.pipeline.stages.erasure_gate`) and
``fence`` records. Readers treat the topic as a log: the embedded broker accepts
``cleanup.policy=compact`` but does not apply it (docs/architecture.md#embedded-broker),
Apache Kafka keeps the last record of each key, and every decision above reads the same
before and after compaction (tests/apache_kafka/test_compaction.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import repeat
from typing import Any, Final, overload

import numpy as np
import orjson

from stream_dp.config.fingerprint import Fingerprint
from stream_dp.errors import StreamDPError
from stream_dp.pipeline.formats.partials import RECORD_OVERHEAD_BYTES, part_bounds
from stream_dp.pipeline.formats.records import (
    SCHEMA_VERSION,
    ColumnKinds,
    ReleaseTemplate,
    dumps,
    escaped_strings,
    format_pieces,
    output_key,
    window_record,
)
from stream_dp.privacy.budget import BOUNDS_CHARGE
from stream_dp.privacy.release import ReleasedValues
from stream_dp.windows.tumbling import epoch_of_iso, iso_utc

FENCE_PREFIX: Final = "__fence__|"
PROGRESS_PREFIX: Final = "__progress__|"
#: Coverage records are keyed ``__coverage__|<writer id>``: one key per record. (Records of
#: earlier versions are keyed ``__coverage__`` alone, and read the same way.)
COVERAGE_KEY: Final = "__coverage__"
FINGERPRINT_KEY: Final = "__fingerprint__"
ROTATION_PREFIX: Final = "__rotation__|"
#: Key check records are keyed ``__key_check__|<key id>|<writer id>``: one key per record,
#: so that compaction keeps the first of racing writers (as coverage records).
KEY_CHECK_PREFIX: Final = "__key_check__|"
CUT_PREFIX: Final = "__cut__|"
BOUNDS_PREFIX: Final = "__bounds__|"
#: Decision records kept in the index (a few days of hourly windows; each is small).
MAX_BOUNDS_DECISIONS: Final = 4096
#: A start-up read notes at most this many keys of released windows (and of earlier
#: versions' fences) to tombstone; the rest are noted by the next start.
MAX_SWEEP_KEYS: Final = 100_000

#: Of windows a worker's read forgets, the spend of at most this many recent ones is kept
#: (for the budget's horizon; older ones count the configured per-window ε).
MAX_SPENT_WINDOWS: Final = 10_000

Ident = tuple[str, int]


@dataclass(frozen=True)
class OutputRecord:
    key: str
    value: Mapping[str, Any]


class DrawnRecord(tuple, OutputRecord):  # type: ignore[type-arg]
    """An output record of a fresh draw: (key, template, the release's values, index). Its
    value is built from the release's template when read: the worker publishes the bytes
    encoded from the same template (:meth:`ReleaseTemplate.encode`) and never reads it, and
    a dict per key was most of a 1,000,000-key release's memory and time. A tuple, so that
    :func:`drawn_records` makes them in C (``tuple.__new__``), not by a Python ``__init__``
    per key; a fresh draw's :class:`DrawnRecords` makes each only when it is read. Equal
    to an :class:`OutputRecord` of the same key and value."""

    __slots__ = ()

    def __new__(
        cls, key: str, template: ReleaseTemplate, values: ReleasedValues, index: int
    ) -> DrawnRecord:
        return tuple.__new__(cls, (key, template, values, index))

    def __init__(self, *args: object) -> None:
        pass  # all set by __new__ (OutputRecord's __init__ would set key and value)

    @property
    def key(self) -> str:
        key: str = tuple.__getitem__(self, 0)
        return key

    @property
    def value(self) -> Mapping[str, Any]:
        _, template, values, index = tuple.__iter__(self)
        record: Mapping[str, Any] = template.record(values[index])
        return record

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, OutputRecord):
            return NotImplemented
        return (self.key, self.value) == (other.key, other.value)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"DrawnRecord(key={self.key!r}, value={self.value!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (DrawnRecord, tuple(tuple.__iter__(self)))


def drawn_records(
    keys: list[str], template: ReleaseTemplate, values: ReleasedValues
) -> list[OutputRecord]:
    """The :class:`DrawnRecord` of every released value, made in C (no Python call per key)."""
    rows = zip(keys, repeat(template), repeat(values), range(len(keys)), strict=False)
    return list(map(tuple.__new__, repeat(DrawnRecord), rows))


#: Output records encoded at a time from a fresh draw's columns (about 10 MB of values):
#: its ledger parts and its output records are made and sent chunk by chunk, so that a
#: release never holds every record's bytes at once (docs/operations.md#memory-at-release).
RECORDS_PER_CHUNK: Final = 20_000
#: Ledger parts (each at most ``kafka.max_message_bytes``) made and written at a time.
PARTS_PER_WRITE: Final = 8


#: One ledger entry, ``{"key": …, "value": …}`` with sorted keys: the key's JSON string
#: between its quotes, the value spliced in as the output's bytes.
_ENTRY: Final = b'{"key":"%b","value":%b}'

#: Ledger entries as ``bytes %`` formats: the formats, each entry's format (an index),
#: and the fields that fill them, one column per slot of a format.
EntryFormats = tuple[tuple[bytes, ...], list[bool] | list[int], list[list[bytes]]]


def _entries_of(escaped: list[bytes], values: list[bytes]) -> EntryFormats:
    """Entries of keys (JSON without quotes) and values made already: one format."""
    return (_ENTRY,), [0] * len(values), [escaped, values]


@dataclass(frozen=True, eq=False)
class DrawnOutput:
    """A fresh draw's output records as what they are made of: the release's template, its
    released values as columns, and its window record (last). Records ``[lo, hi)`` are
    encoded when asked (:meth:`encode`), byte for byte what encoding them all at once
    gives: the bytes of a 1,000,000-key release are never all held."""

    template: ReleaseTemplate
    values: ReleasedValues
    closing_key: str
    closing: bytes
    #: What the columns hold, found once for every chunk (:class:`ColumnKinds`).
    kinds: ColumnKinds = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kinds", self.template.kinds(self.values))

    def __len__(self) -> int:
        return len(self.values) + 1

    def encode(self, lo: int, hi: int) -> tuple[list[str], list[bytes]]:
        """The keys and value bytes of records ``[lo, hi)`` (the window record is last)."""
        n = len(self.values)
        keys: list[str] = []
        values: list[bytes] = []
        if lo < min(hi, n):
            keys, values = self.template.encode(_sliced(self.values, lo, min(hi, n)), self.kinds)
        if hi > n >= lo:
            keys.append(self.closing_key)
            values.append(self.closing)
        return keys, values

    def encode_escaped(self, lo: int, hi: int) -> tuple[list[bytes], list[bytes]]:
        """As :meth:`encode`, each key as its JSON without quotes (what a ledger part
        holds; :meth:`ReleaseTemplate.encode_escaped`)."""
        n = len(self.values)
        keys: list[bytes] = []
        values: list[bytes] = []
        if lo < min(hi, n):
            sliced = _sliced(self.values, lo, min(hi, n))
            keys, values = self.template.encode_escaped(sliced, self.kinds)
        if hi > n >= lo:
            keys.append(escaped_strings([self.closing_key])[0])
            values.append(self.closing)
        return keys, values

    def entry_formats(self, lo: int, hi: int) -> EntryFormats:
        """The ledger entries of records ``[lo, hi)`` as formats and the fields that fill
        them (:meth:`ReleaseTemplate.entry_formats`; the window record's entry, last, a
        format of its own whose slots are filled with nothing)."""
        n = len(self.values)
        made = None
        if lo < min(hi, n):
            sliced = _sliced(self.values, lo, min(hi, n))
            made = self.template.entry_formats(sliced, _ENTRY, self.kinds)
            if made is None:
                return _entries_of(*self.encode_escaped(lo, hi))
        formats, chosen, columns = made or ((), [], [[]])
        which: list[int] | list[bool] = chosen
        if hi > n >= lo:  # its slots filled with nothing, as many as the others have
            closing = _ENTRY % (escaped_strings([self.closing_key])[0], self.closing)
            formats = (*formats, closing.replace(b"%", b"%%") + b"%b" * len(columns))
            which = [*map(int, chosen), len(formats) - 1]
            columns = [[*column, b""] for column in columns]
        return formats, which, columns

    def entry_sizes(self, lo: int, hi: int) -> np.ndarray:
        """Per record of ``[lo, hi)``, its key's JSON (without quotes) and value bytes,
        without encoding them (:meth:`ReleaseTemplate.entry_sizes`)."""
        n = len(self.values)
        sizes = np.zeros(0, np.int64)
        if lo < min(hi, n):
            sizes = self.template.entry_sizes(_sliced(self.values, lo, min(hi, n)), self.kinds)
        if hi > n >= lo:
            closing = len(escaped_strings([self.closing_key])[0]) + len(self.closing)
            sizes = np.append(sizes, closing)
        return sizes


def _sliced(values: ReleasedValues, lo: int, hi: int) -> ReleasedValues:
    """Released values ``[lo, hi)`` as columns (a column that is one number stays one)."""
    scale, half = values.noise_scale, values.ci95
    return ReleasedValues(
        values.groups[lo:hi],
        values.held_values[lo:hi],
        scale[lo:hi] if isinstance(scale, list) else scale,
        half[lo:hi] if isinstance(half, list) else half,
        values.clamped[lo:hi],
    )


class DrawnRecords(Sequence[OutputRecord]):
    """A fresh draw's records, each made when read (:class:`DrawnRecord`), its window
    record last: no object per key is held (the worker reads none of them; it encodes the
    records chunk by chunk from the same columns, :class:`DrawnOutput`)."""

    __slots__ = ("_closing", "_template", "_values")

    def __init__(
        self, template: ReleaseTemplate, values: ReleasedValues, closing: OutputRecord
    ) -> None:
        self._template = template
        self._values = values
        self._closing = closing

    def __len__(self) -> int:
        return len(self._values) + 1

    @overload
    def __getitem__(self, i: int) -> OutputRecord: ...

    @overload
    def __getitem__(self, i: slice) -> list[OutputRecord]: ...

    def __getitem__(self, i: int | slice) -> OutputRecord | list[OutputRecord]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self._values)
        j = i + n + 1 if i < 0 else i
        if j == n:
            return self._closing
        if not 0 <= j < n:
            raise IndexError(i)
        key = self._template.key(self._values[j])
        return DrawnRecord(key, self._template, self._values, j)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"DrawnRecords({list(self)!r})"


@dataclass
class LedgerRelease:
    """One (query, window) release as ledgered: what the output topic must show."""

    release_id: str
    query: str
    window_start_s: int
    window_end_s: int
    epsilon_spent: float
    delta_spent: float
    records: Sequence[OutputRecord]
    #: The partial version taken per source partition (stage 2 takes exactly one each).
    sources: dict[int, str] = field(default_factory=dict)
    published: bool = False
    #: Erasure-log position its partials had applied (docs/erasure.md; 0 with erasure off).
    erasures_through: int = 0
    #: The records' values as the output topic's bytes, once encoded (by the ledger's
    #: encoding of a fresh draw; the publication reuses them).
    encoded: list[bytes] | None = field(default=None, compare=False, repr=False)
    #: The records' keys, when the draw has them as a list (read without a call per record).
    keys: list[str] | None = field(default=None, compare=False, repr=False)
    #: A fresh draw's records as columns, encoded chunk by chunk (:meth:`output_range`).
    drawn: DrawnOutput | None = field(default=None, compare=False, repr=False)

    def output_values(self) -> list[bytes]:
        """Each record's value as canonical JSON (encoded once, then kept)."""
        if self.encoded is None:
            if self.drawn is not None:
                self.encoded = self.drawn.encode(0, len(self.drawn))[1]
            else:
                self.encoded = [dumps(r.value) for r in self.records]
        return self.encoded

    def output_keys(self) -> list[str]:
        """Each record's key, in order."""
        if self.keys is None:
            if self.drawn is not None:
                self.keys = self.drawn.encode(0, len(self.drawn))[0]
            else:
                self.keys = [r.key for r in self.records]
        return self.keys

    def output_range(self, lo: int, hi: int) -> tuple[list[str], list[bytes]]:
        """The keys and value bytes of records ``[lo, hi)``: a fresh draw's encoded from its
        columns now (and not kept), the others' from their lists."""
        if self.drawn is not None and self.encoded is None:
            return self.drawn.encode(lo, hi)
        return self.output_keys()[lo:hi], self.output_values()[lo:hi]

    def escaped_range(self, lo: int, hi: int) -> tuple[list[bytes], list[bytes]]:
        """As :meth:`output_range`, each key as its JSON without quotes (a ledger part's)."""
        if self.drawn is not None and self.encoded is None:
            return self.drawn.encode_escaped(lo, hi)
        keys, values = self.output_range(lo, hi)
        return escaped_strings(keys), values

    def entry_formats(self, lo: int, hi: int) -> EntryFormats:
        """The ledger entries of records ``[lo, hi)`` as ``bytes %`` formats, each
        record's format and the fields that fill them (:meth:`DrawnOutput.entry_formats`
        for a fresh draw; else one format, filled by each key's JSON and value bytes)."""
        if self.drawn is not None and self.encoded is None:
            return self.drawn.entry_formats(lo, hi)
        return _entries_of(*self.escaped_range(lo, hi))

    def entry_sizes(self, lo: int, hi: int) -> np.ndarray:
        """Per record of ``[lo, hi)``, its key's JSON (without quotes) and value bytes: a
        fresh draw's computed from its columns without encoding them."""
        if self.drawn is not None and self.encoded is None:
            return self.drawn.entry_sizes(lo, hi)
        keys, values = self.output_range(lo, hi)
        if len(values) != len(keys) or len(keys) != hi - lo:
            raise ValueError(f"a release with {len(keys)} keys and {len(values)} values")
        sizes = np.fromiter(map(len, escaped_strings(keys)), np.int64, len(keys))
        return sizes + np.fromiter(map(len, values), np.int64, len(values))

    def output_ranges(self, records: int = RECORDS_PER_CHUNK) -> list[tuple[int, int]]:
        """The records' ``[lo, hi)`` in chunks of ``records``, in order (at least one)."""
        n = len(self.records)
        return [(lo, min(lo + records, n)) for lo in range(0, n, records)] or [(0, 0)]

    def output_chunks(self, records: int = RECORDS_PER_CHUNK) -> Iterator[list[tuple[str, bytes]]]:
        """The output topic's (key, value) records, ``records`` at a time, in order."""
        for lo, hi in self.output_ranges(records):
            keys, values = self.output_range(lo, hi)
            yield list(zip(keys, values, strict=True))


@dataclass
class _Parts:
    parts: int
    release_id: str
    window_end_s: int
    epsilon_spent: float
    delta_spent: float
    sources: dict[int, str]
    erasures_through: int = 0
    received: dict[int, list[OutputRecord]] = field(default_factory=dict)


def new_release_id() -> str:
    return uuid.uuid4().hex


def release_key(query: str, window_start_s: int) -> str:
    return f"{query}|{iso_utc(window_start_s)}"


def encode_release(
    release: LedgerRelease, *, now_s: float, max_bytes: int
) -> list[tuple[str, bytes]]:
    """The ledger records (key, value bytes) of one release, parts in order, each under
    ``max_bytes`` (parts are cut by encoded size: group keys may be long)."""
    parts = LedgerParts(release, now_s=now_s, max_bytes=max_bytes)
    return parts.encode(0, len(parts))


class LedgerParts:
    """The ledger records of one release, made a few parts at a time (:meth:`encode`).

    Every part's header states the number of parts, so the cut is decided first: the
    records are encoded chunk by chunk (:data:`RECORDS_PER_CHUNK`) and only each entry's
    size is kept; :meth:`encode` then makes the parts asked for from their records alone.
    The bytes are those of one encoding of every record (:func:`encode_release`)."""

    def __init__(
        self,
        release: LedgerRelease,
        *,
        now_s: float,
        max_bytes: int,
        records_per_chunk: int = RECORDS_PER_CHUNK,
    ) -> None:
        created = datetime.fromtimestamp(now_s, tz=UTC).isoformat().replace("+00:00", "Z")
        base = f"{release_key(release.query, release.window_start_s)}|{release.release_id}"
        header: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "kind": "ledger",
            "release_id": release.release_id,
            "query": release.query,
            "window_start": iso_utc(release.window_start_s),
            "window_end": iso_utc(release.window_end_s),
            "part": 0,
            "parts": 0,
            "epsilon_spent": release.epsilon_spent,
            "delta_spent": release.delta_spent,
            "created_at": created,
            "sources": {str(p): v for p, v in sorted(release.sources.items())},
        }
        if release.erasures_through:
            header["erasures_through"] = release.erasures_through
        budget = max_bytes - RECORD_OVERHEAD_BYTES - len(base) - len(orjson.dumps(header)) - 32
        self._release = release
        self._header = header
        sizes = np.zeros(len(release.records), np.int64)
        for lo, hi in release.output_ranges(records_per_chunk):
            sizes[lo:hi] = release.entry_sizes(lo, hi)
        self._sizes = sizes
        sizes = sizes + (len(_ENTRY) - 4)
        self._bounds = part_bounds(sizes, budget, what=f"a release of query {release.query}")
        #: Every part's key, in order.
        self.keys = [f"{base}|part-{i}" for i in range(len(self._bounds))]
        #: The first parts' records once made (:meth:`prepare`), until taken.
        self._first: list[tuple[str, bytes]] | None = None

    def __len__(self) -> int:
        return len(self._bounds)

    def groups(self, parts: int = PARTS_PER_WRITE) -> list[tuple[int, int]]:
        """The parts' ``[first, last)`` in groups of ``parts``, in order."""
        n = len(self._bounds)
        return [(first, min(first + parts, n)) for first in range(0, n, parts)]

    def prepare(self) -> None:
        """Make the first group of parts now (where the draw runs: a small release is
        then written without making anything more)."""
        self._first = self.encode(*self.groups()[0])

    def take(self, first: int, last: int) -> list[tuple[str, bytes]] | None:
        """The group's records if :meth:`prepare` made them (once), else None."""
        made, self._first = self._first, None
        if made is not None and first == 0 and last == self.groups()[0][1]:
            return made
        return None

    def encode(self, first: int, last: int) -> list[tuple[str, bytes]]:
        """Parts ``[first, last)`` as (key, value bytes): the header with ``"records":
        [entries]``, each part one ``bytes.join`` of its entries' constant pieces and
        fields (:meth:`LedgerRelease.entry_formats` as :func:`format_pieces`: no bytes
        object per entry, key or record, and the part allocated once at its size)."""
        if first >= last:
            return []
        start, end = self._bounds[first][0], self._bounds[last - 1][1]
        formats, which, columns = self._release.entry_formats(start, end)
        width = len(columns)
        # per slot its constant piece, or each format's (chosen per entry by `which`), the
        # first after the comma between entries (the part's first entry has none)
        slots = [
            c[:1] if c.count(c[0]) == len(c) else c
            for c in zip(*map(format_pieces, formats), strict=True)
        ]
        slots[0] = tuple(b"," + c for c in slots[0])
        step = 2 * width + 1
        out = []
        for i in range(first, last):
            lo, hi = self._bounds[i][0] - start, self._bounds[i][1] - start
            head = orjson.dumps({**self._header, "part": i, "parts": len(self._bounds)})
            joined: list[bytes] = [b""] * (step * (hi - lo) + 2)
            chosen = which[lo:hi]
            for slot, pieces in enumerate(slots):
                if len(pieces) == 1:
                    joined[1 + 2 * slot : -1 : step] = pieces * (hi - lo)
                else:
                    joined[1 + 2 * slot : -1 : step] = map(pieces.__getitem__, chosen)
            for slot, column in enumerate(columns):
                joined[2 + 2 * slot : -1 : step] = column[lo:hi]
            if hi > lo:  # the part's first entry: no comma before it
                joined[1] = joined[1][1:]
            joined[0] = head[:-1] + b',"records":['
            joined[-1] = b"]}"
            value = b"".join(joined)
            # the cut was made from the entries' sizes: the part is as long as it said
            made = len(head) + len(b',"records":[]') + max(0, hi - lo - 1)
            made += int(self._sizes[lo + start : hi + start].sum()) + (len(_ENTRY) - 4) * (hi - lo)
            if len(value) != made:
                raise StreamDPError(
                    f"release {self._release.release_id} of query {self._release.query}: its "
                    "records' sizes differ from those its ledger parts were cut by (a bug: "
                    "report it)"
                )
            out.append((self.keys[i], value))
        return out


def encode_published(release: LedgerRelease) -> tuple[str, bytes]:
    value = {
        "schema_version": SCHEMA_VERSION,
        "kind": "published",
        "release_id": release.release_id,
        "query": release.query,
        "window_start": iso_utc(release.window_start_s),
    }
    key = published_key(release.query, release.window_start_s)
    return key, orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def encode_fence(fence_id: str, writer_id: str | None = None) -> tuple[str, bytes]:
    """A fence. Keyed by its writer (a reader's id, fixed for the reader's life) when given:
    compaction then keeps one fence per reader, however many catch-ups it made; the fresh
    ``fence_id`` in the value tells this catch-up's fence from the reader's earlier ones.
    (Without ``writer_id``: keyed by the fence id, as earlier versions wrote every fence.)"""
    value = {"schema_version": SCHEMA_VERSION, "kind": "fence", "fence_id": fence_id}
    key = FENCE_PREFIX + (fence_id if writer_id is None else writer_id)
    return key, orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def published_key(query: str, window_start_s: int) -> str:
    return f"{release_key(query, window_start_s)}|published"


def progress_key(partials_partition: int, released_window_s: int | None) -> str:
    """``__progress__|<r>|<released window>``: one key per released window, so that
    compaction never replaces a higher progress with a lower one written late by a paused
    owner; older ones are tombstoned by the writer of a later one on the same ledger
    partition (:func:`window_tombstones`). ``None``: the key of earlier versions."""
    if released_window_s is None:
        return f"{PROGRESS_PREFIX}{partials_partition}"
    return f"{PROGRESS_PREFIX}{partials_partition}|{iso_utc(released_window_s)}"


def encode_progress(
    partials_partition: int,
    partials_partitions: int,
    next_window_start_s: int,
    released_window_s: int | None = None,
) -> tuple[str, bytes]:
    """Every window of this partials partition before ``next_window_start_s`` is released
    (and published). Written after ``released_window_s`` was released, keyed by it
    (:func:`progress_key`)."""
    value = {
        "schema_version": SCHEMA_VERSION,
        "kind": "progress",
        "partials_partition": partials_partition,
        "partials_partitions": partials_partitions,
        "next_window_start": iso_utc(next_window_start_s),
    }
    return progress_key(partials_partition, released_window_s), orjson.dumps(value)


def encode_coverage(
    first_window_start_s: int,
    window_size_s: int,
    fingerprint: Fingerprint | None = None,
    key_checks: Mapping[str, str] | None = None,
) -> tuple[str, bytes]:
    """The first window the deployment covers (the first such record in log order wins),
    with the deployment's fingerprint (:mod:`stream_dp.config.fingerprint`) and its
    pseudonym keys' check values by key id (:mod:`stream_dp.pipeline.key_check_gate`).

    Keyed by a fresh id: workers racing at a deployment's first start write one record each,
    and compaction (which keeps the *last* record of a key) keeps them all, in log order, so
    the first stays first. Under one shared key it would keep the last racer's instead.
    """
    value: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "kind": "coverage",
        "first_window_start": iso_utc(first_window_start_s),
        "window_size_s": window_size_s,
    }
    if fingerprint is not None:
        value["fingerprint"] = fingerprint.record()
    if key_checks:
        value["key_checks"] = dict(sorted(key_checks.items()))
    return f"{COVERAGE_KEY}|{uuid.uuid4().hex}", orjson.dumps(value)


def encode_key_check(key_id: str, key_check: str) -> tuple[str, bytes]:
    """The check value of a pseudonym key id the ledger has not recorded (a rotation's new
    key, or a deployment from a version before key checks): the first in log order counts."""
    value = {
        "schema_version": SCHEMA_VERSION,
        "kind": "key_check",
        "key_id": key_id,
        "key_check": key_check,
    }
    return f"{KEY_CHECK_PREFIX}{key_id}|{uuid.uuid4().hex}", orjson.dumps(value)


def encode_fingerprint(fingerprint: Fingerprint) -> tuple[str, bytes]:
    """The fingerprint of a deployment whose coverage record has none (recorded before
    fingerprints existed), or of a replay ledger file: the first one in log order counts,
    and one in the coverage record before it. Keyed by a fresh id, as coverage records are,
    so that compaction keeps the first."""
    value = {
        "schema_version": SCHEMA_VERSION,
        "kind": "fingerprint",
        "fingerprint": fingerprint.record(),
    }
    return f"{FINGERPRINT_KEY}|{uuid.uuid4().hex}", orjson.dumps(value)


def encode_cut(window_start_s: int) -> tuple[str, bytes]:
    """The window's release applies the erasures recorded before this record (and maybe
    later ones): what an erasure response calls a release that had begun."""
    value = {
        "schema_version": SCHEMA_VERSION,
        "kind": "cut",
        "window_start": iso_utc(window_start_s),
    }
    return f"{CUT_PREFIX}{iso_utc(window_start_s)}", orjson.dumps(value)


@dataclass(frozen=True)
class BoundsDecision:
    """The bounds a window uses under ``bounds: auto``, chosen from the window before it.

    A deterministic function of that window's ledgered winners (its histograms and released
    values): two owners racing for it write the same record; the first in log order counts.
    ``means`` is what the choice read and ``histograms`` what it read them from (the noisy
    histograms of ``chosen_from``, already released): the next choice compares its own with
    them and averages over both.
    """

    window_start_s: int
    max_contributions_per_window: int
    max_keys_per_user: int | None
    max_contributions_per_key: int | None
    chosen_from_s: int
    reason: str
    means: Mapping[str, float] = field(default_factory=dict)
    #: {"counts": {name: [bins]}, "noise_scales": {name: b}, "epsilon": ε} or None
    histograms: Mapping[str, Any] | None = None

    @property
    def bounds(self) -> tuple[int, int | None, int | None]:
        return (
            self.max_contributions_per_window,
            self.max_keys_per_user,
            self.max_contributions_per_key,
        )


def encode_bounds_decision(decision: BoundsDecision) -> tuple[str, bytes]:
    value = {
        "schema_version": SCHEMA_VERSION,
        "kind": "bounds",
        "window_start": iso_utc(decision.window_start_s),
        "chosen_from": iso_utc(decision.chosen_from_s),
        "max_contributions_per_window": decision.max_contributions_per_window,
        "max_keys_per_user": decision.max_keys_per_user,
        "max_contributions_per_key": decision.max_contributions_per_key,
        "reason": decision.reason,
        "means": dict(decision.means),
        "histograms": None if decision.histograms is None else dict(decision.histograms),
    }
    key = BOUNDS_PREFIX + iso_utc(decision.window_start_s)
    return key, orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def _decode_bounds_decision(obj: Mapping[str, Any]) -> BoundsDecision:
    def bound(name: str) -> int | None:
        value = obj[name]
        return None if value is None else int(value)

    k = bound("max_contributions_per_window")
    if k is None:
        raise ValueError("a bounds record needs max_contributions_per_window")
    return BoundsDecision(
        window_start_s=epoch_of_iso(str(obj["window_start"])),
        max_contributions_per_window=k,
        max_keys_per_user=bound("max_keys_per_user"),
        max_contributions_per_key=bound("max_contributions_per_key"),
        chosen_from_s=epoch_of_iso(str(obj["chosen_from"])),
        reason=str(obj["reason"]),
        means={str(n): float(v) for n, v in obj.get("means", {}).items()},
        histograms=obj.get("histograms"),
    )


def encode_rotation(
    key_id: str,
    previous_key_id: str,
    rotate_at_s: float,
    *,
    key_check: str = "",
    previous_key_check: str = "",
) -> tuple[str, bytes]:
    """A key rotation this deployment has applied (so a restart after it is not refused),
    with both keys' check values."""
    value: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "kind": "rotation",
        "key_id": key_id,
        "previous_key_id": previous_key_id,
        "rotate_at": iso_utc(rotate_at_s),
    }
    if key_check:
        value["key_check"] = key_check
    if previous_key_check:
        value["previous_key_check"] = previous_key_check
    return f"{ROTATION_PREFIX}{previous_key_id}>{key_id}", orjson.dumps(value)


def close_release(
    records: Sequence[OutputRecord],
    *,
    release_id: str,
    query: str,
    window_start_s: int,
    window_end_s: int,
    released_keys: int,
    epsilon_spent: float,
    delta_spent: float,
    horizon_epsilon_spent: float,
    sources: dict[int, str],
    bounds: Mapping[str, Any] | None = None,
    erasures_through: int = 0,
    encoded: list[bytes] | None = None,
    keys: list[str] | None = None,
    drawn: tuple[ReleaseTemplate, ReleasedValues] | None = None,
) -> LedgerRelease:
    """A (query, window) release: its value ``records`` closed by the window record (last:
    a reader that has it has the whole window), as the ledger keeps it. The one place a
    window record is built, for per-window and cumulative queries alike. ``encoded``: the
    ``records``' values as the output topic's bytes, and ``keys`` their keys, when the
    caller has them; ``drawn``: the template and columns the records are made from, to
    encode them chunk by chunk (:class:`DrawnOutput`) instead."""
    closing_key = output_key(query, window_start_s, None)
    closing = window_record(
        release_id=release_id,
        query=query,
        window_start_s=window_start_s,
        window_end_s=window_end_s,
        released_keys=released_keys,
        epsilon_spent=epsilon_spent,
        delta_spent=delta_spent,
        horizon_epsilon_spent=horizon_epsilon_spent,
        bounds=bounds,
    )
    return LedgerRelease(
        release_id=release_id,
        query=query,
        window_start_s=window_start_s,
        window_end_s=window_end_s,
        epsilon_spent=epsilon_spent,
        delta_spent=delta_spent,
        records=(
            [*records, OutputRecord(closing_key, closing)]
            if drawn is None
            else DrawnRecords(*drawn, OutputRecord(closing_key, closing))
        ),
        sources=sources,
        erasures_through=erasures_through,
        encoded=None if encoded is None else [*encoded, dumps(closing)],
        keys=None if keys is None else [*keys, closing_key],
        drawn=None if drawn is None else DrawnOutput(*drawn, closing_key, dumps(closing)),
    )


class LedgerIndex:
    """What the ledger log says, fed record by record in log order (per partition).

    Per (query, window) the first draw whose parts are all present wins; the draws that
    complete later are counted (``losing_draws``) and never returned. Feed records of one
    partition in order; records of different partitions may interleave (a window lives on
    one partition).
    """

    def __init__(
        self,
        *,
        forget_released: bool = False,
        spent_kept_s: int | None = None,
    ) -> None:
        #: Forget as it reads (the worker): a window a progress record covers is dropped
        #: when that record is read, and its parts read later are ignored — released and
        #: published, it is never drawn or published again, whatever its parts say. Memory
        #: is then bounded by the open windows, not the history (docs/exactly-once.md).
        self._forget_released = forget_released
        #: Of forgotten windows, the ε, δ of each winner is kept this far behind the newest
        #: (the budget's horizon needs them), as ``spent``.
        self._spent_kept_s = spent_kept_s
        self.spent: dict[Ident, tuple[float, float]] = {}
        #: (window start, key) of released windows' records read (parts, published markers):
        #: what a start-up tombstones (at most MAX_SWEEP_KEYS).
        self.sweep: list[tuple[int, str]] = []
        #: Parts of windows a progress record had already covered when they were read.
        self.ignored_parts = 0
        self._part_keys: dict[Ident, set[str]] = {}
        #: This process's own draws being written: part key → (release, part, parts)
        #: (:meth:`expect_own`).
        self._own: dict[str, tuple[LedgerRelease, int, int]] = {}
        self._drafts: dict[tuple[str, int], dict[str, _Parts]] = {}
        self._releases: dict[tuple[str, int], LedgerRelease] = {}
        self._published: dict[tuple[str, int], str] = {}
        #: Per partials partition: every window before this start is released and published.
        self.progress: dict[int, int] = {}
        #: The partials partition count the progress records were written under.
        self.partials_partitions: int | None = None
        #: The first covered window (first coverage record in log order), if recorded.
        self.coverage_start_s: int | None = None
        #: The window size the coverage record states.
        self.coverage_window_size_s: int | None = None
        #: The deployment's fingerprint: of the first coverage or fingerprint record in log
        #: order that carries one (None: recorded before fingerprints existed, or new).
        self.fingerprint: Fingerprint | None = None
        #: The latest window whose release had begun (a cut record), with erasure on.
        self.latest_cut_s: int | None = None
        #: Key rotations applied: (previous key id, key id, rotate_at epoch s).
        self.rotations: set[tuple[str, str, int]] = set()
        #: Per pseudonym key id, its key check value: of the first coverage, key check or
        #: rotation record in log order that carries one (:mod:`..key_check_gate`).
        self.key_checks: dict[str, str] = {}
        #: ``bounds: auto``: per window, the bounds it uses (first record in log order).
        self.bounds: dict[int, BoundsDecision] = {}
        #: Complete draws that lost to an earlier complete draw of the same (query, window).
        self.losing_draws = 0
        #: Records read, for the loaded-records metric and start-up logs.
        self.records_read = 0
        #: The broker time stamp (epoch s) of the newest progress record read: when the
        #: deployment last released a window (None: no release, or records without times).
        self.last_progress_wall_s: float | None = None

    def note_progress_time(self, timestamp_ms: int | None) -> None:
        """The broker time stamp of a progress record just fed (see
        :attr:`last_progress_wall_s`)."""
        if timestamp_ms is None or timestamp_ms <= 0:
            return
        at_s = timestamp_ms / 1000
        if self.last_progress_wall_s is None or at_s > self.last_progress_wall_s:
            self.last_progress_wall_s = at_s

    def __len__(self) -> int:
        return len(self._releases)

    def load(self, records: Iterable[tuple[str, bytes | None]]) -> None:
        """Feed raw (key, value) records in log order."""
        for key, value in records:
            self.feed(key, value)

    def expect_own(self, release: LedgerRelease, part_keys: Sequence[str]) -> None:
        """This process is about to write ``release``'s ledger parts under ``part_keys``
        (:class:`LedgerParts`): when they are read back their records are not decoded,
        and if the draw wins, the index holds ``release`` itself — the records it was
        encoded from. Part keys carry the release id, which no other draw has, so what is
        under them is what this process wrote; which draw wins is decided as for any other
        (the first complete in log order). A 1,000,000-key release read back as a dict per
        record was most of a release's memory (issue 39)."""
        for i, key in enumerate(part_keys):
            self._own[key] = (release, i, len(part_keys))

    def feed(self, key: str, value: bytes | None) -> None:
        """One record, in log order. Unknown kinds are ignored (newer writers may add some)."""
        if value is None or key.startswith(FENCE_PREFIX):
            return
        self.records_read += 1
        own = self._own.get(key)
        if own is not None:
            self._feed_own_part(key, *own)
            return
        obj = orjson.loads(value)
        kind = obj.get("kind")
        if kind == "ledger":
            ident = (str(obj["query"]), epoch_of_iso(str(obj["window_start"])))
            if self._forget_released and self.covered(ident[1]):
                self.ignored_parts += 1
                self._note_sweep(ident[1], key)
                return
            self._part_keys.setdefault(ident, set()).add(key)
            self._feed_part(obj)
        elif kind == "published":
            ident = (str(obj["query"]), epoch_of_iso(str(obj["window_start"])))
            if self._forget_released and self.covered(ident[1]):
                self._note_sweep(ident[1], key)
                return
            self._published[ident] = str(obj["release_id"])
            rel = self._releases.get(ident)
            if rel is not None:
                rel.published = rel.release_id == self._published[ident]
        elif kind == "progress":
            r = int(obj["partials_partition"])
            nxt = epoch_of_iso(str(obj["next_window_start"]))
            self.partials_partitions = int(obj["partials_partitions"])
            if nxt > self.progress.get(r, nxt - 1):
                self.progress[r] = nxt
                if self._forget_released:
                    self._forget_covered()
        elif kind == "coverage":
            if self.coverage_start_s is None:
                self.coverage_start_s = epoch_of_iso(str(obj["first_window_start"]))
                self.coverage_window_size_s = int(obj["window_size_s"])
                self._feed_fingerprint(obj)
                if self._forget_released:
                    self._forget_covered()
            checks = obj.get("key_checks")
            if isinstance(checks, Mapping):
                for key_id, check in checks.items():
                    self._feed_key_check(key_id, check)
        elif kind == "key_check":
            self._feed_key_check(obj["key_id"], obj["key_check"])
        elif kind == "fingerprint":
            self._feed_fingerprint(obj)
        elif kind == "cut":
            ws = epoch_of_iso(str(obj["window_start"]))
            if self.latest_cut_s is None or ws > self.latest_cut_s:
                self.latest_cut_s = ws
        elif kind == "bounds":
            decision = _decode_bounds_decision(obj)
            if decision.window_start_s not in self.bounds:
                self.bounds[decision.window_start_s] = decision
                if len(self.bounds) > MAX_BOUNDS_DECISIONS:
                    del self.bounds[min(self.bounds)]
        elif kind == "rotation":
            self.rotations.add(
                (
                    str(obj["previous_key_id"]),
                    str(obj["key_id"]),
                    epoch_of_iso(str(obj["rotate_at"])),
                )
            )
            self._feed_key_check(obj["key_id"], obj.get("key_check"))
            self._feed_key_check(obj["previous_key_id"], obj.get("previous_key_check"))

    def covered(self, window_start_s: int, window_size_s: int | None = None) -> bool:
        """Whether a progress record read says the window is released (and published).
        The window size is the ledger's own (its coverage record's), else ``window_size_s``
        (the release stage's); the forgetting read uses only the ledger's: a configuration
        that does not continue the ledger is refused at start, after the read."""
        n = self.partials_partitions
        size = self.coverage_window_size_s or window_size_s
        if n is None or size is None:
            return False
        return window_start_s < self.progress.get((window_start_s // size) % n, window_start_s)

    def _note_sweep(self, window_start_s: int, key: str) -> None:
        if len(self.sweep) < MAX_SWEEP_KEYS:
            self.sweep.append((window_start_s, key))

    def _forget_covered(self) -> None:
        """Drop every window a progress record now covers, keeping its winners' ε, δ (for
        the budget's horizon) and noting its records' keys to tombstone."""
        idents = {*self._releases, *self._drafts, *self._published, *self._part_keys}
        gone = [i for i in idents if self.covered(i[1])]
        for ident in gone:
            rel = self._releases.pop(ident, None)
            if rel is not None:
                self.spent[ident] = (rel.epsilon_spent, rel.delta_spent)
            self._drafts.pop(ident, None)
            if self._published.pop(ident, None) is not None:
                self._note_sweep(ident[1], published_key(*ident))
            for key in sorted(self._part_keys.pop(ident, ())):
                self._note_sweep(ident[1], key)
        if gone:
            self._forget_own(self.covered)
        if gone and self._spent_kept_s is not None and self.spent:
            oldest = max(ws for _, ws in self.spent) - self._spent_kept_s
            self.spent = {i: v for i, v in self.spent.items() if i[1] >= oldest}

    def keys_of_window(self, window_start_s: int) -> list[str]:
        """Every part key read of the window (winners, losers, incomplete draws) and the
        published marker of each query read: what its release tombstones once its
        progress record is durable."""
        idents = {i for i in (*self._part_keys, *self._published) if i[1] == window_start_s}
        keys = {k for i in idents for k in self._part_keys.get(i, ())}
        keys.update(published_key(*i) for i in idents if i in self._published)
        return sorted(keys)

    def _feed_key_check(self, key_id: Any, check: Any) -> None:
        if check is not None:
            self.key_checks.setdefault(str(key_id), str(check))

    def _feed_fingerprint(self, obj: Mapping[str, Any]) -> None:
        if self.fingerprint is None and obj.get("fingerprint") is not None:
            self.fingerprint = Fingerprint.from_record(obj["fingerprint"])

    def _feed_part(self, value: Mapping[str, Any]) -> None:
        ident = (str(value["query"]), epoch_of_iso(str(value["window_start"])))
        rid = str(value["release_id"])
        drafts = self._drafts.setdefault(ident, {})
        parts = drafts.get(rid)
        if parts is None:
            parts = drafts[rid] = _Parts(
                parts=int(value["parts"]),
                release_id=rid,
                window_end_s=epoch_of_iso(str(value["window_end"])),
                epsilon_spent=float(value["epsilon_spent"]),
                delta_spent=float(value["delta_spent"]),
                sources={int(p): str(v) for p, v in value.get("sources", {}).items()},
                erasures_through=int(value.get("erasures_through", 0)),
            )
        parts.received[int(value["part"])] = [
            OutputRecord(str(r["key"]), r["value"]) for r in value["records"]
        ]
        if len(parts.received) < parts.parts:
            return
        del drafts[rid]
        if not drafts:
            del self._drafts[ident]
        if ident in self._releases:
            if self._releases[ident].release_id != rid:
                self.losing_draws += 1
            return
        self._releases[ident] = LedgerRelease(
            release_id=rid,
            query=ident[0],
            window_start_s=ident[1],
            window_end_s=parts.window_end_s,
            epsilon_spent=parts.epsilon_spent,
            delta_spent=parts.delta_spent,
            records=[r for i in range(parts.parts) for r in parts.received[i]],
            sources=parts.sources,
            # a window's bounds histograms are ledgered like a query, never published
            published=self._published.get(ident) == rid or ident[0] == BOUNDS_CHARGE,
            erasures_through=parts.erasures_through,
        )

    def _feed_own_part(self, key: str, release: LedgerRelease, part: int, parts: int) -> None:
        """A part of this process's own draw read back (:meth:`expect_own`): the same
        bookkeeping as :meth:`_feed_part`, the records taken from ``release``."""
        ident = (release.query, release.window_start_s)
        if self._forget_released and self.covered(ident[1]):
            self.ignored_parts += 1
            self._note_sweep(ident[1], key)
            return
        self._part_keys.setdefault(ident, set()).add(key)
        rid = release.release_id
        drafts = self._drafts.setdefault(ident, {})
        draft = drafts.get(rid)
        if draft is None:
            draft = drafts[rid] = _Parts(
                parts=parts,
                release_id=rid,
                window_end_s=release.window_end_s,
                epsilon_spent=release.epsilon_spent,
                delta_spent=release.delta_spent,
                sources=release.sources,
                erasures_through=release.erasures_through,
            )
        draft.received[part] = []  # the records are the release's own
        if len(draft.received) < draft.parts:
            return
        del drafts[rid]
        if not drafts:
            del self._drafts[ident]
        if ident in self._releases:
            if self._releases[ident].release_id != rid:
                self.losing_draws += 1
            return
        release.published = self._published.get(ident) == rid or ident[0] == BOUNDS_CHARGE
        self._releases[ident] = release

    def get(self, query: str, window_start_s: int) -> LedgerRelease | None:
        """The winning draw of (query, window), if one is complete in what was read."""
        return self._releases.get((query, window_start_s))

    def releases(self) -> list[LedgerRelease]:
        return sorted(self._releases.values(), key=lambda r: (r.window_start_s, r.query))

    def unpublished(self) -> list[LedgerRelease]:
        return [r for r in self.releases() if not r.published]

    def window_complete(self, window_start_s: int, queries: Sequence[str]) -> bool:
        return all((q, window_start_s) in self._releases for q in queries)

    def forget(self, released: Callable[[int], bool]) -> None:
        """Drop what is kept of windows ``released`` says are done (released, published and
        recorded by a progress record): the index then holds only recent windows."""
        for table in (self._releases, self._drafts, self._published, self._part_keys):
            for ident in [i for i in table if released(i[1])]:
                del table[ident]
        self._forget_own(released)

    def _forget_own(self, released: Callable[[int], bool]) -> None:
        for key in [k for k, (rel, _, _) in self._own.items() if released(rel.window_start_s)]:
            del self._own[key]
