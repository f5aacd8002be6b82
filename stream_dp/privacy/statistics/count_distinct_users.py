"""``statistic: count_distinct_users``: distinct users per key."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from stream_dp.privacy.specs import BoundsSpec, QuerySpec, StatisticName
from stream_dp.privacy.statistics.base import Column, NoisePart, NoiseTarget
from stream_dp.privacy.statistics.released_values import GroupKey, ReleasedValues
from stream_dp.privacy.statistics.sensitivity import Sensitivity, distinct_users_sensitivity
from stream_dp.privacy.statistics.single_component import release_single

if TYPE_CHECKING:
    import numpy as np

    from stream_dp.privacy.key_totals import KeyAggregate, KeyTotals
    from stream_dp.privacy.statistics.base import PlanView


class CountDistinctUsers:
    """Noisy distinct users: one user adds one to at most L0 keys (L1 = L0, L2 = √L0)."""

    name: ClassVar[StatisticName] = "count_distinct_users"
    words: ClassVar[str] = "distinct users"
    needs_values: ClassVar[bool] = False
    accumulator: ClassVar[tuple[Column, ...]] = ("users",)
    count_threshold: ClassVar[bool] = True
    cumulative_refusal: ClassVar[str | None] = (
        "a cumulative count_distinct_users would count user-windows (a user once per window), "
        "not distinct users over the horizon; use release: window, or a cumulative count"
    )
    ratio: ClassVar[bool] = False

    def primary_sensitivity(self, query: QuerySpec, bounds: BoundsSpec) -> Sensitivity:
        return distinct_users_sensitivity(bounds)

    def squares_center(self, query: QuerySpec) -> int | None:
        return None

    def noise_parts(
        self, query: QuerySpec, bounds: BoundsSpec, noise_epsilon: float, noise_delta: float
    ) -> tuple[NoisePart, ...]:
        sensitivity = distinct_users_sensitivity(bounds)
        return (NoisePart("value", sensitivity, noise_epsilon, noise_delta),)

    def noise_input(self, totals: KeyTotals, target: NoiseTarget, plan: PlanView) -> np.ndarray:
        return totals.users

    def post_process(
        self, groups: list[GroupKey], noisy: Sequence[Sequence[int]], plan: PlanView
    ) -> ReleasedValues:
        return release_single(groups, noisy, plan, scaled=False)

    def exact_value(self, aggregate: KeyAggregate, query: QuerySpec) -> float:
        return aggregate.users

    def released_range(self, plan: PlanView) -> tuple[float, float] | None:
        return None

    def plan_figures(self, plan: PlanView) -> dict[str, Any]:
        return {}

    def plan_lines(self, plan: PlanView) -> list[str]:
        return []
