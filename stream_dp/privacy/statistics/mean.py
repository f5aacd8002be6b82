"""``statistic: mean``: a noisy sum over a noisy count, clamped to [lower, upper].

The noise budget splits ``mean_count_share`` to the count, the rest to the sum. Released:
noisy sum / max(1, noisy count), clamped to [lower, upper] (the true mean lies there, so
clamping never moves the value away from it). The 95% half-width never exceeds
upper − lower and is exactly that when the noisy count is ≤ 0: the ratio then says nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, assert_never

from stream_dp.errors import PrivacyError
from stream_dp.privacy.specs import BoundsSpec, QuerySpec, StatisticName
from stream_dp.privacy.statistics.base import Column, NoisePart, NoiseTarget
from stream_dp.privacy.statistics.released_values import GroupKey, ReleasedValues, python_ints
from stream_dp.privacy.statistics.sensitivity import Sensitivity, count_sensitivity, sum_sensitivity

if TYPE_CHECKING:
    import numpy as np

    from stream_dp.privacy.key_totals import KeyAggregate, KeyTotals
    from stream_dp.privacy.statistics.base import PlanView

#: Each half of a mean's error bound uses this level, so both hold together w.p. ≥ 95%.
MEAN_COMPONENT_LEVEL = 0.975


class Mean:
    """A sum component (primary) and a count component."""

    name: ClassVar[StatisticName] = "mean"
    words: ClassVar[str] = "mean"
    needs_values: ClassVar[bool] = True
    accumulator: ClassVar[tuple[Column, ...]] = ("events", "value_sums")
    count_threshold: ClassVar[bool] = False
    cumulative_refusal: ClassVar[str | None] = (
        "cumulative means are not supported; publish cumulative sum and count queries and divide"
    )
    ratio: ClassVar[bool] = True
    released_mechanism: ClassVar[str | None] = None
    error_unit: ClassVar[str | None] = None

    def primary_sensitivity(self, query: QuerySpec, bounds: BoundsSpec) -> Sensitivity:
        return sum_sensitivity(query, bounds)

    def squares_center(self, query: QuerySpec) -> int | None:
        return None

    def noise_parts(
        self, query: QuerySpec, bounds: BoundsSpec, noise_epsilon: float, noise_delta: float
    ) -> tuple[NoisePart, ...]:
        count_eps = query.mean_count_share * noise_epsilon
        count_delta = query.mean_count_share * noise_delta
        return (
            NoisePart(
                "sum",
                sum_sensitivity(query, bounds),
                noise_epsilon - count_eps,
                noise_delta - count_delta,
                query.value_granularity,
            ),
            NoisePart("count", count_sensitivity(bounds), count_eps, count_delta),
        )

    def noise_input(self, totals: KeyTotals, target: NoiseTarget, plan: PlanView) -> np.ndarray:
        match target:
            case "count":
                return totals.events
            case "sum":
                return totals.value_sums
            case "value" | "sum_squares":
                raise PrivacyError(f"query {plan.name}: a mean has no {target!r} component")
            case _:
                assert_never(target)

    def post_process(
        self,
        groups: list[GroupKey],
        noisy: Sequence[np.ndarray | Sequence[int]],
        plan: PlanView,
    ) -> ReleasedValues:
        clamp = plan.clamp_negative
        primary = plan.noise[0]
        sums, counts = map(python_ints, noisy)
        unit = primary.unit
        sum_scale = primary.scale
        bound = plan.value_bound or 0.0
        sum_half = primary.mechanism.halfwidth(MEAN_COMPONENT_LEVEL) * unit
        count_half = plan.noise[1].mechanism.halfwidth(MEAN_COMPONENT_LEVEL)
        spread = sum_half + bound * count_half
        assert plan.value_lower is not None and plan.value_upper is not None
        lower, upper = plan.value_lower, plan.value_upper
        whole_range = upper - lower
        values: list[float] = []
        scales: list[float] = []
        halves: list[float] = []
        clamped: list[bool] = []
        for s, c in zip(sums, counts, strict=True):
            denominator = max(1, c)
            mean = min(max(s * unit / denominator, lower), upper)
            half = whole_range if c <= 0 else min(spread / denominator, whole_range)
            is_clamped = clamp and mean < 0
            values.append(0.0 if is_clamped else mean)
            scales.append(sum_scale / denominator)
            halves.append(half)
            clamped.append(is_clamped)
        return ReleasedValues(groups, values, scales, halves, clamped)

    def exact_value(self, aggregate: KeyAggregate, query: QuerySpec) -> float:
        return aggregate.value_sum * query.value_granularity / max(1, aggregate.events)

    def released_range(self, plan: PlanView) -> tuple[float, float] | None:
        assert plan.value_lower is not None and plan.value_upper is not None
        return plan.value_lower, plan.value_upper

    def plan_lines(self, plan: PlanView) -> list[str]:
        return ["  mean CI      per key: (sum CI + |bound| x count CI) / noisy count"]

    def plan_figures(self, plan: PlanView) -> dict[str, Any]:
        return {
            "mean_ci95": (
                "per key: min(upper - lower, (ci95_sum_97.5 + value_bound * ci95_count_97.5)"
                " / noisy count); upper - lower when the noisy count is <= 0"
            )
        }
