"""Post-processing shared by the statistics released as one noisy vector (counts, sum)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from stream_dp.privacy.statistics.released_values import GroupKey, ReleasedValues

if TYPE_CHECKING:
    from stream_dp.privacy.statistics.base import PlanView


def release_single(
    groups: list[GroupKey], noisy: Sequence[Sequence[int]], plan: PlanView, *, scaled: bool
) -> ReleasedValues:
    """Noisy integers as released values (times the unit when ``scaled``: a sum's
    granularity); ``clamp_negative`` sets negative values to 0 (flagged ``clamped``)."""
    primary = plan.noise[0]
    scale, half = primary.scale, primary.ci95
    (noisy_values,) = noisy
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
