"""The internal partials topic: how stage 1 hands bounded counts to the one stage-2 owner.

Stage 1 (whoever owns an input partition) bounds each user's contributions and, when its
partition's watermark passes a window's end, publishes that partition's exact bounded
totals per query and key — a *partial*. Every partial of a window goes to one partition of
the partials topic (:func:`partials_partition`), so one stage-2 owner sees all of them.
After its partials are acknowledged, stage 1 writes a :class:`SourceWatermark` for its
partition to *every* partials partition: within a partition records keep their order, so
a stage-2 owner that has read a watermark has read every partial it covers.

A partial may be published twice for one (query, window, source partition): stage 1
replays its input after a crash and its reservoirs sample anew. Each publication carries a
fresh ``version``; stage 2 takes the first complete version, never a sum of two — unless a
later version applied more erasures (``erasures_through``, docs/erasure.md): stage 1
publishes one when an erasure reaches a window it sealed, and stage 2 takes that instead.

Partials hold exact counts per key and no raw id: the topic is internal and access-controlled
(docs/architecture.md#where-each-number-goes). Schema: ``topics/partials.schema.json``.

Group keys travel as JSON arrays of their values and are read back in canonical form
(:mod:`stream_dp.privacy.group_values`), so stage 2 merges the totals of ``true`` and of 1
into two keys, as stage 1 kept them.

Totals stay columns (:class:`~stream_dp.privacy.key_totals.KeyTotals`) from the seal to the
release, and travel as columns (:mod:`.partials_columns`): a part is encoded with one orjson
call and decoded into columns, with no Python object per key on the way but the group keys
(a 100,000-key window's partial took 1.9 s to encode and decode one key at a time). Parts of
earlier versions, an entry per key, are still read.
"""

from __future__ import annotations

import itertools
import math
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, overload

import numpy as np
import orjson

from stream_dp.errors import StreamDPError
from stream_dp.pipeline.formats.partials_columns import (
    COLUMNS_MEMBER,
    canonical_group_keys,
    check_distinct,
    checked_bin_counts,
    columns_layout,
    columns_partial,
    decode_columns_member,
    encode_columns,
)
from stream_dp.pipeline.formats.partials_plain import plain_partial
from stream_dp.pipeline.formats.records import SCHEMA_VERSION
from stream_dp.privacy.exponential.bin_counts import BinCounts
from stream_dp.privacy.key_totals import KeyAggregate, KeyTotals
from stream_dp.windows.tumbling import epoch_of_iso, iso_utc

WATERMARK_KEY_PREFIX: Final = "__watermark__|"
#: Room left in every part for the record's key and Kafka's record overhead.
RECORD_OVERHEAD_BYTES: Final = 1024

GroupKey = tuple[Any, ...]


class PartialFormatError(ValueError):
    """A record on the partials topic that is not a partial or watermark of this schema."""


@dataclass(frozen=True, slots=True)
class Partial:
    """One source partition's exact bounded totals for one (query, window)."""

    query: str
    window_start_s: int
    source_partition: int
    version: str
    totals: Mapping[GroupKey, KeyAggregate]
    #: Events the partition's reservoirs saw for the window, and kept after bounding.
    events_seen: int
    events_retained: int
    #: The layout the totals were bounded under: the stage-1 topic's partition count, the
    #: pseudonym key id and the user placement (which topic and partitioner put a user's
    #: events on their partition; stream_dp.config.classification.user_placement). Stage 2
    #: merges partials of one layout only (a user is on one partition, under one pseudonym,
    #: only within one layout).
    source_partitions: int = 1
    key_id: str = ""
    placement: str = ""
    #: Erasure-log position the source had applied when it computed the totals.
    erasures_through: int = 0
    #: ``bounds: auto``: the (k, L0, Linf) the totals were bounded with, and the source
    #: partition's exact histograms of the window's users (internal, like the totals).
    bounds: tuple[int, int | None, int | None] | None = None
    histograms: Mapping[str, Sequence[int]] | None = None
    #: The digest of the deployment fingerprint the totals were bounded under
    #: (:mod:`stream_dp.config.fingerprint`); stage 2 merges only its own.
    fingerprint: str = ""
    #: The check value of the pseudonym key the totals were bounded under (its secret, where
    #: ``key_id`` is only its name; :mod:`stream_dp.pipeline.key_check_gate`); stage 2
    #: merges only its window's key's, and never a partial without one.
    key_check: str = ""


@dataclass(frozen=True, slots=True)
class PartialPart:
    query: str
    window_start_s: int
    source_partition: int
    version: str
    part: int
    parts: int
    events_seen: int
    events_retained: int
    totals: Sequence[tuple[GroupKey, KeyAggregate]]
    source_partitions: int = 1
    key_id: str = ""
    placement: str = ""
    erasures_through: int = 0
    bounds: tuple[int, int | None, int | None] | None = None
    histograms: Mapping[str, Sequence[int]] | None = None
    fingerprint: str = ""
    key_check: str = ""


@dataclass(frozen=True, slots=True)
class SourceWatermark:
    """How far one source partition's stage 1 has sealed windows.

    Every partial of a window ending at or before ``watermark_s`` precedes this record on
    the partition it was read from. ``idle``: the partition delivered nothing for the idle
    timeout; with ``open_windows`` false it has nothing left to contribute and holds no
    window back.
    """

    source_partition: int
    source_partitions: int
    watermark_s: float | None
    idle: bool
    open_windows: bool
    #: How long the partition has been idle (0 when active): a reader trusts "idle" only
    #: once this has grown by IDLE_CONFIRM_S since another source last woke up.
    idle_for_s: float = 0.0

    @property
    def quiet(self) -> bool:
        """Idle with nothing open: the partition has nothing left to contribute for now."""
        return self.idle and not self.open_windows


def new_version() -> str:
    return uuid.uuid4().hex


def encode_partial(partial: Partial, *, max_bytes: int) -> list[tuple[str, bytes]]:
    """The (key, value) records of one partial, in part order, each under ``max_bytes``.

    Parts are cut by encoded size, not by key count: group keys may be long (URLs).
    """
    window = iso_utc(partial.window_start_s)
    key = f"{partial.query}|{window}|{partial.source_partition}"
    totals = KeyTotals.of(partial.totals)
    header: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "kind": "partial",
        "query": partial.query,
        "window_start": window,
        "source_partition": partial.source_partition,
        "source_partitions": partial.source_partitions,
        "key_id": partial.key_id,
        "version": partial.version,
        "part": 0,
        "parts": 0,
        "events_seen": partial.events_seen,
        "events_retained": partial.events_retained,
    }
    if partial.placement:
        header["placement"] = partial.placement
    if partial.erasures_through:
        header["erasures_through"] = partial.erasures_through
    if partial.bounds is not None:
        header["bounds"] = list(partial.bounds)
    if partial.fingerprint:
        header["fingerprint"] = partial.fingerprint
    if partial.key_check:
        header["key_check"] = partial.key_check
    if partial.histograms is not None:
        header["histograms"] = {n: list(v) for n, v in partial.histograms.items()}
    head = orjson.dumps(header)
    # Room for the columns: the record's limit less the header (its part numbers grow by
    # a few digits) and the member's name.
    budget = max_bytes - RECORD_OVERHEAD_BYTES - len(key) - len(head) - len(COLUMNS_MEMBER) - 32
    chunks = columns_in_parts(totals, budget, what=f"a partial of query {partial.query}")
    out = []
    for i, chunk in enumerate(chunks):
        head = orjson.dumps({**header, "part": i, "parts": len(chunks)})
        out.append((key, head[:-1] + COLUMNS_MEMBER + chunk + b"}"))
    return out


def columns_in_parts(totals: KeyTotals, budget: int, *, what: str) -> list[bytes]:
    """The ``columns`` members of consecutive slices of ``totals``, each of at most
    ``budget`` bytes, in order (one, possibly of no keys, when they all fit).

    The whole is encoded first (one orjson call: a window's partial usually fits one
    record); a larger one is cut into about size × 1.05 / budget slices of equal key
    counts, a slice that is still too large halved. A key that alone exceeds the budget can
    never be written: :class:`RecordTooLargeError` names the setting to change.
    """
    count = len(totals)
    layout = columns_layout(totals)
    whole = encode_columns(totals, 0, count, layout)
    if len(whole) <= budget:
        return [whole]
    if count == 0:  # the header alone leaves no room (a huge bounds: auto histogram)
        raise _too_large(what, len(whole))
    out: list[bytes] = []
    pieces = min(count, math.ceil(len(whole) * 1.05 / budget))
    del whole
    bounds = np.linspace(0, count, pieces + 1).astype(int).tolist()
    pending = list(itertools.pairwise(bounds))[::-1]
    while pending:
        lo, hi = pending.pop()
        blob = encode_columns(totals, lo, hi, layout)
        if len(blob) <= budget:
            out.append(blob)
        elif hi - lo == 1:
            raise _too_large(what, len(blob))
        else:
            mid = (lo + hi) // 2
            pending += [(mid, hi), (lo, mid)]
    return out


class RecordTooLargeError(StreamDPError):
    """One entry of an internal record cannot fit under ``kafka.max_message_bytes``."""


def _too_large(what: str, size: int) -> RecordTooLargeError:
    return RecordTooLargeError(
        f"{what} has an entry of {size} bytes that cannot fit in one record of "
        "kafka.max_message_bytes; raise it (and the brokers' message.max.bytes) or "
        "lower input.max_record_bytes"
    )


def part_bounds(sizes: np.ndarray, budget: int, *, what: str) -> list[tuple[int, int]]:
    """The greedy cut of entries of ``sizes`` bytes into JSON arrays of at most ``budget``
    bytes: each part's ``[lo, hi)``, in order (one ``(0, 0)`` when there are none)."""
    if not sizes.size:
        return [(0, 0)]
    sizes = sizes + 1
    too_large = np.flatnonzero(sizes + 2 > budget)
    if too_large.size:
        raise _too_large(what, int(sizes[too_large[0]]) - 1)
    # Greedy, as one entry at a time: a chunk [lo, hi) holds 2 + Σ (size + 1) ≤ budget.
    ends = np.concatenate(([0], np.cumsum(sizes)))
    bounds = []
    lo = 0
    while lo < sizes.size:
        hi = int(np.searchsorted(ends, ends[lo] + budget - 2, side="right")) - 1
        bounds.append((lo, hi))
        lo = hi
    return bounds


def join_in_parts(
    entries: Sequence[bytes],
    budget: int,
    *,
    what: str,
    wrap: Callable[[int, int], tuple[bytes, bytes]] | None = None,
) -> list[bytes]:
    """Encoded entries joined into JSON arrays of at most ``budget`` bytes each, in order.

    Always at least one (possibly empty) array; an entry that alone exceeds the budget can
    never be written (:class:`RecordTooLargeError`). ``wrap(part, parts)``: the bytes
    before and after part ``part`` of ``parts`` (default ``[`` and ``]``), written in the
    same copy as the entries (a part of a 1,000,000-key release is hundreds of MB: each
    extra concatenation copies it again).
    """
    bounds = part_bounds(np.fromiter(map(len, entries), np.int64, len(entries)), budget, what=what)
    chunks = []
    for i, (lo, hi) in enumerate(bounds):
        head, tail = (b"[", b"]") if wrap is None else wrap(i, len(bounds))
        items = list(entries[lo:hi])
        if not items:
            chunks.append(head + tail)
            continue
        items[0] = head + items[0]
        items[-1] = items[-1] + tail
        chunks.append(b",".join(items))
    return chunks


def encode_watermark(mark: SourceWatermark) -> tuple[str, bytes]:
    value = {
        "schema_version": SCHEMA_VERSION,
        "kind": "watermark",
        "source_partition": mark.source_partition,
        "source_partitions": mark.source_partitions,
        "watermark_s": mark.watermark_s,
        "idle": mark.idle,
        "open_windows": mark.open_windows,
        "idle_for_s": mark.idle_for_s,
    }
    return f"{WATERMARK_KEY_PREFIX}{mark.source_partition}", orjson.dumps(value)


def decode(value: bytes | None) -> PartialPart | SourceWatermark:
    """Parse one partials-topic record; :class:`PartialFormatError` if it is not one."""
    if value is None:
        raise PartialFormatError("empty record")
    # Most parts: msgspec, exactly orjson's result, or None. Columns, then the per-key
    # entries of earlier versions.
    plain = columns_partial(value) or plain_partial(value)
    try:
        if plain is not None:
            return _partial_part(plain[0], plain[1])
        obj = orjson.loads(value)
        kind = obj["kind"]
        if kind == "watermark":
            wm = obj["watermark_s"]
            return SourceWatermark(
                source_partition=int(obj["source_partition"]),
                source_partitions=int(obj["source_partitions"]),
                watermark_s=None if wm is None else float(wm),
                idle=bool(obj["idle"]),
                open_windows=bool(obj["open_windows"]),
                idle_for_s=float(obj.get("idle_for_s", 0.0)),
            )
        if kind == "partial":
            return _partial_part(obj, None)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, OverflowError) as exc:
        raise PartialFormatError(f"malformed partials record: {exc}") from None
    raise PartialFormatError(f"unknown partials record kind {kind!r}")


def _partial_part(obj: dict[str, Any], totals: KeyTotals | None) -> PartialPart:
    """A part from its decoded record (``totals``: decoded already, or None to decode the
    record's ``columns`` member, or the ``totals`` member of an earlier version)."""
    if not 0 <= int(obj["part"]) < int(obj["parts"]):
        raise ValueError(f"part {obj['part']} of {obj['parts']}")
    return PartialPart(
        query=str(obj["query"]),
        window_start_s=epoch_of_iso(str(obj["window_start"])),
        source_partition=int(obj["source_partition"]),
        version=str(obj["version"]),
        part=int(obj["part"]),
        parts=int(obj["parts"]),
        events_seen=int(obj["events_seen"]),
        events_retained=int(obj["events_retained"]),
        source_partitions=int(obj.get("source_partitions", 1)),
        key_id=str(obj.get("key_id", "")),
        placement=str(obj.get("placement", "")),
        erasures_through=int(obj.get("erasures_through", 0)),
        bounds=_bounds(obj.get("bounds")),
        histograms=_histograms(obj.get("histograms")),
        fingerprint=str(obj.get("fingerprint", "")),
        key_check=str(obj.get("key_check", "")),
        totals=TotalsRows(_totals_member(obj) if totals is None else totals),
    )


def _totals_member(obj: dict[str, Any]) -> KeyTotals:
    """The part's totals: its ``columns``, or the ``totals`` entries of earlier versions
    (never both: which would count?)."""
    if "columns" in obj:
        if "totals" in obj:
            raise ValueError("a part holds columns and totals: one form only")
        return decode_columns_member(obj["columns"])
    return _decode_totals(obj["totals"])


def _decode_totals(entries: Any) -> KeyTotals:
    """[[group values, events, users, value sum(, selection weight(, value squares(, bin
    counts)))], …] into columns, keys in canonical form (the weight is there for ``selection:
    weighted_gaussian`` only, the squares for ``statistic: variance`` only, the list of
    histogram bin counts for ``statistic: quantile`` only)."""
    if type(entries) is not list:
        raise TypeError("totals must be a list")
    lengths = set(map(len, entries)) if type(entries) is list else set()
    if set(map(type, entries)) - {list} or lengths - {4, 5, 6, 7}:
        raise TypeError("a totals entry must be a list of 4 to 7 items")
    histograms: BinCounts | None = None
    # One pass per column in C (zip), not a Python loop per entry (1,000,000 keys: seconds).
    if lengths <= {4}:
        groups, events, users, sums = _transposed(entries, 4)
        weights: Iterable[Any] = itertools.repeat(0, len(entries))
        squares: Iterable[Any] = itertools.repeat(0, len(entries))
    elif 7 in lengths:
        if lengths != {7}:
            raise TypeError("every totals entry of a quantile's part has 7 items")
        groups, events, users, sums, weights, squares, bins = _transposed(entries, 7)
        histograms = _bin_counts(bins)
    else:
        padded = [[*entry, 0, 0][:6] for entry in entries]
        groups, events, users, sums, weights, squares = _transposed(padded, 6)
    if set(map(type, groups)) - {list}:
        raise TypeError("a group key must be a list")
    keys = canonical_group_keys(list(groups))
    check_distinct(keys)
    n = len(keys)
    columns = [
        np.fromiter(map(int, c), np.int64, n) for c in (events, users, sums, weights, squares)
    ]
    if (columns[3] < 0).any():
        raise ValueError("a selection weight is negative")
    if (columns[4] < 0).any():
        raise ValueError("a sum of squares is negative")
    events_c, users_c, sums_c, weights_c, squares_c = columns
    return KeyTotals(keys, events_c, users_c, sums_c, weights_c, squares_c, histograms)


def _bin_counts(rows: Sequence[Any]) -> BinCounts:
    """A quantile's histogram per key, sparse: [bins, [bin indices], [counts]], one number of
    bins for every key, the indices strictly increasing in [0, bins), the counts >= 1."""
    if set(map(type, rows)) - {list} or set(map(len, rows)) - {3}:
        raise TypeError("a histogram must be [bins, [bin indices], [counts]]")
    widths, indices, counts = _transposed(list(rows), 3)
    if set(map(type, widths)) - {int} or len(set(widths)) > 1:
        raise TypeError("every histogram of a part must have one integer number of bins")
    if set(map(type, indices)) - {list} or set(map(type, counts)) - {list}:
        raise TypeError("a histogram's bin indices and counts must be lists")
    sizes = np.fromiter(map(len, indices), np.int64, len(indices))
    if not np.array_equal(sizes, np.fromiter(map(len, counts), np.int64, len(counts))):
        raise ValueError("a histogram needs one count per bin index")
    flat_index = list(itertools.chain.from_iterable(indices))
    flat_counts = list(itertools.chain.from_iterable(counts))
    if set(map(type, flat_index)) - {int} or set(map(type, flat_counts)) - {int}:
        raise TypeError("a bin index and a bin count must be integers")
    return checked_bin_counts(widths[0] if widths else 1, sizes, flat_index, flat_counts)


def _transposed(entries: list[Any], width: int) -> list[Sequence[Any]]:
    """The columns of equally long rows (empty columns for no rows)."""
    return list(zip(*entries, strict=True)) if entries else [() for _ in range(width)]


class TotalsRows(Sequence[tuple[GroupKey, KeyAggregate]]):
    """A part's totals as (group key, aggregate) pairs, backed by columns."""

    __slots__ = ("columns",)

    def __init__(self, columns: KeyTotals) -> None:
        self.columns = columns

    def __len__(self) -> int:
        return len(self.columns)

    def __iter__(self) -> Iterator[tuple[GroupKey, KeyAggregate]]:
        weights = self.columns.selection_weights.tolist()
        squares = self.columns.value_squares.tolist()
        hist = self.columns.value_bins
        bins = (tuple(hist.row(i).tolist()) if hist.bins else () for i in range(len(hist)))
        for (g, e, u, v), w, q, b in zip(self.columns.rows(), weights, squares, bins, strict=True):
            yield g, KeyAggregate(e, u, v, w, q, b)

    @overload
    def __getitem__(self, i: int) -> tuple[GroupKey, KeyAggregate]: ...
    @overload
    def __getitem__(self, i: slice) -> list[tuple[GroupKey, KeyAggregate]]: ...
    def __getitem__(
        self, i: int | slice
    ) -> tuple[GroupKey, KeyAggregate] | list[tuple[GroupKey, KeyAggregate]]:
        rows = list(self)
        return rows[i]


def _bounds(value: Any) -> tuple[int, int | None, int | None] | None:
    if value is None:
        return None
    k, l0, linf = value
    return (int(k), None if l0 is None else int(l0), None if linf is None else int(linf))


def _histograms(value: Any) -> dict[str, tuple[int, ...]] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TypeError("histograms must be an object")
    return {str(n): tuple(int(v) for v in values) for n, values in value.items()}


class PartialAssembler:
    """Collects parts per (query, window, source partition): the first complete version is
    taken, and replaced only by a later complete version that applied more erasures."""

    def __init__(self) -> None:
        self._parts: dict[str, dict[int, PartialPart]] = {}
        self.taken: Partial | None = None
        #: Left out on purpose (bounded under another layout, or erasure-stale): a window
        #: released without it is not missing a report it waits for.
        self.left_out = False

    @property
    def incomplete(self) -> bool:
        """Parts of a version were read but no version is complete: the source reported
        the window, and stage 2 has not got all of it (a part lost or malformed)."""
        return self.taken is None and not self.left_out and bool(self._parts)

    def supersedes(self, part: PartialPart) -> bool:
        """Whether ``part`` belongs to a version that would replace the taken one."""
        taken = self.taken
        return taken is None or (
            part.version != taken.version and part.erasures_through > taken.erasures_through
        )

    def add(self, part: PartialPart) -> bool:
        """Add a part; True when this completed a version that is now ``taken`` (the first,
        or one that supersedes it)."""
        if not self.supersedes(part):
            return False
        received = self._parts.setdefault(part.version, {})
        received[part.part] = part
        if len(received) < part.parts:
            return False
        totals = KeyTotals.concat([_columns(received[i].totals) for i in range(part.parts)])
        self.taken = Partial(
            query=part.query,
            window_start_s=part.window_start_s,
            source_partition=part.source_partition,
            version=part.version,
            totals=totals,
            events_seen=part.events_seen,
            events_retained=part.events_retained,
            source_partitions=part.source_partitions,
            key_id=part.key_id,
            placement=part.placement,
            erasures_through=part.erasures_through,
            bounds=part.bounds,
            histograms=part.histograms,
            fingerprint=part.fingerprint,
            key_check=part.key_check,
        )
        # Versions that could no longer replace this one are dropped; later ones may come.
        self._parts = {
            v: parts
            for v, parts in self._parts.items()
            if next(iter(parts.values())).erasures_through > part.erasures_through
        }
        return True


def _columns(totals: Sequence[tuple[GroupKey, KeyAggregate]]) -> KeyTotals:
    if isinstance(totals, TotalsRows):
        return totals.columns
    return KeyTotals.of(dict(totals))


def merge_totals(partials: Sequence[Partial]) -> KeyTotals:
    """Per-key sums over source partitions (a user's events all live in one partition)."""
    return KeyTotals.merge([p.totals for p in partials])
