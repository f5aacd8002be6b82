"""``statistic: sum``: the bounded sum of a value field, in multiples of the granularity."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from stream_dp.privacy.specs import BoundsSpec, QuerySpec, StatisticName
from stream_dp.privacy.statistics.base import Column, NoisePart, NoiseTarget
from stream_dp.privacy.statistics.released_values import GroupKey, ReleasedValues
from stream_dp.privacy.statistics.sensitivity import Sensitivity, sum_sensitivity
from stream_dp.privacy.statistics.single_component import release_single

if TYPE_CHECKING:
    import numpy as np

    from stream_dp.privacy.key_totals import KeyAggregate, KeyTotals
    from stream_dp.privacy.statistics.base import PlanView


class Sum:
    """Noisy sum in granularity units: the count's sensitivity times U per event."""

    name: ClassVar[StatisticName] = "sum"
    words: ClassVar[str] = "sum"
    needs_values: ClassVar[bool] = True
    accumulator: ClassVar[tuple[Column, ...]] = ("value_sums",)
    count_threshold: ClassVar[bool] = False
    cumulative_refusal: ClassVar[str | None] = None
    ratio: ClassVar[bool] = False

    def primary_sensitivity(self, query: QuerySpec, bounds: BoundsSpec) -> Sensitivity:
        return sum_sensitivity(query, bounds)

    def squares_center(self, query: QuerySpec) -> int | None:
        return None

    def noise_parts(
        self, query: QuerySpec, bounds: BoundsSpec, noise_epsilon: float, noise_delta: float
    ) -> tuple[NoisePart, ...]:
        sensitivity = sum_sensitivity(query, bounds)
        unit = query.value_granularity
        return (NoisePart("value", sensitivity, noise_epsilon, noise_delta, unit),)

    def noise_input(self, totals: KeyTotals, target: NoiseTarget, plan: PlanView) -> np.ndarray:
        return totals.value_sums

    def post_process(
        self, groups: list[GroupKey], noisy: Sequence[Sequence[int]], plan: PlanView
    ) -> ReleasedValues:
        return release_single(groups, noisy, plan, scaled=True)

    def exact_value(self, aggregate: KeyAggregate, query: QuerySpec) -> float:
        return aggregate.value_sum * query.value_granularity

    def released_range(self, plan: PlanView) -> tuple[float, float] | None:
        return None

    def plan_figures(self, plan: PlanView) -> dict[str, Any]:
        return {}

    def plan_lines(self, plan: PlanView) -> list[str]:
        return []
