"""Stage 1 of the worker, without Kafka: decode, pseudonymize, window, bound → partials.

Whoever owns a partition of the stage-1 topic (the input topic when producers key by user
id, else the repartition topic) keeps, per open window, a :class:`UserSamples` — columns of
(pseudonym, random priority, item), at most k items per pseudonym once compacted, items being
ids of interned event signatures — and the first offset the window needs.
A user's events all live in one partition, so bounding per partition bounds per user.
Records come in through :meth:`IngestStage.ingest` (the per-record path and entry point,
:mod:`~stream_dp.pipeline.stages.ingest_records`; whole batches as columns where possible,
:mod:`~stream_dp.pipeline.stages.ingest_columns`). The stage is built from collaborators, its
settings fixed at construction (:class:`IngestSettings`): how raw input is read
(:class:`~stream_dp.pipeline.stages.ingest_columns.InputForm`), the held state and the offsets
to commit (:class:`~stream_dp.pipeline.stages.ingest_columns.WindowStore`), the
:class:`Sealer`, the two paths and the erasure state
(:class:`~stream_dp.pipeline.stages.erasure_state.ErasureState`); this module holds the stage,
its watermarks and sealing.

Each partition has its own watermark (largest event time − grace; by wall clock once the
partition is idle). When it passes a window's end the partition *seals* the window: its
exact bounded totals per query and key become one :class:`Partial` per query (a fresh
version id), and after they are published the window's state is dropped. Stage 2 merges
the partials of every source partition and adds noise once.

Offsets are committed only up to the earliest offset a window not yet sealed (published)
still needs; after a crash the replayed records rebuild the samples.

Only valid, accepted events move a partition's activity clock and watermark: a partition
that delivers nothing but bad, late or replayed records is idle (it cannot stall every
window), and an event stamped ahead of the wall clock (up to ``input.max_future_s``) is kept
but moves the watermark no further than the clock. Events before the first covered window
are late. Keyed input is checked, not trusted: a record on a partition its key does not map
to is dead-lettered (``misplaced_key``, see :mod:`~stream_dp.pipeline.stages.placement`).

Stage 0, for input not keyed by user, is :class:`~stream_dp.pipeline.stages.router.RoutingStage`
(decode, pseudonymize, re-key by pseudonym onto the repartition topic); an
:class:`IngestStage` holds one as :attr:`IngestStage.router` and passes the transport's
stage-0 calls (:meth:`IngestStage.route_packed`, :meth:`IngestStage.progress_marks`, …) to
it. Stage 1 drops a repartitioned record it already saw (by source partition and offset)
and keeps only those pseudonymized under the window's key.

String user ids are normalised (``input.user_id_normalization``) before they are
pseudonymized, in both stages: the batch-local pseudonym cache is keyed by the raw id, so
normalisation runs once per distinct id and batch, not per event. With keyed input the
record key must be the *normalised* id: two spellings of one user keyed by their raw ids
could sit on two partitions and be bounded twice.

Erasure (docs/erasure.md; on when the transport builds the stage with
:attr:`IngestSettings.erasures`): stage 1 drops the events of erased pseudonyms on arrival
(stage 0 repartitions them like anyone's, and both count them as taken),
:meth:`IngestStage.apply_erasures` removes newly erased users from every window held, and
with :attr:`IngestSettings.keep_sealed` a sealed window's state stays until its release is
known, so that an erasure arriving in between re-seals it without the user
(:meth:`IngestStage.reseal_due`). Every partial says up to
which erasure-log position it applied erasures (``erasures_through``).
"""

from __future__ import annotations

import logging
import random  # only the type of a seed for the sampling PRNG (see new_sampling_generator)
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import compress

import numpy as np

from stream_dp.config.classification import user_placement
from stream_dp.config.model import Config
from stream_dp.errors import StreamDPError
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.formats.partials import Partial, SourceWatermark, new_version
from stream_dp.pipeline.stages.auto_bounds import auto_seal_plan
from stream_dp.pipeline.stages.erasure_state import ErasureState
from stream_dp.pipeline.stages.ingest_columns import (
    ColumnPath,
    DeadLetter,
    InputForm,
    InputRecord,
    ReleasedWindows,
    Sources,
    WindowStore,
    input_form,
)
from stream_dp.pipeline.stages.ingest_records import RecordPath, user_key
from stream_dp.pipeline.stages.placement import SourceLayout
from stream_dp.pipeline.stages.queries import CompiledQuery
from stream_dp.pipeline.stages.restart_clock import carried_start, event_time_start
from stream_dp.pipeline.stages.router import RoutingStage
from stream_dp.privacy.adaptive_bounds import BoundsTriple
from stream_dp.privacy.bounding import bounded_columns, new_sampling_rng
from stream_dp.privacy.erasure import Erasure, ErasureSet
from stream_dp.privacy.key_totals import KeyTotals
from stream_dp.privacy.pseudonymize import KeyRing
from stream_dp.privacy.user_samples import (
    SamplingGenerator,
    first_k_per_user,
    new_sampling_generator,
    per_user_items,
)
from stream_dp.windows import TumblingWindows, WatermarkTracker

__all__ = [
    "DeadLetter",
    "IngestSettings",
    "IngestStage",
    "InputForm",
    "InputRecord",
    "ReleasedWindows",
    "user_key",
]

log = logging.getLogger(__name__)


#: A partition holding a window for its bounds reports itself sealed this far before the
#: window's end (the watermark of a source means: windows ending at or before it are out).
HELD_MARGIN_S = 0.001


class _NothingReleased:
    coverage_start_s: int | None = None
    first_unreleased_s: int | None = None
    last_release_wall_s: float | None = None

    def released(self, window_start_s: int) -> bool:
        return False

    def released_earlier(self, window_start_s: int) -> bool:
        return False

    def bounds_for(self, window_start_s: int) -> BoundsTriple | None:
        return None


@dataclass(frozen=True, slots=True)
class IngestSettings:
    """What the transport fixes when it builds stage 1 (the defaults: offline use, tests)."""

    #: The deployment fingerprint's digest stamped on every partial
    #: (:mod:`stream_dp.config.fingerprint`).
    fingerprint: str = ""
    #: Idleness (of stage 0's input partitions and of stage 1's own, read directly) counts
    #: only as far as :meth:`IngestStage.read_to_end` proves it (the worker, which reads
    #: Kafka); otherwise silence up to now is idleness (offline use, unit tests).
    require_read_proof: bool = False
    #: Erasures in force (docs/erasure.md), applied in stage 1 (stage 0 repartitions an
    #: erased user's events like anyone's); None: erasure off.
    erasures: ErasureSet | None = None
    #: The erasure-log position the (empty) state starts from having applied.
    erasures_applied: int = 0
    #: Keep sealed windows until their release is known (the worker, with erasure on).
    keep_sealed: bool = False
    #: Dead-letter raw records whose Kafka key is not their user id or that sit on a
    #: partition their key does not map to (a user's events must share a partition).
    #: None: ``input.keyed_by_user``; off where one partition holds everything (replay).
    enforce_user_keys: bool | None = None
    #: Partitions of the stage-1 topic (what stage 2 waits for, and what placement is
    #: checked against), of the input topic (the sources of each repartition partition) and
    #: of the repartition topic (where stage 0 routes), until the transport learns them
    #: (:meth:`IngestStage.learn_partitions`).
    source_partitions: int = 1
    input_partitions: int = 1
    routed_partitions: int = 1


class Sealer:
    """A partition's exact bounded totals of a window as partials, stamped with the
    deployment's layout (the sealing collaborator of :class:`IngestStage`)."""

    def __init__(
        self,
        config: Config,
        keyring: KeyRing,
        store: WindowStore,
        sources: Sources,
        erasure: ErasureState,
        released: ReleasedWindows,
        queries: Sequence[CompiledQuery],
        *,
        rng: SamplingGenerator,
        py_rng: random.Random,
        fingerprint: str,
    ) -> None:
        self.keyring = keyring
        self.store = store
        self.sources = sources
        self.erasure = erasure
        self.released = released
        self.queries = queries
        self._rng = rng
        #: bounds: auto draws its histograms' L0 picks with this one (not a DP draw either)
        self._py_rng = py_rng
        self.fingerprint = fingerprint
        #: How a user's events came to share a partition (stamped on partials: part of
        #: their layout, like the partition count and the key id).
        self.placement = user_placement(config.input)
        # samples of k (under bounds: auto, of the cap: a window's k is applied at seal)
        self.bounds = config.bounds.start_bounds().values()
        self.auto = auto_seal_plan(config, list(queries))

    def seal(self, partition: int, window_start_s: int) -> list[Partial]:
        """The partition's exact bounded totals for the window, one partial per query.

        Column work only (numpy): the sample's users and items, each query's key and value
        per item, L0/Linf bounding and the totals per key. Sealing does not consume the
        window's state (:meth:`IngestStage.drop` does, once the partials are published).
        """
        part = self.store.parts[partition][window_start_s]
        users, items = part.samples.sample()
        histograms: dict[str, list[int]] | None = None
        bounds = self.bounds
        if self.auto is not None:
            decided = self.released.bounds_for(window_start_s)
            if decided is None:
                raise StreamDPError("a window's bounds must be decided before it is sealed")
            bounds = decided
            histograms = self.auto.histograms(per_user_items(users, items), self._py_rng)
            users, items = first_k_per_user(users, items, bounds[0])
        stamp = partial(
            Partial,
            window_start_s=window_start_s,
            source_partition=partition,
            version=new_version(),
            events_seen=part.samples.events_seen,
            events_retained=len(items),
            source_partitions=self.sources.layout.count_for(
                window_start_s, self.sources.source_partitions
            ),
            key_id=self.keyring.for_window(window_start_s).key_id,
            placement=self.placement,
            key_check=self.keyring.for_window(window_start_s).key_check,
            erasures_through=self.erasure.applied,
            bounds=bounds if self.auto is not None else None,
            histograms=histograms,
            fingerprint=self.fingerprint,
        )
        return [
            stamp(query=q.name, totals=bounded_totals(q, users, items, bounds, self._rng))
            for q in self.queries
        ]


class IngestStage:
    """Stage 1 (and the stage-0 calls of the transport), built from collaborators: how raw
    input is read (:class:`InputForm`), the held state (:class:`WindowStore`), the partition
    counts (:class:`Sources`), the per-record and column paths (:class:`RecordPath`,
    :class:`ColumnPath`), the :class:`Sealer`, the :class:`ErasureState` and stage 0's
    :class:`RoutingStage`; the watermark trackers are its own."""

    def __init__(
        self,
        config: Config,
        keyring: KeyRing,
        *,
        released: ReleasedWindows | None = None,
        metrics: Metrics | None = None,
        sampling_rng: random.Random | None = None,
        settings: IngestSettings = IngestSettings(),
    ) -> None:
        self.config = config
        self.keyring = keyring
        self.settings = settings
        # Windows stage 2 knows released: replayed events of them are dropped here rather
        # than sealed into partials nobody will take — counted as replayed when released
        # before this process read the ledger, as late when it released them itself. The
        # first covered window comes from there too.
        self._windows_released: ReleasedWindows = (
            released if released is not None else _NothingReleased()
        )
        self.metrics = metrics if metrics is not None else Metrics()
        rng = new_sampling_generator(sampling_rng)
        self.k = config.bounds.cap_bounds().values()[0]
        #: bounds: auto — windows due but held until their bounds are decided
        self.awaiting_bounds: set[int] = set()
        self.windows = TumblingWindows(config.window.size_s, config.window.grace_s)
        self.sources = Sources(
            settings.source_partitions,
            settings.input_partitions,
            SourceLayout(config.window.size_s),
        )
        self.form = input_form(config)
        self.decoder = self.form.decoder
        self.queries = [CompiledQuery(q, config.bounds, self.form.fields) for q in config.queries]
        self.store = WindowStore(
            self.windows,
            self.metrics,
            k=self.k,
            rng=rng,
            keep_sealed=settings.keep_sealed,
            histogram_queries=sum(q.bin_of is not None for q in self.queries),
        )
        for q in self.queries:
            q.bind(self.store.signatures)
        self.erasure = ErasureState(
            self.store, keyring, settings.erasures, applied=settings.erasures_applied
        )
        self.sealer = Sealer(
            config,
            keyring,
            self.store,
            self.sources,
            self.erasure,
            self._windows_released,
            self.queries,
            rng=rng,
            py_rng=sampling_rng if sampling_rng is not None else new_sampling_rng(),
            fingerprint=settings.fingerprint,
        )
        enforce = settings.enforce_user_keys
        columns = ColumnPath(
            keyring,
            self.metrics,
            self.form,
            self.store,
            self.sources,
            settings.erasures,
            self._windows_released,
            self.queries,
            lambda p, now_mono_s, routed: self._tracker(p, now_mono_s, routed=routed),
            enforce_user_keys=config.input.keyed_by_user if enforce is None else enforce,
        )
        self.records = RecordPath(columns)
        self._trackers: dict[int, WatermarkTracker] = {}
        #: Stage 0, routing this worker's input partitions (input not keyed by user).
        self.router = RoutingStage(config, keyring, metrics=self.metrics)
        self.router.require_read_proof = settings.require_read_proof
        self.router.routed_partitions = settings.routed_partitions

    # -- settings and what the transport learns -----------------------------------------
    @property
    def source_partitions(self) -> int:
        """Partitions of the stage-1 topic (:meth:`learn_partitions`)."""
        return self.sources.source_partitions

    @property
    def input_partitions(self) -> int:
        """Partitions of the input topic (:meth:`learn_partitions`)."""
        return self.sources.input_partitions

    @property
    def routed_partitions(self) -> int:
        """Partitions of the repartition topic (where stage 0 routes)."""
        return self.router.routed_partitions

    @property
    def layout(self) -> SourceLayout:
        """Keyed input after a partition change: the count per window (the windows begun
        before it under the count before)."""
        return self.sources.layout

    def learn_partitions(
        self, source_partitions: int, *, input_partitions: int | None = None
    ) -> None:
        """The transport learned the partition counts: of the stage-1 topic, and (input not
        keyed by user) of the input topic, the stage-1 topic then being the repartition
        topic stage 0 routes to."""
        self.sources.source_partitions = source_partitions
        if input_partitions is not None:
            self.sources.input_partitions = input_partitions
            self.router.routed_partitions = source_partitions

    @property
    def fingerprint(self) -> str:
        return self.sealer.fingerprint

    @property
    def placement(self) -> str:
        return self.sealer.placement

    @property
    def enforce_user_keys(self) -> bool:
        return self.records.enforce_user_keys

    @property
    def require_read_proof(self) -> bool:
        return self.settings.require_read_proof

    @property
    def keep_sealed(self) -> bool:
        return self.store.keep_sealed

    @property
    def erasures(self) -> ErasureSet | None:
        """Erasures in force (:attr:`IngestSettings.erasures`)."""
        return self.erasure.erasures

    @property
    def erasures_applied(self) -> int:
        """The erasure-log position this stage's state has applied (stamped on partials)."""
        return self.erasure.applied

    # -- partitions ---------------------------------------------------------------------
    def assign(
        self,
        partitions: Iterable[int],
        now_mono_s: float,
        *,
        routed: bool,
        now_s: float | None = None,
    ) -> None:
        """Take partitions of the stage-1 topic; ``routed``: of the repartition topic.

        A partition's watermark tracks its sources: itself, or for a repartition partition
        every input partition (``input_partitions``), each of which must advance (or go
        idle) before a window is sealed.

        Event time starts at what is known
        (:func:`~stream_dp.pipeline.stages.restart_clock.event_time_start`): the first window not
        yet released, and with ``now_s`` (the wall clock at ``now_mono_s``; the worker,
        input keyed by user) the wall clock — which counts only once every partition is
        proven read to its end and quiet for ``window.idle_close_s``. A repartition
        partition learns the wall clock from its sources' routers instead
        (:meth:`assign_routed`).
        """
        taken = list(partitions)
        new = [p for p in dict.fromkeys(taken) if p not in self._trackers]
        for p in taken:
            self.store.parts.setdefault(p, {})
        released = self._windows_released
        tolerance_s = self.config.input.max_future_s  # the clock error the deployment accepts
        start_s = (
            event_time_start(released, self.windows, now_s, tolerance_s, wall_clock=not routed)
            if new
            else None
        )
        for p in new:
            if p not in self._trackers:
                tracker = WatermarkTracker(
                    grace_s=self.config.window.grace_s,
                    idle_timeout_s=self.config.window.idle_close_s,
                    require_read_proof=self.require_read_proof,
                )
                if routed:
                    tracker.expect(range(self.sources.input_partitions))
                else:
                    tracker.assign([p], now_mono_s)
                if start_s is not None:
                    # Time starts at the first window not released, not at the first event:
                    # an idle stream still releases its (empty) windows by wall clock.
                    tracker.start_at(start_s, now_mono_s)
                self._trackers[p] = tracker

    def revoke(self, partitions: Iterable[int]) -> None:
        """Drop the state of partitions that moved away; their new owner replays them."""
        for p in partitions:
            self.store.revoke(p)
            self._trackers.pop(p, None)
        self.store.update_gauges()

    @property
    def partitions(self) -> list[int]:
        return sorted(self._trackers)

    def read_to_end(self, partition: int, at_mono_s: float, *, input_topic: bool) -> None:
        """A fetch answer at ``at_mono_s`` found this worker's reader at the end of the
        partition (of the input topic read by stage 0 if ``input_topic``, else of the
        stage-1 topic): silence before it is the partition's own, so it may count as idle."""
        if input_topic:
            self.router.read_to_end(partition, at_mono_s)
        else:
            tracker = self._trackers.get(partition)
            if tracker is not None:
                tracker.read_to_end(partition, at_mono_s)

    def restart_idle_clocks(self, now_mono_s: float) -> None:
        for tracker in self._trackers.values():
            tracker.restart_idle_clocks(now_mono_s)
        self.router.restart_idle_clocks(now_mono_s)

    # -- stage 0 (kept here for the transport: the routing stage does the work) --------
    def assign_routed(
        self, partitions: Iterable[int], now_mono_s: float, *, now_s: float | None = None
    ) -> None:
        """Input partitions stage 0 now owns (``now_s``: the wall clock at ``now_mono_s``;
        the routers start from the deployment's carried clock,
        :func:`~stream_dp.pipeline.stages.restart_clock.carried_start`, see
        :meth:`.RoutingStage.assign_routed`)."""
        carried = carried_start(self._windows_released, now_s, self.config.input.max_future_s)
        self.router.assign_routed(partitions, now_mono_s, now_s=carried)

    def forget_routed(self, partitions: Iterable[int]) -> None:
        """Input partitions stage 0 no longer owns."""
        self.router.forget_routed(partitions)

    def route(
        self, partition: int, records: Sequence[InputRecord], *, now_s: float, now_mono_s: float
    ) -> tuple[list[tuple[bytes, bytes, int]], list[DeadLetter]]:
        """Stage 0, one JSON record per event: :meth:`.RoutingStage.route`."""
        return self.router.route(partition, records, now_s=now_s, now_mono_s=now_mono_s)

    def route_packed(
        self, partition: int, records: Sequence[InputRecord], *, now_s: float, now_mono_s: float
    ) -> tuple[list[tuple[bytes, bytes, int]], list[DeadLetter]]:
        """Stage 0, packed records: :meth:`.RoutingStage.route_packed`."""
        return self.router.route_packed(partition, records, now_s=now_s, now_mono_s=now_mono_s)

    def progress_marks(self, now_mono_s: float) -> list[bytes]:
        """Stage 0's progress marks: :meth:`.RoutingStage.progress_marks`."""
        return self.router.progress_marks(now_mono_s)

    def _tracker(self, partition: int, now_mono_s: float, *, routed: bool) -> WatermarkTracker:
        if partition not in self._trackers:
            self.assign([partition], now_mono_s, routed=routed)
        return self._trackers[partition]

    # -- sealing --------------------------------------------------------------------------
    def ingest(
        self,
        partition: int,
        records: Sequence[InputRecord],
        *,
        now_s: float,
        now_mono_s: float,
        routed: bool = False,
        topic: str | None = None,
    ) -> list[DeadLetter]:
        """Window and bound one partition's batch: :meth:`.RecordPath.ingest`."""
        return self.records.ingest(
            partition, records, now_s=now_s, now_mono_s=now_mono_s, routed=routed, topic=topic
        )

    def open_windows(self) -> list[int]:
        return self.store.open_windows()

    def due(self, now_mono_s: float) -> list[tuple[int, int]]:
        """(partition, window) pairs whose partition watermark passed the window's end."""
        out: list[tuple[int, int]] = []
        self.awaiting_bounds = set()
        for p, tracker in self._trackers.items():
            wm = tracker.watermark(now_mono_s)
            if wm is None:
                continue
            parts = self.store.parts.get(p, {})
            closed = sorted(ws for ws in parts if self.windows.is_closed(ws, wm))
            if self.sealer.auto is not None:
                for i, ws in enumerate(closed):
                    if self._windows_released.bounds_for(ws) is None:
                        # bounds: auto — held until its bounds are decided; the partition
                        # reports itself sealed up to (not including) this window
                        self.awaiting_bounds.add(ws)
                        wm = min(wm, self.windows.end_of(ws) - HELD_MARGIN_S)
                        closed = closed[:i]
                        break
            self.store.sealed_s[p] = wm
            kept = self.store.kept.get(p, ())
            sealing = self.store.sealing
            out.extend((p, ws) for ws in closed if ws not in kept and (p, ws) not in sealing)
        return sorted(out, key=lambda pw: (pw[1], pw[0]))

    def all_open(self) -> list[tuple[int, int]]:
        """Every (partition, window) with state: sealed at the end of a finite input."""
        return self.store.all_open()

    def seal(self, partition: int, window_start_s: int) -> list[Partial]:
        """The partition's partials of the window: :meth:`.Sealer.seal`."""
        return self.sealer.seal(partition, window_start_s)

    def being_sealed(self, sealed: Iterable[tuple[int, int]]) -> None:
        """These windows' partials are being written: they stay held (and an erasure that
        reaches them re-seals them) until :meth:`drop`, or :meth:`not_sealed` if the write
        failed. A partition revoked meanwhile forgets its own."""
        self.store.sealing.update(sealed)

    def still_sealing(self, partition: int, window_start_s: int) -> bool:
        """Whether the window is being sealed by this stage still (not revoked since)."""
        return (partition, window_start_s) in self.store.sealing

    def not_sealed(self, sealed: Iterable[tuple[int, int]]) -> None:
        """Their partials' write failed: the windows are due again (their state is held)."""
        self.store.sealing.difference_update(sealed)

    def drop(self, partition: int, window_start_s: int) -> None:
        """The window's partials are published: its state goes — or, with
        :attr:`keep_sealed`, stays until its release is known (:meth:`drop_released`)."""
        self.metrics.partials_published.inc(len(self.queries))
        self.store.drop(partition, window_start_s, self.queries)

    def watermarks(
        self, now_mono_s: float, *, dropping: Collection[tuple[int, int]] = ()
    ) -> list[SourceWatermark]:
        """What each assigned partition has sealed: written after its partials.
        ``dropping``: (partition, window)s whose partials go out with these watermarks,
        counted as dropped (:meth:`drop`: no longer open) though their state is still held."""
        marks = []
        for p, tracker in sorted(self._trackers.items()):
            kept: Collection[int] = self.store.kept.get(p, ())
            if dropping:
                kept = {*kept, *(ws for q, ws in dropping if q == p)}
            clock_idle = all(tracker.is_idle(s, now_mono_s) for s in tracker.partitions)
            marks.append(
                SourceWatermark(
                    source_partition=p,
                    source_partitions=self.sources.source_partitions,
                    watermark_s=self.store.sealed_s.get(p),
                    idle=clock_idle,
                    open_windows=any(ws not in kept for ws in self.store.parts.get(p, {})),
                    idle_for_s=tracker.idle_for(now_mono_s) if clock_idle else 0.0,
                )
            )
        return marks

    def drop_released(self) -> int:
        """Forget kept sealed windows whose release is now known; returns how many."""
        return self.store.drop_released(self._windows_released.released)

    @property
    def kept_windows(self) -> int:
        """Sealed windows held until their release is known."""
        return self.store.kept_windows

    # -- erasure ----------------------------------------------------------------------------
    def apply_erasures(self, erasures: Sequence[Erasure], position: int) -> None:
        """Erasures just added to the erasure set: :meth:`.ErasureState.apply_erasures`."""
        self.erasure.apply_erasures(erasures, position)

    def reseal_due(self) -> list[tuple[int, int]]:
        """Sealed windows to seal again: :meth:`.ErasureState.reseal_due`."""
        return self.erasure.reseal_due()

    def reseal_pending(self) -> bool:
        """:meth:`.ErasureState.reseal_pending`."""
        return self.erasure.reseal_pending()

    # -- offsets and held state ---------------------------------------------------------
    def safe_offsets(self) -> dict[int, int]:
        """Per partition, the next offset to commit: nothing an open window needs is skipped."""
        return self.store.safe_offsets()

    def held_bytes(self) -> int:
        """:meth:`.WindowStore.held_bytes`."""
        return self.store.held_bytes()

    @property
    def signature_count(self) -> int:
        return len(self.store.signatures)


def bounded_totals(
    q: CompiledQuery,
    users: np.ndarray,
    items: np.ndarray,
    bounds: BoundsTriple,
    rng: SamplingGenerator,
) -> KeyTotals:
    """One query's exact totals per key over a window's sample (users and item ids as
    columns), each user bounded to L0 keys and Linf contributions per key."""
    _, max_keys, max_per_key = bounds
    keys, values, groups = q.project_columns(items)
    taken = keys >= 0
    found = bounded_columns(
        users[taken],
        keys[taken],
        values[taken] if q.has_values else None,
        n_keys=len(groups),
        max_keys=max_keys,
        max_per_key=max_per_key,
        rng=rng,
        weights=q.weighted_selection,
        squares_center=q.squares_center,
        bin_of=q.bin_of,
    )
    has_data = found.users != 0
    present = np.flatnonzero(has_data)
    if len(present) == len(groups):  # every key (a public list's, often): no key to drop
        # the columns as they are, not copies: a million keys' index list, ints and copied
        # arrays are fresh memory, whose page faults made the seal's time vary (issue 43)
        return KeyTotals(
            groups,
            found.events,
            found.users,
            found.value_sums,
            found.weight_sums,
            found.value_squares,
            found.value_bins,
        )
    return KeyTotals(
        list(compress(groups, has_data.tolist())),  # bools: no Python int per key
        found.events[present],
        found.users[present],
        found.value_sums[present],
        found.weight_sums[present],
        found.value_squares[present],
        found.value_bins.take(present),
    )
