"""Private quantiles (stream_dp.privacy.exponential.quantiles): the score and the
calibration against OpenDP's ``make_quantile_score_candidates`` /
``make_private_quantile`` (the reference), the draws against the exponential mechanism's
exact law and OpenDP's own draws, the plan's rank error at its confidence, monotone
releases, and an empirical privacy test that detects a doubled ε.

Every statistical test states its false-failure probability; each is at most 1e-7
(thresholds from exact binomial tails or the χ² distribution), so the file fails by chance
with probability below 1e-6.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import opendp.prelude as opendp_prelude
import pytest
from scipy.stats import binomtest, chi2, chi2_contingency

from stream_dp.errors import ConfigError
from stream_dp.privacy.exponential.quantiles import (
    QuantilePlan,
    alpha_fraction,
    quantile_scores,
    release_quantile_rows,
    release_quantiles,
)

P_FALSE = 1e-7
#: OpenDP, the reference (untyped: its measurements are built at run time).
dp: Any = opendp_prelude
dp.enable_features("contrib")
#: A fixed, uneven histogram of 200 values in 32 bins (seeded: the test data, not a draw).
_SHAPE = np.linspace(1.0, 3.0, 32) ** 3
HISTOGRAM = np.random.default_rng(40).multinomial(200, _SHAPE / _SHAPE.sum())


def plan(**kw: Any) -> QuantilePlan:
    base: dict[str, Any] = {
        "lower": 0.0,
        "upper": 32.0,
        "bins": 32,
        "quantiles": (0.5, 0.9, 0.99),
        "epsilon": 1.0,
        "max_partitions_contributed": 1,
        "max_contributions_per_partition": 1,
    }
    base.update(kw)
    return QuantilePlan(**base)


def centres(counts: np.ndarray, p: QuantilePlan) -> list[float]:
    """The histogram as values at its bin centres (OpenDP's input)."""
    width = (p.upper - p.lower) / p.bins
    return [p.lower + (j + 0.5) * width for j, c in enumerate(counts.tolist()) for _ in range(c)]


def law(counts: np.ndarray, p: QuantilePlan, alpha: float) -> np.ndarray:
    """Exact probabilities of the B + 1 edges: ∝ exp(−score/b_α)."""
    scores = quantile_scores(counts[None, :], alpha)[0].astype(float)
    w = np.exp(-(scores - scores.min()) / p.scale(alpha))
    probabilities: np.ndarray = w / w.sum()
    return probabilities


# ---------------------------------------------------------------- calibration


@pytest.mark.parametrize("alpha", [0.5, 0.9, 0.99, 0.25, 0.1, 0.333])
def test_scores_are_opendps_quantile_scores(alpha: float) -> None:
    p = plan()
    reference = dp.t.make_quantile_score_candidates(
        dp.vector_domain(dp.atom_domain(T=float, nan=False)),
        dp.symmetric_distance(),
        list(p.edges()),
        alpha,
    )
    assert quantile_scores(HISTOGRAM[None, :], alpha)[0].tolist() == reference(
        centres(HISTOGRAM, p)
    )
    assert reference.map(3) == plan(max_contributions_per_partition=3).score_sensitivity(alpha)


def test_alpha_is_scored_as_opendp_does() -> None:
    assert alpha_fraction(0.5) == (1, 2)
    assert alpha_fraction(0.25) == (1, 4)
    assert alpha_fraction(0.9) == (9000, 10_000)
    assert alpha_fraction(0.99) == (9900, 10_000)
    with pytest.raises(ConfigError, match="quantile"):
        alpha_fraction(1.5)


@pytest.mark.parametrize(
    ("epsilon", "l0", "linf", "quantiles"),
    [(1.0, 1, 1, (0.5,)), (1.0, 2, 3, (0.5, 0.9, 0.99)), (0.3, 4, 1, (0.1, 0.25))],
)
def test_each_quantile_spends_epsilon_over_l0_q_by_opendps_privacy_map(
    epsilon: float, l0: int, linf: int, quantiles: tuple[float, ...]
) -> None:
    """Closed form b_α = 2·Linf·max(num, den − num)·L0·Q/ε (score units); OpenDP's
    ``make_private_quantile`` with the same scale (in ranks) charges exactly ε/(L0·Q)."""
    p = plan(epsilon=epsilon, max_partitions_contributed=l0, max_contributions_per_partition=linf,
             quantiles=quantiles)  # fmt: skip
    for alpha in quantiles:
        num, den = alpha_fraction(alpha)
        assert p.scale(alpha) == pytest.approx(
            2 * linf * max(num, den - num) * l0 * len(quantiles) / epsilon, rel=1e-15
        )
        reference = dp.m.make_private_quantile(
            dp.vector_domain(dp.atom_domain(T=float, nan=False)),
            dp.symmetric_distance(),
            dp.max_divergence(),
            list(p.edges()),
            alpha,
            p.rank_scale(alpha),
        )
        assert reference.map(linf) == pytest.approx(epsilon / (l0 * len(quantiles)), rel=1e-9)


def test_bad_settings_are_refused_with_the_field() -> None:
    with pytest.raises(ConfigError, match="increasing"):
        plan(quantiles=(0.9, 0.5))
    with pytest.raises(ConfigError, match="lower < upper"):
        plan(lower=1.0, upper=1.0)
    with pytest.raises(ConfigError, match="bins"):
        plan(bins=0)
    with pytest.raises(ConfigError, match="epsilon"):
        plan(epsilon=-1.0)


# ---------------------------------------------------------------- the law


def test_draws_follow_the_exponential_mechanism_law() -> None:
    """60,000 groups with the same histogram, one α: Pearson χ² of the edge counts against
    the exact law (cells with expectation < 5 pooled), false failure ≤ 1e-7."""
    p = plan(quantiles=(0.5,), epsilon=0.5)
    rows = 60_000
    picked = release_quantile_rows(np.tile(HISTOGRAM, (rows, 1)), p)[:, 0]
    expected = law(HISTOGRAM, p, 0.5) * rows
    observed = np.bincount(picked, minlength=p.bins + 1)
    big = expected >= 5
    exp_cells = np.append(expected[big], expected[~big].sum())
    obs_cells = np.append(observed[big], observed[~big].sum())
    keep = exp_cells > 0
    stat = float(((obs_cells[keep] - exp_cells[keep]) ** 2 / exp_cells[keep]).sum())
    assert chi2.sf(stat, int(keep.sum()) - 1) > P_FALSE


def test_rank_errors_match_opendps_private_quantile_of_the_same_scale() -> None:
    """The reference's utility: OpenDP's ``make_private_quantile`` under zCDP draws with
    Gumbel noise, the same exponential-mechanism law at the same scale. 2,000 draws each on
    the same data; χ² homogeneity of the rank errors (grouped 0, 1–2, 3–5, 6–10, > 10),
    false failure ≤ 1e-7."""
    p = plan(quantiles=(0.9,), epsilon=0.5)
    reference = dp.m.make_private_quantile(
        dp.vector_domain(dp.atom_domain(T=float, nan=False)),
        dp.symmetric_distance(),
        dp.zero_concentrated_divergence(),
        list(p.edges()),
        0.9,
        p.rank_scale(0.9),
    )
    draws, data = 2_000, centres(HISTOGRAM, p)
    below = np.concatenate([[0], np.cumsum(HISTOGRAM)])
    target = 0.9 * HISTOGRAM.sum()
    edges = list(p.edges())
    theirs = [abs(below[edges.index(reference(data))] - target) for _ in range(draws)]
    ours = np.abs(below[release_quantile_rows(np.tile(HISTOGRAM, (draws, 1)), p)[:, 0]] - target)
    cuts = [0.5, 2.5, 5.5, 10.5]
    table = np.array([np.bincount(np.searchsorted(cuts, e), minlength=5) for e in (ours, theirs)])
    table = table[:, table.sum(axis=0) > 0]
    assert chi2_contingency(table).pvalue > P_FALSE


# ---------------------------------------------------------------- plan figures


def test_the_rank_error_bound_holds_at_its_confidence() -> None:
    """20,000 groups, Q = 3: the share of groups where some released quantile is further
    than max_α OPT_α + rank_error(β) from its target rank is ≤ β = 0.05 (one-sided exact
    binomial test, false failure ≤ 1e-7). And the bound is at most 4 times too large here:
    a quarter of it is exceeded in more than β of the groups (≈ 12% observed, > 40 standard
    deviations above 5%; this check's false failure ≪ 1e-12)."""
    p = plan(epsilon=1.0)
    beta, rows = 0.05, 20_000
    bound = p.rank_error(beta)
    assert bound == pytest.approx(
        max(p.scale(a) / alpha_fraction(a)[1] for a in p.quantiles) * math.log(32 * 3 / beta)
    )
    assert bound < 200 / 3
    below = np.concatenate([[0], np.cumsum(HISTOGRAM)])
    n = int(HISTOGRAM.sum())
    targets = np.array([n * alpha_fraction(a)[0] / alpha_fraction(a)[1] for a in p.quantiles])
    best = max(float(np.abs(below - t).min()) for t in targets)
    released = release_quantile_rows(np.tile(HISTOGRAM, (rows, 1)), p)
    errors = np.abs(below[released] - targets[None, :]).max(axis=1)
    failures = int((errors > best + bound).sum())
    assert binomtest(failures, rows, beta, alternative="greater").pvalue > P_FALSE
    beyond_a_quarter = int((errors > best + bound / 4).sum())
    assert binomtest(beyond_a_quarter, rows, beta, alternative="greater").pvalue < P_FALSE


def test_releases_are_monotone_and_name_the_quantile_they_estimate() -> None:
    """Two close α's with much noise: unsorted draws would cross in about half of the
    groups; every released row is non-decreasing and paired with its α in order."""
    p = plan(quantiles=(0.5, 0.51), epsilon=0.05)
    rows = release_quantile_rows(np.tile(HISTOGRAM, (5_000, 1)), p)
    assert (np.diff(rows, axis=1) >= 0).all()
    assert (rows[:, 0] < rows[:, 1]).any()
    values = release_quantiles(HISTOGRAM.tolist(), p)
    assert [v.quantile for v in values] == [0.5, 0.51]
    assert values[0].value <= values[1].value
    assert all(v.value == p.edges()[v.edge_index] for v in values)


# ---------------------------------------------------------------- empirical privacy


def _draws_in_event(p: QuantilePlan, draws: int) -> tuple[int, int]:
    """Neighbours for the median over B = 10 bins: D has 5 values in bin 0, 1 in bin 8 and
    4 in bin 9 (edges 1–8 tie for the best score, 0; edge 9 scores 2); D' adds one user's
    value in bin 9, which raises the 8 best edges' scores to 1 and lowers edge 9's to 1.
    S = {edge 9}. Returns (draws of D' in S, draws of D in S)."""
    d = np.zeros(10, dtype=np.int64)
    d[0], d[8], d[9] = 5, 1, 4
    d_prime = d.copy()
    d_prime[9] += 1
    return tuple(  # type: ignore[return-value]
        int((release_quantile_rows(np.tile(h, (draws, 1)), p)[:, 0] == 9).sum())
        for h in (d_prime, d)
    )


def test_empirical_privacy_holds_for_quantiles_and_detects_a_doubled_epsilon() -> None:
    """ε-DP bounds P_D'(S) ≤ e^ε·P_D(S): the share of draws in S that come from D' is
    Binomial(n, π) with π ≤ e/(1 + e) = 0.731 (ε = 1); a one-sided exact binomial test at
    1e-7 is the detector. Exact ratios: the planned mechanism (b = 2 score units) has
    P_D'(S)/P_D(S) = 2.53 (share 0.717); drawn with half the scale (ε doubled) 6.68
    (share 0.870), over ≈ 5,000 draws in S a deviation of ≈ 20 standard deviations from
    0.731 (miss probability ≪ 1e-12)."""
    draws = 40_000
    pi0 = math.e / (1 + math.e)
    correct = plan(lower=0.0, upper=10.0, bins=10, quantiles=(0.5,), epsilon=1.0)
    x, y = _draws_in_event(correct, draws)
    assert binomtest(x, x + y, pi0, alternative="greater").pvalue > P_FALSE
    doubled = plan(lower=0.0, upper=10.0, bins=10, quantiles=(0.5,), epsilon=2.0)
    x, y = _draws_in_event(doubled, draws)
    assert binomtest(x, x + y, pi0, alternative="greater").pvalue < P_FALSE


def test_values_are_counted_in_their_bin_and_outside_values_in_the_end_bins() -> None:
    p = plan(lower=-1.0, upper=3.0, bins=4)  # bins [-1, 0), [0, 1), [1, 2), [2, 3)
    cases = {-1.0: 0, -0.01: 0, 0.0: 1, 1.5: 2, 2.999: 3, 3.0: 3, -50.0: 0, 1e308: 3}
    assert {v: p.bin_index(v) for v in cases} == cases
    assert p.bin_index(math.inf) == 3 and p.bin_index(-math.inf) == 0
    with pytest.raises(ValueError, match="NaN"):
        p.bin_index(math.nan)
