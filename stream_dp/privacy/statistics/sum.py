"""``statistic: sum``: the bounded sum of a value field, in multiples of the granularity."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from stream_dp.privacy.specs import BoundsSpec, QuerySpec, StatisticName
from stream_dp.privacy.statistics.base import Column, NoiseTarget
from stream_dp.privacy.statistics.sensitivity import Sensitivity, sum_sensitivity
from stream_dp.privacy.statistics.single_component import SingleComponent

if TYPE_CHECKING:
    import numpy as np

    from stream_dp.privacy.key_totals import KeyAggregate, KeyTotals
    from stream_dp.privacy.statistics.base import PlanView


class Sum(SingleComponent):
    """Noisy sum in granularity units: the count's sensitivity times U per event."""

    name: ClassVar[StatisticName] = "sum"
    words: ClassVar[str] = "sum"
    needs_values: ClassVar[bool] = True
    scaled: ClassVar[bool] = True
    accumulator: ClassVar[tuple[Column, ...]] = ("value_sums",)
    count_threshold: ClassVar[bool] = False
    cumulative_refusal: ClassVar[str | None] = None
    ratio: ClassVar[bool] = False

    def primary_sensitivity(self, query: QuerySpec, bounds: BoundsSpec) -> Sensitivity:
        return sum_sensitivity(query, bounds)

    def noise_input(self, totals: KeyTotals, target: NoiseTarget, plan: PlanView) -> np.ndarray:
        return totals.value_sums

    def exact_value(self, aggregate: KeyAggregate, query: QuerySpec) -> float:
        return aggregate.value_sum * query.value_granularity
