"""The square-root factorisation: exact coefficients, the quantised factor, the output
coefficients that undo it, and the sensitivity factors against brute force."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from stream_dp.privacy.continual import sqrt_factorization as sf

P = sf.PRECISION_BITS


def toeplitz(coefficients: np.ndarray) -> np.ndarray:
    n = len(coefficients)
    out = np.zeros((n, n), dtype=coefficients.dtype)
    for i in range(n):
        out[i:, i] = coefficients[: n - i]
    return out


def test_coefficients_are_binomial_over_four_to_the_k_and_square_to_the_all_ones() -> None:
    c = sf.sqrt_coefficients(60)
    exact = [Fraction(math.comb(2 * k, k), 4**k) for k in range(60)]
    assert np.allclose(c, [float(e) for e in exact], rtol=1e-14, atol=0)
    for k in range(60):  # C·C = A: Σ_j c_j c_{k−j} = 1
        assert sum(exact[j] * exact[k - j] for j in range(k + 1)) == 1


@pytest.mark.parametrize("horizon", [1, 2, 100, 4096, sf.MAX_SQRT_HORIZON])
def test_quantised_factor_is_within_half_a_unit(horizon: int) -> None:
    q = sf.quantized_coefficients(horizon)
    c = sf.sqrt_coefficients(horizon)
    assert q.dtype == np.int64 and q[0] == 1 << P
    assert np.all(np.abs(q - c * 2.0**P) <= 0.5)
    assert np.all(np.diff(q) <= 0) and np.all(q > 0)


def test_output_coefficients_match_the_exact_rational_inverse() -> None:
    horizon = 48
    d = [Fraction(int(v), 1 << P) for v in sf.quantized_coefficients(horizon)]
    g = [d[0]] + [d[k] - d[k - 1] for k in range(1, horizon)]  # (1 − x)·d(x)
    e = [1 / g[0]]
    for n in range(1, horizon):
        e.append(-sum(g[k] * e[n - k] for k in range(1, n + 1)) / g[0])
    assert np.allclose(sf.output_coefficients(horizon), [float(x) for x in e], rtol=0, atol=1e-15)


@pytest.mark.parametrize("horizon", [3, 1024, sf.MAX_SQRT_HORIZON])
def test_output_coefficients_undo_the_factor(horizon: int) -> None:
    """B̃·Ĉ/2^P = A: the running total is unbiased (to ~1e-12 relative)."""
    b = sf.output_coefficients(horizon)
    d = sf.quantized_coefficients(horizon).astype(np.float64) / 2.0**P
    size = 1 << (2 * horizon).bit_length()
    product = np.fft.irfft(np.fft.rfft(b, size) * np.fft.rfft(d, size), size)[:horizon]
    assert np.max(np.abs(product - 1.0)) < 1e-11
    assert np.max(np.abs(b - sf.sqrt_coefficients(horizon))) < 1e-6  # ≈ C itself


@pytest.mark.parametrize("horizon", [1, 2, 7, 33, 200])
def test_gram_factors_against_the_matrix(horizon: int) -> None:
    dm = toeplitz(sf.quantized_coefficients(horizon)).astype(object)  # exact integers
    gram = dm.T.dot(dm)
    assert sf.gram_factor(horizon, every_window=False) == float(max(gram.diagonal()))
    assert sf.gram_factor(horizon, every_window=True) == float(max(gram.sum(axis=1)))


def test_floating_point_row_sums_bound_the_exact_ones_from_above() -> None:
    horizon = 10_000  # beyond the exact int64 path
    q = sf.quantized_coefficients(horizon)
    s = np.cumsum(q)
    exact = int(np.correlate(s, q, mode="full")[horizon - 1 :].max())  # products < 2^48
    bound = sf.gram_factor(horizon, every_window=True)
    assert exact <= bound <= exact * (1 + 2e-9)


@pytest.mark.parametrize("horizon", [2, 6, 10])
def test_every_set_of_windows_costs_at_most_its_size_times_the_factor(horizon: int) -> None:
    dm = toeplitz(sf.quantized_coefficients(horizon)).astype(np.float64)
    lam = sf.gram_factor(horizon, every_window=True)
    single = sf.gram_factor(horizon, every_window=False)
    for size in range(1, horizon + 1):
        for subset in itertools.combinations(range(horizon), size):
            u = np.zeros(horizon)
            u[list(subset)] = 1
            norm2 = float(np.sum((dm @ u) ** 2))
            assert norm2 <= size * lam * (1 + 1e-12)
            if size == 1:
                assert norm2 <= single * (1 + 1e-12)


def test_vector_contributions_over_keys_obey_the_same_bound() -> None:
    """A user spreading each window's ≤ Δ₂ (in L2 over keys) over several keys moves the
    encoded vectors by at most Δ₂²·|W|·λ in squared norm (Cauchy–Schwarz, G ≥ 0)."""
    horizon, keys = 24, 5
    dm = toeplitz(sf.quantized_coefficients(horizon)).astype(np.float64)
    lam = sf.gram_factor(horizon, every_window=True)
    rng = np.random.default_rng(7)
    for _ in range(300):
        size = int(rng.integers(1, horizon + 1))
        windows = rng.choice(horizon, size=size, replace=False)
        u = np.zeros((horizon, keys))
        u[windows] = rng.normal(size=(size, keys))
        u[windows] /= np.linalg.norm(u[windows], axis=1, keepdims=True)
        assert float(np.sum((dm @ u) ** 2)) <= size * lam * (1 + 1e-12)


def test_horizon_limits() -> None:
    with pytest.raises(ValueError, match="supports 1 to"):
        sf.sqrt_coefficients(sf.MAX_SQRT_HORIZON + 1)
    with pytest.raises(ValueError, match="supports 1 to"):
        sf.gram_factor(0, every_window=True)
