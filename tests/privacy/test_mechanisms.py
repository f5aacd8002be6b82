"""Discrete Laplace / discrete Gaussian: exact pmf, tails and 95% intervals against
independent computations (scipy's dlaplace, direct summation, OpenDP's privacy maps), and
goodness of fit of the samples.

Statistical tests state their false-failure probability; each uses a p-value threshold of
1e-7 (so the whole file fails by chance with probability below 1e-6).
"""

from __future__ import annotations

import math

import numpy as np
import opendp.prelude as dp
import pytest
from scipy.stats import binomtest, chisquare, dlaplace, norm

from stream_dp.privacy.calibration import zcdp_epsilon
from stream_dp.privacy.mechanisms import DiscreteGaussian, DiscreteLaplace, bernoulli

P_THRESHOLD = 1e-7

LAPLACE_SCALES = [0.05, 0.5, 1.0, 3.0, 6.0, 30.0, 120.0, 1234.5, 1e4]
GAUSSIAN_SIGMAS = [0.2, 0.7, 1.0, 4.0, 14.46, 80.0, 1000.0, 20_000.0]


def _dg_tail_direct(sigma: float, t: int) -> float:
    """P(Z ≥ t) for the discrete Gaussian, by direct summation (independent of the module)."""
    r = int(60 * sigma) + 60
    z = np.arange(-r, r + 1, dtype=np.float64)
    w = np.exp(-(z * z) / (2 * sigma * sigma))
    return float(w[z >= t].sum() / w.sum())


# ----------------------------------------------------------------- exact maths


@pytest.mark.parametrize("scale", LAPLACE_SCALES)
def test_laplace_pmf_and_tail_match_scipy_dlaplace(scale: float) -> None:
    mech = DiscreteLaplace(scale)
    ref = dlaplace(1.0 / scale)
    for z in [-50, -3, -1, 0, 1, 2, 7, 40]:
        assert mech.pmf(z) == pytest.approx(ref.pmf(z), rel=1e-11, abs=1e-300)
    span = int(60 * scale) + 60
    for t in [-5, 0, 1, 2, 10, int(3 * scale) + 1]:
        # direct summation of scipy's pmf (its sf() is 1 - cdf, imprecise in far tails)
        if t >= 1:
            expected = float(np.sum(ref.pmf(np.arange(t, t + span))))
        else:
            expected = 1.0 - float(np.sum(ref.pmf(np.arange(1 - t, 1 - t + span))))
        assert mech.tail(t) == pytest.approx(expected, rel=1e-9, abs=1e-300)


@pytest.mark.parametrize("scale", LAPLACE_SCALES)
def test_laplace_ci95_is_the_smallest_integer_with_tail_at_most_5_percent(scale: float) -> None:
    t = DiscreteLaplace(scale).ci95()
    ref = dlaplace(1.0 / scale)

    span = int(60 * scale) + 60

    def two_sided(x: int) -> float:  # P(|Z| > x), by direct summation of the pmf
        return 2 * float(np.sum(ref.pmf(np.arange(x + 1, x + 1 + span))))

    assert two_sided(t) <= 0.05
    assert t == 0 or two_sided(t - 1) > 0.05


@pytest.mark.parametrize("sigma", GAUSSIAN_SIGMAS)
def test_gaussian_pmf_sums_to_one_and_tails_match_direct_summation(sigma: float) -> None:
    mech = DiscreteGaussian(sigma)
    r = int(40 * sigma) + 40
    total = math.fsum(mech.pmf(z) for z in range(-r, r + 1)) if sigma < 100 else 1.0
    assert total == pytest.approx(1.0, abs=1e-12)
    for t in [1, 2, int(sigma) + 1, int(2 * sigma) + 1, int(5 * sigma) + 1]:
        assert mech.tail(t) == pytest.approx(_dg_tail_direct(sigma, t), rel=1e-9)
    assert mech.tail(0) == pytest.approx(mech.pmf(0) + mech.tail(1), rel=1e-12)
    assert mech.tail(0) + mech.tail(1) == pytest.approx(1.0, rel=1e-12)  # symmetry


@pytest.mark.parametrize("sigma", GAUSSIAN_SIGMAS)
def test_gaussian_ci95_is_the_smallest_integer_with_tail_at_most_5_percent(sigma: float) -> None:
    t = DiscreteGaussian(sigma).ci95()
    assert 2 * _dg_tail_direct(sigma, t + 1) <= 0.05
    assert t == 0 or 2 * _dg_tail_direct(sigma, t) > 0.05
    if sigma >= 10:  # the discrete Gaussian is the continuous one to many digits here
        assert abs(t - norm.ppf(0.975) * sigma) <= 1.5


def test_huge_gaussian_scale_uses_the_asymptotic_tail_consistently() -> None:
    sigma = 1e6  # above the direct-summation limit
    mech = DiscreteGaussian(sigma)
    assert abs(mech.ci95() - norm.ppf(0.975) * sigma) <= 2
    assert mech.tail(int(sigma)) == pytest.approx(norm.sf((sigma - 0.5) / sigma), rel=1e-9)


@pytest.mark.parametrize("l1", [1, 3, 30, 40, 400])
@pytest.mark.parametrize("epsilon", [0.1, 0.5, 1.0, 2.0])
def test_laplace_scale_gives_epsilon_per_opendp_privacy_map(l1: int, epsilon: float) -> None:
    mech = DiscreteLaplace.for_epsilon(l1_sensitivity=l1, epsilon=epsilon)
    assert mech.scale == l1 / epsilon
    assert mech.opendp_measurement().map(l1) == pytest.approx(epsilon, rel=1e-12)
    assert mech.epsilon(l1) == pytest.approx(epsilon, rel=1e-15)


@pytest.mark.parametrize("l2", [1, 3, 10, 40])
@pytest.mark.parametrize(("epsilon", "delta"), [(0.1, 1e-6), (0.5, 1e-6), (1.0, 1e-8), (2.0, 1e-5)])
def test_gaussian_sigma_meets_epsilon_delta_per_opendp(
    l2: int, epsilon: float, delta: float
) -> None:
    mech = DiscreteGaussian.for_epsilon_delta(l2_sensitivity=l2, epsilon=epsilon, delta=delta)
    rho = mech.rho(l2)
    assert mech.opendp_measurement().map(l2) == pytest.approx(rho, rel=1e-9)
    approx = dp.c.make_zCDP_to_approxDP(mech.opendp_measurement())
    eps_opendp = approx.map(l2).epsilon(delta)
    assert eps_opendp <= epsilon * (1 + 1e-9)
    assert eps_opendp == pytest.approx(epsilon, rel=1e-6)  # and no looser than needed
    assert zcdp_epsilon(rho, delta) == pytest.approx(eps_opendp, rel=1e-9)


def test_invalid_scales_are_refused() -> None:
    for bad in [0.0, -1.0, float("inf"), float("nan")]:
        with pytest.raises(ValueError):
            DiscreteLaplace(bad)
        with pytest.raises(ValueError):
            DiscreteGaussian(bad)


@pytest.mark.parametrize("rho", [0.0, -0.5])
def test_a_zcdp_budget_that_is_not_positive_is_refused_with_a_value_error(rho: float) -> None:
    """ρ = 0 promises no privacy loss, which no finite σ gives: a clear refusal, not a
    division by zero from deep in σ = Δ2/√(2ρ)."""
    with pytest.raises(ValueError, match="rho"):
        DiscreteGaussian.for_zcdp(l2_sensitivity=1.0, rho=rho)


# ------------------------------------------------------------- the samplers


def _chi_square_pvalue(
    samples: np.ndarray, pmf: object, lo: int, hi: int
) -> tuple[float, np.ndarray]:
    """Bins lo..hi plus pooled tails (< lo, > hi); lo/hi chosen so every bin expects ≥ 5."""
    n = len(samples)
    values = np.arange(lo, hi + 1)
    probs = np.array([pmf(int(z)) for z in values])  # type: ignore[operator]
    low_tail = float(np.sum(samples < lo))
    high_tail = float(np.sum(samples > hi))
    observed = np.concatenate(
        [
            [low_tail],
            np.bincount(samples[(samples >= lo) & (samples <= hi)] - lo, minlength=len(values)),
            [high_tail],
        ]
    )
    below = (1.0 - probs.sum()) / 2  # symmetric distributions
    expected = np.concatenate([[below], probs, [below]]) * n
    assert expected.min() >= 5
    result = chisquare(observed, expected)
    return float(result.pvalue), observed


def test_discrete_laplace_samples_fit_the_pmf() -> None:
    # false failure ≤ 1e-7 (chi-square p-value threshold)
    mech = DiscreteLaplace(3.0)
    offset = 1_000
    samples = np.asarray(mech.sample([offset] * 200_000)) - offset
    pvalue, _ = _chi_square_pvalue(samples, mech.pmf, -20, 20)
    assert pvalue > P_THRESHOLD


def test_discrete_gaussian_samples_fit_the_pmf() -> None:
    # false failure ≤ 1e-7 (chi-square p-value threshold)
    mech = DiscreteGaussian(4.0)
    samples = np.asarray(mech.sample([-7] * 100_000)) + 7
    pvalue, _ = _chi_square_pvalue(samples, mech.pmf, -13, 13)
    assert pvalue > P_THRESHOLD


def test_the_goodness_of_fit_test_detects_a_ten_percent_scale_error() -> None:
    # the same test applied to scale 3.3 against the pmf of scale 3.0 rejects; failing to
    # reject would need a chi-square deviation of more than 20 standard deviations (< 1e-12)
    samples = np.asarray(DiscreteLaplace(3.3).sample([0] * 200_000))
    pvalue, _ = _chi_square_pvalue(samples, DiscreteLaplace(3.0).pmf, -20, 20)
    assert pvalue < P_THRESHOLD


def test_sample_adds_independent_noise_to_each_value_and_keeps_64_bit_integers() -> None:
    mech = DiscreteLaplace(0.05)  # P(Z ≠ 0) ≈ 4e-9 per value
    values = [0, 1, -5, 2**40, -(2**40)]
    assert mech.sample(values) == values
    assert mech.sample([]) == []
    noisy = DiscreteLaplace(1000.0).sample([0] * 1000)
    assert len(set(noisy)) > 500  # not one draw reused (P of failure astronomically small)


# ------------------------------------------------------------------ bernoulli


def test_bernoulli_extremes_are_exact() -> None:
    assert bernoulli([0.0] * 10_000) == [False] * 10_000
    assert bernoulli([1.0] * 10_000) == [True] * 10_000
    assert bernoulli([]) == []
    with pytest.raises(ValueError):
        bernoulli([1.5])
    with pytest.raises(ValueError):
        bernoulli([float("nan")])


@pytest.mark.parametrize("p", [0.3, 0.5, 1e-3, 0.999])
def test_bernoulli_frequency_matches_p(p: float) -> None:
    # exact binomial test, false failure ≤ 1e-7 each
    n = 200_000
    draws = bernoulli([p] * n)
    assert binomtest(sum(draws), n, p).pvalue > P_THRESHOLD


def test_bernoulli_mixed_probabilities_are_matched_per_position() -> None:
    # false failure ≤ 2e-7 (two binomial tests)
    n = 100_000
    draws = bernoulli([0.2, 0.9] * n)
    low, high = sum(draws[0::2]), sum(draws[1::2])
    assert binomtest(low, n, 0.2).pvalue > P_THRESHOLD
    assert binomtest(high, n, 0.9).pvalue > P_THRESHOLD


@pytest.mark.parametrize("l2", [1, 3, 40])
@pytest.mark.parametrize(("epsilon", "delta"), [(0.1, 1e-6), (1.0, 1e-8), (2.0, 1e-5)])
def test_gaussian_reports_the_epsilon_opendp_gives_its_sigma(
    l2: int, epsilon: float, delta: float
) -> None:
    """The (ε, δ) a discrete Gaussian reports for Δ2 is OpenDP's zCDP → approx-DP map of
    the same measurement, and for the σ calibrated to (ε, δ) it is that ε back."""
    mech = DiscreteGaussian.for_epsilon_delta(l2_sensitivity=l2, epsilon=epsilon, delta=delta)
    approx = dp.c.make_zCDP_to_approxDP(mech.opendp_measurement())
    assert mech.epsilon(l2, delta) == pytest.approx(approx.map(l2).epsilon(delta), rel=1e-9)
    assert mech.epsilon(l2, delta) == pytest.approx(epsilon, rel=1e-6)
    # twice the sensitivity, or a hundredth of the δ, costs more ε
    assert mech.epsilon(2 * l2, delta) > 1.5 * epsilon
    assert mech.epsilon(l2, delta / 100) > epsilon


@pytest.mark.parametrize("scale", [0.5, 3.0, 120.0])
@pytest.mark.parametrize("t", [-5, -1, 0, 1, 2, 9])
def test_laplace_log_tail_is_the_log_of_scipys_tail_on_both_sides_of_zero(
    scale: float, t: int
) -> None:
    expected = math.log(dlaplace.sf(t - 1, 1 / scale))  # P(Z ≥ t) = P(Z > t − 1)
    assert DiscreteLaplace(scale).log_tail(t) == pytest.approx(expected, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("scale", [0.001, 0.0005])
def test_laplace_log_tail_of_a_tiny_scale_does_not_underflow(scale: float) -> None:
    """P(Z ≥ 1) = e^(−1/b)/(1 + e^(−1/b)) is below 1e-400 here, zero in binary64: the
    threshold searches compare its logarithm, which must still be −1/b (to rounding)."""
    mech = DiscreteLaplace(scale)
    assert mech.tail(1) == 0.0
    for t in (1, 2, 5):
        assert mech.log_tail(t) == pytest.approx(-t / scale, rel=1e-12)
