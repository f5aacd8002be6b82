"""One query's release for one window: partition selection, then noise, then post-processing.

The worker calls :func:`release_query` exactly once per (query, window) with the exact
bounded aggregates of that window and stores the result in the release ledger before
publishing it (docs/privacy.md#invariant-3: one noise draw per (query, window, key), ever).

- Public keys: every listed key is released (a key without data counts as 0); keys in the
  data but not on the list are ignored.
- Private keys: the plan's partition selection decides which keys exist in the output;
  a suppressed key leaves nothing in the returned values.
- ``top_k``: at most N of those keys (public or kept by selection) are chosen by the peeling
  exponential mechanism on their exact bounded counts (:mod:`stream_dp.privacy.top_k_step`);
  the others leave nothing, and no noise is drawn for them.
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

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import NamedTuple, overload

import numpy as np

from stream_dp.errors import PrivacyError
from stream_dp.privacy.group_values import group_sort_key
from stream_dp.privacy.key_totals import KeyAggregate, KeyTotals
from stream_dp.privacy.partition_selection import (
    CountThreshold,
    UserCountSelection,
    WeightedGaussian,
)
from stream_dp.privacy.planner import GroupKey, NoiseComponent, QueryPlan
from stream_dp.privacy.top_k_step import choose_top_k

__all__ = [
    "GroupKey",
    "KeyAggregate",
    "QueryRelease",
    "ReleasedValue",
    "ReleasedValues",
    "release_query",
]

#: Each half of a mean's error bound uses this level, so both hold together w.p. ≥ 95%.
_MEAN_COMPONENT_LEVEL = 0.975


class ReleasedValue(NamedTuple):
    group: GroupKey
    value: int | float
    #: Noise scale in the value's units (for a mean: the sum's scale over the noisy count).
    noise_scale: float
    #: 95% half-width in the value's units.
    ci95: float
    #: True when clamp_negative replaced a negative value by 0.
    clamped: bool


class ReleasedValues(Sequence[ReleasedValue]):
    """A release's values as columns (one list per field), read one by one as a
    :class:`ReleasedValue`.

    A window may release 1,000,000 keys: the record encoder reads the columns, and no
    object per key is made unless a reader asks for one. ``noise_scale`` and ``ci95`` are
    one number for every key when they do not vary (count, count_distinct_users, sum)."""

    __slots__ = ("ci95", "clamped", "groups", "noise_scale", "value")

    def __init__(
        self,
        groups: list[GroupKey],
        value: list[int | float] | list[int] | list[float],
        noise_scale: float | list[float],
        ci95: float | list[float],
        clamped: list[bool],
    ) -> None:
        self.groups = groups
        self.value = value
        self.noise_scale = noise_scale
        self.ci95 = ci95
        self.clamped = clamped

    @classmethod
    def of(cls, values: Sequence[ReleasedValue]) -> ReleasedValues:
        """The columns of released values given one by one."""
        if isinstance(values, ReleasedValues):
            return values
        return cls(
            [v.group for v in values],
            [v.value for v in values],
            [v.noise_scale for v in values],
            [v.ci95 for v in values],
            [v.clamped for v in values],
        )

    def column(self, name: str) -> list[float]:
        """``noise_scale`` or ``ci95`` per key (a list even when it is one number)."""
        found: float | list[float] = getattr(self, name)
        return found if isinstance(found, list) else [found] * len(self.groups)

    def __len__(self) -> int:
        return len(self.groups)

    @overload
    def __getitem__(self, i: int) -> ReleasedValue: ...

    @overload
    def __getitem__(self, i: slice) -> list[ReleasedValue]: ...

    def __getitem__(self, i: int | slice) -> ReleasedValue | list[ReleasedValue]:
        if isinstance(i, slice):
            return list(self)[i]
        scale, half = self.noise_scale, self.ci95
        return ReleasedValue(
            self.groups[i],
            self.value[i],
            scale[i] if isinstance(scale, list) else scale,
            half[i] if isinstance(half, list) else half,
            self.clamped[i],
        )

    def __iter__(self) -> Iterator[ReleasedValue]:
        return map(
            ReleasedValue,
            self.groups,
            self.value,
            self.column("noise_scale"),
            self.column("ci95"),
            self.clamped,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ReleasedValues({list(self)!r})"


@dataclass(frozen=True)
class QueryRelease:
    values: ReleasedValues
    #: Private keys present in the data but not released. INTERNAL ONLY: this number is
    #: not differentially private — never publish it (no record, metric or log line;
    #: docs/privacy.md#invariant-5). It exists for tests and in-process accounting.
    suppressed: int
    epsilon_spent: float
    delta_spent: float


def _column(totals: KeyTotals, component: NoiseComponent, plan: QueryPlan) -> np.ndarray:
    """The exact quantity the component adds noise to, per key."""
    if component.target == "count":
        return totals.events
    if component.target == "sum":
        return totals.value_sums
    if plan.statistic == "count":
        return totals.events
    if plan.statistic == "count_distinct_users":
        return totals.users
    return totals.value_sums  # sum


def release_query(aggregates: Mapping[GroupKey, KeyAggregate], plan: QueryPlan) -> QueryRelease:
    """Release one query for one window (see the module docstring).

    Works on columns (:class:`KeyTotals`): a key's numbers are looked up, tested and noised
    as array elements, the noise of a component drawn in one vectorised call.
    """
    if plan.continual is not None:
        raise PrivacyError(
            f"query {plan.name} is cumulative: its running totals come from a "
            "stream_dp.privacy.continual counter, never from per-window noise"
        )
    totals = KeyTotals.of(aggregates)
    suppressed = 0
    precomputed: list[int] | None = None  # count_threshold: the released counts themselves

    if plan.public_keys is not None:
        groups: list[GroupKey] = list(plan.public_keys)
        index = totals.index()
        rows = np.fromiter(map(index.get, groups, repeat(-1)), np.int64, len(groups))
    else:
        candidates = totals.groups
        selection = plan.selection
        if isinstance(selection, CountThreshold):
            tested = _column(totals, plan.noise[0], plan).tolist()
            outcome = selection.release(tested)
            kept = [i for i, v in enumerate(outcome) if v is not None]
            precomputed = [outcome[i] for i in kept]  # type: ignore[misc]
        elif isinstance(selection, UserCountSelection | WeightedGaussian):
            decisions = (
                selection.select_weights(totals.selection_weights)
                if isinstance(selection, WeightedGaussian)
                else selection.select(totals.users.tolist())
            )
            kept = [i for i, keep in enumerate(decisions) if keep]
        else:  # pragma: no cover - planner always sets a selection for private keys
            raise TypeError("a plan for private keys needs a partition selection")
        suppressed = len(candidates) - len(kept)
        # deterministic order that depends only on the released keys (canonical values,
        # ranked by type where keys mix types), never on the order in which keys arrived
        order = sorted(range(len(kept)), key=lambda j: group_sort_key(candidates[kept[j]]))
        groups = [candidates[kept[j]] for j in order]
        rows = np.fromiter((kept[j] for j in order), np.int64, len(order))
        if precomputed is not None:
            precomputed = [precomputed[j] for j in order]

    if plan.top_k is not None:  # candidates: the public keys or those selection kept
        exact_counts = np.zeros(len(rows), dtype=np.int64)
        exact_counts[rows >= 0] = _column(totals, plan.noise[0], plan)[rows[rows >= 0]]
        chosen = choose_top_k(exact_counts, plan.top_k)
        if plan.public_keys is None:
            suppressed += len(rows) - len(chosen)
        groups, rows = [groups[i] for i in chosen.tolist()], rows[chosen]
        if precomputed is not None:
            precomputed = [precomputed[i] for i in chosen.tolist()]

    present = rows >= 0
    noisy: list[list[int]] = []
    for position, component in enumerate(plan.noise):
        if position == 0 and precomputed is not None:
            noisy.append(precomputed)
        else:
            exact = np.zeros(len(rows), dtype=np.int64)
            exact[present] = _column(totals, component, plan)[rows[present]]
            noisy.append(component.mechanism.sample(exact))

    values = _post_process(groups, noisy, plan)
    return QueryRelease(
        values=values, suppressed=suppressed, epsilon_spent=plan.epsilon, delta_spent=plan.delta
    )


def _post_process(
    groups: list[GroupKey], noisy: Sequence[Sequence[int]], plan: QueryPlan
) -> ReleasedValues:
    clamp = plan.clamp_negative
    primary = plan.noise[0]
    if plan.statistic == "mean":
        return _post_process_mean(groups, noisy, plan)
    scale, half = primary.scale, primary.ci95
    (noisy_values,) = noisy
    values: list[int] | list[float]
    if plan.statistic == "sum":
        unit = primary.unit
        values = [v * unit for v in noisy_values]
    else:
        values = list(noisy_values)
    if not clamp:
        return ReleasedValues(groups, values, scale, half, [False] * len(values))
    clamped = [v < 0 for v in values]
    zero = 0.0 if plan.statistic == "sum" else 0
    if any(clamped):
        values = [zero if c else v for v, c in zip(values, clamped, strict=True)]
    return ReleasedValues(groups, values, scale, half, clamped)


def _post_process_mean(
    groups: list[GroupKey], noisy: Sequence[Sequence[int]], plan: QueryPlan
) -> ReleasedValues:
    clamp = plan.clamp_negative
    primary = plan.noise[0]
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
    values: list[float] = []
    scales: list[float] = []
    halves: list[float] = []
    clamped: list[bool] = []
    for s, c in zip(sums, counts, strict=True):
        denominator = max(1, c)
        mean = min(max(s * unit / denominator, lower), upper)
        half = whole_range if c <= 0 else min(spread / denominator, whole_range)
        is_clamped = clamp and mean < 0
        values.append(0.0 if is_clamped else mean)
        scales.append(sum_scale / denominator)
        halves.append(half)
        clamped.append(is_clamped)
    return ReleasedValues(groups, values, scales, halves, clamped)
