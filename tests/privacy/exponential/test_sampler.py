"""The exact exponential-mechanism sampler (stream_dp.privacy.exponential.sampler): the
Bernoulli(exp(−g/b)) acceptance on every path (small lanes in 64-bit integers, lanes past
the counter limit in Python integers) and the selection law.

Statistical tests state their false-failure probability; each is at most 1e-7.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binomtest, chi2

from stream_dp.errors import ConfigError
from stream_dp.privacy.exact_laplace import exact_parameters
from stream_dp.privacy.exponential import sampler as em

P_FALSE = 1e-7


@pytest.mark.parametrize(("gap", "scale"), [(0, 3.0), (1, 3.0), (5, 3.0), (7, 2.5), (3, 1 / 3)])
def test_acceptance_is_bernoulli_of_exp_minus_gap_over_scale(gap: int, scale: float) -> None:
    """200,000 lanes per case against exp(−g/b) (whole part, remainder, both); two-sided
    exact binomial test, false failure ≤ 1e-7 per case."""
    t, s = exact_parameters(scale) or (0, 0)
    lanes = 200_000
    accepted = em.bernoulli_exp_of_gap(np.full(lanes, gap, dtype=np.int64), t, s)
    assert binomtest(int(accepted.sum()), lanes, math.exp(-gap / scale)).pvalue > P_FALSE


def test_lanes_past_the_counter_limit_finish_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the limit lowered to 1, every lane with g/b ≥ 1 takes the Python-integer path
    (it runs in practice with probability below e⁻⁵¹²): its law is still exp(−g/b); 100,000
    lanes, two-sided exact binomial test, false failure ≤ 1e-7."""
    monkeypatch.setattr(em, "WHOLE_LIMIT", 1)
    t, s = exact_parameters(0.8) or (0, 0)
    lanes = 100_000
    accepted = em.bernoulli_exp_of_gap(np.full(lanes, 2, dtype=np.int64), t, s)  # γ = 2.5
    assert binomtest(int(accepted.sum()), lanes, math.exp(-2.5)).pvalue > P_FALSE


def test_gaps_whose_product_with_the_denominator_exceeds_64_bits_are_exact() -> None:
    """b = 1/3 has s = 2⁵⁴: g·s overflows 64 bits for g ≥ 2⁹; such lanes have probability
    exp(−3g) < e⁻¹⁵³⁶ and are never accepted, and nothing overflows into an acceptance."""
    t, s = exact_parameters(1 / 3) or (0, 0)
    assert s > 2**50
    gaps = np.array([600, 2**40, 2**60], dtype=np.int64)
    assert not em.bernoulli_exp_of_gap(np.repeat(gaps, 10_000), t, s).any()


def test_the_selection_follows_the_exponential_mechanism_law() -> None:
    """100,000 rows over 6 candidates (one unavailable) against exp(u_i/b)/Σ_j exp(u_j/b);
    Pearson χ² with 4 degrees of freedom, false failure ≤ 1e-7."""
    utilities = np.array([3, -2, 0, 7, 5, 40], dtype=np.int64)
    available = np.array([True, True, True, True, True, False])
    rows, scale = 100_000, 2.5
    picked = em.sample_exponential_mechanism(
        np.tile(utilities, (rows, 1)), scale, available=np.tile(available, (rows, 1))
    )
    counts = np.bincount(picked, minlength=6)
    assert counts[5] == 0
    w = np.exp(utilities[:5] / scale)
    expected = rows * w / w.sum()
    stat = float(((counts[:5] - expected) ** 2 / expected).sum())
    assert chi2.sf(stat, 4) > P_FALSE


def test_rows_without_a_candidate_get_minus_one_and_bad_scales_are_refused() -> None:
    none = np.zeros((2, 3), dtype=bool)
    picked = em.sample_exponential_mechanism(np.zeros((2, 3), np.int64), 1.0, available=none)
    assert picked.tolist() == [-1, -1]
    with pytest.raises(ConfigError, match="scale"):
        em.sample_exponential_mechanism(np.zeros((1, 3), np.int64), 2.0**60)
    with pytest.raises(ConfigError, match="scale"):
        em.sample_exponential_mechanism(np.zeros((1, 3), np.int64), 0.0)
