"""``statistic: quantile``: private quantiles of a bounded value per key, by OpenDP's
exponential-mechanism quantile (:mod:`stream_dp.privacy.exponential.quantiles`).

Stage 1 counts each user's kept values (after the reservoir of k per window and L0/Linf)
in B equal bins over [lower, upper) per key: the ``value_bins`` column, merged by addition
and held sparse (:class:`~stream_dp.privacy.exponential.bin_counts.BinCounts`: the bins a
key's values hit, 16 bytes each, never B per key). The release draws, per key and requested
α, one bin edge by the exponential mechanism and sorts the Q edges (monotone across the
list).

Accounting: the bounding enforces Linf = ``max_contributions_per_key`` (k when unset, at
most k) values of a user per key and L0 = ``max_keys_per_user`` (k when unset, at most k)
keys per user; the :class:`~stream_dp.privacy.exponential.quantiles.QuantilePlan` takes
exactly those and the query's noise ε (all of ε with public keys; what partition selection
leaves with private keys), and spends ε/(L0·Q) per draw. Pure ε: no δ.

The release's ``mechanism`` is ``exponential`` (whatever the query's ``mechanism``, which
names additive noise); its ``noise_scale`` and ``ci95`` are in *ranks*, not in the value's
units (``ci95_unit: "ranks"``): the largest rank scale b_α/den and the rank error E at
β = 0.05 (:meth:`QuantilePlan.rank_error`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, assert_never

import numpy as np

from stream_dp.errors import PrivacyError
from stream_dp.privacy.exponential.bin_counts import BinCounts
from stream_dp.privacy.exponential.quantiles import QuantilePlan
from stream_dp.privacy.specs import BoundsSpec, QuerySpec, StatisticName
from stream_dp.privacy.statistics.base import Column, NoisePart, NoiseTarget, PlanView
from stream_dp.privacy.statistics.released_values import GroupKey, ReleasedValues
from stream_dp.privacy.statistics.sensitivity import Sensitivity, count_sensitivity

if TYPE_CHECKING:
    from stream_dp.privacy.key_totals import KeyAggregate, KeyTotals

#: Histogram bins when ``bins`` is not configured (resolution (upper − lower)/1024).
DEFAULT_QUANTILE_BINS = 1024
#: The confidence 1 − β at which ``plan`` states the rank error.
RANK_ERROR_BETA = 0.05


def quantile_plan(query: QuerySpec, bounds: BoundsSpec, epsilon: float) -> QuantilePlan:
    """The mechanism's plan for a query whose draws share ``epsilon`` (its noise ε), with the
    L0 and Linf that stage 1's bounding enforces."""
    assert query.lower is not None and query.upper is not None
    counts = count_sensitivity(bounds)
    return QuantilePlan(
        lower=query.lower,
        upper=query.upper,
        bins=query.bins,
        quantiles=tuple(query.quantiles),
        epsilon=epsilon,
        max_partitions_contributed=counts.max_partitions_contributed,
        max_contributions_per_partition=counts.max_contributions_per_partition,
    )


def bin_indices(
    values_units: np.ndarray, granularity: float, histogram: QuantilePlan
) -> np.ndarray:
    """Per value (integer units of ``granularity``) its bin, as
    :meth:`QuantilePlan.bin_index` of value × granularity (vectorised)."""
    width = histogram.upper - histogram.lower
    position = (values_units.astype(np.float64) * granularity - histogram.lower) / width
    bins = np.floor(position * histogram.bins)
    return np.clip(bins, 0, histogram.bins - 1).astype(np.int64)


def quantile_histograms(totals: KeyTotals, plan: PlanView) -> BinCounts:
    """The keys' histograms (sparse) the exponential mechanism reads, checked to have the
    plan's bins. Totals without a histogram column hold no value (a window whose partials
    had no key of this query: an empty part carries no histogram): every key's histogram
    is then empty, as a public key's without data."""
    bins = totals.value_bins
    if bins.bins == 0 and not bins.index.size:
        return BinCounts.empty(len(totals), _plan_of(plan).bins)
    if bins.bins != _plan_of(plan).bins:
        raise PrivacyError(
            f"query {plan.name}: histograms of {bins.bins} bins, the plan has {_plan_of(plan).bins}"
        )
    return bins


def _plan_of(plan: PlanView) -> QuantilePlan:
    if plan.quantile is None:
        raise PrivacyError(f"query {plan.name}: a quantile plan has no QuantilePlan")
    return plan.quantile


class Quantile:
    """One exponential mechanism per requested α over a key's histogram, sorted."""

    name: ClassVar[StatisticName] = "quantile"
    words: ClassVar[str] = "quantiles"
    needs_values: ClassVar[bool] = True
    accumulator: ClassVar[tuple[Column, ...]] = ("value_bins",)
    count_threshold: ClassVar[bool] = False
    cumulative_refusal: ClassVar[str | None] = (
        "cumulative quantiles are not supported; use release: window"
    )
    ratio: ClassVar[bool] = False
    released_mechanism: ClassVar[str | None] = "exponential"
    error_unit: ClassVar[str | None] = "ranks"

    def primary_sensitivity(self, query: QuerySpec, bounds: BoundsSpec) -> Sensitivity:
        # a user moves each of L0 keys' histograms by at most Linf values
        return count_sensitivity(bounds)

    def squares_center(self, query: QuerySpec) -> int | None:
        return None

    def noise_parts(
        self, query: QuerySpec, bounds: BoundsSpec, noise_epsilon: float, noise_delta: float
    ) -> tuple[NoisePart, ...]:
        # no additive noise: the planner gives the query a QuantilePlan (exponential
        # mechanism) with the whole noise ε instead (see quantile_plan)
        return ()

    def noise_input(self, totals: KeyTotals, target: NoiseTarget, plan: PlanView) -> np.ndarray:
        # no additive noise: the release reads the sparse histograms (quantile_histograms)
        match target:
            case "value" | "sum" | "count" | "sum_squares":
                raise PrivacyError(
                    f"query {plan.name}: a quantile adds no noise; its histograms are read "
                    "by quantile_histograms"
                )
            case _:
                assert_never(target)

    def post_process(
        self, groups: list[GroupKey], noisy: Sequence[np.ndarray | Sequence[Any]], plan: PlanView
    ) -> ReleasedValues:
        """``noisy``: one list of Q sorted edge indices per key. The value of a key is the list
        of its Q quantiles, ``{"quantile": α, "value": edge}`` in the order of the α's, the
        values non-decreasing (one record per key carries them all)."""
        histogram = _plan_of(plan)
        (chosen,) = noisy
        values: list[Any] = [
            [
                {"quantile": alpha, "value": histogram.edge(i)}
                for alpha, i in zip(histogram.quantiles, row, strict=True)
            ]
            for row in chosen
        ]
        scale = max(histogram.rank_scale(a) for a in histogram.quantiles)
        error = histogram.rank_error(RANK_ERROR_BETA)
        return ReleasedValues(groups, values, scale, error, [False] * len(values))

    def exact_value(self, aggregate: KeyAggregate, query: QuerySpec) -> float:
        """The exact lowest α's quantile of the histogram (the lower edge of the bin holding
        rank ⌈α·n⌉); ``lower`` for a key without values."""
        assert query.lower is not None and query.upper is not None
        counts = list(aggregate.value_bins)
        n = sum(counts)
        if n == 0 or not query.quantiles:
            return query.lower
        target = max(1, int(np.ceil(query.quantiles[0] * n)))
        running = 0
        for j, c in enumerate(counts):
            running += c
            if running >= target:
                return query.lower + j * (query.upper - query.lower) / len(counts)
        return query.upper

    def released_range(self, plan: PlanView) -> tuple[float, float]:
        histogram = _plan_of(plan)
        return histogram.lower, histogram.upper

    def plan_figures(self, plan: PlanView) -> dict[str, Any]:
        histogram = _plan_of(plan)
        return {
            "ci95_unit": self.error_unit,
            "quantile": {
                **histogram.describe(),
                "rank_error": {
                    "beta": RANK_ERROR_BETA,
                    "ranks": histogram.rank_error(RANK_ERROR_BETA),
                    "rule": "with probability >= 1 - beta every released quantile of a key"
                    " has |rank - alpha * n| <= E + half the count of the bin holding"
                    " rank alpha * n, E = max_alpha rank_scale_alpha * ln(bins * Q / beta)",
                },
            },
        }

    def plan_lines(self, plan: PlanView) -> list[str]:
        histogram = _plan_of(plan)
        qs = ", ".join(f"{a:g}" for a in histogram.quantiles)
        error = histogram.rank_error(RANK_ERROR_BETA)
        return [
            f"  quantiles    {qs} over {histogram.bins} bins of [{histogram.lower:g}, "
            f"{histogram.upper:g}); exponential mechanism, eps/(L0*Q) = "
            f"{histogram.epsilon_per_quantile:.4g} per draw",
            f"  rank error   <= {error:.4g} ranks per key with probability "
            f"{1 - RANK_ERROR_BETA:.0%} (plus half the count of the bin holding the rank)",
        ]


def histogram_binning(
    query: QuerySpec,
) -> tuple[int, Callable[[np.ndarray], np.ndarray]] | None:
    """(bins, values in units → their bins) for stage 1 when the query releases quantiles
    (the ``value_bins`` column), else None."""
    if not query.quantiles:
        return None
    assert query.lower is not None and query.upper is not None
    histogram = QuantilePlan(
        lower=query.lower,
        upper=query.upper,
        bins=query.bins,
        quantiles=tuple(query.quantiles),
        epsilon=1.0,  # binning does not depend on ε or the bounds
        max_partitions_contributed=1,
        max_contributions_per_partition=1,
    )
    granularity = query.value_granularity
    return histogram.bins, functools.partial(
        bin_indices, granularity=granularity, histogram=histogram
    )
