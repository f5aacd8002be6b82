"""Partition selection: the reference values of docs/privacy.md#reference-values, then each
strategy against an independent implementation over a grid of (ε, δ, L0, Linf):

- count_threshold   ↔ OpenDP make_laplace_threshold's privacy map (and scipy's dlaplace for
                      the δ-exact applied threshold);
- laplace_threshold ↔ PyDP (Google) LaplacePartitionSelection;
- gaussian_threshold↔ PyDP GaussianPartitionSelection and pipeline_dp's Balle–Wang δ;
- truncated_geometric ↔ PyDP NearTruncatedGeometric via pipeline_dp.

Statistical tests state their false-failure probability (each ≤ 1e-7).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import opendp.prelude as dp
import pipeline_dp
import pydp.algorithms.partition_selection as pydp_ps
import pytest
from pipeline_dp import dp_computations
from pipeline_dp.partition_selection import create_partition_selection_strategy
from scipy.stats import binomtest, dlaplace

from stream_dp.privacy.calibration import discrete_gaussian_delta
from stream_dp.privacy.partition_selection import (
    CountThreshold,
    GaussianThreshold,
    LaplaceThreshold,
    TruncatedGeometric,
    adjusted_delta,
)

dp.enable_features("contrib")

P_THRESHOLD = 1e-7

# (ε, δ, L0, Linf): 5 ε × 3 δ × 3 L0 × 2 Linf = 90 combinations; subsets below keep ≥ 20.
EPSILONS = [0.1, 0.25, 0.5, 1.0, 3.0]
DELTAS = [1e-5, 1e-6, 1e-9]
L0S = [1, 3, 8]
LINFS = [1, 10]
GRID = list(itertools.product(EPSILONS, DELTAS, L0S, LINFS))
USER_GRID = list(itertools.product(EPSILONS, DELTAS, L0S))  # 45 (no Linf for user counts)


def _dlaplace_tail(scale: float, t: int) -> float:
    """P(Z ≥ t), t ≥ 1, by direct summation of scipy's dlaplace pmf."""
    return float(np.sum(dlaplace(1.0 / scale).pmf(np.arange(t, t + int(80 * scale) + 80))))


def _dgauss_tail(sigma: float, t: int) -> float:
    r = int(60 * sigma) + 60
    z = np.arange(-r, r + 1, dtype=np.float64)
    w = np.exp(-(z * z) / (2 * sigma * sigma))
    return float(w[z >= t].sum() / w.sum())


# ------------------------------------ reference values (docs/privacy.md#reference-values)


def test_reference_count_threshold() -> None:
    sel = CountThreshold(
        epsilon=1.0,
        delta=1e-6,
        max_partitions_contributed=3,
        max_contributions_per_partition=10,
        l1_sensitivity=30,
    )
    assert sel.mechanism.scale == 30
    assert sel.reference_threshold == 437  # OpenDP make_laplace_threshold
    assert sel.threshold == 438  # δ-exact (docs/privacy.md#reference-values), mass at T included


def test_reference_laplace_threshold() -> None:
    sel = LaplaceThreshold(epsilon=0.5, delta=1e-6, max_partitions_contributed=3)
    assert round(sel.reference_threshold, 2) == 86.33
    assert sel.mechanism.scale == 6.0


def test_reference_gaussian_threshold() -> None:
    sel = GaussianThreshold(epsilon=0.5, delta=1e-6, max_partitions_contributed=3)
    assert sel.reference_threshold == pytest.approx(74.8, abs=0.05)


def test_reference_truncated_geometric() -> None:
    sel = TruncatedGeometric(epsilon=0.5, delta=1e-6, max_partitions_contributed=3)
    assert sel.keep_probability(75) < 0.5 <= sel.keep_probability(76)
    assert sel.users_for_half_keep == 76
    assert sel.keep_probability(150) < 1.0 == sel.keep_probability(151)
    assert sel.users_for_certain_keep == 151


# ------------------------------------------------------------- count_threshold


def _opendp_delta(scale: float, threshold: int, l0: int, linf: int) -> tuple[float, float]:
    meas = dp.m.make_laplace_threshold(
        dp.map_domain(dp.atom_domain(T=str), dp.atom_domain(T="i64")),
        dp.l01inf_distance(dp.absolute_distance(T="i64")),
        scale=scale,
        threshold=threshold,
    )
    eps, delta = meas.map((l0, l0 * linf, linf))
    return float(eps), float(delta)


@pytest.mark.parametrize(("epsilon", "delta", "l0", "linf"), GRID[::3])  # 30 combinations
def test_count_threshold_matches_opendp_and_keeps_delta_exactly(
    epsilon: float, delta: float, l0: int, linf: int
) -> None:
    sel = CountThreshold(
        epsilon=epsilon,
        delta=delta,
        max_partitions_contributed=l0,
        max_contributions_per_partition=linf,
        l1_sensitivity=l0 * linf,
    )
    s = sel.mechanism.scale
    assert s == l0 * linf / epsilon
    ref = sel.reference_threshold
    assert ref is not None
    # reference: the smallest T whose OpenDP privacy map reports δ' ≤ δ, with ε as planned
    eps_at, delta_at = _opendp_delta(s, ref, l0, linf)
    assert eps_at == pytest.approx(epsilon, rel=1e-12)
    assert delta_at <= delta
    assert _opendp_delta(s, ref - 1, l0, linf)[1] > delta
    # applied: exact discrete tail including the mass at T (independent: scipy's pmf)
    t = sel.threshold

    def total_delta(threshold: int) -> float:
        one = _dlaplace_tail(s, threshold - linf)
        return 1 - (1 - one) ** l0

    assert total_delta(t) <= delta * (1 + 1e-9)
    assert total_delta(t - 1) > delta
    assert ref <= t <= ref + 1


@pytest.mark.parametrize(("epsilon", "delta", "l0", "linf"), GRID[1::9])  # 10 combinations
def test_gaussian_count_threshold_keeps_delta_exactly(
    epsilon: float, delta: float, l0: int, linf: int
) -> None:
    sel = CountThreshold(
        epsilon=epsilon,
        delta=delta,
        max_partitions_contributed=l0,
        max_contributions_per_partition=linf,
        l1_sensitivity=l0 * linf,
        mechanism="discrete_gaussian",
    )
    sigma, t = sel.mechanism.scale, sel.threshold
    half = delta / 2
    # the noise covers a user's largest change: linf on each of l0 keys, L2 = √l0·linf
    # (pipeline_dp's independent analytic-Gaussian δ at that sensitivity)
    worst_delta = dp_computations.gaussian_delta(sigma / (math.sqrt(l0) * linf), epsilon)
    assert worst_delta <= half * (1 + 1e-6)

    def total_delta(threshold: int) -> float:
        return 1 - (1 - _dgauss_tail(sigma, threshold - linf)) ** l0

    assert total_delta(t) <= half * (1 + 1e-9)
    assert total_delta(t - 1) > half


def test_count_threshold_release_keeps_only_counts_at_or_above_threshold() -> None:
    sel = CountThreshold(
        epsilon=1.0,
        delta=1e-6,
        max_partitions_contributed=3,
        max_contributions_per_partition=10,
        l1_sensitivity=30,
    )
    out = sel.release([438] * 2000 + [10_000] * 100)
    kept = [v for v in out if v is not None]
    assert all(v >= 438 for v in kept)
    assert all(v is not None for v in out[2000:])  # 10 000 is 318 scales above T


# ------------------------------------------------------------ laplace_threshold


@pytest.mark.parametrize(("epsilon", "delta", "l0"), USER_GRID)
def test_laplace_threshold_matches_pydp_and_keeps_delta_exactly(
    epsilon: float, delta: float, l0: int
) -> None:
    sel = LaplaceThreshold(epsilon=epsilon, delta=delta, max_partitions_contributed=l0)
    ref = pydp_ps.create_laplace_partition_strategy(epsilon, delta, l0)
    assert sel.reference_threshold == pytest.approx(ref.threshold, rel=1e-12)
    assert sel.mechanism.scale == pytest.approx(l0 / epsilon, rel=1e-15)
    d1 = adjusted_delta(delta, l0)
    assert d1 == pytest.approx(1 - (1 - delta) ** (1 / l0), rel=1e-6)
    b, t = sel.mechanism.scale, sel.threshold
    # a key whose only user is the one added survives with P(1 + Z ≥ T) ≤ δ'
    assert _dlaplace_tail(b, t - 1) <= d1 * (1 + 1e-9)
    assert t - 2 < 1 or _dlaplace_tail(b, t - 2) > d1
    assert sel.keep_probability(1) == pytest.approx(_dlaplace_tail(b, t - 1), rel=1e-9)


@pytest.mark.parametrize(("epsilon", "delta", "l0"), [(1.0, 0.5, 3), (1.0, 0.7, 3), (0.5, 0.95, 4)])
def test_laplace_reference_threshold_is_pydps_for_a_delta_of_one_half_and_above(
    epsilon: float, delta: float, l0: int
) -> None:
    """The reference value stated beside the applied threshold is PyDP's on both sides of
    its δ = 1/2 branch (the configuration accepts δ ≤ 1e-3 only; the plan can still be
    computed for any δ in (0, 1))."""
    sel = LaplaceThreshold(epsilon=epsilon, delta=delta, max_partitions_contributed=l0)
    ref = pydp_ps.create_laplace_partition_strategy(epsilon, delta, l0)
    assert sel.reference_threshold == pytest.approx(ref.threshold, rel=1e-12)


# ----------------------------------------------------------- gaussian_threshold


@pytest.mark.parametrize(("epsilon", "delta", "l0"), USER_GRID)
def test_gaussian_threshold_matches_pydp_and_keeps_delta_exactly(
    epsilon: float, delta: float, l0: int
) -> None:
    sel = GaussianThreshold(epsilon=epsilon, delta=delta, max_partitions_contributed=l0)
    ref = pydp_ps.create_gaussian_partition_strategy(epsilon, delta, l0)
    # Google bisects σ to 1e-3 relative and returns the upper end: T_ref − 1 scales with σ
    ours, theirs = sel.reference_threshold - 1, ref.threshold - 1
    assert ours <= theirs * (1 + 1e-12)
    assert theirs <= ours * (1 + 1.001e-3)
    # σ_ref is exactly the analytic Gaussian (pipeline_dp's independent Balle–Wang δ)
    l2 = math.sqrt(l0)
    balle_wang = dp_computations.gaussian_delta(sel.reference_sigma / l2, epsilon)
    assert balle_wang == pytest.approx(sel.noise_delta, rel=1e-6)
    # applied σ: the smallest σ ≥ σ_ref at which the discrete Gaussian's exact (ε, δ/2)
    # curve fits (small σ can need slightly more noise than the continuous Gaussian)
    sigma = sel.mechanism.sigma
    assert sel.reference_sigma <= sigma <= sel.reference_sigma * 1.05
    assert discrete_gaussian_delta(sigma, epsilon, l0) <= sel.noise_delta
    if sigma > sel.reference_sigma:
        assert discrete_gaussian_delta(sigma * (1 - 2e-6), epsilon, l0) > sel.noise_delta
    # applied threshold: exact discrete tail
    d1 = adjusted_delta(sel.threshold_delta, l0)
    t = sel.threshold
    assert _dgauss_tail(sigma, t - 1) <= d1 * (1 + 1e-9)
    assert _dgauss_tail(sigma, t - 2) > d1


def test_discrete_gaussian_delta_agrees_with_the_continuous_curve_for_large_sigma() -> None:
    # for σ ≫ 1 the discrete and continuous Gaussians coincide to many digits
    for l0, sigma, eps in [(1, 40.0, 0.1), (3, 60.0, 0.05), (4, 30.0, 0.2)]:
        exact = discrete_gaussian_delta(sigma, eps, l0)
        continuous = dp_computations.gaussian_delta(sigma / math.sqrt(l0), eps)
        assert exact == pytest.approx(continuous, rel=2e-3)


# ---------------------------------------------------------- truncated_geometric


@pytest.mark.parametrize(("epsilon", "delta", "l0"), USER_GRID)
def test_truncated_geometric_matches_pydp_and_pipeline_dp(
    epsilon: float, delta: float, l0: int
) -> None:
    sel = TruncatedGeometric(epsilon=epsilon, delta=delta, max_partitions_contributed=l0)
    ref = create_partition_selection_strategy(
        pipeline_dp.PartitionSelectionStrategy.TRUNCATED_GEOMETRIC, epsilon, delta, l0
    )
    last = sel.users_for_certain_keep
    assert last is not None
    for n in range(0, last + 3):
        assert sel.keep_probability(n) == pytest.approx(
            ref.probability_of_keep(n), rel=1e-9, abs=1e-15
        ), n
    half = sel.users_for_half_keep
    assert ref.probability_of_keep(half) >= 0.5 > ref.probability_of_keep(half - 1)
    assert ref.probability_of_keep(last) == 1.0 > ref.probability_of_keep(last - 1)


@pytest.mark.parametrize(("epsilon", "delta", "l0"), USER_GRID[::2])
def test_truncated_geometric_satisfies_the_dp_constraints(
    epsilon: float, delta: float, l0: int
) -> None:
    """p(n) ≤ e^ε' p(n−1) + δ' and 1 − p(n−1) ≤ e^ε' (1 − p(n)) + δ' (Desfontaines et al.)."""
    sel = TruncatedGeometric(epsilon=epsilon, delta=delta, max_partitions_contributed=l0)
    e, d = math.exp(epsilon / l0), adjusted_delta(delta, l0)
    last = sel.users_for_certain_keep or 0
    for n in range(1, last + 2):
        p, prev = sel.keep_probability(n), sel.keep_probability(n - 1)
        assert p <= e * prev + d + 1e-12
        assert 1 - prev <= e * (1 - p) + d + 1e-12


# ------------------------------------------------------- keep frequencies


@pytest.mark.parametrize("n_users", [1, 40, 70, 76, 100, 151])
def test_truncated_geometric_keep_frequency_matches_p(n_users: int) -> None:
    # exact binomial test per n: false failure ≤ 1e-7 each
    sel = TruncatedGeometric(epsilon=0.5, delta=1e-6, max_partitions_contributed=3)
    trials = 100_000
    kept = sum(sel.select([n_users] * trials))
    p = sel.keep_probability(n_users)
    if p == 1.0:
        assert kept == trials
    else:
        assert binomtest(kept, trials, p).pvalue > P_THRESHOLD, (kept, p)


@pytest.mark.parametrize("strategy", [LaplaceThreshold, GaussianThreshold])
def test_noise_threshold_keep_frequency_matches_keep_probability(
    strategy: type[LaplaceThreshold] | type[GaussianThreshold],
) -> None:
    # exact binomial test: false failure ≤ 1e-7
    sel = strategy(epsilon=0.5, delta=1e-6, max_partitions_contributed=3)
    n_users = sel.threshold - 5
    trials = 60_000
    kept = sum(sel.select([n_users] * trials))
    assert binomtest(kept, trials, sel.keep_probability(n_users)).pvalue > P_THRESHOLD


def test_invalid_parameters_are_refused() -> None:
    with pytest.raises(ValueError):
        TruncatedGeometric(epsilon=0.0, delta=1e-6, max_partitions_contributed=3)
    with pytest.raises(ValueError):
        LaplaceThreshold(epsilon=1.0, delta=0.0, max_partitions_contributed=3)
    with pytest.raises(ValueError):
        GaussianThreshold(epsilon=1.0, delta=1e-6, max_partitions_contributed=0)


def test_describe_reports_threshold_reference_and_milestones() -> None:
    tg = TruncatedGeometric(epsilon=0.5, delta=1e-6, max_partitions_contributed=3).describe()
    assert (tg["users_for_half_keep"], tg["users_for_certain_keep"]) == (76, 151)
    assert tg["threshold"] is None
    lt = LaplaceThreshold(epsilon=0.5, delta=1e-6, max_partitions_contributed=3).describe()
    assert lt["threshold"] == 87 and round(lt["reference_threshold"], 2) == 86.33
    ct = CountThreshold(
        epsilon=1.0,
        delta=1e-6,
        max_partitions_contributed=3,
        max_contributions_per_partition=10,
        l1_sensitivity=30,
    ).describe()
    assert (ct["threshold"], ct["reference_threshold"]) == (438, 437)
    for d in (tg, lt, ct):
        assert {"strategy", "epsilon", "delta", "threshold", "reference_threshold"} <= set(d)


def test_a_gaussian_sigma_raised_to_meet_the_exact_delta_is_labelled_exact_discrete() -> None:
    """At ε = 0.5, δ = 1e-5, L0 = 1 the reference σ misses the exact discrete δ(ε), so σ is
    raised by bisection to one that meets it; the plan must say the exact curve was used
    (plan.schema.json's "exact_discrete"), not the looser zCDP conversion."""
    from stream_dp.privacy.calibration import discrete_gaussian_delta

    selection = GaussianThreshold(epsilon=0.5, delta=1e-5, max_partitions_contributed=1)
    sigma = selection.mechanism.sigma
    assert sigma > selection.reference_sigma  # the bisection ran
    assert discrete_gaussian_delta(sigma, 0.5, 1) <= selection.noise_delta
    assert selection.describe()["sigma_calibration"] == "exact_discrete"


@pytest.mark.parametrize("epsilon", [100.0, 1000.0])
def test_with_almost_no_noise_a_lone_user_still_cannot_release_a_key(epsilon: float) -> None:
    """However large ε (test mode allows astronomically large ones), a key whose only user
    is the one added or removed is kept with probability at most δ': the noise thresholds
    stay one above what that user alone reaches (2 users; Linf + 1 events), and with noise
    this small they are exactly that. The reference count threshold (OpenDP's accounting,
    one integer of tail less) is Linf."""
    laplace = LaplaceThreshold(epsilon=epsilon, delta=1e-6, max_partitions_contributed=1)
    assert laplace.threshold == 2
    assert laplace.keep_probability(1) <= laplace.adjusted_delta
    count = CountThreshold(
        epsilon=epsilon,
        delta=1e-6,
        max_partitions_contributed=1,
        max_contributions_per_partition=5,
        l1_sensitivity=5,
    )
    assert (count.threshold, count.reference_threshold) == (6, 5)
    assert count.keep_probability(5) <= count.adjusted_threshold_delta


@pytest.mark.parametrize(("linf", "l1"), [(0, 30), (10, 0), (-1, 5)])
def test_a_count_threshold_without_a_positive_contribution_bound_is_refused(
    linf: int, l1: int
) -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        CountThreshold(
            epsilon=1.0,
            delta=1e-6,
            max_partitions_contributed=3,
            max_contributions_per_partition=linf,
            l1_sensitivity=l1,
        )


def test_truncated_geometric_draws_each_key_with_the_probability_of_its_own_user_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The vectorised select (p once per distinct count, spread back to the keys) hands
    the CSPRNG draw exactly the per-key p(users) the one-key-at-a-time rule would, key by key
    in the keys' order (a differential check of the two paths on the same input)."""
    from stream_dp.privacy import partition_selection

    strategy = TruncatedGeometric(epsilon=1.0, delta=1e-6, max_partitions_contributed=2)
    users = [7, 0, 1, 30, 7, 2, 1, 400, 30, 13, 0, 7]
    drawn: list[list[float]] = []

    def recording(probabilities: object) -> list[bool]:
        drawn.append(np.asarray(probabilities, dtype=np.float64).tolist())
        return [False] * len(users)

    monkeypatch.setattr(partition_selection, "bernoulli", recording)
    assert strategy.select(np.array(users)) == [False] * len(users)
    assert strategy.select(users) == [False] * len(users)
    one_at_a_time = [strategy.keep_probability(n) for n in users]
    assert drawn == [one_at_a_time, one_at_a_time]
    assert len(set(one_at_a_time)) == 7  # the counts give distinct probabilities
