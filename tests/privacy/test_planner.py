"""Planner: the sensitivity table of docs/privacy.md#bounding (checked against pipeline_dp's
sensitivity functions), noise scales against OpenDP's privacy maps, the ε/δ split rules, public key
products, and the window/horizon totals (naive and zCDP, the latter against OpenDP)."""

from __future__ import annotations

import itertools
import math
from typing import Any

import opendp.prelude as dp
import pytest
from pipeline_dp import dp_computations

from stream_dp.config import BoundsConfig, QueryConfig, parse_config
from stream_dp.config.model import UNSAFE_TEST_MODE_ENV
from stream_dp.errors import ConfigError
from stream_dp.privacy.mechanisms import DiscreteGaussian, DiscreteLaplace
from stream_dp.privacy.partition_selection import (
    CountThreshold,
    GaussianThreshold,
    LaplaceThreshold,
    TruncatedGeometric,
)
from stream_dp.privacy.planner import (
    count_sensitivity,
    distinct_users_sensitivity,
    plan_config,
    plan_query,
    public_key_product,
    sum_sensitivity,
)
from stream_dp.privacy.specs import BoundsSpec, QuerySpec

dp.enable_features("contrib")


def query(**kw: Any) -> QuerySpec:
    """A query validated by the configuration, as the planner takes it."""
    base: dict[str, Any] = {"name": "q", "epsilon": 1.0, "delta": 1e-6, "group_by": ["domain"]}
    base.update(kw)
    return QueryConfig(**base).spec()


def bounds(k: int = 40, l0: int | None = 3, linf: int | None = 10) -> BoundsSpec:
    return BoundsConfig(
        max_contributions_per_window=k, max_keys_per_user=l0, max_contributions_per_key=linf
    ).spec()


# ------------------------------------------------------------ sensitivities


def _max_sum_of_squares(k: int, l0: int, linf: int) -> int:
    """Brute force: max Σ c_i² over ≤ l0 keys with 1 ≤ c_i ≤ linf and Σ c_i ≤ k (a DP over
    keys and events used, independent of the planner's closed form)."""
    best = {0: 0}  # events used → max sum of squares, after j keys
    overall = 0
    for _ in range(l0):
        nxt: dict[int, int] = {}
        for used, sq in best.items():
            for c in range(1, min(linf, k - used) + 1):
                total = sq + c * c
                if nxt.get(used + c, -1) < total:
                    nxt[used + c] = total
        if not nxt:
            break
        best = nxt
        overall = max(overall, *best.values())
    return overall


BOUNDS_GRID = [
    (k, l0, linf)
    for k, l0, linf in itertools.product([1, 5, 40, 200], [None, 1, 3, 8], [None, 1, 10])
]


def test_sensitivity_table_reference_values() -> None:
    # k only → L1 = L2 = k
    s = count_sensitivity(bounds(40, None, None))
    assert (s.l1, s.l2) == (40, 40)
    # L0, Linf → L0·Linf, √L0·Linf
    s = count_sensitivity(bounds(40, 3, 10))
    assert (s.l1, s.l2) == (30, pytest.approx(math.sqrt(3) * 10))
    # … never above what k events can do: 20 events fill two keys of 10, not three
    s = count_sensitivity(bounds(20, 3, 10))
    assert (s.l1, s.l2_squared) == (20, 2 * 10**2)
    # 12 events: one key of 10 and one of 2
    s = count_sensitivity(bounds(12, 3, 10))
    assert (s.l1, s.l2_squared) == (12, 10**2 + 2**2)
    # distinct users → L0 (k if unset), √L0
    s = distinct_users_sensitivity(bounds(40, 3, 10))
    assert (s.l1, s.l2) == (3, pytest.approx(math.sqrt(3)))
    s = distinct_users_sensitivity(bounds(40, None, 10))
    assert (s.l1, s.l2) == (40, pytest.approx(math.sqrt(40)))


@pytest.mark.parametrize(("k", "l0", "linf"), BOUNDS_GRID)
def test_count_sensitivity_matches_pipeline_dp(k: int, l0: int | None, linf: int | None) -> None:
    s = count_sensitivity(bounds(k, l0, linf))
    l0_eff, linf_eff = min(l0 or k, k), min(linf or k, k)
    assert (s.max_partitions_contributed, s.max_contributions_per_partition) == (l0_eff, linf_eff)
    assert s.l1 == min(k, dp_computations.compute_l1_sensitivity(l0_eff, linf_eff))
    # pipeline_dp's √L0·Linf (and k) are upper bounds; ours is the exact maximum
    assert s.l2 <= min(k, dp_computations.compute_l2_sensitivity(l0_eff, linf_eff)) + 1e-9
    assert s.l2_squared == _max_sum_of_squares(k, l0_eff, linf_eff)
    users = distinct_users_sensitivity(bounds(k, l0, linf))
    assert users.l1 == dp_computations.compute_l1_sensitivity(l0_eff, 1)
    assert users.l2 == pytest.approx(dp_computations.compute_l2_sensitivity(l0_eff, 1))


@pytest.mark.parametrize(
    ("lower", "upper", "granularity", "units"),
    [(0, 10, None, 1000), (0, 60, 0.5, 120), (-5, 2, 1, 5), (-3, 7, 3, 3), (1, 2, 0.3, 7)],
)
def test_sum_sensitivity_is_count_times_value_units(
    lower: float, upper: float, granularity: float | None, units: int
) -> None:
    q = query(statistic="sum", value_field="v", lower=lower, upper=upper, granularity=granularity)
    s = sum_sensitivity(q, bounds(40, 3, 10))
    assert s.value_units_per_event == units
    assert s.l1 == 30 * units
    assert s.l2 == pytest.approx(math.sqrt(3) * 10 * units)


# ------------------------------------------------------------- noise scales

SCALE_GRID = list(itertools.product([0.1, 0.5, 1.0, 2.0], [1e-6, 1e-8], [1, 3, 8], [1, 10]))


@pytest.mark.parametrize(("epsilon", "delta", "l0", "linf"), SCALE_GRID)  # 48 combinations
def test_noise_scales_match_opendp_maps(epsilon: float, delta: float, l0: int, linf: int) -> None:
    b = bounds(40, l0, linf)
    public = {"domain": ["a", "b"]}
    lap = plan_query(query(epsilon=epsilon, delta=delta, keys=public), b)
    (c,) = lap.noise
    assert isinstance(c.mechanism, DiscreteLaplace)
    assert c.mechanism.scale == min(40, l0 * linf) / epsilon
    assert c.mechanism.opendp_measurement().map(c.sensitivity.l1) == pytest.approx(epsilon)
    assert lap.noise_scale == c.scale and lap.ci95 == c.mechanism.ci95()

    gauss = plan_query(
        query(epsilon=epsilon, delta=delta, keys=public, mechanism="discrete_gaussian"), b
    )
    (g,) = gauss.noise
    assert isinstance(g.mechanism, DiscreteGaussian)
    assert g.rho == pytest.approx(g.sensitivity.l2_squared / (2 * g.mechanism.sigma**2))
    if float(g.sensitivity.l2).is_integer():  # OpenDP's L2 metric on i64 takes integers
        meas = g.mechanism.opendp_measurement()
        assert meas.map(int(g.sensitivity.l2)) == pytest.approx(g.rho, rel=1e-9)
    profile = dp.c.make_zCDP_to_approxDP(
        dp.m.make_gaussian(
            dp.vector_domain(dp.atom_domain(T=float, nan=False)),
            dp.l2_distance(T=float),
            scale=g.mechanism.sigma,
        )
    ).map(g.sensitivity.l2)
    assert profile.epsilon(delta) <= epsilon * (1 + 1e-9)


# ----------------------------------------------------------- budget split


def test_private_keys_split_epsilon_and_give_selection_the_delta() -> None:
    plan = plan_query(query(selection_epsilon_share=0.25), bounds())
    assert plan.selection_epsilon == pytest.approx(0.25)
    assert plan.noise_epsilon == pytest.approx(0.75)
    assert (plan.selection_delta, plan.noise_delta) == (1e-6, 0.0)
    assert isinstance(plan.selection, TruncatedGeometric)
    assert plan.selection.epsilon == pytest.approx(0.25)
    assert plan.selection.max_partitions_contributed == 3
    assert plan.noise[0].mechanism.scale == pytest.approx(30 / 0.75)
    assert math.fsum(c.epsilon for c in plan.charges) == pytest.approx(plan.epsilon)
    assert math.fsum(c.delta for c in plan.charges) == pytest.approx(plan.delta)


@pytest.mark.parametrize("strategy", ["laplace_threshold", "gaussian_threshold"])
def test_selection_strategy_is_built_from_its_share(strategy: str) -> None:
    plan = plan_query(query(selection=strategy, epsilon=2.0, delta=2e-6), bounds())
    assert isinstance(plan.selection, LaplaceThreshold | GaussianThreshold)
    assert plan.selection.epsilon == pytest.approx(1.0)
    assert plan.selection.delta == pytest.approx(2e-6)


def test_gaussian_noise_splits_delta_between_noise_and_selection() -> None:
    plan = plan_query(query(mechanism="discrete_gaussian", delta=2e-6), bounds())
    assert plan.noise_delta == pytest.approx(1e-6)
    assert plan.selection_delta == pytest.approx(1e-6)
    assert plan.noise[0].delta == pytest.approx(1e-6)
    assert plan.rho > 0


def test_count_threshold_spends_all_epsilon_on_the_count_and_delta_on_the_threshold() -> None:
    plan = plan_query(query(selection="count_threshold"), bounds())
    assert isinstance(plan.selection, CountThreshold)
    assert (plan.noise_epsilon, plan.selection_epsilon) == (1.0, 0.0)
    assert (plan.noise_delta, plan.selection_delta) == (0.0, 1e-6)
    assert plan.noise[0].mechanism is plan.selection.mechanism  # one noise draw, tested
    assert plan.noise_scale == 30.0
    assert (plan.selection.threshold, plan.selection.reference_threshold) == (438, 437)


def test_count_threshold_is_refused_for_sum_and_mean() -> None:
    q = query(selection="count_threshold", statistic="sum", value_field="v", lower=0, upper=1)
    with pytest.raises(ConfigError, match="count_threshold"):
        plan_query(q, bounds())


def test_mean_splits_the_noise_epsilon_between_sum_and_count() -> None:
    q = query(
        statistic="mean",
        value_field="v",
        lower=0,
        upper=10,
        granularity=0.5,
        mean_count_share=0.25,
        keys={"domain": ["a"]},
    )
    plan = plan_query(q, bounds())
    total, count = plan.noise
    assert (total.target, count.target) == ("sum", "count")
    assert count.epsilon == pytest.approx(0.25) and total.epsilon == pytest.approx(0.75)
    assert total.mechanism.scale == pytest.approx(30 * 20 / 0.75)
    assert total.unit == 0.5 and total.scale == pytest.approx(total.mechanism.scale * 0.5)
    assert count.mechanism.scale == pytest.approx(30 / 0.25)
    assert plan.value_bound == 10


def test_public_laplace_query_charges_its_configured_delta_as_unused() -> None:
    plan = plan_query(query(keys={"domain": ["a"]}), bounds())
    assert plan.delta_unused == 1e-6 and plan.noise_delta == 0.0
    assert math.fsum(c.delta for c in plan.charges) == pytest.approx(1e-6)


# ------------------------------------------------------------- public keys


def test_public_keys_are_the_cartesian_product_in_group_by_order() -> None:
    q = query(group_by=["country", "domain"], keys={"domain": ["a", "b"], "country": ["DE", 7]})
    assert public_key_product(q) == (("DE", "a"), ("DE", "b"), (7, "a"), (7, "b"))
    plan = plan_query(q, bounds())
    assert plan.public_keys == public_key_product(q)
    assert plan.selection is None
    assert public_key_product(query()) is None
    assert public_key_product(query(group_by=[], keys={})) == ((),)


def test_an_enormous_public_key_product_is_refused() -> None:
    values = list(range(2_000))
    q = query(group_by=["a", "b"], keys={"a": values, "b": values})  # 4 000 000 keys
    with pytest.raises(ConfigError, match="public key lists"):
        plan_query(q, bounds())


# ----------------------------------------------------------------- totals


def _config(**privacy: Any) -> dict[str, Any]:
    return {
        "privacy": {
            "epsilon_per_window": 2.0,
            "delta_per_window": 1e-5,
            "horizon_windows": 24,
            "max_epsilon_per_horizon": 48.0,
            **privacy,
        },
        "bounds": {"max_contributions_per_window": 40, "max_keys_per_user": 3},
        "queries": [
            {"name": "a", "group_by": ["d"], "epsilon": 1.0, "delta": 1e-6},
            {
                "name": "g",
                "group_by": ["c"],
                "keys": {"c": ["x", "y"]},
                "mechanism": "discrete_gaussian",
                "epsilon": 0.5,
                "delta": 1e-6,
            },
        ],
    }


def test_plan_config_totals_naive_and_zcdp() -> None:
    plan = plan_config(parse_config(_config()).spec())
    assert [q.name for q in plan.queries] == ["a", "g"]
    assert plan.window.epsilon == pytest.approx(1.5)
    assert plan.window.delta == pytest.approx(2e-6)
    assert plan.horizon.epsilon == pytest.approx(24 * 1.5)
    assert plan.horizon.delta == pytest.approx(24 * 2e-6)
    g = plan.query("g")
    assert plan.window.rho == pytest.approx(g.rho)
    assert plan.horizon.rho == pytest.approx(24 * g.rho)
    # the Gaussian part over the horizon, composed in zCDP, vs OpenDP's conversion
    sigma = 1.0 / math.sqrt(2 * plan.horizon.rho)  # a Gaussian whose ρ at d_in=1 is the total
    meas = dp.m.make_gaussian(
        dp.atom_domain(T=float, nan=False), dp.absolute_distance(T=float), scale=sigma
    )
    eps_opendp = dp.c.make_zCDP_to_approxDP(meas).map(1.0).epsilon(24 * 1e-6)
    assert plan.horizon.epsilon_zcdp == pytest.approx(24 * 1.0 + eps_opendp, rel=1e-9)
    assert plan.horizon.epsilon_zcdp is not None
    assert plan.horizon.epsilon_zcdp < plan.horizon.epsilon  # tighter over 24 windows
    assert plan.describe()["horizon"]["windows"] == 24


def test_plan_config_without_gaussian_has_no_zcdp_total() -> None:
    data = _config()
    data["queries"] = data["queries"][:1]
    plan = plan_config(parse_config(data).spec())
    assert plan.window.epsilon_zcdp is None and plan.horizon.rho == 0.0


def test_unsafe_test_mode_is_passed_through_and_huge_epsilon_plans(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(UNSAFE_TEST_MODE_ENV, "1")
    data = _config(unsafe_test_mode=True, epsilon_per_window=2e6, max_epsilon_per_horizon=1e8)
    for q in data["queries"]:
        q["epsilon"] = 1e6
    plan = plan_config(parse_config(data).spec())
    assert plan.unsafe_test_mode and all(q.unsafe_test_mode for q in plan.queries)
    assert plan.query("a").noise_scale < 1e-3
    assert plan.describe()["unsafe_test_mode"] is True


# ------------------------------------------------- tight L2 sensitivity (issue 12)


def test_l2_sensitivity_is_tight_when_linf_is_set_without_l0() -> None:
    """k = 12, Linf = 5: a user fills two keys with 5 and a third with 2, so
    L2 = √(2·5² + 2²) = √54, not k = 12 (main's σ was 12/√54 ≈ 1.63 times too large)."""
    s = count_sensitivity(bounds(12, None, 5))
    assert (s.l1, s.l2_squared) == (12, 54)
    plan = plan_query(
        query(mechanism="discrete_gaussian", keys={"domain": ["a"]}), bounds(12, None, 5)
    )
    tight = DiscreteGaussian.for_epsilon_delta(
        l2_sensitivity=math.sqrt(54), epsilon=1.0, delta=1e-6
    )
    loose = DiscreteGaussian.for_epsilon_delta(l2_sensitivity=12, epsilon=1.0, delta=1e-6)
    assert plan.noise_scale == tight.scale
    assert loose.scale / plan.noise_scale == pytest.approx(12 / math.sqrt(54), rel=1e-9)


@pytest.mark.parametrize(
    ("k", "l0", "linf", "l2_squared"),
    [
        (12, 3, 5, 2 * 25 + 4),  # L0 = 3 > ⌊12/5⌋ = 2: the third key gets the rest
        (12, 2, 5, 2 * 25),  # L0 = 2 = ⌊12/5⌋: two full keys, nothing left for a third
        (10, 4, 5, 2 * 25),  # k a multiple of Linf: no remainder key
        (7, 1, 5, 25),  # one key only, capped at Linf
        (40, 3, 10, 3 * 100),  # the example config: √L0·Linf is already tight
        (3, 8, 1, 3),  # Linf = 1: one event per key
    ],
)
def test_l2_sensitivity_with_both_bounds_is_the_exact_maximum(
    k: int, l0: int, linf: int, l2_squared: int
) -> None:
    s = count_sensitivity(bounds(k, l0, linf))
    assert s.l2_squared == l2_squared == _max_sum_of_squares(k, l0, linf)
    assert (
        sum_sensitivity(
            query(statistic="sum", value_field="v", lower=0, upper=3, granularity=1),
            bounds(k, l0, linf),
        ).l2_squared
        == l2_squared * 9
    )


@pytest.mark.parametrize("mechanism", ["discrete_laplace", "discrete_gaussian"])
def test_public_keys_spend_nothing_on_selection(mechanism: str) -> None:
    """With public keys no key is selected: the plan states no selection ε or δ and gives
    the whole ε to the noise."""
    plan = plan_query(query(keys={"domain": ["a", "b"]}, mechanism=mechanism), bounds())
    assert plan.selection is None
    assert (plan.selection_epsilon, plan.selection_delta) == (0.0, 0.0)
    assert plan.describe()["selection_epsilon"] == 0.0
