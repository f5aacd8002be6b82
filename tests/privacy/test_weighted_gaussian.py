"""``selection: weighted_gaussian`` (DP set union, Gopi et al. 2020) in fixed point.

What its privacy argument rests on, each checked here:

- a user's weight vector has ℓ2 norm ≤ Q whatever keys it touches, and adding or removing a
  user changes no other user's weights (the seal's weight sums, on neighbouring inputs);
- the noise is ρ-zCDP at ℓ2 sensitivity Q with ρ small enough for (ε, δ/2) — checked with
  OpenDP's own privacy map and conversion, not ours;
- the threshold: a user alone on t ≤ L0 keys gets any of them released with probability
  ≤ δ/2, from an independent discrete Gaussian tail (direct summation), and it is tight;
- the reference (Gopi et al.'s continuous threshold with the analytic Gaussian) is
  reproduced by an independent implementation, and the applied rule stays close to it.

Statistical tests state their false-failure probability (each ≤ 1e-7).
"""

from __future__ import annotations

import functools
import itertools
import math
import random
from fractions import Fraction

import numpy as np
import opendp.prelude as dp
import pytest
from pipeline_dp import dp_computations
from scipy.stats import binomtest

from bench.set_union import weighted_gaussian_parameters
from stream_dp.privacy.bounding import bounded_totals_columns
from stream_dp.privacy.calibration import zcdp_delta
from stream_dp.privacy.partition_selection import (
    EXACT_THROUGH,
    WEIGHT_SCALE,
    WeightedGaussian,
    adjusted_delta,
    user_key_weight,
)

dp.enable_features("contrib")

P_THRESHOLD = 1e-7
GRID = list(itertools.product([0.1, 0.5, 1.0, 3.0], [1e-5, 1e-9], [1, 3, 20]))


@functools.lru_cache(maxsize=4)
def _terms(sigma: float) -> tuple[np.ndarray, float]:
    """exp(−z²/2σ²) for z = 0 … 60σ, and the normalizer over ±60σ."""
    z = np.arange(0, int(60 * sigma) + 60, dtype=np.float64)
    w = np.exp(-(z * z) / (2 * sigma * sigma))
    return w, float(2 * w.sum() - w[0])


def _tail(sigma: float, t: int) -> float:
    """P(Z ≥ t) of the discrete Gaussian by direct summation (independent of the mechanism's
    tail code)."""
    w, total = _terms(sigma)
    if t <= 0:
        return 1.0 - _tail(sigma, 1 - t)
    return float(w[t:].sum() / total)


def _any_lone_key_kept(sigma: float, threshold: int, t: int) -> float:
    return -math.expm1(t * math.log1p(-_tail(sigma, threshold - user_key_weight(t))))


# ------------------------------------------------------------------- weights


def test_weights_are_floor_q_over_sqrt_d_and_a_users_vector_has_l2_norm_at_most_q() -> None:
    for d in [*range(1, 3000), 10**5 - 1, 10**5]:
        w = user_key_weight(d)
        # w = ⌊Q/√d⌋ exactly: w² ≤ Q²/d < (w + 1)², in rationals
        assert Fraction(w * w) <= Fraction(WEIGHT_SCALE**2, d) < Fraction((w + 1) ** 2)
        assert d * w * w <= WEIGHT_SCALE**2  # ℓ2 norm of the user's d weights ≤ Q
        assert w >= 1 or d > WEIGHT_SCALE**2
    with pytest.raises(ValueError):
        user_key_weight(0)


def _seal(users: list[int], keys: list[int], *, max_keys: int | None) -> np.ndarray:
    _, _, _, weights = bounded_totals_columns(
        np.array(users, dtype=np.int64),
        np.array(keys, dtype=np.int64),
        None,
        n_keys=40,
        max_keys=max_keys,
        max_per_key=2,
        rng=np.random.default_rng(7),
        weights=True,
    )
    return weights


def test_the_seal_sums_each_users_weight_over_the_keys_it_kept() -> None:
    # user 0 keeps keys 1, 2 (two events on key 1); user 1 keeps key 1; user 2 keeps 1, 2, 3
    users = [0, 0, 0, 1, 2, 2, 2]
    keys = [1, 1, 2, 1, 1, 2, 3]
    weights = _seal(users, keys, max_keys=None)
    w1, w2, w3 = user_key_weight(1), user_key_weight(2), user_key_weight(3)
    assert weights[1] == w2 + w1 + w3
    assert weights[2] == w2 + w3
    assert weights[3] == w3
    assert weights.sum() == weights[1] + weights[2] + weights[3]
    # without the flag the column is zeros: other strategies never compute it
    _, _, _, none = bounded_totals_columns(
        np.array(users),
        np.array(keys),
        None,
        n_keys=40,
        max_keys=None,
        max_per_key=None,
        rng=np.random.default_rng(7),
    )
    assert not none.any()


def test_on_neighbouring_inputs_the_weight_sums_move_by_one_users_vector_only() -> None:
    """Adding one user (any number of events and keys, L0 = 5) changes the weight sums by a
    vector of ℓ2 norm ≤ Q supported on that user's keys: no other user's weight moves."""
    gen = random.Random(3)
    for _ in range(200):
        others = [(u, gen.randrange(40)) for u in range(30) for _ in range(gen.randint(1, 9))]
        added = [(30, gen.randrange(40)) for _ in range(gen.randint(1, 60))]
        # rows grouped by user, as the seal gets them; no L0 here, so no random choice
        both = others + added
        base = _seal([u for u, _ in others], [k for _, k in others], max_keys=None)
        diff = _seal([u for u, _ in both], [k for _, k in both], max_keys=None) - base
        touched = {k for _, k in added}
        assert set(np.flatnonzero(diff).tolist()) == touched
        assert int((diff * diff).sum()) <= WEIGHT_SCALE**2
    # with L0 bounding: the added user keeps ≤ 5 keys, each at weight w(≤5)
    others = [(u, k) for u in range(10) for k in range(u % 3 + 1)]  # ≤ 3 keys: L0 keeps all
    added = [(10, k) for k in range(20) for _ in range(2)]
    both = others + added
    before = _seal([u for u, _ in others], [k for _, k in others], max_keys=5)
    after = _seal([u for u, _ in both], [k for _, k in both], max_keys=5)
    diff = after - before
    assert np.count_nonzero(diff) == 5
    assert set(diff[diff != 0].tolist()) == {user_key_weight(5)}
    assert int((diff * diff).sum()) <= WEIGHT_SCALE**2


# --------------------------------------------------------------------- noise


@pytest.mark.parametrize(("epsilon", "delta", "l0"), GRID[::3])
def test_the_noise_is_zcdp_at_l2_sensitivity_q_by_opendps_own_map(
    epsilon: float, delta: float, l0: int
) -> None:
    sel = WeightedGaussian(epsilon=epsilon, delta=delta, max_partitions_contributed=l0)
    assert sel.noise_delta + sel.threshold_delta == pytest.approx(delta, rel=1e-15)
    space = dp.vector_domain(dp.atom_domain(T="i64")), dp.l2_distance(T="i64")
    measurement = dp.m.make_gaussian(*space, scale=sel.mechanism.sigma)
    rho = measurement.map(WEIGHT_SCALE)
    assert zcdp_delta(rho, epsilon) <= sel.noise_delta * (1 + 1e-9)
    # and OpenDP's own zCDP → (ε, δ) conversion agrees
    approx = dp.c.make_zCDP_to_approxDP(measurement)
    assert approx.map(WEIGHT_SCALE).epsilon(sel.noise_delta) <= epsilon * (1 + 1e-6)


# ----------------------------------------------------------------- threshold


@pytest.mark.parametrize(("epsilon", "delta", "l0"), GRID)
def test_a_user_alone_on_its_keys_gets_any_released_with_probability_at_most_half_delta(
    epsilon: float, delta: float, l0: int
) -> None:
    sel = WeightedGaussian(epsilon=epsilon, delta=delta, max_partitions_contributed=l0)
    sigma, threshold = sel.mechanism.sigma, sel.threshold
    worst = max(_any_lone_key_kept(sigma, threshold, t) for t in range(1, l0 + 1))
    assert worst <= sel.threshold_delta * (1 + 1e-9)
    # tight: one integer lower breaks it for some t (every t ≤ EXACT_THROUGH is exact)
    assert max(_any_lone_key_kept(sigma, threshold - 1, t) for t in range(1, l0 + 1)) > (
        sel.threshold_delta
    )
    assert sel.keep_probability(user_key_weight(1)) <= adjusted_delta(sel.threshold_delta, 1)


@pytest.mark.parametrize("l0", [EXACT_THROUGH + 1, EXACT_THROUGH + 2, 3 * EXACT_THROUGH])
def test_above_the_exact_range_the_threshold_is_safe_and_barely_higher(l0: int) -> None:
    """Every t ≤ L0 is covered, also the first ones past the exact range (L0 = 257: a
    threshold solved through t = 256 only lets 257 lone keys through too often)."""
    sel = WeightedGaussian(epsilon=1.0, delta=1e-6, max_partitions_contributed=l0)
    sigma = sel.mechanism.sigma
    tails = {}  # one independent tail per distinct argument
    worst = 0.0
    for t in range(1, l0 + 1):
        x = sel.threshold - user_key_weight(t)
        if x not in tails:
            tails[x] = _tail(sigma, x)
        worst = max(worst, -math.expm1(t * math.log1p(-tails[x])))
    assert worst <= sel.threshold_delta * (1 + 1e-9)
    exact = WeightedGaussian(epsilon=1.0, delta=1e-6, max_partitions_contributed=EXACT_THROUGH)
    assert sel.threshold <= exact.threshold * 1.05  # larger L0 costs a little, not a lot


@pytest.mark.parametrize(("epsilon", "delta", "l0"), GRID[1::2])
def test_the_reference_threshold_is_gopi_et_al_and_the_applied_one_stays_close(
    epsilon: float, delta: float, l0: int
) -> None:
    sel = WeightedGaussian(epsilon=epsilon, delta=delta, max_partitions_contributed=l0)
    # σ_ref is the analytic Gaussian at sensitivity 1 (pipeline_dp's Balle–Wang δ)
    assert dp_computations.gaussian_delta(sel.reference_sigma, epsilon) == pytest.approx(
        sel.noise_delta, rel=1e-6
    )
    # ρ_ref: the bench's independent implementation of Gopi et al.'s formula
    sigma_ref, rho_ref = weighted_gaussian_parameters(epsilon, delta, l0)
    assert sel.reference_sigma == pytest.approx(sigma_ref, rel=1e-9)
    assert sel.reference_threshold == pytest.approx(rho_ref * WEIGHT_SCALE, rel=1e-9)
    # applied: zCDP costs a few % of σ over the analytic Gaussian, and so of the threshold
    ratio = sel.mechanism.sigma / (sel.reference_sigma * WEIGHT_SCALE)
    assert 1.0 <= ratio <= 1.12
    assert sel.reference_threshold <= sel.threshold <= sel.reference_threshold * ratio * 1.01


# ---------------------------------------------------------------- decisions


def test_keep_frequency_matches_the_keep_probability() -> None:
    # exact binomial test on 60 000 identical keys: false failure ≤ 1e-7
    sel = WeightedGaussian(epsilon=0.5, delta=1e-6, max_partitions_contributed=5)
    weight = sel.threshold - int(sel.mechanism.sigma // 3)
    trials = 60_000
    kept = sum(sel.select_weights([weight] * trials))
    p = sel.keep_probability(weight)
    assert 0.3 < p < 0.5
    assert binomtest(kept, trials, p).pvalue > P_THRESHOLD


def test_users_with_fewer_keys_weigh_more_so_fewer_of_them_keep_a_key() -> None:
    sel = WeightedGaussian(epsilon=1.0, delta=1e-6, max_partitions_contributed=10)
    light = sel.users_for_half_keep  # users who each keep 10 keys
    assert sel.keep_probability(light * user_key_weight(10)) >= 0.5
    assert sel.keep_probability((light - 1) * user_key_weight(10)) < 0.5
    heavy = -(-sel.threshold // user_key_weight(1))  # users who each keep one key
    assert heavy < light / 3


def test_describe_states_the_rule_its_units_and_reference() -> None:
    d = WeightedGaussian(epsilon=0.5, delta=1e-6, max_partitions_contributed=3).describe()
    assert d["strategy"] == "weighted_gaussian" and d["tested"] == "user_weights"
    assert d["weight_scale"] == WEIGHT_SCALE and d["sigma_calibration"] == "zcdp"
    assert d["noise"]["mechanism"] == "discrete_gaussian"
    assert str(d["threshold"]) in d["rule"] and "Gopi" in d["reference"]
