"""The analytic Gaussian's σ is the smallest that gives (ε, δ)-DP (Balle & Wang 2018,
Theorem 8, evaluated here with scipy in log space), also for ε so large (test mode) that σ
falls below the search's first guess of 1e-3·Δ."""

from __future__ import annotations

import math

import pytest
from scipy.stats import norm

from stream_dp.privacy.calibration import analytic_gaussian_sigma


def _delta(sigma: float, epsilon: float, l2: float) -> float:
    a, b = l2 / (2 * sigma), epsilon * sigma / l2
    return float(norm.cdf(a - b) - math.exp(epsilon + norm.logcdf(-a - b)))


@pytest.mark.parametrize(
    ("epsilon", "delta", "l2"),
    [(0.1, 1e-9, 1.0), (1.0, 1e-6, 2.0), (3000.0, 1e-5, 2.0), (1e6, 1e-6, 1.0), (1e7, 1e-5, 3.0)],
)
def test_sigma_is_the_smallest_that_keeps_delta(epsilon: float, delta: float, l2: float) -> None:
    sigma = analytic_gaussian_sigma(epsilon, delta, l2)
    assert _delta(sigma, epsilon, l2) <= delta * (1 + 1e-6)
    # smallest to 0.1% (the module drops e^ε·Φ(−a−b) where Φ underflows, which only
    # over-states δ and so σ, slightly, at ε in the thousands)
    assert _delta(sigma * (1 - 1e-3), epsilon, l2) > delta
