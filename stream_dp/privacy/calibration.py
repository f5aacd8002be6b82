"""Noise calibration for Gaussian noise: zCDP ↔ (ε, δ), the analytic Gaussian, and the exact
(ε, δ) curve of the discrete Gaussian under unit shifts.

Pure numerics (floats and the standard library); every solver returns the *conservative*
end of its bracket: a σ that is never too small, a ρ that is never too large, an ε that is
never too small.

- :func:`zcdp_delta` / :func:`zcdp_epsilon` / :func:`zcdp_rho`: ρ-zCDP implies (ε, δ)-DP
  with δ = inf_{α>1} exp((α−1)(αρ−ε)) / (α−1) · (1 − 1/α)^α (Canonne, Kamath, Steinke 2020,
  "The Discrete Gaussian for Differential Privacy", Corollary 13). The exponent
  g(α) = (α−1)(αρ−ε) − ln(α−1) + α·ln(1−1/α) is convex with g'(α) = (2α−1)ρ − ε + ln(1−1/α),
  so the infimum is found by bisection on g'. This is the conversion OpenDP's
  ``make_zCDP_to_approxDP`` uses; the tests compare both.
- :func:`analytic_gaussian_delta` / :func:`analytic_gaussian_sigma`: Balle & Wang 2018
  ("Improving the Gaussian Mechanism", Theorem 8), the calibration Google's library and
  PyDP use for their Gaussian partition selection.
- :func:`discrete_gaussian_delta`: the exact hockey-stick divergence of the discrete
  Gaussian mechanism when ``unit_shifts`` coordinates move by one (the shape of a
  distinct-user count vector when one user is added), computed from the privacy-loss
  distribution by direct convolution of the pmf.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

_STANDARD_NORMAL = NormalDist()


def normal_cdf(x: float) -> float:
    """Φ(x), accurate in both tails (erfc instead of 1 + erf)."""
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def normal_upper_quantile(p: float) -> float:
    """Φ⁻¹(1 − p), computed as −Φ⁻¹(p) so that tiny p keeps its precision."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    return -_STANDARD_NORMAL.inv_cdf(p)


# --------------------------------------------------------------------------- zCDP


def zcdp_delta(rho: float, epsilon: float) -> float:
    """Smallest δ such that ρ-zCDP implies (ε, δ)-DP (CKS20, Corollary 13)."""
    if rho < 0 or epsilon < 0:
        raise ValueError("rho and epsilon must be non-negative")
    if rho == 0:
        return 0.0

    def slope(alpha: float) -> float:
        return (2 * alpha - 1) * rho - epsilon + math.log1p(-1.0 / alpha)

    lo, hi = 1.0, 2.0
    while slope(hi) < 0:
        lo, hi = hi, hi * 2
        if hi > 1e300:  # pragma: no cover - needs absurd parameters
            break
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid in (lo, hi):
            break
        if slope(mid) < 0:
            lo = mid
        else:
            hi = mid
    alpha = hi
    log_delta = (alpha - 1) * (alpha * rho - epsilon) - math.log(alpha - 1)
    log_delta += alpha * math.log1p(-1.0 / alpha)
    return min(1.0, math.exp(min(log_delta, 0.0)))


def zcdp_epsilon(rho: float, delta: float) -> float:
    """Smallest ε (up to 1e-12 relative, rounded up) with ρ-zCDP ⇒ (ε, δ)-DP."""
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if rho == 0:
        return 0.0
    lo = 0.0
    hi = rho + 2 * math.sqrt(rho * math.log(1 / delta)) + 1e-12  # always sufficient
    while zcdp_delta(rho, hi) > delta:  # pragma: no cover - the bound above holds
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid in (lo, hi) or hi - lo <= 1e-13 * hi:
            break
        if zcdp_delta(rho, mid) > delta:
            lo = mid
        else:
            hi = mid
    return hi


def zcdp_rho(epsilon: float, delta: float) -> float:
    """Largest ρ (rounded down) such that ρ-zCDP ⇒ (ε, δ)-DP."""
    if epsilon <= 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    lo, hi = 0.0, epsilon
    while zcdp_delta(hi, epsilon) <= delta:
        lo, hi = hi, hi * 2
    for _ in range(300):
        mid = (lo + hi) / 2
        if mid in (lo, hi) or hi - lo <= 1e-14 * hi:
            break
        if zcdp_delta(mid, epsilon) <= delta:
            lo = mid
        else:
            hi = mid
    return lo


# ------------------------------------------------------------ analytic Gaussian


def analytic_gaussian_delta(sigma: float, epsilon: float, l2_sensitivity: float) -> float:
    """δ of the continuous Gaussian mechanism N(0, σ²) at ε (Balle & Wang 2018, Theorem 8).

    δ = Φ(Δ/(2σ) − εσ/Δ) − e^ε Φ(−Δ/(2σ) − εσ/Δ). For very large ε the second term is
    computed in log space; if it underflows it is dropped, which only over-states δ.
    """
    if sigma <= 0 or l2_sensitivity <= 0:
        raise ValueError("sigma and l2_sensitivity must be > 0")
    a = l2_sensitivity / (2 * sigma)
    b = epsilon * sigma / l2_sensitivity
    first = normal_cdf(a - b)
    tail = normal_cdf(-a - b)
    second = 0.0 if tail == 0.0 else math.exp(min(epsilon + math.log(tail), 700.0))
    return max(0.0, first - second)


def analytic_gaussian_sigma(epsilon: float, delta: float, l2_sensitivity: float) -> float:
    """Smallest σ (to 1e-12 relative, rounded up) giving (ε, δ)-DP for N(0, σ²) noise."""
    if epsilon <= 0 or not 0.0 < delta < 1.0 or l2_sensitivity <= 0:
        raise ValueError("need epsilon > 0, 0 < delta < 1 and l2_sensitivity > 0")
    lo, hi = l2_sensitivity * 1e-3, l2_sensitivity
    while analytic_gaussian_delta(hi, epsilon, l2_sensitivity) > delta:
        lo, hi = hi, hi * 2
    while analytic_gaussian_delta(lo, epsilon, l2_sensitivity) <= delta and lo > 1e-300:
        hi, lo = lo, lo / 2
    for _ in range(300):
        mid = (lo + hi) / 2
        if mid in (lo, hi) or hi - lo <= 1e-13 * hi:
            break
        if analytic_gaussian_delta(mid, epsilon, l2_sensitivity) > delta:
            lo = mid
        else:
            hi = mid
    return hi


# ------------------------------------------------- exact discrete Gaussian curve

#: Per-coordinate support used by :func:`discrete_gaussian_delta` is ±(cutoff·σ + 2); the
#: mass outside it (< e^{-cutoff²/2} per coordinate) is added to δ as an upper bound.
_SUPPORT_CUTOFF_SIGMAS = 10.0
#: Above this many support points of the summed coordinates the exact curve is not
#: computed (callers fall back to the zCDP conversion, which is valid but looser).
MAX_EXACT_SUPPORT = 400_000


def _discrete_gaussian_pmf_array(sigma: float, radius: int) -> np.ndarray:
    z = np.arange(-radius, radius + 1, dtype=np.float64)
    w = np.exp(-(z * z) / (2 * sigma * sigma))
    total = float(np.sum(w))
    # normalise over the whole of Z, not the window: the window's complement is tiny
    full = discrete_gaussian_normalizer(sigma)
    return w / max(total, full)


def discrete_gaussian_normalizer(sigma: float) -> float:
    """Σ_{z∈Z} exp(−z²/(2σ²))."""
    if sigma >= 1.0:
        # Poisson summation: √(2π)σ · (1 + 2 Σ_k exp(−2π²σ²k²)); k ≥ 3 is below 1e-70.
        s = sum(math.exp(-2 * math.pi**2 * sigma**2 * k * k) for k in (1, 2, 3))
        return math.sqrt(2 * math.pi) * sigma * (1 + 2 * s)
    radius = 60
    z = np.arange(-radius, radius + 1, dtype=np.float64)
    return float(np.sum(np.exp(-(z * z) / (2 * sigma * sigma))))


def discrete_gaussian_support_size(sigma: float, unit_shifts: int) -> int:
    radius = math.ceil(_SUPPORT_CUTOFF_SIGMAS * sigma) + 2
    return unit_shifts * (2 * radius) + 1


def discrete_gaussian_delta(sigma: float, epsilon: float, unit_shifts: int) -> float:
    """Exact δ(ε) of adding N_Z(0, σ²) to each coordinate when ``unit_shifts`` coordinates
    of the input move by +1 (and the rest stay).

    Per coordinate the privacy loss at output noise w is (2w + 1)/(2σ²); over m coordinates
    it is (2S + m)/(2σ²) with S the sum of m independent discrete Gaussians, so
    δ = E[(1 − e^{ε − L})₊] is a finite sum over the pmf of S (direct convolution, all terms
    positive, no cancellation). Removing coordinates or flipping signs cannot increase δ
    (marginalisation is post-processing; the pmf is symmetric), so this is the worst case
    over neighbours that change at most m coordinates by at most one.
    """
    if sigma <= 0 or unit_shifts < 1:
        raise ValueError("need sigma > 0 and unit_shifts >= 1")
    if discrete_gaussian_support_size(sigma, unit_shifts) > MAX_EXACT_SUPPORT:
        raise ValueError("support too large for the exact computation")
    radius = math.ceil(_SUPPORT_CUTOFF_SIGMAS * sigma) + 2
    pmf = _discrete_gaussian_pmf_array(sigma, radius)
    outside = max(0.0, 1.0 - float(np.sum(pmf)))
    total = pmf
    for _ in range(unit_shifts - 1):
        total = np.convolve(total, pmf)
    m = unit_shifts
    s = np.arange(-m * radius, m * radius + 1, dtype=np.float64)
    loss = (2 * s + m) / (2 * sigma * sigma)
    positive = loss > epsilon
    contrib = total[positive] * -np.expm1(epsilon - loss[positive])
    return min(1.0, float(np.sum(contrib)) + m * outside)
