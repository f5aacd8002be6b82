"""Issue #17's table reproduced empirically: the standard deviation of the running count at
the horizon's worst step, for every option, at T = 1,024 and 65,536.

How: a counter holds K replicate keys whose per-window totals are random counts; after the
worst step, e = released − true running total over the K keys gives the empirical variance
V̂ = mean(e²) (the noise has mean 0). The closed form predicts Var(e) = κ₂·Σa² and the fourth
cumulant κ₄·Σa⁴ (:mod:`stream_dp.privacy.continual.planning`), hence Var(e²) = 2·Var(e)² + κ₄Σa⁴
exactly, and by the central limit theorem V̂ lies within Z·√(Var(e²)/K) of Var(e) except with
probability 2·Φ(−Z) = 3.8e-8 for Z = 5.5 (plus a ≤ ¼ + √Var allowance for rounding the released
values to integers). With at most 16 such checks in this file (the interval coverages are
binomial checks at the same Z), the whole file fails by chance with probability below 1e-6.

Every check's tolerance is below half the variance gap between its column and the nearest
other column of the same row and noise family (the closest pair, the plain tree and the
per-window sum at T = 1,024, are 18% apart), so a mechanism passing for its neighbour would
fail; :func:`test_closed_forms_reproduce_the_reference_table` in test_planning shows that the
closed forms round to the table's figures.

Noise: :class:`~tests.privacy.continual.noise.FastNoise` (the samplers' exact laws, numpy) for
speed, and one check with OpenDP's own samplers. At T = 1,024 the counters run window by
window. At T = 65,536 the released noise of the worst step is drawn directly from its exact
law, with the same keys and the same Z as a streaming run (so the same power): the
√-factorisation's Σ_j b̃_{T−j}·z_j/2^P (a streaming run costs O(T²) per key); the trees'
sums of node draws, where a sum of n i.i.d. discrete Laplace draws is drawn at once as the
difference of two negative binomial (n, p) variables (a discrete Laplace is the difference of
two geometric ones), and the Gaussian tree's few forest roots. That the counters apply
exactly these coefficients is tested exactly at every step in test_counter (T ≤ 45), and at
T = 65,536 by :func:`test_the_tree_counters_at_65536_windows_apply_the_estimators_exactly`,
which runs them window by window on a few keys against an independent vectorised
Honaker estimator.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from stream_dp.privacy.calibration import zcdp_rho
from stream_dp.privacy.continual import binary_tree
from stream_dp.privacy.continual import sqrt_factorization as sf
from stream_dp.privacy.continual.counter import make_counter
from stream_dp.privacy.continual.planning import (
    ContinualOption,
    ContinualPlan,
    Participation,
    plan_continual,
)
from stream_dp.privacy.mechanisms import NoiseMechanism
from tests.privacy.continual.noise import FastNoise

pytestmark = pytest.mark.slow

Z = 5.5
SENSITIVITY = 10_000  # large: the discrete laws' variances equal the continuous closed forms
EPSILON, DELTA_DP = 1.0, 1e-6
LAPLACE_UNIT = SENSITIVITY / EPSILON
GAUSS_UNIT = SENSITIVITY / math.sqrt(2 * zcdp_rho(EPSILON, DELTA_DP))
TABLE = {
    1024: {"tree": 49.2, "tree_honaker": 37.5, "per_window_sum": 45.3, "gauss_tree": 10.5,
           "sqrt": 3.27},
    65536: {"tree": 96.2, "tree_honaker": 71.3, "per_window_sum": 362, "gauss_tree": 16.5,
            "sqrt": 4.60},
}  # fmt: skip
#: replicate keys per horizon (Laplace: the tree and the per-window sum need the most; the
#: Gaussian columns are far apart, so fewer keys suffice)
KEYS = {1024: 20_000, 65536: 2_000}
GAUSS_KEYS = {1024: 20_000, 65536: 1_000}
FAMILY_COLUMNS = (("tree", "tree_honaker", "per_window_sum"), ("gauss_tree", "sqrt"))


def make_plan(
    option: ContinualOption,
    family: str,
    horizon: int,
    participation: Participation = "one_window",
    sensitivity: int = SENSITIVITY,
) -> ContinualPlan:
    return plan_continual(
        option,
        family=family,  # type: ignore[arg-type]
        horizon_windows=horizon,
        l1_sensitivity=sensitivity,
        l2_sensitivity=sensitivity,
        epsilon=EPSILON,
        delta=DELTA_DP if family == "discrete_gaussian" else 0.0,
        participation=participation,
    )


def predicted(plan: ContinualPlan, step: int) -> tuple[float, float]:
    """(Var(e), Var(e²)) of the released running total's noise at ``step``."""
    second, fourth = plan._moments
    kappa2, kappa4 = plan._draw_cumulants
    var = kappa2 * float(second[step - 1])
    return var, 2 * var * var + kappa4 * float(fourth[step - 1])


def assert_variance(errors: np.ndarray, plan: ContinualPlan, step: int) -> float:
    """V̂ within the CLT bound of the predicted variance; returns the relative tolerance."""
    var, var_of_square = predicted(plan, step)
    v_hat = float(np.mean(errors.astype(np.float64) ** 2))
    tolerance = Z * math.sqrt(var_of_square / errors.size) + 0.25 + math.sqrt(var)
    assert abs(v_hat - var) <= tolerance, (plan.option, step, v_hat / var)
    assert plan.sd(step) == pytest.approx(math.sqrt(var))
    return tolerance / var


def assert_table(errors: np.ndarray, unit: float, horizon: int, column: str, tau: float) -> None:
    """The empirical sd matches the table's figure, and the check could tell the column from
    its nearest neighbour (tolerance below half their variance gap)."""
    row = TABLE[horizon]
    family = next(c for c in FAMILY_COLUMNS if column in c)
    gap = min(abs((row[other] / row[column]) ** 2 - 1) for other in family if other != column)
    assert tau < gap / 2, (column, tau, gap)
    sd = math.sqrt(float(np.mean(errors.astype(np.float64) ** 2))) / unit
    # |V̂/V − 1| ≤ τ bounds |sd/√V − 1| by τ/2 + τ²; the table rounds to 3 digits (≤ 0.2%)
    assert abs(sd / row[column] - 1) <= tau / 2 + tau * tau + 0.002, (column, sd)


def assert_coverage(errors: np.ndarray, half_width: float) -> None:
    """The 95% interval holds 95% of the errors (binomial, normal approximation at Z)."""
    covered = float(np.mean(np.abs(errors) <= half_width))
    slack = Z * math.sqrt(0.95 * 0.05 / errors.size)
    # Cornish–Fisher is conservative by at most ~0.5 percentage points here
    assert 0.95 - slack <= covered <= 0.955 + slack, covered


def run(
    plan: ContinualPlan, keys: int, steps: int, *, plain_too: bool = False
) -> tuple[np.ndarray, np.ndarray | None]:
    """Errors of the running totals after ``steps`` windows of random counts; with
    ``plain_too`` (a Honaker tree) also those of the plain tree on the same draws."""
    rng = np.random.default_rng()
    counter = make_counter(plan, list(range(keys)), noise=FastNoise())
    plain = None
    if plain_too:
        plain_plan = make_plan("tree", plan.family, plan.horizon_windows, plan.participation)
        plain = make_counter(plain_plan, list(range(keys)))
        plain.fingerprint = counter.fingerprint  # same draws, other estimator
    truth = np.zeros(keys, dtype=np.int64)
    for _ in range(steps):
        totals = rng.integers(0, 100, size=keys)
        truth += totals
        step = counter.advance(totals)
        plain_values = plain.replay(step.draws) if plain is not None else None
    errors = step.values - truth
    return errors, (None if plain_values is None else plain_values - truth)


def laplace_sums(scale: float, n: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` sums of ``n`` i.i.d. discrete Laplace(``scale``) draws, exactly: each draw is
    G − G' with G, G' geometric on {0, 1, …} with P(0) = p = 1 − e^{−1/scale}, and a sum of n
    such geometric variables is negative binomial (n, p)."""
    p = -math.expm1(-1.0 / scale)
    out: np.ndarray = rng.negative_binomial(n, p, size) - rng.negative_binomial(n, p, size)
    return out


def direct_tree_errors(plan: ContinualPlan, keys: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    """(Honaker, plain tree) errors of the running total at ``step`` on the same node draws,
    drawn from their exact law: per forest root (level h, a subtree of height h), the sum of
    its 2^{h−j} nodes at each level j enters Honaker's estimate with one coefficient, and
    the plain tree takes the root alone (discrete Laplace)."""
    rng = np.random.default_rng()
    honaker = np.zeros(keys, dtype=np.float64)
    plain = np.zeros(keys, dtype=np.int64)
    for h in binary_tree.root_levels(step):
        for depth, (nodes, coefficient) in enumerate(binary_tree._level_coefficients(h)):
            sums = laplace_sums(plan.mechanism.scale, nodes, keys, rng)
            honaker += coefficient * sums
            if depth == 0:
                plain += sums
    # the counter releases the rounded estimate; the truth is an integer
    return np.floor(honaker + 0.5), plain


@pytest.mark.parametrize("horizon", [1024, 65536])
def test_laplace_tree_and_honaker(horizon: int) -> None:
    plan = make_plan("tree_honaker", "discrete_laplace", horizon)
    worst = horizon - 1
    assert plan.worst_step == worst
    if horizon == 1024:
        honaker, plain = run(plan, KEYS[horizon], worst, plain_too=True)
    else:
        honaker, plain = direct_tree_errors(plan, KEYS[horizon], worst)
    assert plain is not None
    tau = assert_variance(honaker, plan, worst)
    assert_table(honaker, LAPLACE_UNIT, horizon, "tree_honaker", tau)
    plain_plan = make_plan("tree", "discrete_laplace", horizon)
    tau = assert_variance(plain, plain_plan, worst)
    assert_table(plain, LAPLACE_UNIT, horizon, "tree", tau)
    if horizon == 1024:
        assert_coverage(honaker, plan.ci95(worst))


@pytest.mark.parametrize("horizon", [1024, 65536])
def test_laplace_per_window_sum(horizon: int) -> None:
    plan = make_plan("per_window_sum", "discrete_laplace", horizon)
    if horizon == 1024:
        errors, _ = run(plan, KEYS[horizon], horizon)
    else:  # the sum of the T draws, from its exact law
        rng = np.random.default_rng()
        errors = laplace_sums(plan.mechanism.scale, horizon, KEYS[horizon], rng)
    tau = assert_variance(errors, plan, horizon)
    assert_table(errors, LAPLACE_UNIT, horizon, "per_window_sum", tau)
    if horizon == 1024:
        assert_coverage(errors, plan.ci95(horizon))


@pytest.mark.parametrize("horizon", [1024, 65536])
def test_gaussian_tree(horizon: int) -> None:
    plan = make_plan("tree", "discrete_gaussian", horizon)
    worst = horizon - 1
    # the plain tree releases the sum of its forest roots: popcount(worst) draws per key
    keys, roots = GAUSS_KEYS[horizon], len(binary_tree.root_levels(worst))
    draws = FastNoise().gaussian(plan.mechanism.scale, keys * roots).reshape(roots, keys)
    errors = draws.sum(axis=0)
    tau = assert_variance(errors, plan, worst)
    assert_table(errors, GAUSS_UNIT, horizon, "gauss_tree", tau)


def test_square_root_factorization_streaming_at_1024() -> None:
    horizon = 1024
    plan = make_plan("sqrt_factorization", "discrete_gaussian", horizon)
    errors, _ = run(plan, 2_000, horizon)
    tau = assert_variance(errors, plan, horizon)
    assert_table(errors, GAUSS_UNIT, horizon, "sqrt", tau)
    assert_coverage(errors, plan.ci95(horizon))


def test_square_root_factorization_last_step_at_65536() -> None:
    horizon, keys = 65536, GAUSS_KEYS[65536]
    plan = make_plan("sqrt_factorization", "discrete_gaussian", horizon)
    b = sf.output_coefficients(horizon)[::-1]  # b̃_{T−j} for j = 1 … T
    noise = FastNoise()
    sigma = plan.mechanism.scale
    acc = np.zeros(keys, dtype=np.float64)
    chunk = 2048
    for start in range(0, horizon, chunk):
        z = noise.gaussian(sigma, chunk * keys).reshape(chunk, keys).astype(np.float64)
        acc += b[start : start + chunk] @ z
    errors = np.floor(acc / float(1 << sf.PRECISION_BITS) + 0.5)
    tau = assert_variance(errors, plan, horizon)
    assert_table(errors, GAUSS_UNIT, horizon, "sqrt", tau)


class _Recording:
    """FastNoise that keeps every step's noise (the draws minus the exact values)."""

    def __init__(self) -> None:
        self.inner = FastNoise()
        self.noise: list[np.ndarray] = []

    def __call__(self, mechanism: NoiseMechanism, values: np.ndarray) -> np.ndarray:
        noisy = self.inner(mechanism, values)
        self.noise.append(noisy - values)
        return noisy


def test_the_tree_counters_at_65536_windows_apply_the_estimators_exactly() -> None:
    """Window by window on a few keys: the Honaker counter's released values at the worst
    step are the bottom-up estimate computed here, independently and vectorised, from the
    nodes it drew — and the plain tree's, on the same draws, the sum of the forest roots."""
    horizon, keys = 65536, 4
    plan = make_plan("tree_honaker", "discrete_laplace", horizon)
    worst = plan.worst_step
    source = _Recording()
    counter = make_counter(plan, list(range(keys)), noise=source)
    plain = make_counter(make_plan("tree", "discrete_laplace", horizon), list(range(keys)))
    plain.fingerprint = counter.fingerprint  # same draws, other estimator
    zeros = np.zeros(keys, dtype=np.int64)  # the released values are then the errors
    for _ in range(worst):
        step = counter.advance(zeros)
        plain_values = plain.replay(step.draws)
    # node draws per level in completion order: step t completes levels 0 … ν(t)
    levels: list[list[np.ndarray]] = [[] for _ in range(binary_tree.levels(horizon))]
    for noise in source.noise:
        for h, row in enumerate(noise.reshape(-1, keys)):
            levels[h].append(row)
    y = [np.asarray(rows, dtype=np.float64) for rows in levels if rows]
    z = [y[0]]
    for h in range(1, len(y)):
        alpha = binary_tree.honaker_weight(h)
        children = z[h - 1][: 2 * len(y[h])]
        z.append(alpha * y[h] + (1 - alpha) * (children[0::2] + children[1::2]))
    roots = binary_tree.root_levels(worst)
    estimate = sum(z[h][(worst >> h) - 1] for h in roots)
    assert np.all(np.abs(step.values - estimate) <= 0.5 + 1e-6), (step.values, estimate)
    assert plain_values.tolist() == sum(y[h][(worst >> h) - 1] for h in roots).tolist()


def test_opendp_samplers_give_the_predicted_variance() -> None:
    """The production noise source, on a short horizon (OpenDP samples ~10 µs a value)."""
    horizon, keys = 64, 3_000
    plan = make_plan("tree_honaker", "discrete_laplace", horizon, sensitivity=50)
    rng = np.random.default_rng()
    counter = make_counter(plan, list(range(keys)))
    truth = np.zeros(keys, dtype=np.int64)
    for _ in range(plan.worst_step):
        totals = rng.integers(0, 100, size=keys)
        truth += totals
        step = counter.advance(totals)
    assert_variance(step.values - truth, plan, plan.worst_step)
