"""Sensitivities: how much one user can move the vector a noise component perturbs.

Pure arithmetic on the contribution bounds (k, L0, Linf) and, for value statistics, on the
value range in granularity units. The planner (:mod:`stream_dp.privacy.planner`) and each
statistic (:mod:`stream_dp.privacy.statistics`) build their noise from these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from stream_dp.privacy.specs import BoundsSpec, QuerySpec


@dataclass(frozen=True)
class Sensitivity:
    """How much one user can move the vector a noise component perturbs (in noise units)."""

    max_partitions_contributed: int
    max_contributions_per_partition: int
    l1: int
    l2_squared: int
    #: sum/mean: |value| per event in granularity units (U); None for counts.
    value_units_per_event: int | None = None

    @property
    def l2(self) -> float:
        return math.sqrt(self.l2_squared)

    def describe(self) -> dict[str, Any]:
        return {
            "max_partitions_contributed": self.max_partitions_contributed,
            "max_contributions_per_partition": self.max_contributions_per_partition,
            "l1": self.l1,
            "l2": self.l2,
            "value_units_per_event": self.value_units_per_event,
        }


def _effective_bounds(bounds: BoundsSpec) -> tuple[int, int, int]:
    k, l0, linf = bounds.values()  # concrete bounds: a window's, never "auto"
    return k, min(l0 or k, k), min(linf or k, k)


def count_l2_squared(k: int, l0: int, linf: int) -> int:
    """max Σ c_i² over a user's per-key counts c with Σ c_i ≤ k, c_i ≤ Linf, ≤ L0 keys.

    A convex function is largest at a vertex of the polytope: fill ⌊k/Linf⌋ keys to Linf
    (at most L0 of them) and, if a key is left, give it the remaining k mod Linf.
    """
    full = k // linf
    if l0 <= full:
        return l0 * linf * linf
    rest = k - full * linf
    return full * linf * linf + rest * rest


def count_sensitivity(bounds: BoundsSpec) -> Sensitivity:
    """Bounded event counts per key."""
    k, l0, linf = _effective_bounds(bounds)
    return Sensitivity(
        max_partitions_contributed=l0,
        max_contributions_per_partition=linf,
        l1=min(k, l0 * linf),
        l2_squared=count_l2_squared(k, l0, linf),
    )


def distinct_users_sensitivity(bounds: BoundsSpec) -> Sensitivity:
    """Distinct users per key: one user adds one to at most L0 keys."""
    _, l0, _ = _effective_bounds(bounds)
    return Sensitivity(
        max_partitions_contributed=l0, max_contributions_per_partition=1, l1=l0, l2_squared=l0
    )


def value_units_per_event(query: QuerySpec) -> int:
    """U = ⌈max(|lower|, |upper|) / granularity⌉."""
    assert query.lower is not None and query.upper is not None
    bound = max(abs(query.lower), abs(query.upper))
    return max(1, math.ceil(bound / query.value_granularity))


def per_event_sensitivity(bounds: BoundsSpec, units: int) -> Sensitivity:
    """A sum over the bounded events of a per-event quantity within ±``units``: the count's
    L1 and L2 times ``units``."""
    counts = count_sensitivity(bounds)
    return Sensitivity(
        max_partitions_contributed=counts.max_partitions_contributed,
        max_contributions_per_partition=counts.max_contributions_per_partition,
        l1=counts.l1 * units,
        l2_squared=counts.l2_squared * units * units,
        value_units_per_event=units,
    )


def sum_sensitivity(query: QuerySpec, bounds: BoundsSpec) -> Sensitivity:
    """A sum of values in [lower, upper]: U = ⌈max(|lower|, |upper|)/granularity⌉ per event."""
    return per_event_sensitivity(bounds, value_units_per_event(query))
