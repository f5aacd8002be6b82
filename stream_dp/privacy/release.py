"""One query's release for one window: partition selection, then noise, then post-processing.

The worker calls :func:`release_query` exactly once per (query, window) with the exact
bounded aggregates of that window and stores the result in the release ledger before
publishing it (docs/privacy.md#invariant-3: one noise draw per (query, window, key), ever).

- Public keys: every listed key is released (a key without data counts as 0); keys in the
  data but not on the list are ignored.
- Private keys: the plan's partition selection decides which keys exist in the output;
  a suppressed key leaves nothing in the returned values.
- ``top_k``: at most N of those keys (public or kept by selection) are chosen by the peeling
  exponential mechanism on their exact bounded counts
  (:mod:`stream_dp.privacy.exponential.top_k_step`); the others leave nothing, and no noise
  is drawn for them.
- Noise: one draw per released key and noise component, all keys of a component in one
  vectorised call (:mod:`stream_dp.privacy.mechanisms`), its noised values one int64
  array (no Python object per key: a count's stay so in the released values).
- Values: the statistic's post-processing of its noisy components
  (:mod:`stream_dp.privacy.statistics`): count → noisy events; count_distinct_users → noisy
  users; sum → noisy units × granularity; mean → noisy sum / max(1, noisy count), clamped to
  [lower, upper]; variance → mean of squares − square of the mean, clamped to
  [0, ((upper − lower)/2)²]; quantile → per key the Q bin edges the exponential
  mechanism chose from the key's histogram, sorted (no additive noise).
  ``clamp_negative`` then sets negative values to 0
  (post-processing, flagged by ``clamped``).

Released values are ordered by group key (public keys in their configured order), never by
the order in which keys arrived: private keys by :func:`group_sort_key` (type, then value).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np

from stream_dp.errors import PrivacyError
from stream_dp.privacy.exponential.quantiles import release_quantile_rows
from stream_dp.privacy.exponential.top_k_step import choose_top_k
from stream_dp.privacy.group_values import sort_order
from stream_dp.privacy.key_totals import KeyAggregate, KeyTotals
from stream_dp.privacy.partition_selection import (
    CountThreshold,
    UserCountSelection,
    WeightedGaussian,
)
from stream_dp.privacy.planner import GroupKey, NoiseComponent, QueryPlan
from stream_dp.privacy.statistics import statistic_of
from stream_dp.privacy.statistics.quantile import quantile_histograms
from stream_dp.privacy.statistics.released_values import ReleasedValue, ReleasedValues

__all__ = [
    "GroupKey",
    "KeyAggregate",
    "QueryRelease",
    "ReleasedValue",
    "ReleasedValues",
    "release_query",
]


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
    """The exact quantity the component adds noise to, per key (the statistic says which)."""
    return statistic_of(plan.statistic).noise_input(totals, component.target, plan)


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

    if plan.public_keys is not None and plan.public_places is not None:
        groups: list[GroupKey] = list(plan.public_keys)
        # Each key's place on the list (-1: not listed, never released), then per listed
        # key its row (-1: no data): no index of the window's keys is made.
        place = plan.public_places
        at = np.fromiter(map(place.get, totals.groups, repeat(-1)), np.int64, len(totals))
        listed = np.flatnonzero(at >= 0)
        rows = np.full(len(groups), -1, dtype=np.int64)
        rows[at[listed]] = listed
    else:
        candidates = totals.groups
        selection = plan.selection
        if isinstance(selection, CountThreshold):
            outcome = selection.release(_column(totals, plan.noise[0], plan))
            kept_list = [i for i, v in enumerate(outcome) if v is not None]
            precomputed = [outcome[i] for i in kept_list]  # type: ignore[misc]
            kept = np.array(kept_list, dtype=np.int64)
        elif isinstance(selection, UserCountSelection | WeightedGaussian):
            decisions = (
                selection.select_weights(totals.selection_weights)
                if isinstance(selection, WeightedGaussian)
                else selection.select(totals.users)
            )
            kept = np.flatnonzero(np.array(decisions, dtype=bool))
        else:  # pragma: no cover - planner always sets a selection for private keys
            raise TypeError("a plan for private keys needs a partition selection")
        suppressed = len(candidates) - len(kept)
        # deterministic order that depends only on the released keys (canonical values,
        # ranked by type where keys mix types), never on the order in which keys arrived
        kept_groups = list(map(candidates.__getitem__, kept.tolist()))
        order = sort_order(kept_groups)
        groups = list(map(kept_groups.__getitem__, order))
        rows = kept[np.array(order, dtype=np.int64)]
        if precomputed is not None:
            precomputed = list(map(precomputed.__getitem__, order))

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
    # per component an int64 array (one entry per key: kept so up to the records'
    # encoding, no Python object per key), or a list (a vector per key, a count
    # threshold's released counts, a quantile's edges)
    noisy: list[np.ndarray | list[int] | list[Any]] = []
    if plan.quantile is not None:
        # the exponential mechanism chooses Q edges per key from its exact histogram (no
        # additive noise; a key without data has an empty histogram), held sparse
        histograms = quantile_histograms(totals, plan).take(rows)
        noisy.append(release_quantile_rows(histograms, plan.quantile).tolist())
    for position, component in enumerate(plan.noise):
        if position == 0 and precomputed is not None:
            noisy.append(precomputed)
            continue
        column = _column(totals, component, plan)
        # one entry per key, or a vector per key (keys × m: one draw per entry, e.g. a
        # quantile's histogram bins): the noise is drawn on the flattened entries
        exact = np.zeros((len(rows), *column.shape[1:]), dtype=np.int64)
        exact[present] = column[rows[present]]
        drawn = component.mechanism.sample_array(exact.ravel())
        if exact.ndim == 1:
            noisy.append(drawn)
        else:
            noisy.append(np.reshape(drawn, exact.shape).tolist())

    values = _post_process(groups, noisy, plan)
    return QueryRelease(
        values=values, suppressed=suppressed, epsilon_spent=plan.epsilon, delta_spent=plan.delta
    )


def _post_process(
    groups: list[GroupKey], noisy: Sequence[np.ndarray | Sequence[Any]], plan: QueryPlan
) -> ReleasedValues:
    return statistic_of(plan.statistic).post_process(groups, noisy, plan)
