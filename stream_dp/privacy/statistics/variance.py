"""``statistic: variance``: the population variance of a bounded value per key, as PipelineDP
computes it (``VarianceCombiner`` / ``dp_computations.compute_dp_var``).

Values are clamped to [lower, upper] and held as integers v in granularity units g. With
c = ⌊(lo + hi)/2⌋ and D = max(c − lo, hi − c) for lo = ⌊lower/g⌋, hi = ⌈upper/g⌉ (every
value stage 1 keeps lies in [lo, hi], whatever monotone rounding it uses), three noise
components share the query's noise budget equally (PipelineDP's ``equally_split_budget``:
ε/3, ε/3 and the rest, δ alike):

- count: n = bounded events per key; the count's sensitivity (L1 = min(k, L0·Linf));
- normalized sum: S1 = Σ (v − c), each term within ±D: the count's sensitivity × D;
- normalized sum of squares: S2 = Σ (2(v − c)² − D²), each term within ±D² (the squares
  (v − c)² ∈ [0, D²] centred on D²/2, in half units so that it stays an integer): the
  count's sensitivity × D². (PipelineDP does not centre the squares: its sensitivity for
  them is that of [0, max(lower², upper²)]; ours is the exact range of the centred squares.)

Stage 1 keeps per key the events, Σ v (``value_sums``) and Σ (v − c)² (``value_squares``);
S1 and S2 are exact integer functions of them. Post-processing (PipelineDP's): with
n' = max(1, noisy n), mean m1 = S̃1/n', mean of squares m2 = (S̃2/n' + D²)/2, released
variance = (m2 − m1²)·g² clamped to [0, ((upper − lower)/2)²] — the largest variance of
values in [lower, upper], so clamping never moves the value away from the true one.

95% half-width, per key (each component's half-width h at level 1 − 0.05/3, so all three
hold together w.p. ≥ 95%): A = (h_S2 + D²·h_n)/(2n'), B = (h_S1 + D·h_n)/n',
half = min(((upper − lower)/2)², (A + B·(2D + B))·g²); the whole range when the noisy count
is ≤ 0. It covers the variance of the values as stage 1 rounded them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, assert_never

import numpy as np

from stream_dp.errors import PrivacyError
from stream_dp.privacy.specs import BoundsSpec, QuerySpec, StatisticName
from stream_dp.privacy.statistics.base import Column, NoisePart, NoiseTarget
from stream_dp.privacy.statistics.released_values import GroupKey, ReleasedValues, python_ints
from stream_dp.privacy.statistics.sensitivity import (
    Sensitivity,
    count_sensitivity,
    per_event_sensitivity,
)

if TYPE_CHECKING:
    from stream_dp.privacy.key_totals import KeyAggregate, KeyTotals
    from stream_dp.privacy.statistics.base import PlanView

#: Each of the three half-widths uses this level, so all hold together w.p. ≥ 95%.
VARIANCE_COMPONENT_LEVEL = 1 - 0.05 / 3
#: Noisy counts at which ``plan`` states the 95% half-width.
PLAN_COUNTS = (100, 1_000, 10_000)
VARIANCE_CI95_RULE = (
    "per key: min(((upper - lower) / 2)^2, (A + B * (2 * D + B)) * granularity^2)"
    " with A = (h_sum_squares + D^2 * h_count) / (2 * noisy count) and"
    " B = (h_sum + D * h_count) / noisy count, each half-width h at level"
    " 1 - 0.05/3; ((upper - lower) / 2)^2 when the noisy count is <= 0"
)


def center_units(lower: float, upper: float, granularity: float) -> tuple[int, int]:
    """(c, D): the centre of the values in units and the largest |v − c| (see the module)."""
    lo = math.floor(lower / granularity)
    hi = math.ceil(upper / granularity)
    center = (lo + hi) // 2
    return center, max(1, center - lo, hi - center)


def _query_center(query: QuerySpec) -> tuple[int, int]:
    assert query.lower is not None and query.upper is not None
    return center_units(query.lower, query.upper, query.value_granularity)


def _plan_center(plan: PlanView) -> tuple[int, int]:
    assert plan.value_lower is not None and plan.value_upper is not None
    assert plan.granularity is not None
    return center_units(plan.value_lower, plan.value_upper, plan.granularity)


class Variance:
    """A normalized sum of squares (primary), a normalized sum and a count."""

    name: ClassVar[StatisticName] = "variance"
    words: ClassVar[str] = "variance"
    needs_values: ClassVar[bool] = True
    accumulator: ClassVar[tuple[Column, ...]] = ("events", "value_sums", "value_squares")
    count_threshold: ClassVar[bool] = False
    cumulative_refusal: ClassVar[str | None] = (
        "cumulative variances are not supported; use release: window"
    )
    ratio: ClassVar[bool] = True
    released_mechanism: ClassVar[str | None] = None
    error_unit: ClassVar[str | None] = None

    def primary_sensitivity(self, query: QuerySpec, bounds: BoundsSpec) -> Sensitivity:
        _, spread = _query_center(query)
        return per_event_sensitivity(bounds, spread * spread)

    def squares_center(self, query: QuerySpec) -> int | None:
        center, _ = _query_center(query)
        return center

    def noise_parts(
        self, query: QuerySpec, bounds: BoundsSpec, noise_epsilon: float, noise_delta: float
    ) -> tuple[NoisePart, ...]:
        _, spread = _query_center(query)
        g = query.value_granularity
        # PipelineDP's equally_split_budget: thirds, the last part takes what is left
        count_eps, sum_eps = noise_epsilon / 3, noise_epsilon / 3
        count_delta, sum_delta = noise_delta / 3, noise_delta / 3
        squares_eps = noise_epsilon - (count_eps + sum_eps)
        squares_delta = noise_delta - (count_delta + sum_delta)
        return (
            NoisePart(
                "sum_squares",
                per_event_sensitivity(bounds, spread * spread),
                squares_eps,
                squares_delta,
                g * g / 2,
            ),
            NoisePart("sum", per_event_sensitivity(bounds, spread), sum_eps, sum_delta, g),
            NoisePart("count", count_sensitivity(bounds), count_eps, count_delta),
        )

    def noise_input(self, totals: KeyTotals, target: NoiseTarget, plan: PlanView) -> np.ndarray:
        center, spread = _plan_center(plan)
        match target:
            case "count":
                return totals.events
            case "sum":  # Σ (v − c)
                return totals.value_sums - center * totals.events
            case "sum_squares":  # Σ (2(v − c)² − D²)
                return 2 * totals.value_squares - spread * spread * totals.events
            case "value":
                raise PrivacyError(f"query {plan.name}: a variance has no 'value' component")
            case _:
                assert_never(target)

    def post_process(
        self,
        groups: list[GroupKey],
        noisy: Sequence[np.ndarray | Sequence[int]],
        plan: PlanView,
    ) -> ReleasedValues:
        _, spread = _plan_center(plan)
        assert plan.granularity is not None
        g2 = plan.granularity * plan.granularity
        _, cap = self.released_range(plan)
        squares_scale = plan.noise[0].scale
        d2 = spread * spread
        squares, sums, counts = map(python_ints, noisy)
        values: list[float] = []
        scales: list[float] = []
        halves: list[float] = []
        for s2, s1, c in zip(squares, sums, counts, strict=True):
            n = max(1, c)
            mean = s1 / n
            mean_of_squares = (s2 / n + d2) / 2
            values.append(min(max((mean_of_squares - mean * mean) * g2, 0.0), cap))
            scales.append(squares_scale / n)
            halves.append(halfwidth(plan, c))
        # a variance is never negative: clamp_negative has nothing to clamp
        return ReleasedValues(groups, values, scales, halves, [False] * len(values))

    def exact_value(self, aggregate: KeyAggregate, query: QuerySpec) -> float:
        if aggregate.events <= 0:
            return 0.0
        center, _ = _query_center(query)
        n = aggregate.events
        mean = (aggregate.value_sum - center * n) / n
        g = query.value_granularity
        return (aggregate.value_squares / n - mean * mean) * g * g

    def released_range(self, plan: PlanView) -> tuple[float, float]:
        assert plan.value_lower is not None and plan.value_upper is not None
        return 0.0, ((plan.value_upper - plan.value_lower) / 2) ** 2

    def plan_figures(self, plan: PlanView) -> dict[str, Any]:
        return {
            "variance_ci95": {
                "rule": VARIANCE_CI95_RULE,
                "at_noisy_count": {str(n): halfwidth(plan, n) for n in PLAN_COUNTS},
            }
        }

    def plan_lines(self, plan: PlanView) -> list[str]:
        at = ", ".join(f"{_num(halfwidth(plan, n))} at {n:,}" for n in PLAN_COUNTS)
        _, cap = self.released_range(plan)
        return [
            f"  variance CI  per key, by noisy count of events: {at} "
            f"(the whole range {_num(cap)} at <= 0)"
        ]


def halfwidth(plan: PlanView, noisy_count: int) -> float:
    """The 95% half-width of a released variance at a noisy count (the module docstring)."""
    _, spread = _plan_center(plan)
    assert plan.granularity is not None
    assert plan.value_lower is not None and plan.value_upper is not None
    cap = ((plan.value_upper - plan.value_lower) / 2) ** 2
    if noisy_count <= 0:
        return cap
    squares_part, sum_part, count_part = plan.noise
    h_squares = squares_part.mechanism.halfwidth(VARIANCE_COMPONENT_LEVEL)
    h_sum = sum_part.mechanism.halfwidth(VARIANCE_COMPONENT_LEVEL)
    h_count = count_part.mechanism.halfwidth(VARIANCE_COMPONENT_LEVEL)
    a = (h_squares + spread * spread * h_count) / (2 * noisy_count)
    b = (h_sum + spread * h_count) / noisy_count
    return min((a + b * (2 * spread + b)) * plan.granularity * plan.granularity, cap)


def _num(x: float) -> str:
    return f"{x:.4g}"
