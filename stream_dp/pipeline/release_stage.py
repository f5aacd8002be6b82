"""Stage 2 of the worker, without Kafka: merge partials, release every window once.

The owner of a partials partition sees every partial of the windows mapped to it, plus a
:class:`SourceWatermark` from each source partition. **Which windows are released never
depends on the data** (docs/privacy.md#partition-selection; issue 12): every window from the
first covered one (``window.start_at`` or the deployment's recorded start) up to the point
all sources have passed is released in order, with or without events — public keys get
their noisy values in every window, and every window gets its ``window`` record. A source
has passed a window when its watermark is at or past the window's end, or when it is idle
with nothing open (confirmed, see :func:`_quiet_confirmed`); if every source is idle, the
furthest idle watermark (which advances by wall clock) bounds the range.

Per (query, source partition) the first complete version of a partial is taken and the
others ignored. A window merges partials of one layout only — one stage-1 partition count
and one pseudonym key id — the layout of the first partial taken: a user's events are on
one partition under one pseudonym only within a layout, so mixing two would bound a user
twice. The merged exact totals go through the privacy core once — noise, τ-threshold,
budget — and the versions taken are recorded in the ledger.

Per partials partition a *cursor* is the next window not yet released (every window before
it is released and published, and a ``progress`` record in the ledger says so); windows
are released strictly in cursor order. Offsets of the partials topic are committed only up
to the earliest partial an unreleased window still needs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stream_dp.config.model import Config
from stream_dp.errors import PrivacyError
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.auto_bounds import (
    BoundsSchedule,
    decide_next,
    histograms_release,
    released_values,
)
from stream_dp.pipeline.continual_state import ContinualStore
from stream_dp.pipeline.cumulative import (
    CumulativeQuery,
    CumulativeReleases,
    CumulativeValues,
    Preparation,
    cumulative_release,
)
from stream_dp.pipeline.ledger import LedgerIndex, LedgerRelease, OutputRecord, new_release_id
from stream_dp.pipeline.partials import (
    Partial,
    PartialAssembler,
    PartialFormatError,
    PartialPart,
    SourceWatermark,
    decode,
    merge_totals,
)
from stream_dp.pipeline.queries import CompiledQuery, needed_fields
from stream_dp.pipeline.records import output_key, release_records, window_record
from stream_dp.privacy.adaptive_bounds import BoundsTriple, merge_counts, release_histograms
from stream_dp.privacy.budget import BOUNDS_CHARGE, BudgetAccountant
from stream_dp.privacy.continual.counter import NoiseSource
from stream_dp.privacy.planner import QueryPlan, plan_query
from stream_dp.privacy.release import KeyAggregate, release_query
from stream_dp.privacy.specs import BoundsSpec
from stream_dp.windows import TumblingWindows
from stream_dp.windows.tumbling import iso_utc
from stream_dp.windows.watermark import IDLE_CONFIRM_S

log = logging.getLogger(__name__)

#: What :meth:`ReleaseStage.erasures_applied` says of a window without partials: it holds
#: no one's events, so every erasure is applied.
_NO_PARTIALS = 2**62

#: (query, window start, exact bounded aggregates per group key) — see ReleaseStage.__init__.
ExactTotalsObserver = Callable[[str, int, Mapping[tuple[Any, ...], KeyAggregate]], None]


def expected_key_id(config: Config, window_start_s: int) -> str:
    """The pseudonym key id of a window under this configuration (no secret needed)."""
    p = config.pseudonymization
    if p.rotate_at is not None and window_start_s < p.rotate_at.timestamp():
        assert p.previous_key_id is not None
        return p.previous_key_id
    return p.key_id


@dataclass
class _PendingWindow:
    first_offset: int
    assemblers: dict[tuple[str, int], PartialAssembler] = field(default_factory=dict)
    #: (source partitions, key id) of the first partial taken; None before that.
    layout: tuple[int, str] | None = None


class ReleaseStage:
    def __init__(
        self,
        config: Config,
        *,
        partials_partitions: int = 1,
        ledger: LedgerIndex | None = None,
        metrics: Metrics | None = None,
        exact_totals_observer: ExactTotalsObserver | None = None,
        retain_ledger: bool = False,
        key_id_of: Callable[[int], str] | None = None,
        continual_store: ContinualStore | None = None,
        continual_partitions: int = 1,
        continual_noise: NoiseSource | None = None,
    ) -> None:
        self.config = config
        #: The pseudonym key id of a window (the keyring's; by default the configuration's).
        self._key_id_of = key_id_of or (lambda ws: expected_key_id(config, ws))
        #: Keep every release read or made in the ledger index (replay prints them); the
        #: worker forgets those behind the cursors, so its memory stays bounded.
        self._retain_ledger = retain_ledger
        # Sees the exact bounded totals before noise. Only the demo passes one (its data is
        # synthetic, so showing true values beside private ones is the point); the worker
        # and replay never do, and nothing exact is ever published.
        self._observe_exact = exact_totals_observer
        self.ledger = ledger if ledger is not None else LedgerIndex()
        self.metrics = metrics if metrics is not None else Metrics()
        self.windows = TumblingWindows(config.window.size_s, config.window.grace_s)
        self.partials_partitions = partials_partitions
        fields, _, _ = needed_fields(config.queries)
        self.queries = [CompiledQuery(q, config.bounds, fields) for q in config.queries]
        #: Cumulative queries' running totals (module stream_dp.pipeline.cumulative): their
        #: state lives in the continual topic, read and written by the transport.
        store = continual_store if continual_store is not None else ContinualStore()
        self.continual_store = store
        cumulative = [
            CumulativeQuery.of(q.config, q.plan) for q in self.queries if q.plan.continual
        ]
        self.cumulative = CumulativeReleases(
            cumulative,
            window_size_s=config.window.size_s,
            partitions=continual_partitions,
            store=store,
            noise=continual_noise,
        )
        self.accountant = BudgetAccountant(
            window_size_s=config.window.size_s,
            epsilon_per_window=config.privacy.epsilon_per_window,
            delta_per_window=config.privacy.delta_per_window,
            horizon_windows=config.privacy.horizon_windows,
            max_epsilon_per_horizon=config.privacy.max_epsilon_per_horizon,
        )
        self._epsilon_per_window = sum(q.epsilon for q in config.queries) + config.bounds_epsilon
        #: Which bounds each window uses (bounds: auto: decided window by window).
        self.schedule = BoundsSchedule(config, self.ledger)
        self._plans: dict[tuple[str, BoundsTriple], QueryPlan] = {}
        #: bounds: auto — due windows waiting for their bounds (the worker reads the
        #: ledger partition of the window before, where the decision is written)
        self.awaiting_bounds: set[int] = set()
        #: The first covered window: from the configuration, else set by the transport
        #: (from the ledger's coverage record). Nothing is released while it is unknown.
        self.coverage_start_s: int | None = config.window.first_window_start()
        #: Per partials partition, the next window not yet released (own and ledger-read).
        self._cursor: dict[int, int] = {}
        #: The cursors as last read from the ledger: windows before them were released by
        #: an earlier run or another worker (their events are replays, not late).
        self._cursor_read: dict[int, int] = {}
        self._windows: dict[int, dict[int, _PendingWindow]] = {}
        self._marks: dict[int, dict[int, SourceWatermark]] = {}
        # Per partials partition, per source: idle_for_s of its first "idle, nothing open"
        # mark since another source last woke up (went from that to active or open).
        self._idle_base: dict[int, dict[int, float]] = {}
        self._positions: dict[int, int] = {}
        self.adopt_ledger()

    # -- coverage and cursors -------------------------------------------------------------
    def set_coverage(self, first_window_start_s: int) -> None:
        self.coverage_start_s = self.windows.start_of(first_window_start_s)

    def _first_on(self, r: int) -> int:
        """The first covered window that maps to partials partition ``r``."""
        assert self.coverage_start_s is not None
        size, parts = self.windows.size_s, self.partials_partitions
        first = self.coverage_start_s
        return first + ((r - self.windows.partition_of(first, parts)) % parts) * size

    def cursor(self, r: int) -> int:
        """The next window of partials partition ``r`` not yet released."""
        first = self._first_on(r)
        return max(first, self._cursor.get(r, first))

    def released(self, window_start_s: int) -> bool:
        """Whether a covered window is known released (by anyone, as far as read)."""
        if self.coverage_start_s is None or window_start_s < self.coverage_start_s:
            return False
        r = self.windows.partition_of(window_start_s, self.partials_partitions)
        return window_start_s < self.cursor(r)

    def released_earlier(self, window_start_s: int) -> bool:
        """Released before this process read the ledger (its events are replays)."""
        if self.coverage_start_s is None or window_start_s < self.coverage_start_s:
            return False
        r = self.windows.partition_of(window_start_s, self.partials_partitions)
        return window_start_s < self._cursor_read.get(r, self._first_on(r))

    def bounds_for(self, window_start_s: int) -> BoundsTriple | None:
        """The bounds of a window (None under bounds: auto until they are decided).

        The releaser of the window before writes the decision to that window's ledger
        partition before its progress record. So once a progress record read from the ledger
        says the window before is released and no decision came before it, none will: that
        window was released by a version or configuration without ``bounds: auto`` (a
        deployment switching to it), and the start values apply — a held window must not
        wait for ever.
        """
        bounds = self.schedule.bounds_for(window_start_s, self.coverage_start_s)
        if bounds is None and self._released_in_ledger(window_start_s - self.windows.size_s):
            return self.schedule.start
        return bounds

    def _released_in_ledger(self, window_start_s: int) -> bool:
        """Whether a progress record read from the ledger covers the window."""
        if self.ledger.partials_partitions != self.partials_partitions:
            return False
        r = self.windows.partition_of(window_start_s, self.partials_partitions)
        return window_start_s < self.ledger.progress.get(r, window_start_s)

    def plan_for(self, q: CompiledQuery, bounds: BoundsTriple) -> QueryPlan:
        """The query's plan for a window bounded with ``bounds`` (noise calibrated to them)."""
        if not self.schedule.auto:
            return q.plan
        key = (q.name, bounds)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) > 256:
                self._plans.clear()
            plan = self._plans[key] = plan_query(
                q.spec, BoundsSpec(*bounds), unsafe_test_mode=q.plan.unsafe_test_mode
            )
        return plan

    def adopt_ledger(self) -> None:
        """Take in what the ledger says (at start, and after each read): cursors, charges,
        the coverage; then forget releases of windows behind the cursors."""
        ledger = self.ledger
        if self.coverage_start_s is None and ledger.coverage_start_s is not None:
            self.set_coverage(ledger.coverage_start_s)
        if ledger.partials_partitions not in (None, self.partials_partitions):
            log.error(
                "the ledger's progress records were written for %s partials partitions, "
                "this worker sees %d: the partials topic changed while windows were open",
                ledger.partials_partitions,
                self.partials_partitions,
            )
        else:
            for r, nxt in ledger.progress.items():
                if nxt > self._cursor.get(r, nxt - 1):
                    self._cursor[r] = nxt
                if nxt > self._cursor_read.get(r, nxt - 1):
                    self._cursor_read[r] = nxt
        for rel in ledger.releases():
            if self.accountant.query_spent(rel.window_start_s, rel.query) == (0.0, 0.0):
                self.accountant.record(
                    rel.window_start_s, rel.query, rel.epsilon_spent, rel.delta_spent
                )
        if self.coverage_start_s is not None and not self._retain_ledger:
            ledger.forget(self.released)
            for windows in self._windows.values():
                for ws in [w for w in windows if self.released(w)]:
                    del windows[ws]

    # -- partitions ---------------------------------------------------------------------
    def assign(self, partitions: Iterable[int]) -> None:
        for r in partitions:
            self._windows.setdefault(r, {})
            self._marks.setdefault(r, {})
            self._idle_base.setdefault(r, {})

    def revoke(self, partitions: Iterable[int]) -> None:
        for r in partitions:
            self._windows.pop(r, None)
            self._marks.pop(r, None)
            self._idle_base.pop(r, None)
            self._positions.pop(r, None)

    @property
    def partitions(self) -> list[int]:
        return sorted(self._windows)

    # -- ingest ---------------------------------------------------------------------------
    def ingest(self, partition: int, records: Sequence[tuple[int, bytes | None]]) -> None:
        """Take one partials partition's batch of (offset, value)."""
        if not records:
            return
        windows = self._windows.setdefault(partition, {})
        marks = self._marks.setdefault(partition, {})
        idle_base = self._idle_base.setdefault(partition, {})
        ignored = self.metrics.partials_ignored
        for offset, value in records:
            try:
                item = decode(value)
            except PartialFormatError as exc:
                ignored.labels(reason="malformed").inc()
                log.error("partials topic: %s (partition %d offset %d)", exc, partition, offset)
                continue
            if isinstance(item, SourceWatermark):
                source = item.source_partition
                before = marks.get(source)
                marks[source] = _newer(before, item)
                if before is not None and before.quiet and not item.quiet:
                    # A source woke up (a burst?): every idle source must confirm again
                    # that the burst did not reach it too.
                    idle_base.clear()
                if item.quiet:
                    idle_base.setdefault(source, item.idle_for_s)
                else:
                    idle_base.pop(source, None)
                continue
            self._add_part(windows, offset, item)
        self._positions[partition] = records[-1][0] + 1

    def _add_part(self, windows: dict[int, _PendingWindow], offset: int, part: PartialPart) -> None:
        ignored = self.metrics.partials_ignored
        ws = part.window_start_s
        if self.released(ws) or self.ledger.get(part.query, ws) is not None:
            ignored.labels(reason="window_released").inc()
            return
        if self.coverage_start_s is not None and ws < self.coverage_start_s:
            ignored.labels(reason="before_coverage").inc()
            return
        if part.key_id and part.key_id != self._key_id_of(ws):
            # Bounded under another pseudonym key (a rotation changed): never merged.
            ignored.labels(reason="key_mismatch").inc()
            return
        pending = windows.get(ws)
        if pending is None:
            pending = windows[ws] = _PendingWindow(offset)
        ident = (part.query, part.source_partition)
        assembler = pending.assemblers.get(ident)
        if assembler is None:
            assembler = pending.assemblers[ident] = PartialAssembler()
        if assembler.taken is not None and not assembler.supersedes(part):
            if assembler.taken.version != part.version:
                ignored.labels(reason="duplicate_version").inc()
            return
        before = assembler.taken
        if assembler.add(part):
            taken = assembler.taken
            assert taken is not None
            if before is not None:
                # A version that applied more erasures replaces the one taken
                # (docs/erasure.md): still one version per source, never a sum of two.
                ignored.labels(reason="superseded").inc()
            layout = (taken.source_partitions, taken.key_id)
            if pending.layout is None:
                pending.layout = layout
            elif layout != pending.layout:
                # Bounded under another partition layout (partitions were added): a user
                # may be on a partition of each layout, so only one layout is merged.
                assembler.taken = before
                ignored.labels(reason="layout_changed").inc()
                log.error(
                    "a partial bounded under another partition layout was left out",
                    extra={"window": iso_utc(ws), "query": part.query},
                )

    # -- closing --------------------------------------------------------------------------
    def open_windows(self) -> list[int]:
        return sorted({ws for windows in self._windows.values() for ws in windows})

    def passed_through(self, r: int) -> float | None:
        """How far every source of partials partition ``r`` has passed (event time), or
        None while some source is unheard of or has sealed nothing and is not idle."""
        marks = self._marks.get(r, {})
        if not marks:
            return None
        idle_base = self._idle_base.get(r, {})
        n_sources = max(m.source_partitions for m in marks.values())
        active: list[float] = []
        quiet: list[float] = []
        for p in range(n_sources):
            mark = marks.get(p)
            if mark is None:
                return None
            if _quiet_confirmed(mark, idle_base.get(p)):
                if mark.watermark_s is not None:
                    quiet.append(mark.watermark_s)
            elif mark.watermark_s is None:
                return None
            else:
                active.append(mark.watermark_s)
        if active:
            return min(active)
        return max(quiet) if quiet else None

    def due_windows(self, limit: int | None = None) -> list[int]:
        """Covered windows every source has passed, in order, from each partition's cursor
        (at most ``limit``; the rest next time): empty windows included (invariant 7)."""
        if self.coverage_start_s is None:
            return []
        size = self.windows.size_s
        step = size * self.partials_partitions
        due: list[int] = []
        self.awaiting_bounds = set()
        for r in sorted(self._windows):
            through = self.passed_through(r)
            if through is None:
                continue
            ws = self.cursor(r)
            taken = 0
            while ws + size <= through and (limit is None or taken < limit):
                if self.bounds_for(ws) is None:
                    self.awaiting_bounds.add(ws)  # released in order: the rest waits too
                    break
                due.append(ws)
                ws += step
                taken += 1
        due.sort()
        return due if limit is None else due[:limit]

    def compute_release(self, window_start_s: int, *, now_s: float) -> list[LedgerRelease]:
        """Fresh draws for the queries of a due window that the ledger has no release of.

        Every such query is charged to the budget first (so the window records show the
        full horizon total), then released once through the privacy core. The caller
        ledgers them, reads the ledger back, and publishes :meth:`winners`.
        """
        window_end_s = self.windows.end_of(window_start_s)
        pending = self._pending(window_start_s)
        bounds = self.bounds_for(window_start_s)
        if bounds is None:
            raise PrivacyError("a window's bounds must be decided before it is released")
        draw_histograms = self._charge_histograms(window_start_s)
        to_draw: list[tuple[CompiledQuery, CumulativeValues | None]] = []
        for q in self.queries:
            if self.ledger.get(q.name, window_start_s) is not None:
                continue
            cfg = q.config
            if self.accountant.query_spent(window_start_s, q.name) != (0.0, 0.0):
                continue  # drawn by this process already; its draw lost or is in flight
            found: CumulativeValues | None = None
            if cfg.cumulative:
                # from the winning draw in the continual state (prepare_continual first)
                found = self.cumulative.values(q.name, window_start_s)
                if found is None:
                    continue
            if not self.accountant.can_charge(window_start_s, q.name, cfg.epsilon, cfg.delta):
                self.metrics.budget_exhausted.labels(query=q.name).inc()
                log.error(
                    "budget exhausted: release suppressed",
                    extra={"query": q.name, "window": iso_utc(window_start_s)},
                )
                continue
            self.accountant.charge(window_start_s, q.name, cfg.epsilon, cfg.delta)
            to_draw.append((q, found))
        horizon = self.horizon_spent(window_start_s)
        out = []
        for q, found in to_draw:
            taken = self._taken(pending, q.name, window_start_s, bounds)
            sources = {p.source_partition: p.version for p in taken}
            if found is not None:
                out.append(
                    cumulative_release(
                        self.cumulative.queries[q.name],
                        found,
                        window_start_s=window_start_s,
                        window_end_s=window_end_s,
                        horizon_epsilon_spent=horizon,
                        sources=sources,
                    )
                )
                continue
            aggregates = merge_totals(taken)
            rel = self._release(
                q, window_start_s, window_end_s, aggregates, sources, horizon, bounds
            )
            rel.erasures_through = min((p.erasures_through for p in taken), default=0)
            out.append(rel)
        if draw_histograms:
            out.append(self._release_histograms(pending, window_start_s, window_end_s, bounds))
        return out

    # -- cumulative queries (stream_dp.pipeline.cumulative) ---------------------------------
    def continual_pending(self, window_start_s: int) -> list[str]:
        """Cumulative queries of the window the ledger has no release of."""
        return [
            name
            for name in self.cumulative.queries
            if self.ledger.get(name, window_start_s) is None
        ]

    def continual_partitions(self, window_start_s: int) -> list[int]:
        """The continual partitions holding the state the window's pending cumulative
        queries continue (read them to a fence before :meth:`prepare_continual`)."""
        return sorted(
            {
                self.cumulative.partition_of(name, window_start_s)
                for name in self.continual_pending(window_start_s)
            }
        )

    def prepare_continual(self, window_start_s: int) -> Preparation:
        """Draw the window's step of every pending cumulative query that has no winning
        draw yet (in memory: the transport writes and reads back ``to_write`` before
        :meth:`compute_release`), or say which must wait for the previous window."""
        assert self.coverage_start_s is not None
        pending = self._pending(window_start_s)
        previous_s = window_start_s - self.windows.size_s
        previous_released = self.released(previous_s) or any(
            self.ledger.get(q.name, previous_s) is not None for q in self.queries
        )

        def totals_of(name: str) -> Mapping[tuple[Any, ...], KeyAggregate]:
            return merge_totals(self._taken(pending, name, window_start_s))

        def may_spend(name: str) -> bool:
            cfg = self.cumulative.queries[name].config
            return self.accountant.can_charge(window_start_s, name, cfg.epsilon, cfg.delta)

        def erasures_of(name: str) -> int:
            taken = self._taken(pending, name, window_start_s)
            return min((p.erasures_through for p in taken), default=0)

        return self.cumulative.prepare(
            window_start_s,
            self.continual_pending(window_start_s),
            first_covered_s=self.coverage_start_s,
            totals_of=totals_of,
            may_spend=may_spend,
            previous_released=previous_released,
            erasures_of=erasures_of,
        )

    def erasures_applied(self, window_start_s: int) -> int:
        """The erasure-log position every partial the window would merge has applied: the
        least ``erasures_through`` of the versions taken (docs/erasure.md). A window whose
        partials have not applied an erasure it must exclude waits for newer versions."""
        pending = self._pending(window_start_s)
        if pending is None:
            return _NO_PARTIALS
        taken = [a.taken for a in pending.assemblers.values() if a.taken is not None]
        return min((p.erasures_through for p in taken), default=_NO_PARTIALS)

    def drop_stale_partials(self, window_start_s: int, required: int) -> int:
        """Leave out of the window every partial that did not apply the erasure log up to
        ``required`` (docs/erasure.md: when no newer version came in time). That source's
        data is missing from the window — never the erased user's. Returns how many."""
        pending = self._pending(window_start_s)
        dropped = 0
        for assembler in pending.assemblers.values() if pending is not None else ():
            if assembler.taken is not None and assembler.taken.erasures_through < required:
                assembler.taken = None
                dropped += 1
        if dropped:
            self.metrics.partials_ignored.labels(reason="erasure_stale").inc(dropped)
        return dropped

    def last_released(self, r: int) -> int | None:
        """The latest window of partials partition ``r`` known released (None: none yet)."""
        if self.coverage_start_s is None:
            return None
        cursor = self.cursor(r)
        return (
            None
            if cursor <= self._first_on(r)
            else cursor - self.windows.size_s * self.partials_partitions
        )

    def _charge_histograms(self, window_start_s: int) -> bool:
        """bounds: auto — charge the window's histograms (once; False: nothing to draw)."""
        if not self.schedule.auto or self.ledger.get(BOUNDS_CHARGE, window_start_s) is not None:
            return False
        epsilon = self.schedule.epsilon
        if self.accountant.query_spent(window_start_s, BOUNDS_CHARGE) != (0.0, 0.0):
            return False
        if not self.accountant.can_charge(window_start_s, BOUNDS_CHARGE, epsilon, 0.0):
            log.error(
                "budget exhausted: the window's bounds histograms are not drawn (the next "
                "window keeps this one's bounds)",
                extra={"window": iso_utc(window_start_s)},
            )
            return False
        self.accountant.charge(window_start_s, BOUNDS_CHARGE, epsilon, 0.0)
        return True

    def _release_histograms(
        self,
        pending: _PendingWindow | None,
        window_start_s: int,
        window_end_s: int,
        bounds: BoundsTriple,
    ) -> LedgerRelease:
        """The window's histograms, merged over source partitions and noised once."""
        layout = self.schedule.layout
        assert layout is not None
        # one partial per source partition (every partial of a seal carries the same
        # histograms): each user is in one partition, so it counts once
        per_source: dict[int, Partial] = {}
        for q in self.queries:
            for partial in self._taken(pending, q.name, window_start_s, bounds):
                if partial.histograms is not None:
                    per_source.setdefault(partial.source_partition, partial)
        exact = merge_counts(
            layout, [p.histograms for p in per_source.values() if p.histograms is not None]
        )
        noisy = release_histograms(exact, layout, epsilon=self.schedule.epsilon)
        return histograms_release(
            release_id=new_release_id(),
            window_start_s=window_start_s,
            window_end_s=window_end_s,
            noisy=noisy,
            bounds=bounds,
            sources={p: partial.version for p, partial in sorted(per_source.items())},
        )

    def bounds_decision(self, window_start_s: int) -> tuple[str, bytes] | None:
        """bounds: auto — the ledger record of the next window's bounds, from this window's
        winners (call once they are decided: after the ledger read-back). None when not
        auto or already decided."""
        if not self.schedule.auto:
            return None
        nxt = window_start_s + self.windows.size_s
        if nxt in self.ledger.bounds:
            return None
        current = self.bounds_for(window_start_s)
        assert current is not None
        return decide_next(
            self.schedule,
            window_start_s=window_start_s,
            window_size_s=self.windows.size_s,
            current=current,
            histograms=self.ledger.get(BOUNDS_CHARGE, window_start_s),
            released=released_values(self.winners(window_start_s)),
        )

    def winners(self, window_start_s: int) -> list[LedgerRelease]:
        """The ledger's release of each query of the window (first complete draw in log
        order), in query order; queries the budget suppressed are missing."""
        found = (self.ledger.get(q.name, window_start_s) for q in self.queries)
        return [rel for rel in found if rel is not None]

    def horizon_spent(self, window_start_s: int) -> float:
        """Σ ε over the horizon ending with this window (windows released by other workers
        and not read yet count the configured per-window ε: every covered window is
        released)."""
        return self.accountant.horizon_spent(
            window_start_s,
            first_window_s=self.coverage_start_s,
            per_window_epsilon=self._epsilon_per_window,
        )

    def _pending(self, window_start_s: int) -> _PendingWindow | None:
        for windows in self._windows.values():
            if window_start_s in windows:
                return windows[window_start_s]
        return None

    def _taken(
        self,
        pending: _PendingWindow | None,
        query: str,
        window_start_s: int,
        bounds: BoundsTriple | None = None,
    ) -> list[Partial]:
        if pending is None:
            return []
        taken = []
        for (name, source), assembler in sorted(pending.assemblers.items()):
            if name != query:
                continue
            if assembler.taken is None:
                log.warning(
                    "an incomplete partial was left out (its writer crashed mid-way)",
                    extra={"query": query, "window": iso_utc(window_start_s), "source": source},
                )
                continue
            if self.schedule.auto and not self._bounded_with(assembler, bounds):
                continue
            taken.append(assembler.taken)
        return taken

    def _bounded_with(self, assembler: PartialAssembler, bounds: BoundsTriple | None) -> bool:
        """bounds: auto — a partial is merged only if bounded with the window's bounds (the
        noise is calibrated to them) and its histograms fit the layout; else it is left
        out, counted once (``bounds_mismatch``)."""
        partial = assembler.taken
        assert partial is not None
        layout = self.schedule.layout
        ok = partial.bounds == bounds and partial.histograms is not None and layout is not None
        if ok and layout is not None and partial.histograms is not None:
            try:
                merge_counts(layout, [partial.histograms])
            except PrivacyError:
                ok = False
        if not ok:
            assembler.taken = None
            self.metrics.partials_ignored.labels(reason="bounds_mismatch").inc()
            log.error(
                "a partial bounded with other bounds than its window's was left out",
                extra={"query": partial.query, "window": iso_utc(partial.window_start_s)},
            )
        return ok

    def _release(
        self,
        q: CompiledQuery,
        window_start_s: int,
        window_end_s: int,
        aggregates: Mapping[tuple[Any, ...], KeyAggregate],
        sources: dict[int, str],
        horizon: float,
        bounds: BoundsTriple,
    ) -> LedgerRelease:
        cfg = q.config
        plan = self.plan_for(q, bounds)
        if self._observe_exact is not None:
            self._observe_exact(q.name, window_start_s, aggregates)
        result = release_query(aggregates, plan)
        release_id = new_release_id()
        selection = plan.selection.record_parameters() if plan.selection is not None else None
        records = [
            OutputRecord(key, value)
            for key, value in release_records(
                release_id=release_id,
                query=q.name,
                window_start_s=window_start_s,
                window_end_s=window_end_s,
                group_by=cfg.group_by,
                statistic=cfg.statistic,
                epsilon=cfg.epsilon,
                delta=cfg.delta,
                mechanism=cfg.mechanism,
                selection=selection,
                values=result.values,
            )
        ]
        records.append(
            OutputRecord(
                output_key(q.name, window_start_s, None),
                window_record(
                    release_id=release_id,
                    query=q.name,
                    window_start_s=window_start_s,
                    window_end_s=window_end_s,
                    released_keys=len(result.values),
                    epsilon_spent=cfg.epsilon,
                    delta_spent=cfg.delta,
                    horizon_epsilon_spent=horizon,
                    bounds=self._bounds_field(window_start_s, bounds),
                ),
            )
        )
        return LedgerRelease(
            release_id=release_id,
            query=q.name,
            window_start_s=window_start_s,
            window_end_s=window_end_s,
            epsilon_spent=cfg.epsilon,
            delta_spent=cfg.delta,
            records=records,
            sources=sources,
        )

    def _bounds_field(self, window_start_s: int, bounds: BoundsTriple) -> dict[str, Any] | None:
        """bounds: auto — what the window record states: the bounds the window used, how
        they were chosen, and the ε this window spends choosing the next window's."""
        if not self.schedule.auto:
            return None
        k, l0, linf = bounds
        decision = self.schedule.decision_of(window_start_s)
        return {
            "max_contributions_per_window": k,
            "max_keys_per_user": l0,
            "max_contributions_per_key": linf,
            "chosen": "start" if decision is None else decision.reason,
            "epsilon": self.schedule.epsilon,
        }

    def finish_window(
        self, window_start_s: int, releases: Sequence[LedgerRelease], now_s: float
    ) -> int:
        """The window's releases are ledgered and published: drop its state, advance its
        partition's cursor, note metrics. Returns the partition's new cursor."""
        for windows in self._windows.values():
            windows.pop(window_start_s, None)
        r = self.windows.partition_of(window_start_s, self.partials_partitions)
        if window_start_s >= self.cursor(r):
            self._cursor[r] = window_start_s + self.windows.size_s * self.partials_partitions
        end = self.windows.end_of(window_start_s)
        for rel in releases:
            self.metrics.windows_released.labels(query=rel.query).inc()
            self.metrics.releases_published.labels(query=rel.query).inc(len(rel.records) - 1)
            self.metrics.keys_released.labels(query=rel.query).inc(len(rel.records) - 1)
            self.metrics.epsilon_spent.labels(query=rel.query).set(rel.epsilon_spent)
        bounds = self.bounds_for(window_start_s)
        if bounds is not None:  # fixed bounds too: the gauges say what a window used
            charged = (
                self.accountant.query_spent(window_start_s, BOUNDS_CHARGE)[0]
                if self.schedule.auto
                else 0.0
            )
            self.metrics.set_bounds(bounds, charged)
        spent = self.accountant.window_spent(window_start_s)[0]
        self.metrics.epsilon_remaining.set(max(0.0, self.config.privacy.epsilon_per_window - spent))
        horizon = self.horizon_spent(window_start_s)
        self.metrics.horizon_epsilon_spent.set(horizon)
        self.metrics.horizon_epsilon_remaining.set(
            max(0.0, self.config.privacy.max_epsilon_per_horizon - horizon)
        )
        self.metrics.release_delay.observe(max(0.0, now_s - end))
        self.metrics.last_release.set(now_s)
        if not self._retain_ledger:
            self.ledger.forget(self.released)
        self.forget_finished_horizons()
        return self.cursor(r)

    def forget_finished_horizons(self) -> None:
        """Drop (and skip when read) the continual state of horizons whose every window is
        released: every window before the smallest cursor."""
        if self.cumulative.queries and self.coverage_start_s is not None:
            self.cumulative.forget(min(self.cursor(p) for p in range(self.partials_partitions)))

    def watermark_s(self) -> float | None:
        """The slowest source watermark over assigned partials partitions (for /metrics)."""
        values = [
            m.watermark_s
            for marks in self._marks.values()
            for m in marks.values()
            if m.watermark_s is not None
        ]
        return min(values) if values else None

    # -- offsets --------------------------------------------------------------------------
    def safe_offsets(self) -> dict[int, int]:
        """Per partials partition, the next offset to commit."""
        safe: dict[int, int] = {}
        for r, position in self._positions.items():
            firsts = [w.first_offset for w in self._windows.get(r, {}).values()]
            safe[r] = min(firsts) if firsts else position
        return safe


def _newer(old: SourceWatermark | None, new: SourceWatermark) -> SourceWatermark:
    """The watermark never moves back: what an earlier writer sealed stays sealed."""
    if old is None or old.watermark_s is None:
        return new
    if new.watermark_s is None or new.watermark_s < old.watermark_s:
        return SourceWatermark(
            new.source_partition,
            new.source_partitions,
            old.watermark_s,
            new.idle,
            new.open_windows,
            new.idle_for_s,
        )
    return new


def _quiet_confirmed(mark: SourceWatermark, idle_base_s: float | None) -> bool:
    """Idle with nothing open, and *stayed* so for IDLE_CONFIRM_S since another source last
    woke up: an "idle" written just before a burst reached it must not let the others'
    share of the burst close the window."""
    return (
        mark.quiet and idle_base_s is not None and mark.idle_for_s - idle_base_s >= IDLE_CONFIRM_S
    )
