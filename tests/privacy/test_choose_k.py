"""Choosing k from a DP histogram of events per user (docs/privacy.md#budget).

Statistical tests state their false-failure probability (each ≤ 1e-7)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chisquare

from stream_dp.errors import ConfigError
from stream_dp.privacy.choose_k import suggest_k
from stream_dp.privacy.mechanisms import DiscreteLaplace

P_THRESHOLD = 1e-7


def _exact_k(hist: dict[int, int], quantile: float, max_k: int) -> int:
    bins = np.zeros(max_k, dtype=np.int64)
    for events, users in hist.items():
        bins[min(events, max_k) - 1] += users
    cumulative = np.cumsum(bins)
    return int(np.argmax(cumulative >= quantile * cumulative[-1]) + 1)


# a browser-log-like histogram: 9 000 users, most with few events, a long tail
HIST = {e: int(900 * 0.88 ** (e - 1)) for e in range(1, 120)}
HIST[500] = 3  # heavy users beyond max_k


def test_negligible_noise_gives_the_exact_quantile_and_clips_into_the_last_bin() -> None:
    for quantile in (0.5, 0.9, 0.95, 0.99):
        out = suggest_k(HIST, epsilon=1e6, quantile=quantile, max_k=200)
        assert out.k == _exact_k(HIST, quantile, 200)
    out = suggest_k(HIST, epsilon=1e6, max_k=50)
    assert len(out.noisy_histogram) == 50
    assert out.noisy_histogram[-1] == sum(u for e, u in HIST.items() if e >= 50)
    assert out.epsilon_spent == 1e6


def test_a_realistic_budget_lands_within_two_of_the_exact_quantile() -> None:
    # Noise: discrete Laplace of scale 1 in each of 1000 bins. The total's noise has standard
    # deviation √2000 ≈ 45, so the 90% target moves by ≈ 40 users; bins near the quantile hold
    # > 70 users each, so k moves by at most 1 unless the noise exceeds 6 standard deviations
    # (false failure < 1e-8).
    exact = _exact_k(HIST, 0.9, 1000)
    out = suggest_k(HIST, epsilon=1.0, quantile=0.9, max_k=1000)
    assert abs(out.k - exact) <= 2, (out.k, exact)


def test_the_histogram_noise_is_discrete_laplace_with_scale_one_over_epsilon() -> None:
    # chi-square goodness of fit on 60 000 empty bins: false failure ≤ 1e-7
    epsilon = 0.5
    out = suggest_k({}, epsilon=epsilon, max_k=60_000)
    noise = np.asarray(out.noisy_histogram)
    mech = DiscreteLaplace(1 / epsilon)
    lo, hi = -14, 14
    values = np.arange(lo, hi + 1)
    probs = np.array([mech.pmf(int(z)) for z in values])
    observed = np.concatenate(
        [
            [np.sum(noise < lo)],
            np.bincount(noise[(noise >= lo) & (noise <= hi)] - lo, minlength=len(values)),
            [np.sum(noise > hi)],
        ]
    )
    tail = (1 - probs.sum()) / 2
    expected = np.concatenate([[tail], probs, [tail]]) * len(noise)
    assert expected.min() >= 5
    assert chisquare(observed, expected).pvalue > P_THRESHOLD
    assert out.k == 60_000 or out.k >= 1  # with no users k is meaningless but defined


@pytest.mark.parametrize(
    "kwargs",
    [
        {"epsilon": 0.0},
        {"epsilon": -1.0},
        {"epsilon": 1.0, "quantile": 0.0},
        {"epsilon": 1.0, "quantile": 1.5},
        {"epsilon": 1.0, "max_k": 0},
    ],
)
def test_invalid_parameters_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        suggest_k(HIST, **kwargs)  # type: ignore[arg-type]


def test_invalid_histograms_are_refused() -> None:
    with pytest.raises(ConfigError):
        suggest_k({0: 3}, epsilon=1.0)
    with pytest.raises(ConfigError):
        suggest_k({2: -1}, epsilon=1.0)
