"""The statistics registry is the one place a statistic's behaviour lives: the release asks it
for the exact input and the post-processing, and a vector per key (a quantile's histogram
bins) is noised entry by entry and handed back per key (issue 40)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from stream_dp.config import BoundsConfig, QueryConfig
from stream_dp.errors import ConfigError
from stream_dp.privacy.key_totals import KeyTotals
from stream_dp.privacy.mechanisms import DiscreteLaplace
from stream_dp.privacy.planner import QueryPlan, plan_query
from stream_dp.privacy.release import KeyAggregate, release_query
from stream_dp.privacy.statistics import STATISTICS
from stream_dp.privacy.statistics.count import Count
from stream_dp.privacy.statistics.released_values import GroupKey, ReleasedValues


class _TwoBins(Count):
    """A count whose exact input is a vector per key: (events, users)."""

    def noise_input(self, totals: KeyTotals, target: Any, plan: QueryPlan) -> np.ndarray:
        return np.stack([totals.events, totals.users], axis=1)

    def post_process(
        self, groups: list[GroupKey], noisy: Sequence[Sequence[Any]], plan: QueryPlan
    ) -> ReleasedValues:
        (bins,) = noisy
        values = [10 * events + users for events, users in bins]
        return ReleasedValues(groups, values, 0.0, 0.0, [False] * len(values))


def test_a_vector_per_key_gets_one_draw_per_entry_and_comes_back_per_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    drawn: list[int] = []

    def shifted(self: DiscreteLaplace, values: Any) -> np.ndarray:
        drawn.append(len(values))
        return np.asarray(values, dtype=np.int64) + 1

    monkeypatch.setattr(DiscreteLaplace, "sample_array", shifted)
    monkeypatch.setitem(STATISTICS, "count", _TwoBins())
    plan = plan_query(
        QueryConfig(name="c", group_by=["d"], keys={"d": ["a", "b", "c"]}, epsilon=1.0).spec(),
        BoundsConfig(max_contributions_per_window=3).spec(),
    )
    out = release_query({("a",): KeyAggregate(4, 2, 0), ("c",): KeyAggregate(7, 5, 0)}, plan)
    assert drawn == [6]  # 3 keys × 2 entries, one vectorised draw
    # a: (4+1, 2+1); b (no data): (0+1, 0+1); c: (7+1, 5+1)
    assert [v.value for v in out.values] == [53, 11, 86]


def test_every_statistic_declares_what_it_needs() -> None:
    """The registry's statistics and their settings, as the docs' table states them."""
    assert list(STATISTICS) == [
        "count",
        "count_distinct_users",
        "sum",
        "mean",
        "variance",
        "quantile",
    ]
    needs = {name: s.needs_values for name, s in STATISTICS.items()}
    assert needs == {
        "count": False,
        "count_distinct_users": False,
        "sum": True,
        "mean": True,
        "variance": True,
        "quantile": True,
    }
    cumulative = [name for name, s in STATISTICS.items() if s.cumulative_refusal is None]
    assert cumulative == ["count", "sum"]
    threshold = [name for name, s in STATISTICS.items() if s.count_threshold]
    assert threshold == ["count", "count_distinct_users"]


def test_an_unknown_statistic_is_refused_not_planned_as_a_sum() -> None:
    """Issue 40: a spec built in code with statistic "median" (pydantic keeps users from it,
    nothing kept a developer) was planned with the sum's sensitivity and released with the
    count's post-processing. The registry refuses it, naming the statistics it knows."""
    valued = QueryConfig(
        name="m", statistic="sum", value_field="x", lower=0, upper=10, epsilon=1.0, delta=1e-6
    ).spec()
    median = dataclasses.replace(valued, statistic="median")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="unknown statistic 'median'; use one of count, "):
        plan_query(median, BoundsConfig(max_contributions_per_window=3).spec())
