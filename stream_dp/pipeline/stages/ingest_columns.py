"""Stage 1 a batch at a time: the column paths of :class:`IngestStage`, and what stages 0
and 1 share (records, dead letters, the decoder, pseudonyms of raw ids).

:class:`IngestStage` (``ingest.py``) is built from collaborators: how raw input is read
(:class:`InputForm`), the held state (:class:`WindowStore`), the partition counts placement
is checked against (:class:`Sources`), the per-record path
(:class:`~stream_dp.pipeline.stages.ingest_records.RecordPath`) and :class:`ColumnPath`, the
paths that take a whole fetched batch as columns (:mod:`stream_dp.pipeline.stages.columns`,
:mod:`stream_dp.pipeline.formats.packed`):

* stage 1 on raw input (:meth:`ColumnPath.ingest_columns`), when every record is a good
  event of the common form — else the per-record path takes the batch, with the same
  result;
* stage 1 on a packed repartition record (:meth:`ColumnPath.ingest_packed`).

Stage 0 writing packed records is
:meth:`~stream_dp.pipeline.stages.router.RoutingStage.route_packed`.

The privacy-relevant checks are the per-record path's, done on columns: placement of keyed
records and of repartitioned pseudonyms, re-sent events, the window's pseudonym key, late
and replayed windows; a user is bounded in one partition's samples only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from stream_dp.config.model import Config
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.formats.decode import BadRecord, Decoder
from stream_dp.pipeline.formats.packed import PackedEvents
from stream_dp.pipeline.key_check_gate import KEY_CHECK_FIX
from stream_dp.pipeline.stages.columns import (
    decode_columns,
    intern_signatures,
    pseudonym_columns,
)
from stream_dp.pipeline.stages.placement import (
    SourceLayout,
    partition_function,
    partitions_function,
    pseudonym_partitions,
)
from stream_dp.pipeline.stages.queries import DROP_REASONS, CompiledQuery, needed_fields
from stream_dp.privacy.adaptive_bounds import BoundsTriple
from stream_dp.privacy.erasure import ErasureSet
from stream_dp.privacy.pseudonymize import (
    KeyRing,
    UserIdNormalization,
    canonical_user_ids,
    normalized_user_ids,
    user_id_normalizer,
)
from stream_dp.privacy.user_samples import SamplingGenerator, UserSamples
from stream_dp.windows import TumblingWindows, WatermarkTracker

log = logging.getLogger(__name__)

#: The signature table is compacted once it holds at least this many entries and has doubled
#: since it was last compacted.
SIGNATURES_COMPACT_MIN = 4096

#: Distinct strings shared per signature position: a position with more (a domain, a URL)
#: is not shared any more, one with fewer (a country) keeps one string per value.
SHARED_VALUES_MAX = 4096

#: What ingest does with an event, decided once per window: keep it, or count it as late
#: (its partition already sealed the window) or replayed (the window is already released).
ACCEPT, LATE, REPLAYED = 0, 1, 2

#: (offset, Kafka record key, value)
InputRecord = tuple[int, bytes | None, bytes | None]


class FetchedRecords(Sequence[InputRecord]):
    """A partition's fetched records (anything with ``offset``, ``key`` and ``value``, as
    aiokafka's ConsumerRecord) as a sequence of (offset, key, value) — built only if a
    per-record path asks — whose columns the column paths take directly."""

    __slots__ = ("_messages", "_tuples")

    def __init__(self, messages: Sequence[Any]) -> None:
        self._messages = messages
        self._tuples: list[InputRecord] | None = None

    def _all(self) -> list[InputRecord]:
        if self._tuples is None:
            self._tuples = [(m.offset, m.key, m.value) for m in self._messages]
        return self._tuples

    def __len__(self) -> int:
        return len(self._messages)

    def __getitem__(self, i: Any) -> Any:
        return self._all()[i]

    def __iter__(self) -> Iterator[InputRecord]:
        return iter(self._all())

    def values(self) -> list[bytes | None]:
        return [m.value for m in self._messages]

    def keys(self) -> list[bytes | None]:
        return [m.key for m in self._messages]

    def offsets(self) -> list[int]:
        return [m.offset for m in self._messages]


def _values(records: Sequence[InputRecord]) -> list[bytes | None]:
    if isinstance(records, FetchedRecords):
        return records.values()
    return [v for _, _, v in records]


def _keys(records: Sequence[InputRecord]) -> list[bytes | None]:
    if isinstance(records, FetchedRecords):
        return records.keys()
    return [k for _, k, _ in records]


def _offset_at(records: Sequence[InputRecord], row: int) -> int:
    if isinstance(records, FetchedRecords):
        offset: int = records._messages[row].offset
        return offset
    return records[row][0]


def _gather(values: list[bytes], index: np.ndarray) -> list[bytes]:
    """``values[i]`` for each ``i`` of ``index``: numpy's gather over an object array, no
    Python call per item (bytes are scalars to numpy, so each is one element)."""
    table = np.empty(len(values), dtype=object)
    table[:] = values
    gathered: list[bytes] = table[index].tolist()
    return gathered


def _distinct_starts(starts: np.ndarray) -> list[int]:
    """The distinct window starts of a batch, ascending (most batches hold one window)."""
    if starts[0] == starts[-1] and (starts == starts[0]).all():
        return [int(starts[0])]
    distinct: list[int] = np.unique(starts).tolist()
    return distinct


@dataclass(frozen=True, slots=True)
class DeadLetter:
    reason: str
    detail: str
    partition: int
    offset: int
    payload: bytes | None
    #: The topic it was read from; None: the input topic.
    topic: str | None = None


def dead_letter(
    metrics: Metrics,
    bad: BadRecord,
    partition: int,
    offset: int,
    value: bytes | None,
    include_payload: bool,
    topic: str | None = None,
) -> DeadLetter:
    """A bad record as a dead letter (its payload only if configured), counted by reason."""
    metrics.bad_records.labels(reason=bad.reason).inc()
    return DeadLetter(
        bad.reason, bad.detail, partition, offset, value if include_payload else None, topic
    )


def input_decoder(config: Config) -> tuple[Decoder, list[str], list[str]]:
    """The decoder of raw input records, the event fields the queries need, and which of
    them are scalar (both stages decode raw input the same way)."""
    fields, scalar, numeric = needed_fields(config.queries)
    decoder = Decoder(
        user_field=config.input.user_field,
        time_field=config.input.time_field,
        max_record_bytes=config.input.max_record_bytes,
        max_future_s=config.input.max_future_s,
        scalar_fields=scalar,
        numeric_fields=numeric,
    )
    return decoder, fields, scalar


def empty_user_record(config: Config) -> BadRecord:
    """The dead letter of a user id that normalises to nothing."""
    return BadRecord(
        "bad_user",
        f"field {config.input.user_field!r} is empty once input.user_id_normalization "
        "removes its surrounding whitespace",
    )


#: Pseudonym of a user id that normalises to nothing (dead-lettered).
EMPTY_ID = b""


def pseudonym_of(
    user: str | int,
    normalize: Callable[[str | int], str | int],
    pseudonymize: Callable[[str | int], bytes],
) -> bytes:
    """The pseudonym of a raw id (normalised first); :data:`EMPTY_ID` if nothing is left."""
    normal = normalize(user)
    if normal == "":
        return EMPTY_ID
    return pseudonymize(normal)


def window_starts(times: np.ndarray, window_size_s: int) -> np.ndarray:
    """The start of each event time's tumbling window."""
    return (np.floor(times / window_size_s) * window_size_s).astype(np.int64)


#: Bytes one event takes in a sample: its pseudonym (two 64-bit words), priority and item.
ROW_BYTES = 16 + 8 + 4
#: Bytes one event can add, per ``statistic: quantile`` query, to the histograms a seal of its
#: window builds (:class:`~stream_dp.privacy.exponential.bin_counts.BinCounts`): its bin's
#: index and count (16), its key's row start (8) and, counted per event as a bound, the
#: table's closing start (8): 16·values + 8·keys + 8 ≤ 32·values for a window with values.
HISTOGRAM_ROW_BYTES = 16 + 8 + 8


@dataclass(slots=True)
class WindowPart:
    samples: UserSamples
    first_offset: int
    #: Events that arrived for the window, erased users' included, whatever erasures, the
    #: bound k or compaction took out since: what :meth:`WindowStore.held_bytes` counts.
    events_arrived: int = 0


class ReleasedWindows(Protocol):
    """What stage 1 needs to know of stage 2 (implemented by ReleaseStage)."""

    @property
    def coverage_start_s(self) -> int | None:
        """The first covered window (None while unknown)."""
        ...

    def released(self, window_start_s: int) -> bool: ...

    @property
    def first_unreleased_s(self) -> int | None:
        """The earliest covered window not known released (None while unknown)."""
        ...

    @property
    def last_release_wall_s(self) -> float | None:
        """When the deployment last released a window (None: never, or unknown)."""
        ...

    def released_earlier(self, window_start_s: int) -> bool: ...

    def bounds_for(self, window_start_s: int) -> BoundsTriple | None:
        """``bounds: auto``: the window's bounds, None while undecided (stage 1 waits)."""
        ...


@dataclass(frozen=True, slots=True)
class InputForm:
    """How stage 1 reads raw input (the decoder collaborator): the decoder, the event fields
    the queries need (and which are scalar), user id normalisation and the placement
    functions keyed input is checked with, all fixed by the configuration."""

    decoder: Decoder
    fields: list[str]
    scalar_fields: tuple[str, ...]
    normalization: UserIdNormalization
    normalize: Callable[[str | int], str | int]
    empty_user: BadRecord
    partition_of_key: Callable[[bytes, int], int]
    partitions_of_keys: Callable[[Sequence[bytes], int], np.ndarray]
    include_payload: bool


def input_form(config: Config) -> InputForm:
    decoder, fields, scalar = input_decoder(config)
    normalization: UserIdNormalization = config.input.user_id_normalization
    return InputForm(
        decoder=decoder,
        fields=fields,
        scalar_fields=tuple(scalar),
        normalization=normalization,
        normalize=user_id_normalizer(normalization),
        empty_user=empty_user_record(config),
        partition_of_key=partition_function(config.input.partitioner),
        partitions_of_keys=partitions_function(config.input.partitioner),
        include_payload=config.output.dead_letter_include_payload,
    )


@dataclass(slots=True)
class Sources:
    """The partition counts stage 1 checks placement against, learned by the transport
    (:meth:`~stream_dp.pipeline.stages.ingest.IngestStage.learn_partitions`): of the stage-1
    topic (keyed input after a change: per window, ``layout``) and of the input topic (the
    sources of each repartition partition)."""

    source_partitions: int
    input_partitions: int
    layout: SourceLayout


class WindowStore:
    """Stage 1's held state, per partition of the stage-1 topic: each open window's
    :class:`WindowPart`, the next offset read, how far it sealed, the repartitioned records
    already seen, the sealed windows kept for their release (and those due a re-seal), and
    the table of interned event signatures the samples' items point into."""

    def __init__(
        self,
        windows: TumblingWindows,
        metrics: Metrics,
        *,
        k: int,
        rng: SamplingGenerator,
        keep_sealed: bool,
        histogram_queries: int = 0,
    ) -> None:
        self.windows = windows
        self.metrics = metrics
        self.k = k
        self.rng = rng
        #: What :meth:`held_bytes` counts per arrived event: the sample's row and, per
        #: ``statistic: quantile`` query, what the seal's histograms can take for it.
        self.row_bytes = ROW_BYTES + HISTOGRAM_ROW_BYTES * histogram_queries
        #: Keep sealed windows until their release is known (the worker, with erasure on).
        self.keep_sealed = keep_sealed
        self.parts: dict[int, dict[int, WindowPart]] = {}
        self.positions: dict[int, int] = {}
        self.sealed_s: dict[int, float] = {}
        #: Per repartition partition: source partition → largest source offset seen.
        self.routed_seen: dict[int, dict[int, int]] = {}
        #: Per partition, sealed windows kept for a possible re-seal; and those due one.
        self.kept: dict[int, set[int]] = {}
        self.reseal: set[tuple[int, int]] = set()
        #: (partition, window)s sealed whose partials are written but not yet acknowledged
        #: (:class:`~stream_dp.pipeline.handoff.Handoff`): closed to events (``sealed_s``),
        #: their state and input offsets held, an erasure reaching them re-seals them.
        self.sealing: set[tuple[int, int]] = set()
        self.signatures: list[tuple[Any, ...]] = []
        self.signature_ids: dict[tuple[Any, ...], int] = {}
        self._compact_signatures_at = SIGNATURES_COMPACT_MIN
        #: Per signature position, its strings (None once it had too many to share).
        self._shared: list[dict[str, str] | None] = []

    def part(self, state: dict[int, WindowPart], window_start_s: int, offset: int) -> WindowPart:
        """A window's part in a partition's ``state``, created at ``offset`` if new."""
        part = state.get(window_start_s)
        if part is None:
            part = state[window_start_s] = WindowPart(UserSamples(self.k, self.rng), offset)
        return part

    def accept(
        self,
        partition: int,
        window_start_s: int,
        first_offset: int,
        words: np.ndarray,
        signature_ids: np.ndarray,
        *,
        arrived: int,
    ) -> None:
        """Offer accepted events of one window to its samples (creating its state);
        ``arrived`` counts erased users' events dropped on arrival too."""
        part = self.part(self.parts.setdefault(partition, {}), window_start_s, first_offset)
        part.events_arrived += arrived
        part.samples.add_columns(words, signature_ids)

    def intern(self, signature: tuple[Any, ...]) -> int:
        sid = self.signature_ids.get(signature)
        if sid is None:
            signature = self._sharing(signature)
            sid = self.signature_ids[signature] = len(self.signatures)
            self.signatures.append(signature)
        return sid

    def _sharing(self, signature: tuple[Any, ...]) -> tuple[Any, ...]:
        """A new signature whose strings are those of earlier signatures where a position
        has few distinct ones (issue 39: a 1M-key window held a country string per
        signature, ~50 bytes each). Only ``str`` values: equal values of other types
        (1, 1.0, True) are not made one."""
        shared = self._shared
        if len(shared) < len(signature):
            shared.extend({} for _ in range(len(signature) - len(shared)))
        values = list(signature)
        for i, value in enumerate(values):
            table = shared[i]
            if table is None or type(value) is not str:
                continue
            values[i] = table.setdefault(value, value)
            if len(table) > SHARED_VALUES_MAX:
                shared[i] = None
        return tuple(values)

    def revoke(self, partition: int) -> None:
        self.parts.pop(partition, None)
        self.sealed_s.pop(partition, None)
        self.positions.pop(partition, None)
        self.routed_seen.pop(partition, None)
        self.kept.pop(partition, None)
        self.reseal = {(q, ws) for q, ws in self.reseal if q != partition}
        self.sealing = {(q, ws) for q, ws in self.sealing if q != partition}

    def open_windows(self) -> list[int]:
        return sorted({ws for parts in self.parts.values() for ws in parts})

    def all_open(self) -> list[tuple[int, int]]:
        """Every (partition, window) with state, neither kept sealed nor being sealed."""
        return sorted(
            (
                (p, ws)
                for p, parts in self.parts.items()
                for ws in parts
                if ws not in self.kept.get(p, ()) and (p, ws) not in self.sealing
            ),
            key=lambda pw: (pw[1], pw[0]),
        )

    def drop(self, partition: int, window_start_s: int, queries: Sequence[CompiledQuery]) -> None:
        """The window's partials are published: its state goes — or, with
        :attr:`keep_sealed`, stays until its release is known (:meth:`drop_released`)."""
        held = window_start_s in self.parts.get(partition, {})
        self.sealing.discard((partition, window_start_s))
        if self.keep_sealed and held:
            self.kept.setdefault(partition, set()).add(window_start_s)
        else:
            self.parts.get(partition, {}).pop(window_start_s, None)
        # Also when the last partition holding the window let it go: its signatures go
        # now, before its release, not when the table has doubled again (issue 39: a
        # 1M-key window's table was held through its release).
        last = held and all(window_start_s not in parts for parts in self.parts.values())
        if len(self.signatures) >= self._compact_signatures_at or last:
            self._compact_signatures(queries)
        self.update_gauges()

    def _compact_signatures(self, queries: Sequence[CompiledQuery]) -> None:
        """Forget interned signatures no open window uses (they went with their windows),
        renumbering the live ones: the table stays proportional to open state. Runs when the
        table doubled since the last run, so its cost is amortised over the interning."""
        parts = [part for parts in self.parts.values() for part in parts.values()]
        held = [part.samples.item_ids() for part in parts]
        live = np.unique(np.concatenate(held)) if held else np.zeros(0, dtype=np.int64)
        order = live.tolist()
        if 2 * len(order) <= len(self.signatures):
            remap = np.full(len(self.signatures), -1, dtype=np.int64)
            remap[live] = np.arange(len(order))
            for part in parts:
                part.samples.remap(remap)
            self.signatures[:] = [self.signatures[old] for old in order]  # shared in place
            self.signature_ids = {sig: i for i, sig in enumerate(self.signatures)}
            for q in queries:
                q.forget_projections()
        self._compact_signatures_at = max(SIGNATURES_COMPACT_MIN, 2 * len(self.signatures))

    def drop_released(self, released: Callable[[int], bool]) -> int:
        """Forget kept sealed windows whose release is now known; returns how many."""
        gone = 0
        for p, kept in self.kept.items():
            for ws in [w for w in kept if released(w)]:
                kept.discard(ws)
                self.parts.get(p, {}).pop(ws, None)
                gone += 1
        if gone:
            self.update_gauges()
        return gone

    @property
    def kept_windows(self) -> int:
        """Sealed windows held until their release is known."""
        return sum(len(kept) for kept in self.kept.values())

    def safe_offsets(self) -> dict[int, int]:
        """Per partition, the next offset to commit: nothing an open window needs is skipped."""
        safe: dict[int, int] = {}
        for p, position in self.positions.items():
            firsts = [part.first_offset for part in self.parts.get(p, {}).values()]
            safe[p] = min(firsts) if firsts else position
        return safe

    def update_gauges(self) -> None:
        open_windows = self.open_windows()
        oldest_end = self.windows.end_of(open_windows[0]) if open_windows else None
        self.metrics.set_open_windows(len(open_windows), oldest_end)

    def held_bytes(self) -> int:
        """What window.max_held_state_bytes caps and ``stream_dp_held_state_bytes`` shows:
        :data:`ROW_BYTES` per event that *arrived* for a window this stage holds, never less
        than its samples' bytes (a sample only loses rows: bound k, erasures), plus
        :data:`HISTOGRAM_ROW_BYTES` per event and ``statistic: quantile`` query, never less
        than the histograms the window's seal builds (sparse: a bin per kept value at
        most), and moved by no erasure — an erased user's rows removed, and events dropped
        on arrival, still count until their window goes, so neither the gauge nor the cap's
        decisions tell whether, or how much, an erased person had sent
        (docs/attack-model.md)."""
        return self.row_bytes * sum(
            part.events_arrived for parts in self.parts.values() for part in parts.values()
        )


class ColumnPath:
    """Stage 1's column paths, over the stage's collaborators: how input is read, the window
    store, the partition counts, the erasure state and what stage 2 released."""

    def __init__(
        self,
        keyring: KeyRing,
        metrics: Metrics,
        form: InputForm,
        store: WindowStore,
        sources: Sources,
        erasures: ErasureSet | None,
        released: ReleasedWindows,
        queries: Sequence[CompiledQuery],
        tracker_of: Callable[[int, float, bool], WatermarkTracker],
        *,
        enforce_user_keys: bool,
    ) -> None:
        self.keyring = keyring
        self.metrics = metrics
        self.form = form
        self.store = store
        self.sources = sources
        #: Erasures in force (None: erasure off): erased users' events never enter a sample.
        self.erasures = erasures
        self.released = released
        self.queries = queries
        self.windows = store.windows
        self.tracker_of = tracker_of
        self.enforce_user_keys = enforce_user_keys

    # -- stage 1 ---------------------------------------------------------------------------
    def fate(self, partition: int, window_start_s: int) -> int:
        """What happens to a partition's events of this window (as in :meth:`ingest`)."""
        self.sources.layout.saw(window_start_s)
        sealed = self.store.sealed_s.get(partition)
        coverage = self.released.coverage_start_s
        if (sealed is not None and window_start_s + self.windows.size_s <= sealed) or (
            coverage is not None and window_start_s < coverage
        ):
            return LATE
        if self.released.released(window_start_s):
            return REPLAYED if self.released.released_earlier(window_start_s) else LATE
        return ACCEPT

    def count_drops(self, signature_ids: np.ndarray) -> None:
        """Count, per query and reason, the events of covered windows (signature ids) the
        query does not take (``stream_dp_query_events_dropped_total``): raw input counts,
        taken before the erasure filter and the per-user bounds, so that they move with any
        record of any user and say nothing of who was erased or bounded out."""
        if not len(signature_ids):
            return
        dropped = self.metrics.query_events_dropped
        for q in self.queries:
            for reason, n in zip(DROP_REASONS, q.dropped_counts(signature_ids), strict=True):
                if n:
                    dropped.labels(query=q.name, reason=reason).inc(n)

    def _window_starts(self, times: np.ndarray) -> np.ndarray:
        return window_starts(times, self.windows.size_s)

    def ingest_columns(
        self, partition: int, records: Sequence[InputRecord], now_s: float, now_mono_s: float
    ) -> bool:
        """Raw input as columns when every record is a good event of the common form (and,
        keyed, keyed and placed right); False leaves the batch, untouched, to the per-record
        path, which would give the same result record by record."""
        cols = decode_columns(self.form.decoder, self.form.fields, _values(records), now_s)
        if cols is None:
            return False
        starts = self._window_starts(cols.times)
        fates = {ws: self.fate(partition, ws) for ws in _distinct_starts(starts)}
        accepted = [ws for ws, fate in fates.items() if fate == ACCEPT]
        key_ids = {self.keyring.for_window(ws).key_id for ws in accepted}
        if len(key_ids) > 1:
            return False  # a key rotation inside the batch: the per-record path
        users, index = cols.distinct_users, cols.user_index
        normal = normalized_user_ids(users, self.form.normalization)
        if "" in normal:
            return False  # an id that normalises to nothing is dead-lettered there
        # The bytes that are keyed, which are also what a keyed record's key must be.
        canonical = canonical_user_ids(normal) if accepted or self.enforce_user_keys else []
        if self.enforce_user_keys:
            expected = canonical
            if _keys(records) != _gather(expected, index):
                return False
            sources = self.sources
            counts = {sources.layout.count_for(ws, sources.source_partitions) for ws in fates}
            if len(counts) > 1:
                return False  # windows under two partition counts: the per-record path
            homes = self.form.partitions_of_keys(expected, counts.pop())
            if (homes != partition).any():
                return False
        late = skipped = 0
        max_time: float | None = None
        if accepted:
            pseudonyms = pseudonym_columns(canonical, self.keyring.for_window(accepted[0]))
            if pseudonyms is None:
                return False
            words = np.frombuffer(pseudonyms, dtype=np.uint64).reshape(-1, 2)[index]
            everything = len(accepted) == len(fates)
            mask = None if everything else np.isin(starts, accepted)
            fields = (
                cols.fields
                if mask is None
                else [[v for v, m in zip(c, mask.tolist(), strict=True) if m] for c in cols.fields]
            )
            sids = np.empty(len(records), dtype=np.int32)
            table, interned = self.store.signature_ids, self.store.signatures
            if mask is None:
                sids[:] = intern_signatures(fields, table, interned, n_events=len(sids))
            else:
                n_accepted = int(np.count_nonzero(mask))
                sids[mask] = intern_signatures(fields, table, interned, n_events=n_accepted)
            self.count_drops(sids if mask is None else sids[mask])
            kept = np.zeros(len(records), dtype=bool)
            key_id = self.keyring.for_window(accepted[0]).key_id
            for ws in accepted:
                rows = starts == ws
                first = _offset_at(records, int(np.argmax(rows)))  # the window's first record
                arrived = int(np.count_nonzero(rows))
                kept |= rows  # erased users' events too: they move time like any valid event
                gone = self._erased_rows(key_id, ws, words)
                if gone is not None:  # erased: never enters a sample (no count), moved time
                    rows &= ~gone
                # (State for the window even if all its events were erased, as record by
                # record: it is sealed and released like any other.)
                self.store.accept(partition, ws, first, words[rows], sids[rows], arrived=arrived)
            max_time = float(cols.times[kept].max()) if kept.any() else None
        for ws, fate in fates.items():
            if fate == LATE:
                late += int(np.count_nonzero(starts == ws))
            elif fate == REPLAYED:
                skipped += int(np.count_nonzero(starts == ws))
        metrics = self.metrics
        metrics.events_consumed.inc(len(records))
        last = records._messages[-1].offset if isinstance(records, FetchedRecords) else None
        self.store.positions[partition] = (records[-1][0] if last is None else last) + 1
        tracker = self.tracker_of(partition, now_mono_s, False)
        if max_time is not None:
            tracker.observe(partition, min(max_time, now_s), now_mono_s)
        if late:
            metrics.late_events.inc(late)
        if skipped:
            metrics.replayed_events_skipped.inc(skipped)
        self.store.update_gauges()
        return True

    def ingest_packed(
        self,
        partition: int,
        offset: int,
        packed: PackedEvents,
        topic: str | None,
        seen: dict[int, int],
    ) -> list[DeadLetter]:
        """Stage 1 on a packed repartition record (see :mod:`stream_dp.pipeline.formats.packed`):
        per event the placement check, re-sent events dropped, the window's key id, then
        the accepted events offered to their windows' samples."""
        metrics = self.metrics
        dead: list[DeadLetter] = []
        n = len(packed)
        home = pseudonym_partitions(packed.pseudonyms, self.sources.source_partitions) == partition
        if not home.all():
            # One dead letter per misplaced event, naming its place on the input topic.
            misplaced = BadRecord("misplaced_key", self.misplaced_detail())
            for src_offset in packed.offsets[~home].tolist():
                dead.append(self.dead(misplaced, packed.src_partition, src_offset, None, False))
        last = seen.get(packed.src_partition, -1)
        fresh = home & (packed.offsets > last)
        duplicates = int(np.count_nonzero(home)) - int(np.count_nonzero(fresh))
        if fresh.any():
            seen[packed.src_partition] = max(last, int(packed.offsets[fresh].max()))
        if duplicates:
            metrics.repartition_duplicates_skipped.inc(duplicates)
        words = np.frombuffer(packed.pseudonyms, dtype=np.uint64).reshape(n, 2)
        table = np.fromiter(
            (self.store.intern(sig) for sig in packed.signatures), np.int32, len(packed.signatures)
        )
        sids = table[packed.signature_index]
        starts = self._window_starts(packed.times)
        late = skipped = stale = other_secret = 0
        for ws in np.unique(starts[fresh]).tolist():
            rows = fresh & (starts == ws)
            count = int(np.count_nonzero(rows))
            fate = self.fate(partition, ws)
            if fate == LATE:
                late += count
            elif fate == REPLAYED:
                skipped += count
            elif packed.key_id != self.keyring.for_window(ws).key_id:
                stale += count
            elif packed.key_check != self.keyring.for_window(ws).key_check:
                # The window's key id under another secret (or a record from before key
                # checks): its pseudonyms are not this window's; never taken.
                other_secret += count
            else:
                self.count_drops(sids[rows])
                gone = self._erased_rows(packed.key_id, ws, words)
                if gone is not None:  # erased: never enters a sample (no count)
                    rows &= ~gone
                # State for the window even if all its events were erased, as record by
                # record: whether a window opens must not tell that an erased user sent.
                self.store.accept(partition, ws, offset, words[rows], sids[rows], arrived=count)
        if other_secret:
            dead.append(self.key_check_dead(partition, offset, topic))
            self.log_key_check_mismatch(other_secret, partition)
        if late or stale:
            metrics.late_events.inc(late + stale)
        if skipped:
            metrics.replayed_events_skipped.inc(skipped)
        if stale:
            log.warning(
                "dropped %d repartitioned events pseudonymized under another key than their "
                "window's (pseudonymization.rotate_at changed while the window was open)",
                stale,
                extra={"partition": partition},
            )
        return dead

    def key_check_dead(self, partition: int, offset: int, topic: str | None) -> DeadLetter:
        """The dead letter of a repartition record under another secret (never its payload:
        the events are pseudonymous, and the reason needs none)."""
        bad = BadRecord(
            "key_check_mismatch",
            "pseudonymized under another secret than the window's key id names (or by a "
            "worker from before key checks); its events are left out",
        )
        return self.dead(bad, partition, offset, None, False, topic)

    def log_key_check_mismatch(self, events: int, partition: int) -> None:
        log.error(
            "left out %d repartitioned events pseudonymized under another secret than their "
            "window's key id names: %s",
            events,
            KEY_CHECK_FIX,
            extra={"partition": partition},
        )

    def _erased_rows(
        self, key_id: str, window_start_s: int, words: np.ndarray
    ) -> np.ndarray | None:
        """Which rows (pseudonyms as (n, 2) words) belong to users erased for the window
        (docs/erasure.md); None when nobody is."""
        if self.erasures is None:
            return None
        erased = self.erasures.erased(key_id, window_start_s)
        if not erased:
            return None
        targets = np.frombuffer(b"".join(sorted(erased)), dtype=np.uint64).reshape(-1, 2)
        candidates = np.flatnonzero(np.isin(words[:, 0], targets[:, 0]))
        rows = np.zeros(len(words), dtype=bool)
        for i in candidates.tolist():
            rows[i] = words[i].tobytes() in erased
        return rows

    def dead(
        self,
        bad: BadRecord,
        partition: int,
        offset: int,
        value: bytes | None,
        include_payload: bool,
        topic: str | None = None,
    ) -> DeadLetter:
        return dead_letter(self.metrics, bad, partition, offset, value, include_payload, topic)

    def misplaced_detail(self, partitions: int | None = None) -> str:
        count = self.sources.source_partitions if partitions is None else partitions
        return (
            f"the record's key maps to another of the topic's {count} "
            "partitions: a producer used another partitioner than input.partitioner, or "
            "partitions were added; its user would be bounded once per partition"
        )
