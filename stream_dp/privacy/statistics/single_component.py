"""What the statistics released as one noisy vector (count, count_distinct_users, sum) share:
one noise part of their primary sensitivity, the post-processing of its noisy integers, and
no range, squares or plan figures of their own (:class:`SingleComponent`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from stream_dp.privacy.specs import BoundsSpec, QuerySpec
from stream_dp.privacy.statistics.base import NoisePart
from stream_dp.privacy.statistics.released_values import GroupKey, ReleasedValues
from stream_dp.privacy.statistics.sensitivity import Sensitivity

if TYPE_CHECKING:
    from stream_dp.privacy.statistics.base import PlanView


def release_single(
    groups: list[GroupKey],
    noisy: Sequence[np.ndarray | Sequence[int]],
    plan: PlanView,
    *,
    scaled: bool,
) -> ReleasedValues:
    """Noisy integers as released values (times the unit when ``scaled``: a sum's
    granularity); ``clamp_negative`` sets negative values to 0 (flagged ``clamped``).
    Unscaled noisy integers drawn as an int64 array stay one (:class:`ReleasedValues`
    gives them as Python ints to a reader; the record encoder reads the array)."""
    primary = plan.noise[0]
    scale, half = primary.scale, primary.ci95
    (noisy_values,) = noisy
    if isinstance(noisy_values, np.ndarray) and not scaled:
        if not plan.clamp_negative:
            return ReleasedValues(groups, noisy_values, scale, half, [False] * len(groups))
        negative = noisy_values < 0
        kept = np.where(negative, 0, noisy_values) if negative.any() else noisy_values
        return ReleasedValues(groups, kept, scale, half, negative.tolist())
    if isinstance(noisy_values, np.ndarray):
        noisy_values = noisy_values.tolist()
    values: list[int] | list[float]
    if scaled:
        unit = primary.unit
        values = [v * unit for v in noisy_values]
    else:
        values = list(noisy_values)
    if not plan.clamp_negative:
        return ReleasedValues(groups, values, scale, half, [False] * len(values))
    clamped = [v < 0 for v in values]
    zero = 0.0 if scaled else 0
    if any(clamped):
        values = [zero if c else v for v, c in zip(values, clamped, strict=True)]
    return ReleasedValues(groups, values, scale, half, clamped)


class SingleComponent(ABC):
    """The shared half of a one-vector statistic; a subclass names itself and gives its
    primary sensitivity, its noised column and its exact value."""

    #: Whether the noisy integers are released times the granularity (a sum's units).
    scaled: ClassVar[bool] = False
    released_mechanism: ClassVar[str | None] = None
    error_unit: ClassVar[str | None] = None

    @abstractmethod
    def primary_sensitivity(self, query: QuerySpec, bounds: BoundsSpec) -> Sensitivity:
        """The L1/L2 sensitivity of the statistic's one noised vector."""

    def squares_center(self, query: QuerySpec) -> int | None:
        return None

    def noise_parts(
        self, query: QuerySpec, bounds: BoundsSpec, noise_epsilon: float, noise_delta: float
    ) -> tuple[NoisePart, ...]:
        sensitivity = self.primary_sensitivity(query, bounds)
        if self.scaled:
            unit = query.value_granularity
            return (NoisePart("value", sensitivity, noise_epsilon, noise_delta, unit),)
        return (NoisePart("value", sensitivity, noise_epsilon, noise_delta),)

    def post_process(
        self,
        groups: list[GroupKey],
        noisy: Sequence[np.ndarray | Sequence[int]],
        plan: PlanView,
    ) -> ReleasedValues:
        return release_single(groups, noisy, plan, scaled=self.scaled)

    def released_range(self, plan: PlanView) -> tuple[float, float] | None:
        return None

    def plan_figures(self, plan: PlanView) -> dict[str, Any]:
        return {}

    def plan_lines(self, plan: PlanView) -> list[str]:
        return []
