"""The weighted-Gaussian set union threshold the set-union bench measures (bench/set_union.py).

Its guarantee (Gopi et al. 2020): σ is the analytic Gaussian for (ε, δ/2) at ℓ2 sensitivity 1,
and ρ is such that a user alone on t ≤ Δ0 keys — each with weight 1/√t — gets *any* of them
released with probability at most δ/2. Checked exactly (normal tail) for every t, and
tight: a threshold 0.001 σ lower breaks it. The pipeline measurement (plan_query,
bounded_totals_columns, release_query) counts keys within the distinct keys, releases keys
every user shares, and a lone user's key has keep probability ≤ δ.
"""

from __future__ import annotations

import json
import math
from statistics import NormalDist

import pytest

from bench.set_union import (
    MAX_KEYS,
    STRATEGIES,
    expected_keys,
    measure,
    pipeline_keys,
    population,
    product_plan,
    section,
    weighted_gaussian_parameters,
)
from stream_dp.privacy.calibration import analytic_gaussian_delta
from stream_dp.privacy.partition_selection import WeightedGaussian, user_key_weight

_NORMAL = NormalDist()


def _any_released(t: int, sigma: float, rho: float) -> float:
    per_key = _NORMAL.cdf((1 / math.sqrt(t) - rho) / sigma)
    return -math.expm1(t * math.log1p(-per_key))


@pytest.mark.parametrize(
    ("epsilon", "delta", "max_keys"), [(0.5, 1e-6, 10), (1.0, 1e-5, 1), (3.0, math.exp(-10), 50)]
)
def test_a_users_own_keys_are_released_with_probability_at_most_half_delta(
    epsilon: float, delta: float, max_keys: int
) -> None:
    sigma, rho = weighted_gaussian_parameters(epsilon, delta, max_keys)
    assert analytic_gaussian_delta(sigma, epsilon, 1.0) <= delta / 2 * (1 + 1e-9)
    worst = max(_any_released(t, sigma, rho) for t in range(1, max_keys + 1))
    assert worst <= delta / 2 * (1 + 1e-9)
    # tight: a slightly lower threshold breaks it for some t
    lower = rho - 1e-3 * sigma
    assert max(_any_released(t, sigma, lower) for t in range(1, max_keys + 1)) > delta / 2


def test_weights_favour_users_with_few_keys_and_counts_are_expected_values() -> None:
    sets = population(2000, 500, seed=1)
    got = expected_keys(sets, epsilon=1.0, delta=1e-6, max_keys=5, seed=1)
    assert 0 < got["weighted_gaussian"] <= got["distinct_keys"]
    assert 0 < got["truncated_geometric"] <= got["distinct_keys"]
    # one user alone on one key: its weight 1 is far below ρ, so it is (almost) never kept
    alone = expected_keys([[0]], epsilon=1.0, delta=1e-6, max_keys=5, seed=0)
    assert alone["weighted_gaussian"] <= 1e-6 / 2


def test_the_pipeline_measurement_counts_released_keys_within_the_distinct_keys() -> None:
    sets = population(2000, 500, seed=1)
    got = pipeline_keys(sets, epsilon=1.0, delta=1e-6, max_keys=5, seed=1, draws=2)
    distinct = len({k for keys in sets for k in keys})
    assert got["distinct_keys"] == distinct
    for name in STRATEGIES:
        assert 0 <= got[name] <= distinct
        assert 0 <= got[f"{name} rule"] <= distinct
    # the plan gives the selection exactly the ε and δ asked for, at L0 = 5
    plan = product_plan("weighted_gaussian", 1.0, 1e-6, 5)
    assert plan.selection_epsilon == 1.0 and plan.epsilon == 2.0
    assert isinstance(plan.selection, WeightedGaussian)
    assert plan.selection.delta == 1e-6 and plan.selection.max_partitions_contributed == 5


def test_keys_every_user_shares_are_released_and_a_lone_users_key_is_not() -> None:
    # 1,000 users all on the same 3 keys: each key has 1,000 users and weight sum
    # 1,000·⌊4096/√3⌋, far above every rule's threshold.
    users, keys = 1000, [0, 1, 2]
    for name in STRATEGIES:
        selection = product_plan(name, 1.0, 1e-6, 5).selection
        assert selection is not None
        tested = users * user_key_weight(3) if name == "weighted_gaussian" else users
        miss = 1 - selection.keep_probability(tested)
        # false-failure rate of the equality below: ≤ 3 keys × 2 draws × miss, checked here
        assert 6 * miss < 1e-9
    got = pipeline_keys([keys] * users, epsilon=1.0, delta=1e-6, max_keys=5, seed=0, draws=2)
    for name in STRATEGIES:
        assert got[name] == 3
        assert got[f"{name} rule"] == pytest.approx(3)
    # one user alone on one key: every rule keeps it with probability ≤ δ (expected values,
    # no draw is tested)
    alone = pipeline_keys([[0]], epsilon=1.0, delta=1e-6, max_keys=5, seed=0)
    assert alone["weighted_gaussian rule"] <= 1e-6 / 2
    for name in STRATEGIES:
        assert alone[f"{name} rule"] <= 1e-6


def test_the_results_section_renders_every_row_and_survives_json() -> None:
    result = measure(users=300, keys=200, runs=2, draws=1, epsilon=1.0, delta=1e-6, log=len)
    kept = json.loads(json.dumps(result))  # what --write keeps and bench.report reads back
    lines = section(kept)
    assert lines[0].startswith("## 8. ")
    rows = [line for line in lines if line.startswith("| ") and line[2].isdigit()]
    assert [int(r.split("|")[1]) for r in rows] == list(MAX_KEYS)
    assert all(r.count("|") == 2 + 2 * len(STRATEGIES) + 1 for r in rows)
    assert "--runs 2 --draws 1 --write" in "\n".join(lines)
