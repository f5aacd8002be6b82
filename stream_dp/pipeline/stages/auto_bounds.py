"""``bounds: auto`` in the pipeline: which bounds each window uses, and where they come from.

The rule (docs/privacy.md#budget; :mod:`stream_dp.privacy.adaptive_bounds` has the argument):

- the first covered window uses the configured start values;
- every later window w uses the bounds decided from window w − 1: a ``bounds`` record in
  the ledger (``__bounds__|<w>``), written by whoever released w − 1 once its draws were
  decided, as a deterministic function of them (w − 1's histograms and released key counts,
  and the trend against w − 2's choice). Two owners racing for w − 1 write the same record;
  the first in log order counts;
- stage 1 seals w only once w's bounds are known — it keeps reservoirs at the caps, and a
  uniform subsample of a uniform reservoir is uniform, so the bound applies at seal time —
  and stage 2 releases w only then, with noise calibrated to those bounds, after checking
  that every partial it merges was bounded with them. Releasing w − 1 needs only seals of
  w − 1: nothing waits on itself;
- each window's stage 1 also computes exact histograms of its users' contributions (at the
  caps), carried in the partials; stage 2 merges them, adds noise once (charged to the
  window's budget as ``#bounds``) and ledgers them like a query's release — never published
  to the output topic.
"""

from __future__ import annotations

import logging
import random  # only the type of the sampling PRNG that picks a user's per-key bin (not a DP draw)
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from stream_dp.config.model import Config
from stream_dp.errors import PrivacyError
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.formats.ledger import (
    BoundsDecision,
    LedgerIndex,
    LedgerRelease,
    OutputRecord,
    encode_bounds_decision,
    new_release_id,
)
from stream_dp.pipeline.formats.partials import Partial, PartialAssembler
from stream_dp.pipeline.stages.queries import CompiledQuery
from stream_dp.privacy.adaptive_bounds import (
    BoundsTriple,
    HistogramLayout,
    NoisyHistograms,
    UserHistograms,
    choose_bounds,
    merge_counts,
    release_histograms,
)
from stream_dp.privacy.budget import BOUNDS_CHARGE
from stream_dp.privacy.planner import AutoBoundsPlan, QueryPlan, plan_config, plan_query
from stream_dp.privacy.specs import BoundsSpec
from stream_dp.windows.tumbling import iso_utc

log = logging.getLogger(__name__)

#: (group key, value) of an item for a query, or None when the query does not count it.
Projection = Callable[[int], "tuple[Any, int] | None"]


class BoundsSchedule:
    """Which bounds each window uses: the configuration's, or under ``bounds: auto`` the
    start values for the first covered window and the ledger's decision for later ones."""

    def __init__(self, config: Config, ledger: LedgerIndex) -> None:
        self.config = config
        self.ledger = ledger
        self.auto = config.bounds.is_auto
        self.plan: AutoBoundsPlan | None = (
            plan_config(config.spec()).auto_bounds if self.auto else None
        )
        self.start: BoundsTriple = config.bounds.start_bounds().values()
        #: The bounds reservoirs hold (the caps under auto).
        self.reservoir_k = config.bounds.cap_bounds().values()[0]
        self.epsilon = config.bounds_epsilon

    @property
    def layout(self) -> HistogramLayout | None:
        return None if self.plan is None else self.plan.layout

    def bounds_for(self, window_start_s: int, coverage_start_s: int | None) -> BoundsTriple | None:
        """The bounds of a window, or None while they are not decided yet (auto only)."""
        if not self.auto:
            return self.start
        if coverage_start_s is not None and window_start_s <= coverage_start_s:
            return self.start
        decision = self.ledger.bounds.get(window_start_s)
        return None if decision is None else decision.bounds

    def decision_of(self, window_start_s: int) -> BoundsDecision | None:
        return self.ledger.bounds.get(window_start_s)


def user_histograms(
    layout: HistogramLayout,
    users: Sequence[Sequence[int]],
    projections: Mapping[str, Projection],
    rng: random.Random,
) -> dict[str, list[int]]:
    """Exact histograms of one partition's users in one window (stage 1, internal only):
    per user its kept events, and per projection its event count on each key."""
    hist = UserHistograms(layout, rng)
    for items in users:
        per_projection: dict[str, list[int]] = {}
        for p, project in projections.items():
            keys = Counter(k for k, _ in filter(None, map(project, items)))
            per_projection[p] = list(keys.values())
        hist.add_user(len(items), per_projection)
    return hist.counts()


def histograms_release(
    *,
    release_id: str,
    window_start_s: int,
    window_end_s: int,
    noisy: NoisyHistograms,
    bounds: BoundsTriple,
    sources: dict[int, str],
) -> LedgerRelease:
    """The window's histograms as a ledger entry (``#bounds``; never published)."""
    k, l0, linf = bounds
    value = {
        "kind": "bounds_histograms",
        "window_start": iso_utc(window_start_s),
        "window_end": iso_utc(window_end_s),
        **noisy.describe(),
        "bounds": {
            "max_contributions_per_window": k,
            "max_keys_per_user": l0,
            "max_contributions_per_key": linf,
        },
    }
    return LedgerRelease(
        release_id=release_id,
        query=BOUNDS_CHARGE,
        window_start_s=window_start_s,
        window_end_s=window_end_s,
        epsilon_spent=noisy.epsilon,
        delta_spent=0.0,
        records=[OutputRecord(f"{BOUNDS_CHARGE}|{iso_utc(window_start_s)}", value)],
        sources=sources,
    )


def noisy_from_release(release: LedgerRelease) -> NoisyHistograms:
    """The histograms of a ledgered ``#bounds`` entry."""
    value = release.records[0].value
    return NoisyHistograms(
        counts={str(n): tuple(int(v) for v in c) for n, c in value["histograms"].items()},
        epsilon=float(value["epsilon"]),
        scales={str(n): float(v) for n, v in value["noise_scales"].items()},
    )


def _carried(noisy: NoisyHistograms) -> dict[str, Any]:
    """Released histograms as a decision record carries them to the next choice."""
    return {
        "counts": {n: list(v) for n, v in noisy.counts.items()},
        "noise_scales": dict(noisy.scales),
        "epsilon": noisy.epsilon,
    }


def _from_carried(
    carried: Mapping[str, Any] | None, layout: HistogramLayout
) -> NoisyHistograms | None:
    """The histograms a decision record carries, if they fit the layout (a record written
    under another configuration does not)."""
    if carried is None:
        return None
    counts = {str(n): tuple(int(v) for v in c) for n, c in carried["counts"].items()}
    if {n: len(v) for n, v in counts.items()} != layout.sizes():
        return None
    return NoisyHistograms(
        counts=counts,
        epsilon=float(carried["epsilon"]),
        scales={str(n): float(v) for n, v in carried["noise_scales"].items()},
    )


def decide_next(
    schedule: BoundsSchedule,
    *,
    window_start_s: int,
    window_size_s: int,
    current: BoundsTriple,
    histograms: LedgerRelease | None,
    released: Mapping[str, Sequence[float]],
) -> tuple[str, bytes]:
    """The ledger record of the next window's bounds, from this window's winners."""
    plan = schedule.plan
    assert plan is not None
    nxt = window_start_s + window_size_s
    if histograms is None:
        # the histograms were not drawn (budget refused): keep this window's bounds
        decision = BoundsDecision(
            nxt, *current, chosen_from_s=window_start_s, reason="kept: no histograms"
        )
        return encode_bounds_decision(decision)
    before = schedule.decision_of(window_start_s)
    noisy = noisy_from_release(histograms)
    choice = choose_bounds(
        noisy,
        plan.layout,
        spec=plan.spec,
        current=current,
        queries=plan.models,
        released=released,
        means_before=None if before is None else before.means,
        previous=None if before is None else _from_carried(before.histograms, plan.layout),
    )
    decision = BoundsDecision(
        nxt,
        *choice.bounds,
        chosen_from_s=window_start_s,
        reason=choice.reason,
        means={n: round(v, 6) for n, v in choice.means.items()},
        histograms=_carried(noisy),
    )
    return encode_bounds_decision(decision)


def released_values(releases: Sequence[LedgerRelease]) -> dict[str, list[float]]:
    """Per query, the values its (ledgered) release published, one per key."""
    return {
        rel.query: [
            float(r.value["value"]) for r in rel.records if r.value.get("kind") == "release"
        ]
        for rel in releases
    }


class AutoSeal:
    """Stage 1's part: a sealed window's exact histograms (the cut to its k:
    :func:`stream_dp.privacy.user_samples.first_k_per_user`)."""

    def __init__(self, layout: HistogramLayout, projections: Mapping[str, Projection]) -> None:
        self.layout = layout
        self.projections = dict(projections)

    def histograms(
        self, users: Sequence[Sequence[int]], rng: random.Random
    ) -> dict[str, list[int]]:
        return user_histograms(self.layout, users, self.projections, rng)


def auto_seal_plan(config: Config, queries: Sequence[Any]) -> AutoSeal | None:
    """Stage 1's :class:`AutoSeal` (None unless a bound is auto). ``queries``: compiled
    queries (``name`` and ``project``), in configuration order."""
    if not config.bounds.is_auto:
        return None
    plan = plan_config(config.spec()).auto_bounds
    assert plan is not None  # a bound is auto
    projections: dict[str, Projection] = {}
    for q in queries:
        projections.setdefault(plan.projection_of[q.name], q.project)
    return AutoSeal(plan.layout, projections)


class AutoBounds:
    """Stage 2's part of ``bounds: auto`` (held by
    :class:`~stream_dp.pipeline.stages.release_stage.ReleaseStage`; with fixed bounds it answers
    the configured ones): which bounds a window is released with, each query's plan
    calibrated to them, which partials were bounded with them, the window's noisy
    histograms, and the decision of the next window's bounds."""

    def __init__(self, config: Config, ledger: LedgerIndex, metrics: Metrics) -> None:
        #: Which bounds each window uses (bounds: auto: decided window by window).
        self.schedule = BoundsSchedule(config, ledger)
        self.auto = self.schedule.auto
        self.ledger = ledger
        self.metrics = metrics
        self.window_size_s = config.window.size_s
        self._plans: dict[tuple[str, BoundsTriple], QueryPlan] = {}

    def bounds_for(
        self,
        window_start_s: int,
        coverage_start_s: int | None,
        released_in_ledger: Callable[[int], bool],
    ) -> BoundsTriple | None:
        """The bounds of a window (None under bounds: auto until they are decided).

        The releaser of the window before writes the decision to that window's ledger
        partition before its progress record. So once a progress record read from the ledger
        says the window before is released (``released_in_ledger``) and no decision came
        before it, none will: that window was released by a version or configuration without
        ``bounds: auto`` (a deployment switching to it), and the start values apply — a held
        window must not wait for ever.
        """
        bounds = self.schedule.bounds_for(window_start_s, coverage_start_s)
        if bounds is None and released_in_ledger(window_start_s - self.window_size_s):
            return self.schedule.start
        return bounds

    def plan_for(self, q: CompiledQuery, bounds: BoundsTriple) -> QueryPlan:
        """The query's plan for a window bounded with ``bounds`` (noise calibrated to them)."""
        if not self.auto:
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

    def bounded_with(self, assembler: PartialAssembler, bounds: BoundsTriple | None) -> bool:
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

    def histograms(
        self,
        taken: Iterable[Partial],
        window_start_s: int,
        window_end_s: int,
        bounds: BoundsTriple,
    ) -> LedgerRelease:
        """The window's histograms from the partials ``taken``, merged over source
        partitions (one partial each: every partial of a seal carries the same histograms,
        and each user is in one partition, so it counts once) and noised once."""
        layout = self.schedule.layout
        assert layout is not None
        per_source: dict[int, Partial] = {}
        for partial in taken:
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

    def decision(
        self, window_start_s: int, current: BoundsTriple, winners: Sequence[LedgerRelease]
    ) -> tuple[str, bytes] | None:
        """The ledger record of the next window's bounds from this window's ``winners``;
        None when not auto or already decided."""
        if not self.auto or window_start_s + self.window_size_s in self.ledger.bounds:
            return None
        return decide_next(
            self.schedule,
            window_start_s=window_start_s,
            window_size_s=self.window_size_s,
            current=current,
            histograms=self.ledger.get(BOUNDS_CHARGE, window_start_s),
            released=released_values(winners),
        )

    def window_field(self, window_start_s: int, bounds: BoundsTriple) -> dict[str, Any] | None:
        """bounds: auto — what the window record states: the bounds the window used, how
        they were chosen, and the ε this window spends choosing the next window's."""
        if not self.auto:
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
