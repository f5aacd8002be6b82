"""``statistic: count``: bounded events per key."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from stream_dp.privacy.specs import BoundsSpec, QuerySpec, StatisticName
from stream_dp.privacy.statistics.base import Column, NoisePart, NoiseTarget
from stream_dp.privacy.statistics.released_values import GroupKey, ReleasedValues
from stream_dp.privacy.statistics.sensitivity import Sensitivity, count_sensitivity
from stream_dp.privacy.statistics.single_component import release_single

if TYPE_CHECKING:
    import numpy as np

    from stream_dp.privacy.key_totals import KeyAggregate, KeyTotals
    from stream_dp.privacy.statistics.base import PlanView


class Count:
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

    def squares_center(self, query: QuerySpec) -> int | None:
        return None

    def noise_parts(
        self, query: QuerySpec, bounds: BoundsSpec, noise_epsilon: float, noise_delta: float
    ) -> tuple[NoisePart, ...]:
        return (NoisePart("value", count_sensitivity(bounds), noise_epsilon, noise_delta),)

    def noise_input(self, totals: KeyTotals, target: NoiseTarget, plan: PlanView) -> np.ndarray:
        return totals.events

    def post_process(
        self, groups: list[GroupKey], noisy: Sequence[Sequence[int]], plan: PlanView
    ) -> ReleasedValues:
        return release_single(groups, noisy, plan, scaled=False)

    def exact_value(self, aggregate: KeyAggregate, query: QuerySpec) -> float:
        return aggregate.events

    def released_range(self, plan: PlanView) -> tuple[float, float] | None:
        return None

    def plan_figures(self, plan: PlanView) -> dict[str, Any]:
        return {}

    def plan_lines(self, plan: PlanView) -> list[str]:
        return []
