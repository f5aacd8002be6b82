"""Noise calibration against independent references (scipy, brute-force sums, a dense grid
over the Rényi order): Φ and its upper quantile; the zCDP → (ε, δ) conversion of Canonne,
Kamath & Steinke (2020), Corollary 13, and its inverses; the analytic Gaussian's δ (Balle &
Wang 2018, Theorem 8); the discrete Gaussian's normaliser and its exact (ε, δ) curve under
unit shifts, recomputed here as the hockey-stick divergence summed point by point over Z^m.

Every check is deterministic (no sampling): the tolerances are those of double precision.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.optimize import minimize_scalar
from scipy.stats import norm

from stream_dp.privacy.calibration import (
    MAX_EXACT_SUPPORT,
    analytic_gaussian_delta,
    analytic_gaussian_sigma,
    discrete_gaussian_delta,
    discrete_gaussian_normalizer,
    discrete_gaussian_support_size,
    normal_cdf,
    normal_upper_quantile,
    zcdp_delta,
    zcdp_epsilon,
    zcdp_rho,
)

# ----------------------------------------------------------------------- Φ and Φ⁻¹


@pytest.mark.parametrize("x", [-30.0, -20.0, -8.0, -1.3, 0.0, 0.7, 2.0, 5.0, 8.0])
def test_normal_cdf_is_phi_in_both_tails(x: float) -> None:
    assert normal_cdf(x) == pytest.approx(float(norm.cdf(x)), rel=1e-12, abs=0)


@pytest.mark.parametrize("p", [1e-300, 1e-30, 1e-9, 0.01, 0.3, 0.5, 0.8, 0.999])
def test_the_upper_quantile_inverts_the_upper_tail(p: float) -> None:
    assert normal_upper_quantile(p) == pytest.approx(float(norm.isf(p)), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("p", [0.0, 1.0, -0.1, 1.5])
def test_the_upper_quantile_refuses_a_probability_outside_0_1(p: float) -> None:
    with pytest.raises(ValueError, match="p must be in"):
        normal_upper_quantile(p)


# ------------------------------------------------------------------------- zCDP


def _log_delta_at(alpha: float, rho: float, epsilon: float) -> float:
    """log of exp((α−1)(αρ−ε)) / (α−1) · (1 − 1/α)^α (CKS20, Corollary 13)."""
    return (
        (alpha - 1) * (alpha * rho - epsilon) - math.log(alpha - 1) + alpha * math.log1p(-1 / alpha)
    )


def _reference_zcdp_delta(rho: float, epsilon: float) -> float:
    """The infimum over α > 1 found by a dense logarithmic grid, then refined by scipy's
    bounded scalar minimiser around the best grid point: no bisection on the slope."""
    grid = 1 + np.logspace(-9, 7, 40_001)
    values = (grid - 1) * (grid * rho - epsilon) - np.log(grid - 1) + grid * np.log1p(-1 / grid)
    i = int(np.argmin(values))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    found = minimize_scalar(
        lambda a: _log_delta_at(a, rho, epsilon),
        bounds=(lo, hi),
        method="bounded",
        options={"xatol": 1e-14 * hi},
    )
    return min(1.0, math.exp(min(float(found.fun), float(values[i]), 0.0)))


ZCDP_CASES = [
    (0.001, 1.0),  # optimal order α ≈ ε/2ρ = 500: the search must grow its bracket
    (0.01, 0.5),
    (0.1, 1.0),
    (0.5, 2.0),
    (1.0, 3.0),
    (3.0, 10.0),
    (0.05, 0.05),
    (0.5, 0.8),  # optimal order below 2: the search must not start above it
    (2.0, 3.0),
]


@pytest.mark.parametrize(("rho", "epsilon"), ZCDP_CASES)
def test_zcdp_delta_is_the_infimum_over_renyi_orders(rho: float, epsilon: float) -> None:
    assert zcdp_delta(rho, epsilon) == pytest.approx(_reference_zcdp_delta(rho, epsilon), rel=1e-7)


def test_zcdp_delta_edges() -> None:
    assert zcdp_delta(0.0, 0.5) == 0.0  # no privacy loss
    assert zcdp_delta(0.0, 0.0) == 0.0
    assert zcdp_delta(50.0, 0.0) == 1.0  # capped at 1, never above
    assert zcdp_delta(2.0, 0.1) <= 1.0
    for rho, epsilon in [(-0.1, 1.0), (0.1, -1.0)]:
        with pytest.raises(ValueError, match="non-negative"):
            zcdp_delta(rho, epsilon)


@pytest.mark.parametrize(("rho", "delta"), [(0.001, 1e-6), (0.02, 1e-9), (0.5, 1e-5), (4.0, 1e-8)])
def test_zcdp_epsilon_is_the_smallest_epsilon_to_1e_12(rho: float, delta: float) -> None:
    epsilon = zcdp_epsilon(rho, delta)
    assert zcdp_delta(rho, epsilon) <= delta  # rounded up: never too small
    assert zcdp_delta(rho, epsilon * (1 - 1e-11)) > delta  # and tight to the promise


@pytest.mark.parametrize("delta", [0.0, 1.0, -1e-9, 2.0])
def test_zcdp_epsilon_and_rho_refuse_a_delta_outside_0_1(delta: float) -> None:
    with pytest.raises(ValueError, match="delta must be in"):
        zcdp_epsilon(0.5, delta)
    with pytest.raises(ValueError, match="delta must be in"):
        zcdp_rho(1.0, delta)


@pytest.mark.parametrize("epsilon", [0.0, -1.0])
def test_zcdp_rho_refuses_an_epsilon_that_is_not_positive(epsilon: float) -> None:
    with pytest.raises(ValueError, match="epsilon must be > 0"):
        zcdp_rho(epsilon, 1e-6)


@pytest.mark.parametrize(
    ("epsilon", "delta"), [(0.05, 1e-9), (0.3, 1e-6), (1.0, 1e-6), (2.0, 1e-5), (8.0, 1e-3)]
)
def test_zcdp_rho_is_the_largest_rho_to_1e_12(epsilon: float, delta: float) -> None:
    rho = zcdp_rho(epsilon, delta)
    assert zcdp_delta(rho, epsilon) <= delta  # rounded down: never too large
    assert zcdp_delta(rho * (1 + 1e-11), epsilon) > delta
    # and it is the inverse of the ε conversion
    assert zcdp_epsilon(rho, delta) == pytest.approx(epsilon, rel=1e-9)
    assert zcdp_epsilon(rho, delta) <= epsilon * (1 + 1e-12)


# ------------------------------------------------------------ analytic Gaussian


def _reference_analytic_delta(sigma: float, epsilon: float, l2: float) -> float:
    a, b = l2 / (2 * sigma), epsilon * sigma / l2
    return max(0.0, float(norm.cdf(a - b) - math.exp(epsilon + norm.logcdf(-a - b))))


@pytest.mark.parametrize(
    ("sigma", "epsilon", "l2"),
    [(0.5, 0.1, 1.0), (2.0, 0.5, 1.0), (4.0, 1.0, 3.0), (10.0, 0.2, 2.0), (1.0, 3.0, 1.0)],
)
def test_analytic_gaussian_delta_is_balle_wang_theorem_8(
    sigma: float, epsilon: float, l2: float
) -> None:
    expected = _reference_analytic_delta(sigma, epsilon, l2)
    assert analytic_gaussian_delta(sigma, epsilon, l2) == pytest.approx(expected, rel=1e-9)


def test_analytic_gaussian_delta_refuses_a_scale_that_is_not_positive() -> None:
    for sigma, l2 in [(0.0, 1.0), (-1.0, 1.0), (1.0, 0.0), (1.0, -2.0)]:
        with pytest.raises(ValueError, match="must be > 0"):
            analytic_gaussian_delta(sigma, 1.0, l2)


@pytest.mark.parametrize(
    ("epsilon", "delta", "l2"),
    [(0.0, 1e-6, 1.0), (1.0, 0.0, 1.0), (1.0, 1.0, 1.0), (1.0, 1e-6, 0.0)],
)
def test_analytic_gaussian_sigma_refuses_bad_parameters(
    epsilon: float, delta: float, l2: float
) -> None:
    with pytest.raises(ValueError, match="need epsilon > 0"):
        analytic_gaussian_sigma(epsilon, delta, l2)


@pytest.mark.parametrize(
    ("epsilon", "delta", "l2"),
    [(0.1, 1e-9, 1.0), (1.0, 1e-6, 2.0), (0.5, 1e-3, 5.0), (5.0, 1e-3, 0.01)],
)
def test_analytic_gaussian_sigma_is_the_smallest_to_1e_12(
    epsilon: float, delta: float, l2: float
) -> None:
    sigma = analytic_gaussian_sigma(epsilon, delta, l2)
    assert analytic_gaussian_delta(sigma, epsilon, l2) <= delta
    assert analytic_gaussian_delta(sigma * (1 - 1e-11), epsilon, l2) > delta


# ------------------------------------------------- exact discrete Gaussian curve


@pytest.mark.parametrize("sigma", [0.2, 0.6, 0.99, 1.0, 1.05, 1.7, 7.3, 150.0])
def test_the_normalizer_is_the_sum_over_the_integers(sigma: float) -> None:
    radius = math.ceil(40 * sigma) + 40
    direct = math.fsum(math.exp(-(z * z) / (2 * sigma * sigma)) for z in range(-radius, radius + 1))
    assert discrete_gaussian_normalizer(sigma) == pytest.approx(direct, rel=1e-13)


def _reference_discrete_delta(sigma: float, epsilon: float, shifts: int) -> float:
    """max(0, P(y) − e^ε Q(y)) summed over every point y of Z^m (|y_i| ≤ 12σ + 6), with
    P = N_Z(1, σ²)^m and Q = N_Z(0, σ²)^m: the hockey-stick divergence itself."""
    radius = math.ceil(12 * sigma) + 6
    points = range(-radius, radius + 2)
    normalizer = math.fsum(math.exp(-(z * z) / (2 * sigma * sigma)) for z in range(-400, 401))
    q1 = {y: math.exp(-(y * y) / (2 * sigma * sigma)) / normalizer for y in points}
    p1 = {y: math.exp(-((y - 1) ** 2) / (2 * sigma * sigma)) / normalizer for y in points}
    total = []
    for ys in itertools.product(points, repeat=shifts):
        p = math.prod(p1[y] for y in ys)
        q = math.prod(q1[y] for y in ys)
        total.append(max(0.0, p - math.exp(epsilon) * q))
    return math.fsum(total)


@pytest.mark.parametrize(
    ("sigma", "epsilon", "shifts"),
    [
        (0.7, 0.5, 1),
        (1.5, 0.2, 1),
        (3.0, 1.0, 1),
        (2.2, 0.05, 1),
        (1.2, 0.8, 2),
        (2.5, 0.3, 2),
        (1.0, 1.5, 3),
    ],
)
def test_the_discrete_gaussian_delta_is_the_hockey_stick_divergence(
    sigma: float, epsilon: float, shifts: int
) -> None:
    expected = _reference_discrete_delta(sigma, epsilon, shifts)
    assert expected > 1e-12  # a case where δ is not negligible
    assert discrete_gaussian_delta(sigma, epsilon, shifts) == pytest.approx(expected, rel=1e-9)


def test_the_discrete_gaussian_delta_is_capped_at_one_and_refuses_bad_input() -> None:
    assert 0.99 < discrete_gaussian_delta(0.05, 0.0, 3) <= 1.0
    for sigma, shifts in [(0.0, 1), (-1.0, 1), (1.0, 0)]:
        with pytest.raises(ValueError, match="need sigma > 0"):
            discrete_gaussian_delta(sigma, 1.0, shifts)


def test_the_exact_curve_is_computed_up_to_max_exact_support_and_refused_above() -> None:
    """The support of the summed coordinates is m·2r + 1 points for the per-coordinate
    radius r = ⌈10σ⌉ + 2: computed at or below MAX_EXACT_SUPPORT, refused above."""
    assert discrete_gaussian_support_size(1.0, 1) == 2 * 12 + 1
    assert discrete_gaussian_support_size(2.5, 3) == 3 * 2 * 27 + 1
    sigma = 9999.95  # r = 100002: 2 shifts give 400,009 points, 1 shift 200,005
    assert discrete_gaussian_support_size(sigma, 2) > MAX_EXACT_SUPPORT
    with pytest.raises(ValueError, match="support too large"):
        discrete_gaussian_delta(sigma, 1e-4, 2)
    assert 0.0 < discrete_gaussian_delta(sigma, 1e-6, 1) < 1.0


@pytest.mark.parametrize(
    ("sigma", "epsilon", "shifts"), [(0.3, 40.0, 1), (0.3, 60.0, 2), (1.0, 40.0, 1)]
)
def test_the_discrete_gaussian_delta_stays_an_upper_bound_where_it_vanishes(
    sigma: float, epsilon: float, shifts: int
) -> None:
    """Far in the tail the exact δ underflows; the mass outside the computed support (and
    the rounding of the pmf's sum) is added, never subtracted: δ is never negative and
    never below the point-by-point sum."""
    delta = discrete_gaussian_delta(sigma, epsilon, shifts)
    assert delta >= _reference_discrete_delta(sigma, epsilon, shifts) >= 0.0
    assert delta < 1e-12
