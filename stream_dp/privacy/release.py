"""One query's release for one window: partition selection, then noise, then post-processing.

The worker calls :func:`release_query` exactly once per (query, window) with the exact
bounded aggregates of that window and stores the result in the release ledger before
publishing it (PRIVACY.md invariant 3: one noise draw per (query, window, key), ever).

- Public keys: every listed key is released (a key without data counts as 0); keys in the
  data but not on the list are ignored.
- Private keys: the plan's partition selection decides which keys exist in the output;
  a suppressed key leaves nothing in the returned values.
- Noise: one draw per released key and noise component, all keys of a component in one
  vectorised call (:mod:`stream_dp.privacy.mechanisms`).
- Values: count → noisy events; count_distinct_users → noisy users; sum → noisy units ×
  granularity; mean → noisy sum / max(1, noisy count), clamped to [lower, upper] (the true
  mean lies there, so clamping never moves the value away from it). ``clamp_negative`` then
  sets negative values to 0 (post-processing, flagged by ``clamped``).
- A mean's 95% half-width never exceeds upper − lower (a value in [lower, upper] is that
  close to any mean), and is exactly that when the noisy count is ≤ 0: the ratio then says
  nothing, and the released value is only known to lie in the range.

Released values are ordered by group key (public keys in their configured order), never by
the order in which keys arrived: private keys by :func:`group_sort_key` (type, then value).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from stream_dp.errors import PrivacyError
from stream_dp.privacy.group_values import group_sort_key
from stream_dp.privacy.partition_selection import CountThreshold, UserCountSelection
from stream_dp.privacy.planner import GroupKey, NoiseComponent, QueryPlan

__all__ = ["GroupKey", "KeyAggregate", "QueryRelease", "ReleasedValue", "release_query"]

#: Each half of a mean's error bound uses this level, so both hold together w.p. ≥ 95%.
_MEAN_COMPONENT_LEVEL = 0.975


@dataclass(frozen=True)
class KeyAggregate:
    """Exact bounded values for one group key in one window (internal, never published)."""

    #: Bounded event count (≤ Linf per user, ≤ k per user over all keys).
    events: int
    #: Distinct users contributing to the key.
    users: int
    #: Bounded sum of the values, in granularity units.
    value_sum: int


_EMPTY = KeyAggregate(events=0, users=0, value_sum=0)


@dataclass(frozen=True)
class ReleasedValue:
    group: GroupKey
    value: int | float
    #: Noise scale in the value's units (for a mean: the sum's scale over the noisy count).
    noise_scale: float
    #: 95% half-width in the value's units.
    ci95: float
    #: True when clamp_negative replaced a negative value by 0.
    clamped: bool


@dataclass(frozen=True)
class QueryRelease:
    values: list[ReleasedValue]
    #: Private keys present in the data but not released. INTERNAL ONLY: this number is
    #: not differentially private — never publish it (no record, metric or log line;
    #: PRIVACY.md invariant 5). It exists for tests and in-process accounting.
    suppressed: int
    epsilon_spent: float
    delta_spent: float


def _quantity(aggregate: KeyAggregate, component: NoiseComponent, plan: QueryPlan) -> int:
    if component.target == "count":
        return aggregate.events
    if component.target == "sum":
        return aggregate.value_sum
    if plan.statistic == "count":
        return aggregate.events
    if plan.statistic == "count_distinct_users":
        return aggregate.users
    return aggregate.value_sum  # sum


def release_query(aggregates: Mapping[GroupKey, KeyAggregate], plan: QueryPlan) -> QueryRelease:
    """Release one query for one window (see the module docstring)."""
    if plan.continual is not None:
        raise PrivacyError(
            f"query {plan.name} is cumulative: its running totals come from a "
            "stream_dp.privacy.continual counter, never from per-window noise"
        )
    suppressed = 0
    precomputed: list[int] | None = None  # count_threshold: the released counts themselves

    if plan.public_keys is not None:
        groups: list[GroupKey] = list(plan.public_keys)
        rows = [aggregates.get(g, _EMPTY) for g in groups]
    else:
        candidates = list(aggregates.items())
        selection = plan.selection
        if isinstance(selection, CountThreshold):
            tested = [_quantity(a, plan.noise[0], plan) for _, a in candidates]
            outcome = selection.release(tested)
            kept = [(c, v) for c, v in zip(candidates, outcome, strict=True) if v is not None]
            precomputed = [v for _, v in kept]
            groups = [g for (g, _), _ in kept]
            rows = [a for (_, a), _ in kept]
        elif isinstance(selection, UserCountSelection):
            decisions = selection.select([a.users for _, a in candidates])
            groups = [g for (g, _), keep in zip(candidates, decisions, strict=True) if keep]
            rows = [a for (_, a), keep in zip(candidates, decisions, strict=True) if keep]
        else:  # pragma: no cover - planner always sets a selection for private keys
            raise TypeError("a plan for private keys needs a partition selection")
        suppressed = len(candidates) - len(groups)
        # deterministic order that depends only on the released keys (canonical values,
        # ranked by type where keys mix types), never on the order in which keys arrived
        sort_keys = [group_sort_key(g) for g in groups]
        order = sorted(range(len(groups)), key=sort_keys.__getitem__)
        groups = [groups[i] for i in order]
        rows = [rows[i] for i in order]
        if precomputed is not None:
            precomputed = [precomputed[i] for i in order]

    noisy: list[list[int]] = []
    for index, component in enumerate(plan.noise):
        if index == 0 and precomputed is not None:
            noisy.append(precomputed)
        else:
            noisy.append(component.mechanism.sample([_quantity(a, component, plan) for a in rows]))

    values = _post_process(groups, noisy, plan)
    return QueryRelease(
        values=values, suppressed=suppressed, epsilon_spent=plan.epsilon, delta_spent=plan.delta
    )


def _post_process(
    groups: Sequence[GroupKey], noisy: Sequence[Sequence[int]], plan: QueryPlan
) -> list[ReleasedValue]:
    clamp = plan.clamp_negative
    primary = plan.noise[0]
    if plan.statistic == "mean":
        sums, counts = noisy
        unit = primary.unit
        sum_scale = primary.scale
        bound = plan.value_bound or 0.0
        sum_half = primary.mechanism.halfwidth(_MEAN_COMPONENT_LEVEL) * unit
        count_half = plan.noise[1].mechanism.halfwidth(_MEAN_COMPONENT_LEVEL)
        spread = sum_half + bound * count_half
        assert plan.value_lower is not None and plan.value_upper is not None
        lower, upper = plan.value_lower, plan.value_upper
        whole_range = upper - lower
        out: list[ReleasedValue] = []
        for group, s, c in zip(groups, sums, counts, strict=True):
            denominator = max(1, c)
            mean = min(max(s * unit / denominator, lower), upper)
            half = whole_range if c <= 0 else min(spread / denominator, whole_range)
            clamped = clamp and mean < 0
            out.append(
                ReleasedValue(
                    group,
                    0.0 if clamped else mean,
                    sum_scale / denominator,
                    half,
                    clamped,
                )
            )
        return out

    scale, half = primary.scale, primary.ci95
    (values,) = noisy
    if plan.statistic == "sum":
        unit = primary.unit
        totals = [v * unit for v in values]
        return [
            ReleasedValue(g, 0.0, scale, half, True)
            if clamp and t < 0
            else ReleasedValue(g, t, scale, half, False)
            for g, t in zip(groups, totals, strict=True)
        ]
    return [
        ReleasedValue(g, 0, scale, half, True)
        if clamp and v < 0
        else ReleasedValue(g, v, scale, half, False)
        for g, v in zip(groups, values, strict=True)
    ]
