"""Stage 2 of the worker, without Kafka: merge partials, release every window once.

The owner of a partials partition sees every partial of the windows mapped to it, plus a
:class:`~stream_dp.pipeline.formats.partials.SourceWatermark` from each source partition. **Which
windows are released never depends on the data** (docs/privacy.md#partition-selection;
issue 12): every window from the first covered one (``window.start_at`` or the
deployment's recorded start) up to the point all sources have passed is released in order,
with or without events — public keys get their noisy values in every window, and every
window gets its ``window`` record.

:class:`ReleaseStage` decides and draws; it holds five parts, each a module:

* :class:`~stream_dp.pipeline.stages.partials_inbox.PartialsInbox` — the partials and source
  watermarks read, which version of each (query, source partition) is taken, which are
  never merged (another fingerprint, pseudonym key or partition layout), and how far every
  source has passed;
* :class:`~stream_dp.pipeline.stages.release_cursors.ReleaseCursors` — the first covered window
  and per partials partition a *cursor*, the next window not yet released (every window
  before it is released and published, and a ``progress`` record in the ledger says so);
  windows are released strictly in cursor order;
* :class:`~stream_dp.pipeline.stages.auto_bounds.AutoBounds` — which bounds a window is released
  with (``bounds: auto``: decided from the window before), plans calibrated to them;
* :class:`~stream_dp.pipeline.stages.window_charges.WindowCharges` — each window's draws charged
  to the budget once, in order, before anything takes their data in;
* :class:`~stream_dp.pipeline.stages.cumulative.ContinualSteps` (:attr:`ReleaseStage.continual`)
  — the cumulative queries' steps of a window, drawn on the previous window's state once
  charged.

The merged exact totals go through the privacy core once (:func:`draw_release`: noise,
τ-threshold) and the versions taken are recorded in the ledger. Offsets of the partials
topic are committed only up to the earliest partial an unreleased window still needs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any

from stream_dp.config.classification import user_placement
from stream_dp.config.model import Config
from stream_dp.errors import PrivacyError
from stream_dp.ops.metrics import Metrics
from stream_dp.ops.progress import report_progress
from stream_dp.pipeline.formats.continual_state import ContinualStore
from stream_dp.pipeline.formats.ledger import (
    LedgerIndex,
    LedgerRelease,
    close_release,
    new_release_id,
)
from stream_dp.pipeline.formats.partials import Partial, PartialPart, merge_totals
from stream_dp.pipeline.formats.records import ReleaseTemplate
from stream_dp.pipeline.stages.auto_bounds import AutoBounds
from stream_dp.pipeline.stages.cumulative import (
    ContinualSteps,
    CumulativeQuery,
    CumulativeReleases,
    CumulativeValues,
    cumulative_release,
)
from stream_dp.pipeline.stages.hold import SourceCompleteness
from stream_dp.pipeline.stages.partials_inbox import PartialsInbox, PendingWindow
from stream_dp.pipeline.stages.queries import CompiledQuery, needed_fields
from stream_dp.pipeline.stages.release_cursors import ReleaseCursors
from stream_dp.pipeline.stages.window_charges import WindowCharges
from stream_dp.privacy.adaptive_bounds import BoundsTriple
from stream_dp.privacy.budget import BOUNDS_CHARGE, BudgetAccountant
from stream_dp.privacy.continual.counter import NoiseSource
from stream_dp.privacy.planner import QueryPlan
from stream_dp.privacy.release import KeyAggregate, release_query
from stream_dp.windows import TumblingWindows

log = logging.getLogger(__name__)

#: (query, window start, exact bounded aggregates per group key) — see ReleaseStage.__init__.
ExactTotalsObserver = Callable[[str, int, Mapping[tuple[Any, ...], KeyAggregate]], None]


def expected_key_id(config: Config, window_start_s: int) -> str:
    """The pseudonym key id of a window under this configuration (no secret needed)."""
    p = config.pseudonymization
    if p.rotate_at is not None and window_start_s < p.rotate_at.timestamp():
        assert p.previous_key_id is not None
        return p.previous_key_id
    return p.key_id


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
        key_check_of: Callable[[int], str] | None = None,
        continual_store: ContinualStore | None = None,
        continual_partitions: int = 1,
        continual_noise: NoiseSource | None = None,
        fingerprint: str | None = None,
    ) -> None:
        self.config = config
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
        #: Cumulative queries' running totals (module stream_dp.pipeline.stages.cumulative): their
        #: state lives in the continual topic, read and written by the transport.
        self.continual_store = continual_store if continual_store is not None else ContinualStore()
        self.cumulative = CumulativeReleases(
            [CumulativeQuery.of(q.config, q.plan) for q in self.queries if q.plan.continual],
            window_size_s=config.window.size_s,
            partitions=continual_partitions,
            store=self.continual_store,
            noise=continual_noise,
        )
        self.accountant = budget_accountant(config)
        self._epsilon_per_window = sum(q.epsilon for q in config.queries) + config.bounds_epsilon
        #: bounds: auto — which bounds each window uses, plans calibrated to them, the
        #: histograms and the next window's decision (with fixed bounds: the configured).
        self.auto_bounds = AutoBounds(config, self.ledger, self.metrics)
        self.schedule = self.auto_bounds.schedule
        #: Charges before state: each window's draws are charged once, in order, before
        #: anything (a running total's state) takes its data in.
        self.charges = WindowCharges(
            self.accountant,
            config.queries,
            bounds_epsilon=self.schedule.epsilon if self.schedule.auto else None,
            metrics=self.metrics,
        )
        #: bounds: auto — due windows waiting for their bounds (the worker reads the
        #: ledger partition of the window before, where the decision is written)
        self.awaiting_bounds: set[int] = set()
        #: The first covered window and each partials partition's next window to release.
        self.cursors = ReleaseCursors(
            self.windows, partials_partitions, config.window.first_window_start()
        )
        #: The partials and source watermarks of the owned partials partitions.
        self.inbox = PartialsInbox(
            self.metrics,
            refusal=self._refusal,
            key_id_of=key_id_of or (lambda ws: expected_key_id(config, ws)),
            key_check_of=key_check_of,
            fingerprint=fingerprint,
            placement=user_placement(config.input),
        )
        #: Due windows wait for every source's report in full (stages.hold).
        self.completeness = SourceCompleteness(self.inbox, self.metrics)
        #: The cumulative queries' steps (stages.cumulative).
        self.continual = ContinualSteps(
            self.cumulative,
            self.ledger,
            self.inbox,
            self.cursors,
            self.queries,
            charge=self._charge,
            taken=self._taken,
        )
        self.adopt_ledger()

    # -- coverage and cursors (ReleaseCursors) --------------------------------------------
    @property
    def coverage_start_s(self) -> int | None:
        """The first covered window (None: not known yet, nothing is released)."""
        return self.cursors.coverage_start_s

    def set_coverage(self, first_window_start_s: int) -> None:
        self.cursors.set_coverage(first_window_start_s)

    def cursor(self, r: int) -> int:
        """The next window of partials partition ``r`` not yet released."""
        return self.cursors.cursor(r)

    def released(self, window_start_s: int) -> bool:
        """Whether a covered window is known released (by anyone, as far as read)."""
        return self.cursors.released(window_start_s)

    def released_earlier(self, window_start_s: int) -> bool:
        """Released before this process read the ledger (its events are replays)."""
        return self.cursors.released_earlier(window_start_s)

    @property
    def first_unreleased_s(self) -> int | None:
        """The earliest covered window not known released (where stage 1's event time
        starts after a restart; None while the coverage is unknown)."""
        return self.cursors.first_unreleased()

    @property
    def last_release_wall_s(self) -> float | None:
        """When the deployment last released a window (its progress record's broker time)."""
        return self.ledger.last_progress_wall_s

    def windows_due_count(self) -> int:
        """Windows of the owned partials partitions that every source has passed but that
        are not released yet (a backlog after a restart while idle drains through
        :meth:`due_windows`, a bounded number per loop iteration)."""
        if self.coverage_start_s is None:
            return 0
        due = 0
        for r in self.inbox.partitions:
            through = self.inbox.passed_through(r)
            if through is not None:
                due += self.cursors.due_count(r, through)
        return due

    def last_released(self, r: int) -> int | None:
        """The latest window of partials partition ``r`` known released (None: none yet)."""
        return self.cursors.last_released(r)

    def bounds_for(self, window_start_s: int) -> BoundsTriple | None:
        """The bounds of a window (None under bounds: auto until they are decided:
        :meth:`AutoBounds.bounds_for
        <stream_dp.pipeline.stages.auto_bounds.AutoBounds.bounds_for>`)."""
        return self.auto_bounds.bounds_for(
            window_start_s,
            self.coverage_start_s,
            lambda ws: self.cursors.released_in_ledger(self.ledger, ws),
        )

    def adopt_ledger(self) -> None:
        """Take in what the ledger says (at start, and after each read): cursors, charges,
        the coverage; then forget releases of windows behind the cursors."""
        ledger = self.ledger
        self.cursors.adopt(ledger)
        _adopt_spend(self.accountant, ledger)
        if self.coverage_start_s is not None and not self._retain_ledger:
            ledger.forget(self.released)
            self.inbox.drop(self.released)

    # -- partitions and partials (the inbox) -------------------------------------------
    def assign(self, partitions: Iterable[int]) -> None:
        self.inbox.assign(partitions)

    def revoke(self, partitions: Iterable[int]) -> None:
        self.inbox.revoke(partitions)

    @property
    def partitions(self) -> list[int]:
        return self.inbox.partitions

    @property
    def fingerprint(self) -> str | None:
        """The deployment fingerprint's digest whose partials are merged (None: any)."""
        return self.inbox.fingerprint

    def ingest(self, partition: int, records: Sequence[tuple[int, bytes | None]]) -> None:
        """Take one partials partition's batch of (offset, value)."""
        self.inbox.ingest(partition, records)

    def _refusal(self, part: PartialPart) -> str | None:
        """Why no partial of its window is taken any more, or None."""
        ws = part.window_start_s
        if self.released(ws) or self.ledger.get(part.query, ws) is not None:
            return "window_released"
        if self.coverage_start_s is not None and ws < self.coverage_start_s:
            return "before_coverage"
        return None

    def open_windows(self) -> list[int]:
        return self.inbox.open_windows()

    # -- closing --------------------------------------------------------------------------
    def due_windows(self, limit: int | None = None) -> list[int]:
        """Covered windows every source has passed, in order, from each partition's cursor
        (at most ``limit``; the rest next time): empty windows included (invariant 7)."""
        if self.coverage_start_s is None:
            return []
        size = self.windows.size_s
        step = size * self.partials_partitions
        due: list[int] = []
        self.awaiting_bounds = set()
        self.completeness.begin()
        for r in self.inbox.partitions:
            through = self.inbox.passed_through(r)
            if through is None:
                self.completeness.note_unheard(r, self.inbox.unheard_sources(r))
                continue
            ws = self.cursor(r)
            taken = 0
            while ws + size <= through and (limit is None or taken < limit):
                if self.bounds_for(ws) is None:
                    self.awaiting_bounds.add(ws)  # released in order: the rest waits too
                    break
                if self.completeness.holds(ws):
                    break  # a source's partial is incomplete: in order, the rest waits too
                due.append(ws)
                ws += step
                taken += 1
        self.completeness.end()
        due.sort()
        return due if limit is None else due[:limit]

    def compute_release(self, window_start_s: int, *, now_s: float) -> list[LedgerRelease]:
        """Fresh draws for the queries of a due window that the ledger has no release of.

        Every such query is charged to the budget first (so the window records show the
        full horizon total), then released once through the privacy core. The caller
        ledgers them, reads the ledger back, and publishes :meth:`winners`.
        """
        window_end_s = self.windows.end_of(window_start_s)
        pending = self.inbox.pending(window_start_s)
        bounds = self.bounds_for(window_start_s)
        if bounds is None:
            raise PrivacyError("a window's bounds must be decided before it is released")
        charged = self._charge(window_start_s)
        draw_histograms = BOUNDS_CHARGE in charged and self.charges.take(
            window_start_s, BOUNDS_CHARGE
        )
        to_draw: list[tuple[CompiledQuery, CumulativeValues | None]] = []
        for q in self.queries:
            if self.ledger.get(q.name, window_start_s) is not None or q.name not in charged:
                continue  # ledgered, refused, or drawn by this process already
            found: CumulativeValues | None = None
            if q.config.cumulative:
                # from the winning draw in the continual state (prepare_continual first)
                found = self.cumulative.values(q.name, window_start_s)
                if found is None:
                    continue  # stays charged: nothing is drawn, the spend is over-stated
            self.charges.take(window_start_s, q.name)
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
            report_progress("merge")  # liveness: a long draw moves (ops.progress)
            if self._observe_exact is not None:
                self._observe_exact(q.name, window_start_s, aggregates)
            rel = draw_release(
                q,
                self.auto_bounds.plan_for(q, bounds),
                aggregates,
                window_start_s=window_start_s,
                window_end_s=window_end_s,
                sources=sources,
                horizon_epsilon_spent=horizon,
                bounds_field=self.auto_bounds.window_field(window_start_s, bounds),
            )
            rel.erasures_through = min((p.erasures_through for p in taken), default=0)
            out.append(rel)
        if draw_histograms:  # from the partials of every query
            every = (
                p
                for q in self.queries
                for p in self._taken(pending, q.name, window_start_s, bounds)
            )
            out.append(self.auto_bounds.histograms(every, window_start_s, window_end_s, bounds))
        return out

    def erasures_applied(self, window_start_s: int) -> int:
        """:meth:`.PartialsInbox.erasures_applied` (docs/erasure.md)."""
        return self.inbox.erasures_applied(window_start_s)

    def drop_stale_partials(self, window_start_s: int, required: int) -> int:
        """:meth:`.PartialsInbox.drop_stale_partials` (docs/erasure.md)."""
        return self.inbox.drop_stale_partials(window_start_s, required)

    def _charge(self, window_start_s: int) -> frozenset[str]:
        """Charge the window's draws not charged yet (:mod:`.window_charges`): the draws
        charged and not yet drawn (``#bounds``: the histograms)."""
        return self.charges.charge(
            window_start_s, ledgered=lambda name: self.ledger.get(name, window_start_s) is not None
        )

    def bounds_decision(self, window_start_s: int) -> tuple[str, bytes] | None:
        """bounds: auto — the ledger record of the next window's bounds, from this window's
        winners (call once they are decided: after the ledger read-back). None when not
        auto or already decided."""
        if not self.schedule.auto:
            return None
        current = self.bounds_for(window_start_s)
        assert current is not None
        return self.auto_bounds.decision(window_start_s, current, self.winners(window_start_s))

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

    def _taken(
        self,
        pending: PendingWindow | None,
        query: str,
        window_start_s: int,
        bounds: BoundsTriple | None = None,
    ) -> list[Partial]:
        """The query's partials taken for the window (bounds: auto — bounded with
        ``bounds``)."""
        keep = partial(self.auto_bounds.bounded_with, bounds=bounds) if self.schedule.auto else None
        return self.inbox.taken(pending, query, window_start_s, keep)

    def finish_window(
        self, window_start_s: int, releases: Sequence[LedgerRelease], now_s: float
    ) -> int:
        """The window's releases are ledgered and published: drop its state, advance its
        partition's cursor, note metrics. Returns the partition's new cursor."""
        self.inbox.drop_window(window_start_s)
        r = self.cursors.advance(window_start_s)
        bounds = self.bounds_for(window_start_s)
        note_release(
            self.metrics,
            releases,
            bounds=bounds,
            bounds_epsilon=(
                self.accountant.query_spent(window_start_s, BOUNDS_CHARGE)[0]
                if self.schedule.auto
                else 0.0
            ),
            epsilon_remaining=self.config.privacy.epsilon_per_window
            - self.accountant.window_spent(window_start_s)[0],
            horizon_epsilon_spent=self.horizon_spent(window_start_s),
            max_epsilon_per_horizon=self.config.privacy.max_epsilon_per_horizon,
            release_delay_s=now_s - self.windows.end_of(window_start_s),
            now_s=now_s,
        )
        if not self._retain_ledger:
            self.ledger.forget(self.released)
        self.charges.forget(self.released)
        self.forget_finished_horizons()
        return self.cursor(r)

    def forget_finished_horizons(self) -> None:
        """Drop (and skip when read) the continual state of horizons whose every window is
        released: every window before the smallest cursor."""
        if self.cumulative.queries and self.coverage_start_s is not None:
            self.cumulative.forget(min(self.cursor(p) for p in range(self.partials_partitions)))

    def watermark_s(self) -> float | None:
        """The slowest source watermark over assigned partials partitions (for /metrics)."""
        return self.inbox.watermark_s()

    def safe_offsets(self) -> dict[int, int]:
        """Per partials partition, the next offset to commit."""
        return self.inbox.safe_offsets()


def draw_release(
    q: CompiledQuery,
    plan: QueryPlan,
    aggregates: Mapping[tuple[Any, ...], KeyAggregate],
    *,
    window_start_s: int,
    window_end_s: int,
    sources: dict[int, str],
    horizon_epsilon_spent: float,
    bounds_field: dict[str, Any] | None,
) -> LedgerRelease:
    """One query's release of a window, drawn once through the privacy core (noise,
    τ-threshold under ``plan``): its output records and its ``window`` record."""
    cfg = q.config
    result = release_query(aggregates, plan)
    report_progress("noise")
    release_id = new_release_id()
    selection = plan.selection.record_parameters() if plan.selection is not None else None
    template = ReleaseTemplate(
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
    )
    # The records are encoded chunk by chunk from the columns when written (ledger parts,
    # output): never all at once (docs/operations.md#memory-at-release).
    return close_release(
        (),
        release_id=release_id,
        query=q.name,
        window_start_s=window_start_s,
        window_end_s=window_end_s,
        released_keys=len(result.values),
        epsilon_spent=cfg.epsilon,
        delta_spent=cfg.delta,
        horizon_epsilon_spent=horizon_epsilon_spent,
        sources=sources,
        bounds=bounds_field,
        drawn=(template, result.values),
    )


def note_release(
    metrics: Metrics,
    releases: Sequence[LedgerRelease],
    *,
    bounds: BoundsTriple | None,
    bounds_epsilon: float,
    epsilon_remaining: float,
    horizon_epsilon_spent: float,
    max_epsilon_per_horizon: float,
    release_delay_s: float,
    now_s: float,
) -> None:
    """A finished window on /metrics: its releases, the bounds it used (fixed bounds too:
    the gauges say what a window used) and the budget left."""
    for rel in releases:
        metrics.windows_released.labels(query=rel.query).inc()
        metrics.releases_published.labels(query=rel.query).inc(len(rel.records) - 1)
        metrics.keys_released.labels(query=rel.query).inc(len(rel.records) - 1)
        metrics.epsilon_spent.labels(query=rel.query).set(rel.epsilon_spent)
    if bounds is not None:
        metrics.set_bounds(bounds, bounds_epsilon)
    metrics.epsilon_remaining.set(max(0.0, epsilon_remaining))
    metrics.horizon_epsilon_spent.set(horizon_epsilon_spent)
    metrics.horizon_epsilon_remaining.set(max(0.0, max_epsilon_per_horizon - horizon_epsilon_spent))
    metrics.release_delay.observe(max(0.0, release_delay_s))
    metrics.last_release.set(now_s)


def budget_accountant(config: Config) -> BudgetAccountant:
    """The privacy budget of the configuration, per window and per horizon."""
    return BudgetAccountant(
        window_size_s=config.window.size_s,
        epsilon_per_window=config.privacy.epsilon_per_window,
        delta_per_window=config.privacy.delta_per_window,
        horizon_windows=config.privacy.horizon_windows,
        max_epsilon_per_horizon=config.privacy.max_epsilon_per_horizon,
    )


def _adopt_spend(accountant: BudgetAccountant, ledger: LedgerIndex) -> None:
    """Charge the budget with what the ledger's winning draws spent, once per (window,
    query): the releases it holds, and the windows it forgot as it read them (released)."""
    for rel in ledger.releases():
        if accountant.query_spent(rel.window_start_s, rel.query) == (0.0, 0.0):
            accountant.record(rel.window_start_s, rel.query, rel.epsilon_spent, rel.delta_spent)
    for (query, ws), (epsilon, delta) in sorted(ledger.spent.items(), key=lambda i: i[0][1]):
        if accountant.query_spent(ws, query) == (0.0, 0.0):
            accountant.record(ws, query, epsilon, delta)
    ledger.spent.clear()
