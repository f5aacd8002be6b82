"""``statistic: count_distinct_users``: distinct users per key."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from stream_dp.privacy.specs import BoundsSpec, QuerySpec, StatisticName
from stream_dp.privacy.statistics.base import Column, NoiseTarget
from stream_dp.privacy.statistics.sensitivity import Sensitivity, distinct_users_sensitivity
from stream_dp.privacy.statistics.single_component import SingleComponent

if TYPE_CHECKING:
    import numpy as np

    from stream_dp.privacy.key_totals import KeyAggregate, KeyTotals
    from stream_dp.privacy.statistics.base import PlanView


class CountDistinctUsers(SingleComponent):
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

    def noise_input(self, totals: KeyTotals, target: NoiseTarget, plan: PlanView) -> np.ndarray:
        return totals.users

    def exact_value(self, aggregate: KeyAggregate, query: QuerySpec) -> float:
        return aggregate.users
