"""``statistic: count``: bounded events per key."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from stream_dp.privacy.specs import BoundsSpec, QuerySpec, StatisticName
from stream_dp.privacy.statistics.base import Column, NoiseTarget
from stream_dp.privacy.statistics.sensitivity import Sensitivity, count_sensitivity
from stream_dp.privacy.statistics.single_component import SingleComponent

if TYPE_CHECKING:
    import numpy as np

    from stream_dp.privacy.key_totals import KeyAggregate, KeyTotals
    from stream_dp.privacy.statistics.base import PlanView


class Count(SingleComponent):
    """Noisy bounded event count: L1 = min(k, L0·Linf), L2 from the count's polytope."""

    name: ClassVar[StatisticName] = "count"
    words: ClassVar[str] = "count"
    needs_values: ClassVar[bool] = False
    accumulator: ClassVar[tuple[Column, ...]] = ("events",)
    count_threshold: ClassVar[bool] = True
    cumulative_refusal: ClassVar[str | None] = None
    ratio: ClassVar[bool] = False

    def primary_sensitivity(self, query: QuerySpec, bounds: BoundsSpec) -> Sensitivity:
        return count_sensitivity(bounds)

    def noise_input(self, totals: KeyTotals, target: NoiseTarget, plan: PlanView) -> np.ndarray:
        return totals.events

    def exact_value(self, aggregate: KeyAggregate, query: QuerySpec) -> float:
        return aggregate.events
