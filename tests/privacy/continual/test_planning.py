"""Calibration, predicted error and accounting of the continual options — exact arithmetic,
against the issue's reference table and OpenDP's own privacy maps."""

from __future__ import annotations

import math

import pytest

from stream_dp.privacy.calibration import zcdp_epsilon, zcdp_rho
from stream_dp.privacy.continual import binary_tree
from stream_dp.privacy.continual import sqrt_factorization as sf
from stream_dp.privacy.continual.planning import (
    MAX_SQRT_STATE_VALUES,
    ContinualOption,
    Participation,
    candidate_plans,
    choose,
    plan_continual,
)
from stream_dp.privacy.mechanisms import DiscreteGaussian, DiscreteLaplace

#: Issue #17's table: per-step standard deviation of a running count after T steps
#: (the worst step t ≤ T), in units of Δ/ε (pure ε) or Δ/√(2ρ) (zCDP), one user in one step.
TABLE: dict[int, dict[str, float]] = {
    1024: {
        "tree": 49.2,
        "tree_honaker": 37.5,
        "per_window_sum": 45.3,
        "gauss_tree": 10.5,
        "sqrt": 3.27,
    },
    65536: {
        "tree": 96.2,
        "tree_honaker": 71.3,
        "per_window_sum": 362,
        "gauss_tree": 16.5,
        "sqrt": 4.60,
    },
}
#: Large sensitivity: the discrete laws' sd is then the continuous closed form's to < 1e-9.
DELTA = 10_000
EPSILON = 1.0
DELTA_DP = 1e-6


def laplace_plan(option: ContinualOption, horizon: int, sensitivity: int = DELTA):
    return plan_continual(
        option,
        family="discrete_laplace",
        horizon_windows=horizon,
        l1_sensitivity=sensitivity,
        l2_sensitivity=sensitivity,
        epsilon=EPSILON,
    )


def gaussian_plan(
    option: ContinualOption,
    horizon: int,
    participation: Participation = "one_window",
    sensitivity: int = DELTA,
):
    return plan_continual(
        option,
        family="discrete_gaussian",
        horizon_windows=horizon,
        l1_sensitivity=sensitivity,
        l2_sensitivity=sensitivity,
        epsilon=EPSILON,
        delta=DELTA_DP,
        participation=participation,
    )


def three_digits(x: float) -> float:
    return float(f"{x:.3g}")


@pytest.mark.parametrize("horizon", sorted(TABLE))
def test_closed_forms_reproduce_the_reference_table(horizon: int) -> None:
    row = TABLE[horizon]
    laplace_unit = DELTA / EPSILON
    for option in ("tree", "tree_honaker", "per_window_sum"):
        plan = laplace_plan(option, horizon)  # type: ignore[arg-type]
        assert three_digits(plan.worst_sd / laplace_unit) == row[option], option
    gauss_unit = DELTA / math.sqrt(2 * zcdp_rho(EPSILON, DELTA_DP))
    tree = gaussian_plan("tree", horizon)
    sqrt = gaussian_plan("sqrt_factorization", horizon)
    assert three_digits(tree.worst_sd / gauss_unit) == row["gauss_tree"]
    assert three_digits(sqrt.worst_sd / gauss_unit) == row["sqrt"]
    # where the worst step is: all bits set for the trees, the last step otherwise
    assert laplace_plan("tree", horizon).worst_step == horizon - 1
    assert laplace_plan("tree_honaker", horizon).worst_step == horizon - 1
    assert laplace_plan("per_window_sum", horizon).worst_step == horizon
    assert sqrt.worst_step == horizon


def test_laplace_calibration_and_opendp_privacy_map() -> None:
    """A window's total enters L tree nodes: scale L·Δ₁/ε; OpenDP's own map of the node
    vector's L1 sensitivity L·Δ₁ (one window) gives back ε."""
    horizon, sensitivity = 1000, 30
    levels = binary_tree.levels(horizon)
    for option in ("tree", "tree_honaker"):
        plan = laplace_plan(option, horizon, sensitivity)  # type: ignore[arg-type]
        assert isinstance(plan.mechanism, DiscreteLaplace)
        assert plan.mechanism.scale == levels * sensitivity / EPSILON
        measurement = plan.mechanism.opendp_measurement()
        assert measurement.map(levels * sensitivity) == pytest.approx(EPSILON, rel=1e-12)
        # a user in m windows: L1 change ≤ m·L·Δ₁, so m·ε
        assert measurement.map(7 * levels * sensitivity) == pytest.approx(7 * EPSILON, rel=1e-12)
    per_window = laplace_plan("per_window_sum", horizon, sensitivity)
    reference = DiscreteLaplace.for_epsilon(l1_sensitivity=sensitivity, epsilon=EPSILON)
    assert per_window.mechanism.scale == reference.scale


@pytest.mark.parametrize("participation", ["every_window", "one_window"])
def test_gaussian_calibration_and_opendp_privacy_map(participation: Participation) -> None:
    horizon, sensitivity = 300, 12
    rho = zcdp_rho(EPSILON, DELTA_DP)
    every = participation == "every_window"
    factors = {
        "per_window_sum": 1.0,
        "tree": float(binary_tree.gram_factor(horizon, every_window=every)),
        "tree_honaker": float(binary_tree.gram_factor(horizon, every_window=every)),
        "sqrt_factorization": sf.gram_factor(horizon, every_window=every),
    }
    for option, factor in factors.items():
        plan = gaussian_plan(option, horizon, participation, sensitivity)  # type: ignore[arg-type]
        assert isinstance(plan.mechanism, DiscreteGaussian)
        assert plan.rho == rho and plan.sensitivity_factor == factor
        # OpenDP's zCDP map is d²/(2σ²) for an integer L2 distance d; at the squared
        # sensitivity λ·Δ₂² of a window it must give ρ
        d = 1000
        rho_at_d = plan.mechanism.opendp_measurement().map(d)
        assert rho_at_d * factor * sensitivity**2 / d**2 == pytest.approx(rho, rel=1e-9)
    per_window = gaussian_plan("per_window_sum", horizon, participation, sensitivity)
    reference = DiscreteGaussian.for_epsilon_delta(
        l2_sensitivity=sensitivity, epsilon=EPSILON, delta=DELTA_DP
    )
    assert per_window.mechanism.scale == reference.scale


def test_accounting_over_the_horizon_is_exact() -> None:
    horizon = 168
    plan = laplace_plan("tree_honaker", horizon)
    acc = plan.accounting()
    assert acc["epsilon_per_window"] == EPSILON and acc["delta_per_window"] == 0.0
    assert acc["epsilon_over_horizon"] == EPSILON * horizon
    assert acc["rho_over_horizon"] is None and acc["epsilon_zcdp_over_horizon"] is None
    gauss = gaussian_plan("per_window_sum", horizon, "every_window")
    acc = gauss.accounting()
    rho = zcdp_rho(EPSILON, DELTA_DP)
    assert acc["rho_per_window"] == rho
    assert acc["rho_over_horizon"] == rho * horizon
    assert acc["delta_over_horizon"] == DELTA_DP * horizon
    assert acc["epsilon_zcdp_over_horizon"] == zcdp_epsilon(rho * horizon, DELTA_DP * horizon)
    # zCDP composition is never worse than adding the per-window ε up
    assert acc["epsilon_zcdp_over_horizon"] <= acc["epsilon_over_horizon"]
    single = gaussian_plan("sqrt_factorization", horizon, "one_window").accounting()
    assert single["rho_over_horizon"] == rho and single["epsilon_over_horizon"] == EPSILON


@pytest.mark.parametrize(
    ("family", "horizon", "participation", "expected"),
    [
        ("discrete_laplace", 2, "every_window", "per_window_sum"),
        ("discrete_laplace", 64, "every_window", "per_window_sum"),
        ("discrete_laplace", 512, "every_window", "per_window_sum"),
        ("discrete_laplace", 1024, "every_window", "tree_honaker"),
        ("discrete_laplace", 65536, "every_window", "tree_honaker"),
        ("discrete_laplace", 1 << 20, "every_window", "tree_honaker"),
        # zCDP with users in every window: the per-window sum is optimal at the last step
        ("discrete_gaussian", 2, "every_window", "per_window_sum"),
        ("discrete_gaussian", 1024, "every_window", "per_window_sum"),
        ("discrete_gaussian", 65536, "every_window", "per_window_sum"),
        ("discrete_gaussian", 1024, "one_window", "sqrt_factorization"),
        ("discrete_gaussian", 1 << 17, "one_window", "tree_honaker"),  # √ stops at 2^16
    ],
)
def test_default_is_the_smallest_worst_step_error(
    family: str, horizon: int, participation: Participation, expected: str
) -> None:
    plans = candidate_plans(
        family=family,  # type: ignore[arg-type]
        horizon_windows=horizon,
        l1_sensitivity=5,
        l2_sensitivity=5.0,
        epsilon=0.5,
        delta=DELTA_DP if family == "discrete_gaussian" else 0.0,
        participation=participation,
    )
    chosen = choose(plans)
    assert chosen.option == expected
    assert chosen.worst_sd == min(p.worst_sd for p in plans)


def test_per_window_sum_is_optimal_at_the_last_step_under_zcdp_every_window() -> None:
    """Lower bound: the last running total alone has L2 sensitivity T·Δ₂ and budget T·ρ, so
    no mechanism's sd there is below √T·Δ₂/√(2ρ) — which the per-window sum attains."""
    for horizon in (2, 10, 100, 4096):
        plans = candidate_plans(
            family="discrete_gaussian",
            horizon_windows=horizon,
            l1_sensitivity=1,
            l2_sensitivity=1.0,
            epsilon=1.0,
            delta=DELTA_DP,
        )
        rho = plans[0].rho
        assert rho is not None
        bound = math.sqrt(horizon) / math.sqrt(2 * rho)
        for plan in plans:
            assert plan.sd(horizon) >= bound * (1 - 1e-9), plan.option
        assert plans[0].option == "per_window_sum"
        assert plans[0].sd(horizon) == pytest.approx(bound, rel=1e-9)


def test_square_root_option_is_left_out_when_it_does_not_fit() -> None:
    common = dict(
        family="discrete_gaussian", l1_sensitivity=1, l2_sensitivity=1.0, epsilon=1.0,
        delta=DELTA_DP,
    )  # fmt: skip
    names = [p.option for p in candidate_plans(horizon_windows=1024, **common)]  # type: ignore[arg-type]
    assert "sqrt_factorization" in names
    too_long = candidate_plans(horizon_windows=sf.MAX_SQRT_HORIZON + 1, **common)  # type: ignore[arg-type]
    assert "sqrt_factorization" not in [p.option for p in too_long]
    keys = MAX_SQRT_STATE_VALUES // 1024 + 1
    too_wide = candidate_plans(horizon_windows=1024, key_count=keys, **common)  # type: ignore[arg-type]
    assert "sqrt_factorization" not in [p.option for p in too_wide]


def test_single_draw_intervals_are_the_mechanisms_exact_ones() -> None:
    plan = laplace_plan("per_window_sum", 10, 3)
    assert plan.ci95(1) == plan.mechanism.ci95()
    tree = laplace_plan("tree", 16, 3)
    for step in (1, 2, 4, 8, 16):
        assert tree.ci95(step) == tree.mechanism.ci95()
    assert tree.ci95(3) > tree.mechanism.ci95()
    assert laplace_plan("tree_honaker", 16, 3).ci95(1) == tree.mechanism.ci95()


def test_units_scale_the_released_figures() -> None:
    base = laplace_plan("tree_honaker", 100, 4)
    scaled = plan_continual(
        "tree_honaker",
        family="discrete_laplace",
        horizon_windows=100,
        l1_sensitivity=4,
        l2_sensitivity=4.0,
        epsilon=EPSILON,
        unit=0.25,
    )
    assert scaled.sd(77) == base.sd(77) * 0.25
    assert scaled.ci95(77) == base.ci95(77) * 0.25
    assert scaled.draw_scale == base.draw_scale * 0.25


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"option": "sqrt_factorization", "family": "discrete_laplace"}, "not available"),
        ({"horizon_windows": 1}, "between 2 and"),
        ({"horizon_windows": sf.MAX_SQRT_HORIZON * 2, "option": "sqrt_factorization"}, "at most"),
        ({"epsilon": 0.0}, "must be > 0"),
        ({"family": "discrete_gaussian", "delta": 0.0}, "0 < delta < 1"),
    ],
)
def test_bad_arguments(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {
        "option": "tree",
        "family": "discrete_gaussian" if "delta" not in kwargs else "discrete_laplace",
        "horizon_windows": 16,
        "l1_sensitivity": 1,
        "l2_sensitivity": 1.0,
        "epsilon": 1.0,
        "delta": 1e-6,
    }
    args.update(kwargs)
    option = args.pop("option")
    with pytest.raises(ValueError, match=message):
        plan_continual(option, **args)  # type: ignore[arg-type]
