"""``top_k: N`` in the plan and the release (stream_dp.privacy.exponential.top_k_step): at
most N keys, chosen among the public or kept keys only, charged with the rest of the query's ε."""

from __future__ import annotations

import math

import pytest

from stream_dp.privacy.exponential.top_k import TopKPlan
from stream_dp.privacy.key_totals import KeyAggregate
from stream_dp.privacy.planner import compose, plan_query
from stream_dp.privacy.release import release_query
from stream_dp.privacy.specs import BoundsSpec, QuerySpec

BOUNDS = BoundsSpec(
    max_contributions_per_window=50, max_keys_per_user=2, max_contributions_per_key=5
)


def _query(**changes: object) -> QuerySpec:
    base: dict[str, object] = {
        "name": "visits",
        "epsilon": 2.0,
        "statistic": "count_distinct_users",
        "group_by": ("domain",),
        "delta": 1e-9,
        "top_k": 2,
    }
    base.update(changes)
    return QuerySpec(**base)  # type: ignore[arg-type]


def _users(counts: dict[str, int]) -> dict[tuple[str, ...], KeyAggregate]:
    return {(key,): KeyAggregate(events=n, users=n, value_sum=0) for key, n in counts.items()}


@pytest.mark.parametrize("statistic", ["count", "count_distinct_users"])
@pytest.mark.parametrize("keys", [None, (("a", "b", "c", "d"),)])
def test_the_selection_is_charged_on_top_of_the_rest_of_the_query(
    statistic: str, keys: tuple[tuple[str, ...], ...] | None
) -> None:
    """ε_sel = share·ε goes to the choice (``selection:top_k``, pure ε); the rest is planned
    exactly as a query of ε − ε_sel without top_k; the query's whole ε is charged."""
    for share in (0.5, 0.25):
        query = _query(statistic=statistic, key_values=keys, top_k_epsilon_share=share)
        plan = plan_query(query, BOUNDS)
        rest = plan_query(_query(statistic=statistic, key_values=keys, top_k=None,
                                 epsilon=2.0 - 2.0 * share), BOUNDS)  # fmt: skip
        assert plan.charges == (*rest.charges, _charge(2.0 * share))
        assert [c.describe() for c in plan.noise] == [c.describe() for c in rest.noise]
        assert plan.selection == rest.selection or (
            plan.selection is not None
            and rest.selection is not None
            and plan.selection.describe() == rest.selection.describe()
        )
        assert plan.epsilon == 2.0 == compose(plan.charges).epsilon
        assert plan.delta == query.delta
        linf = 5 if statistic == "count" else 1  # Δ: one user's most on one key's count
        assert plan.top_k == TopKPlan(2, 2.0 * share, linf)
        assert plan.top_k.scale == 2 * linf / (2.0 * share)


def _charge(epsilon: float) -> object:
    from stream_dp.privacy.planner import PrivacyCharge

    return PrivacyCharge("selection:top_k", epsilon, 0.0)


def test_a_query_without_top_k_is_planned_as_before() -> None:
    plan = plan_query(_query(top_k=None), BOUNDS)
    assert plan.top_k is None and "selection:top_k" not in [c.part for c in plan.charges]
    assert plan.describe()["top_k"] is None


@pytest.mark.parametrize("statistic", ["count", "count_distinct_users"])
def test_at_most_n_keys_are_released_the_leaders_when_leads_are_large(statistic: str) -> None:
    """Five kept keys, leads of 100 users over the third (the choice's scale is 1 or 5):
    the two leaders, with noisy values, and nothing of the other three."""
    plan = plan_query(_query(statistic=statistic, epsilon=4.0), BOUNDS)
    data = _users({"a": 400, "b": 300, "c": 200, "d": 150, "e": 120})
    for _ in range(20):
        result = release_query(data, plan)
        assert [v.group for v in result.values] == [("a",), ("b",)]
        assert result.suppressed == 3
        assert (result.epsilon_spent, result.delta_spent) == (4.0, 1e-9)
        assert all(abs(v.value - data[v.group].users) < 100 for v in result.values)


def test_public_keys_are_the_candidates_and_fewer_than_n_are_all_released() -> None:
    keys = (("a", "b", "c", "d"),)
    plan = plan_query(_query(key_values=keys, epsilon=4.0, delta=0.0), BOUNDS)
    result = release_query(_users({"c": 300, "b": 200, "zzz": 10_000}), plan)
    assert [v.group for v in result.values] == [("b",), ("c",)]
    assert result.suppressed == 0  # public keys: nothing of the data is hidden
    one = plan_query(_query(key_values=(("a",),), top_k=3, epsilon=4.0, delta=0.0), BOUNDS)
    assert [v.group for v in release_query({}, one).values] == [("a",)]


def test_only_keys_partition_selection_kept_are_candidates() -> None:
    """A key one user made (count 5 = Linf events) is dropped by partition selection (keep
    probability below δ = 1e-9 for one user) and must not be chosen although it has the
    largest count: with it among the candidates, top-1 would release it nearly always."""
    plan = plan_query(_query(statistic="count", top_k=1, epsilon=4.0), BOUNDS)
    assert plan.selection is not None
    assert plan.selection.keep_probability(1) < 1e-9
    data = {
        ("solo",): KeyAggregate(events=5, users=1, value_sum=0),
        ("shared",): KeyAggregate(events=2, users=2, value_sum=0),
        **{(f"k{i}",): KeyAggregate(events=1, users=1, value_sum=0) for i in range(30)},
    }
    data[("popular",)] = KeyAggregate(events=60, users=60, value_sum=0)
    data[("solo",)] = KeyAggregate(events=5_000, users=1, value_sum=0)  # as if unbounded
    for _ in range(20):
        groups = [v.group for v in release_query(data, plan).values]
        assert groups == [("popular",)]


def test_the_plan_figure_is_what_the_release_does() -> None:
    """One key leads m = 9 others by the lead ``plan`` states for probability 0.9; N = 1, so
    the bound is exact: P = 1/(1 + 9·exp(−lead/b)). Over R = 3,000 releases the chosen
    fraction is within t = √(ln(2e6)/(2R)) ≈ 0.049 of it (Hoeffding, two-sided: false
    failure below 1e-6); a choice at twice the scale (P ≈ 0.58) lands outside. The scale
    itself (ε_sel, Δ) is checked exactly above."""
    keys = (tuple(f"k{i}" for i in range(10)),)
    plan = plan_query(_query(key_values=keys, top_k=1, epsilon=2.0, delta=0.0), BOUNDS)
    assert plan.top_k is not None and plan.top_k.scale == 1.0
    figure = {
        (row["competitors"], row["probability"]): row["lead"]
        for row in plan.describe()["top_k"]["leads"]
    }
    assert set(figure) == {(9, 0.9), (9, 0.99)}
    lead = figure[(9, 0.9)]
    assert lead == plan.top_k.lead_for_probability(0.9, 9) == 5
    exact = 1 / (1 + 9 * math.exp(-lead / plan.top_k.scale))
    data = _users({f"k{i}": 100 for i in range(1, 10)} | {"k0": 100 + lead})
    runs = 3_000
    chosen = sum(release_query(data, plan).values[0].group == ("k0",) for _ in range(runs))
    slack = math.sqrt(math.log(2e6) / (2 * runs))
    assert abs(chosen / runs - exact) <= slack, (chosen, exact)
    assert exact >= 0.9
    assert abs(1 / (1 + 9 * math.exp(-lead / 2.0)) - exact) > 2 * slack


def test_the_choice_is_random_not_the_largest_counts() -> None:
    """Two keys with equal counts, top-1: each is chosen with probability 1/2, so in 60
    releases both appear (false failure 2·2⁻⁶⁰); a choice by sorting the counts would
    release the same key every time."""
    plan = plan_query(_query(key_values=(("a", "b"),), top_k=1, delta=0.0), BOUNDS)
    data = _users({"a": 50, "b": 50})
    seen = {release_query(data, plan).values[0].group for _ in range(60)}
    assert seen == {("a",), ("b",)}
