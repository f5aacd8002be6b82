"""The weighted-Gaussian set union threshold the set-union bench measures (bench/set_union.py).

Its guarantee (Gopi et al. 2020): σ is the analytic Gaussian for (ε, δ/2) at ℓ2 sensitivity 1,
and ρ is such that a user alone on t ≤ Δ0 keys — each with weight 1/√t — gets *any* of them
released with probability at most δ/2. Checked exactly (normal tail) for every t, and
tight: a threshold 0.001 σ lower breaks it.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import pytest

from bench.set_union import expected_keys, population, weighted_gaussian_parameters
from stream_dp.privacy.calibration import analytic_gaussian_delta

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
