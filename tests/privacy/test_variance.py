"""``statistic: variance`` (issue 40): PipelineDP's estimator — a noisy count, a noisy sum of
normalized values and a noisy sum of normalized squares, the noise budget split in thirds,
variance = mean of squares − square of the mean, clamped to [0, ((upper − lower)/2)²].

Calibration is checked exactly against closed forms and PipelineDP's own budget split and
Laplace calibration; the estimate's bias, its stated 95% interval and its privacy are checked
empirically, each with a stated false-failure probability below 1e-6.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from pipeline_dp import dp_computations
from scipy.stats import binomtest

from stream_dp.config import BoundsConfig, QueryConfig
from stream_dp.errors import ConfigError
from stream_dp.privacy.mechanisms import DiscreteLaplace
from stream_dp.privacy.planner import QueryPlan, plan_query
from stream_dp.privacy.release import KeyAggregate, release_query
from stream_dp.privacy.statistics import STATISTICS, statistic_of
from stream_dp.privacy.statistics.variance import Variance, center_units, halfwidth

P_THRESHOLD = 1e-7
K = 5
BOUNDS = BoundsConfig(max_contributions_per_window=K)
LOWER, UPPER, GRANULARITY = 0.0, 10.0, 0.01
#: c and D in units of 0.01: values lie in [0, 1000], centred on 500
CENTER, SPREAD = 500, 500


def _plan(keys: int = 1, bounds: BoundsConfig = BOUNDS, **kw: Any) -> QueryPlan:
    base: dict[str, Any] = {
        "name": "v",
        "statistic": "variance",
        "group_by": ["slot"],
        "value_field": "x",
        "lower": LOWER,
        "upper": UPPER,
        "granularity": GRANULARITY,
        "epsilon": 0.9,
        "keys": {"slot": [f"s{i}" for i in range(keys)]},
    }
    base.update(kw)
    return plan_query(QueryConfig(**base).spec(), bounds.spec())


def _aggregate(values_units: Sequence[int]) -> KeyAggregate:
    """A key's exact totals for these values (in units), as stage 1 keeps them."""
    v = np.asarray(values_units, dtype=np.int64)
    return KeyAggregate(
        events=len(v),
        users=len(v),
        value_sum=int(v.sum()),
        value_squares=int(((v - CENTER) ** 2).sum()),
    )


# ------------------------------------------------------------------ calibration (exact)


def test_center_and_spread_cover_every_rounded_value() -> None:
    assert center_units(LOWER, UPPER, GRANULARITY) == (CENTER, SPREAD)
    # an odd span: [-3, 4] in units → c = 0, D = 4 (floor of the midpoint, the larger side)
    assert center_units(-0.3, 0.4, 0.1) == (0, 4)
    # bounds off the grid: floor(lower/g) and ceil(upper/g) hold every rounding of a value
    assert center_units(0.05, 0.97, 0.1) == (5, 5)


def test_three_components_split_the_noise_budget_like_pipeline_dp() -> None:
    """Thirds in PipelineDP's order (count, sum, the last takes what is left), and the parts
    add up to the query's ε exactly: public keys, Laplace, so the noise gets all of ε."""
    plan = _plan(epsilon=0.9)
    squares, sums, count = plan.noise
    assert [c.target for c in plan.noise] == ["sum_squares", "sum", "count"]
    (c_eps, _), (s_eps, _), (q_eps, _) = dp_computations.equally_split_budget(0.9, 0.0, 3)
    assert (count.epsilon, sums.epsilon, squares.epsilon) == (c_eps, s_eps, q_eps)
    assert math.fsum(c.epsilon for c in plan.noise) == pytest.approx(0.9, abs=1e-15)
    assert [c.part for c in plan.charges] == ["noise:sum_squares", "noise:sum", "noise:count"]


def test_gaussian_components_split_delta_in_thirds_too() -> None:
    plan = _plan(epsilon=0.9, delta=3e-6, mechanism="discrete_gaussian")
    (c_eps, c_d), (s_eps, s_d), (q_eps, q_d) = dp_computations.equally_split_budget(0.9, 3e-6, 3)
    squares, sums, count = plan.noise
    assert (count.epsilon, count.delta) == (c_eps, c_d)
    assert (sums.epsilon, sums.delta) == (s_eps, s_d)
    assert (squares.epsilon, squares.delta) == (q_eps, q_d)
    # σ of each from its own L2 sensitivity (k only: Δ2 = k·units)
    assert squares.sensitivity.l2 == K * SPREAD**2
    assert sums.sensitivity.l2 == K * SPREAD


def test_laplace_scales_match_the_closed_forms_and_pipeline_dp() -> None:
    """b = Δ1/ε per component, with Δ1 = k (count), k·D (normalized sum, in units), k·D²
    (normalized squares, in half units). In released units: the count's and the sum's
    scales equal PipelineDP's Laplace diversity for its count and normalized sum
    (L0 = 1, Linf = k, max contribution |middle − min| = 5); the squares' equals the same
    formula on the centred squares' range [0, ((upper − lower)/2)²] (half-width 12.5)."""
    bounds = BoundsConfig(max_contributions_per_window=K, max_keys_per_user=1)
    plan = _plan(bounds=bounds, epsilon=0.9)
    squares, sums, count = plan.noise
    eps = count.epsilon
    assert count.sensitivity.l1 == K
    assert sums.sensitivity.l1 == K * SPREAD
    assert squares.sensitivity.l1 == K * SPREAD**2
    assert count.mechanism.scale == pytest.approx(K / eps, rel=1e-12)
    assert sums.mechanism.scale == pytest.approx(K * SPREAD / sums.epsilon, rel=1e-12)
    assert squares.mechanism.scale == pytest.approx(K * SPREAD**2 / squares.epsilon, rel=1e-12)
    # released units: the sum's unit is g, the squares' g²/2
    half_range = (UPPER - LOWER) / 2
    assert count.scale == pytest.approx(1 * K / eps, rel=1e-12)
    assert sums.scale == pytest.approx(K * half_range / sums.epsilon, rel=1e-12)
    assert squares.scale == pytest.approx(K * half_range**2 / 2 / squares.epsilon, rel=1e-12)
    # PipelineDP's own calibration of the count and the normalized sum (std = √2·b)
    params = dict(
        delta=0.0,
        min_value=LOWER,
        max_value=UPPER,
        min_sum_per_partition=None,
        max_sum_per_partition=None,
        max_partitions_contributed=1,
        max_contributions_per_partition=K,
        noise_kind=dp_computations.aggregate_params.NoiseKind.LAPLACE,
    )
    count_std = dp_computations.compute_dp_count_noise_std(
        dp_computations.ScalarNoiseParams(eps=count.epsilon, **params)  # type: ignore[arg-type]
    )
    assert count.scale * math.sqrt(2) == pytest.approx(count_std, rel=1e-12)
    sum_params = {**params, "min_sum_per_partition": -K * half_range}
    sum_params["max_sum_per_partition"] = K * half_range
    sum_std = dp_computations.compute_dp_sum_noise_std(
        dp_computations.ScalarNoiseParams(eps=sums.epsilon, **sum_params)  # type: ignore[arg-type]
    )
    assert sums.scale * math.sqrt(2) == pytest.approx(sum_std, rel=1e-12)


def test_the_plan_states_the_interval_rule_and_its_figures() -> None:
    plan = _plan()
    described = plan.describe()
    figures = described["variance_ci95"]
    assert figures["at_noisy_count"] == {str(n): halfwidth(plan, n) for n in (100, 1000, 10000)}
    assert figures["at_noisy_count"]["100"] > figures["at_noisy_count"]["10000"] > 0
    assert described["mean_ci95"] is None
    assert halfwidth(plan, 0) == ((UPPER - LOWER) / 2) ** 2


def test_variance_refuses_cumulative_release_and_count_threshold() -> None:
    with pytest.raises(ValueError, match="cumulative variances are not supported"):
        QueryConfig(
            name="v",
            statistic="variance",
            value_field="x",
            lower=0,
            upper=1,
            release="cumulative",
            horizon_windows=24,
            keys={"slot": ["a"]},
            group_by=["slot"],
            epsilon=1.0,
        )
    threshold = dataclasses.replace(_plan_spec(), selection="count_threshold")
    with pytest.raises(ConfigError, match="works with statistic count or count_distinct_users"):
        plan_query(threshold, BOUNDS.spec())
    with pytest.raises(ValueError, match="needs value_field, lower and upper"):
        QueryConfig(name="v", statistic="variance", epsilon=1.0)


def _plan_spec() -> Any:
    return QueryConfig(
        name="v",
        statistic="variance",
        group_by=["slot"],
        value_field="x",
        lower=LOWER,
        upper=UPPER,
        granularity=GRANULARITY,
        epsilon=1.0,
        delta=1e-6,
    ).spec()


def test_the_config_model_names_exactly_the_registered_statistics() -> None:
    """The registry is the list the config model accepts (the committed schemas' enums are
    checked by tests/test_reference.py, the refusal of an unknown statistic by
    tests/privacy/test_statistics_registry.py)."""
    from typing import get_args

    from stream_dp.privacy.specs import StatisticName

    names = list(STATISTICS)
    assert list(get_args(StatisticName)) == names
    config = QueryConfig.model_json_schema()["properties"]["statistic"]
    assert config["enum"] == names
    for name in names:
        assert statistic_of(name).name == name


# ------------------------------------------------------------------ release


def test_the_released_variance_is_the_exact_one_without_noise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Noise replaced by none: values 2.0 and 6.0 (mean 4, variance 4) come out as 4.0
    exactly, and the exact value the demo shows agrees. A mean of squares not centred back
    (D²) or a mean not subtracted would give another number."""
    monkeypatch.setattr(DiscreteLaplace, "sample_array", lambda self, values: np.asarray(values))
    agg = _aggregate([200, 600] * 50)
    plan = _plan()
    (value,) = release_query({("s0",): agg}, plan).values
    assert value.value == pytest.approx(4.0, abs=1e-12)
    assert Variance().exact_value(agg, _plan_spec()) == pytest.approx(4.0, abs=1e-12)


@pytest.mark.parametrize(
    ("squares", "sums", "count", "released"),
    [
        # noisy mean of squares far above the largest variance → clamped to 25
        (10**9, 0, 10, 25.0),
        # mean of squares below the square of the mean → clamped to 0
        (-250_000 * 10, 500 * 10, 10, 0.0),
        # noisy count ≤ 0: divided by 1, interval the whole range
        # (m2 = D²/2 = 125,000 units² = 12.5, mean 0)
        (0, 0, -3, 12.5),
    ],
)
def test_a_released_variance_lies_in_zero_to_the_largest_variance(
    monkeypatch: pytest.MonkeyPatch, squares: int, sums: int, count: int, released: float
) -> None:
    draws = iter([[squares], [sums], [count]])
    monkeypatch.setattr(DiscreteLaplace, "sample_array", lambda self, values: np.array(next(draws)))
    (value,) = release_query({("s0",): _aggregate([500])}, _plan()).values
    assert 0.0 <= value.value <= 25.0
    assert value.value == pytest.approx(released, abs=1e-9)
    if count <= 0:
        assert value.ci95 == 25.0


@pytest.mark.parametrize("noisy_count", [0, -1, -40])
def test_variance_interval_is_the_whole_range_when_the_noisy_count_is_not_positive(
    monkeypatch: pytest.MonkeyPatch, noisy_count: int
) -> None:
    """With a noisy count ≤ 0 the ratios mean nothing: the interval is [0, 25] itself. At
    k = 1 and ε = 100 the interval of a noisy count of 1 is narrower than that (checked
    first), so stating it for a count ≤ 0 fails the last assert."""
    plan = _plan(bounds=BoundsConfig(max_contributions_per_window=1), epsilon=100.0)
    assert halfwidth(plan, 1) < 25.0
    draws = iter([[0], [0], [noisy_count]])
    monkeypatch.setattr(DiscreteLaplace, "sample_array", lambda self, values: np.array(next(draws)))
    (value,) = release_query({("s0",): _aggregate([500])}, plan).values
    assert value.ci95 == 25.0
    assert plan.describe()["variance_ci95"]["at_noisy_count"]["100"] < 25.0


def test_variance_estimates_are_unbiased_within_five_standard_errors() -> None:
    """20,000 keys of 100,000 events each (half at 2.0, half at 6.0: variance 4), real noise
    at ε = 0.9. The estimator's bias is of second order, −g²·Var(sum noise)/n² ≈ −1e-6 (plus
    smaller count terms), a twentieth of the standard error of the average over keys
    (≈ 2e-5). The average must lie within 5.5 empirical standard errors of 4 plus that bias:
    false failure below 4e-8 (normal tail; the sample sd of 20,000 estimates is within 2% of
    the true one). A mean of squares not re-centred, a square of the mean not subtracted or
    the sum's centre forgotten moves the average by more than 1."""
    keys = 20_000
    plan = _plan(keys=keys)
    n = 100_000
    agg = _aggregate([200, 600] * (n // 2))
    out = release_query({(f"s{i}",): agg for i in range(keys)}, plan).values
    values = np.array([v.value for v in out], dtype=float)
    se = values.std(ddof=1) / math.sqrt(keys)
    sum_b = plan.noise[1].scale  # released units
    bias = 2 * sum_b**2 / n**2 * 10  # Var(Laplace) = 2b², with room for the count's terms
    assert 0 < se < 1e-3
    assert abs(values.mean() - 4.0) <= 5.5 * se + bias, (values.mean(), se, bias)


def test_the_stated_interval_covers_the_exact_variance_at_least_95_percent() -> None:
    """20,000 keys of 200 events at ε = 0.9 (the interval is then narrower than the range):
    the stated ci95 (the plan's figure at the key's noisy count) must cover the exact
    variance in ≥ 95% of keys; one-sided exact binomial test, false failure ≤ 1e-7."""
    keys = 20_000
    plan = _plan(keys=keys, epsilon=3.0)
    agg = _aggregate([100, 700, 450, 900] * 50)
    exact = Variance().exact_value(agg, _plan_spec())
    assert exact == pytest.approx(8.921875)
    out = release_query({(f"s{i}",): agg for i in range(keys)}, plan).values
    halves = [v.ci95 for v in out]
    assert np.median(halves) < 25.0  # informative: narrower than the range
    covered = sum(abs(v.value - exact) <= v.ci95 for v in out)
    assert binomtest(covered, keys, 0.95, alternative="less").pvalue >= P_THRESHOLD, covered


# ------------------------------------------------------------------ empirical privacy


def _components_in_tail(plan: QueryPlan, with_user: bool, keys: int) -> int:
    """Draws (one per key) whose three noisy components all reach the neighbour's exact
    values: D' has one more user with k events at the upper bound (v − c = D), which moves
    the count by k, the normalized sum by k·D and the normalized squares by k·D² — each by
    exactly its L1 sensitivity. The components are read as the release draws them (the
    post-processing is wrapped)."""
    base = [300, 700] * 20
    extra = [1000] * K if with_user else []
    agg = _aggregate(base + extra)
    target = _aggregate(base + [1000] * K)
    variance = Variance()
    cut = [int(variance.noise_input(_totals(target), c.target, plan)[0]) for c in plan.noise]
    seen: list[Sequence[Sequence[int]]] = []
    original = Variance.post_process

    def spy(self: Variance, groups: Any, noisy: Any, plan_: QueryPlan) -> Any:
        seen.append(noisy)
        return original(self, groups, noisy, plan_)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Variance, "post_process", spy)
        release_query({(f"s{i}",): agg for i in range(keys)}, plan)
    (noisy,) = seen
    columns = [np.asarray(c) >= t for c, t in zip(noisy, cut, strict=True)]
    return int(np.logical_and.reduce(columns).sum())


def _totals(agg: KeyAggregate) -> Any:
    from stream_dp.privacy.key_totals import KeyTotals

    return KeyTotals.of({("s0",): agg})


def _violates_epsilon(plan: QueryPlan, keys: int) -> tuple[bool, float]:
    """S = {every component ≥ the neighbour's exact value}: for independent discrete Laplace
    components each shifted by its L1 sensitivity, the likelihood ratio on S is exactly
    e^(ε₁+ε₂+ε₃) = e^ε. Of the draws in S, the share from D' is Binomial(·, π) with
    π ≤ e^ε/(1 + e^ε) under ε-DP: a one-sided exact binomial test at level 1e-7."""
    x = _components_in_tail(plan, True, keys)
    y = _components_in_tail(plan, False, keys)
    pi0 = math.exp(plan.epsilon) / (1 + math.exp(plan.epsilon))
    pvalue = binomtest(x, x + y, pi0, alternative="greater").pvalue
    return pvalue < P_THRESHOLD, x / y


def test_empirical_privacy_holds_for_variance_and_detects_doubled_epsilon() -> None:
    """(1) The planned variance (k-only bounds, ε = 0.9) passes: false failure ≤ 1e-7.
    (2) The same test on the plan with every component's scale halved (ε doubled) flags it:
    the ratio on S is e^1.8 ≈ 6.0 against ≤ e^0.9 ≈ 2.46 allowed, over ≈ 10,000 draws in S,
    dozens of standard deviations (miss probability far below 1e-12)."""
    keys = 80_000
    plan = _plan(keys=keys, epsilon=0.9)
    violated, ratio = _violates_epsilon(plan, keys)
    assert not violated
    assert ratio <= math.exp(0.9) * 1.1
    halved = tuple(
        dataclasses.replace(c, mechanism=DiscreteLaplace(c.mechanism.scale / 2)) for c in plan.noise
    )
    violated, ratio = _violates_epsilon(dataclasses.replace(plan, noise=halved), keys)
    assert violated
    assert ratio > math.exp(0.9) * 1.8
