"""Break 10 of issue 12: absurd privacy numbers are refused at load with the allowed range.

On main δ = 0.9 passed (``plan`` printed a horizon δ of 21.6), ε = 5e-324 crashed ``plan``
and the first release, ε = 1e-300 saturated releases at 2^63−1, and k = 1e18 hung. Every
setting inside the limits plans (no hang, no crash) and releases values far inside int64.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml

from stream_dp.cli.main import main
from stream_dp.config import parse_config
from stream_dp.config.model import (
    MAX_CONTRIBUTIONS,
    MAX_DELTA,
    MAX_HORIZON_WINDOWS,
    MIN_EPSILON,
    UNSAFE_TEST_MODE_ENV,
)
from stream_dp.errors import ConfigError
from stream_dp.privacy.planner import MAX_NOISE_SCALE_UNITS, plan_config
from stream_dp.privacy.release import KeyAggregate, release_query


def _data(
    *, privacy: dict[str, Any] | None = None, bounds: dict[str, Any] | None = None, **query: Any
) -> dict[str, Any]:
    q: dict[str, Any] = {"name": "visits", "group_by": ["domain"], "epsilon": 1.0, "delta": 1e-6}
    q.update(query)
    return {
        "privacy": {"epsilon_per_window": 1.0, "delta_per_window": 1e-6, **(privacy or {})},
        "bounds": {"max_contributions_per_window": 40, **(bounds or {})},
        "queries": [q],
    }


def _plan_exit(tmp_path: Path, data: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    assert main(["plan", "--config", str(path)]) == 2
    return capsys.readouterr().err


def test_epsilon_5e_324_is_refused_at_load_not_a_crash_in_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _plan_exit(
        tmp_path,
        _data(privacy={"epsilon_per_window": 5e-324}, epsilon=5e-324),
        capsys,
    )
    assert "privacy.epsilon_per_window" in err
    assert f"[{MIN_EPSILON:g}, 100]" in err


def test_epsilon_1e_300_is_refused_rather_than_saturating_releases() -> None:
    with pytest.raises(ConfigError, match=r"queries\[0\]\.epsilon = 1e-300.*\[0\.001, 100\]"):
        parse_config(_data(epsilon=1e-300))


def test_k_1e18_is_refused_at_load_rather_than_hanging() -> None:
    with pytest.raises(ConfigError, match=r"bounds\.max_contributions_per_window.*100000"):
        parse_config(_data(bounds={"max_contributions_per_window": 10**18}))


def test_delta_0_9_is_refused_with_the_allowed_range(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _plan_exit(tmp_path, _data(privacy={"delta_per_window": 0.9}, delta=0.9), capsys)
    assert "privacy.delta_per_window" in err
    assert f"{MAX_DELTA:g}]" in err and "no privacy guarantee" in err


@pytest.mark.parametrize(
    ("data", "field", "hint"),
    [
        (_data(delta=2e-3), "queries[0].delta", "1e-100, 0.001"),
        (_data(privacy={"delta_per_window": 1e-300}, delta=1e-300), "delta", "numerically zero"),
        (_data(epsilon=float("inf")), "queries[0].epsilon", "finite"),
        (_data(privacy={"epsilon_per_window": 200.0}, epsilon=150.0), "epsilon", "no meaningful"),
        (_data(bounds={"max_keys_per_user": 10**6}), "bounds.max_keys_per_user", "100000"),
        (_data(bounds={"max_contributions_per_key": 10**6}), "max_contributions_per_key", "100000"),
        (_data(privacy={"horizon_windows": 10**7}), "privacy.horizon_windows", "1000000"),
        (_data(selection_epsilon_share=1e-9), "selection_epsilon_share", "0.01"),
        (_data(mean_count_share=0.999), "mean_count_share", "0.99"),
        (
            _data(statistic="sum", value_field="v", lower=0, upper=1e9, granularity=1e-3),
            "query visits",
            "granularity",
        ),
        (
            _data(
                epsilon=MIN_EPSILON,
                privacy={"epsilon_per_window": MIN_EPSILON},
                bounds={"max_contributions_per_window": MAX_CONTRIBUTIONS},
                statistic="sum",
                value_field="v",
                lower=0,
                upper=1e4,
                granularity=1,  # one user moves the sum by 1e9 units; half of ε is for noise
            ),
            "noise scale",
            "raise epsilon",
        ),
    ],
    ids=[
        "query-delta-above-ceiling",
        "delta-numerically-zero",
        "epsilon-infinite",
        "epsilon-above-100",
        "l0-ceiling",
        "linf-ceiling",
        "horizon-ceiling",
        "tiny-selection-share",
        "extreme-mean-share",
        "sum-units-times-k",
        "noise-scale-ceiling",
    ],
)
def test_out_of_range_settings_are_refused_with_what_to_change(
    data: dict[str, Any], field: str, hint: str
) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert field in str(err.value)
    assert hint in str(err.value)


def test_limits_are_inclusive_and_unsafe_test_mode_still_lifts_the_epsilon_ceiling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parse_config(
        _data(
            privacy={
                "epsilon_per_window": MIN_EPSILON,
                "delta_per_window": MAX_DELTA,
                "horizon_windows": MAX_HORIZON_WINDOWS,
                "max_epsilon_per_horizon": 1e4,
            },
            bounds={"max_contributions_per_window": MAX_CONTRIBUTIONS},
            epsilon=MIN_EPSILON,
            delta=MAX_DELTA,
        )
    )
    monkeypatch.setenv(UNSAFE_TEST_MODE_ENV, "1")
    config = parse_config(
        _data(
            privacy={
                "unsafe_test_mode": True,
                "epsilon_per_window": 2e6,
                "max_epsilon_per_horizon": 1e12,
            },
            epsilon=2e6,
        )
    )
    assert plan_config(config.spec()).queries[0].noise_scale < 1e-4
    with pytest.raises(ConfigError, match=r"\[0\.001, 100\]"):  # the floor stays
        parse_config(_data(privacy={"unsafe_test_mode": True}, epsilon=1e-4))


STRATEGIES = [
    "truncated_geometric",
    "laplace_threshold",
    "gaussian_threshold",
    "count_threshold",
    "weighted_gaussian",
]
MECHANISMS = ["discrete_laplace", "discrete_gaussian"]


@pytest.mark.parametrize(
    ("selection", "mechanism", "l0", "delta"),
    list(itertools.product(STRATEGIES, MECHANISMS, [1, MAX_CONTRIBUTIONS], [MAX_DELTA, 1e-100])),
)
def test_every_corner_of_the_allowed_range_plans_and_releases_inside_int64(
    selection: str, mechanism: str, l0: int, delta: float
) -> None:
    """ε at the floor, k and L0 at the ceiling, δ at either end: on main such corners hung
    (linear searches over millions of user counts) or overflowed. The pytest timeout is the
    hang guard; the released values must stay far inside int64 (2^63 ≈ 9.2e18)."""
    config = parse_config(
        _data(
            privacy={"epsilon_per_window": MIN_EPSILON, "delta_per_window": delta},
            bounds={"max_contributions_per_window": MAX_CONTRIBUTIONS, "max_keys_per_user": l0},
            epsilon=MIN_EPSILON,
            delta=delta,
            selection=selection,
            mechanism=mechanism,
        )
    )
    (plan,) = plan_config(config.spec()).queries
    plan.describe()  # computes every milestone (keep-probability searches included)
    assert plan.noise_scale <= MAX_NOISE_SCALE_UNITS
    release = release_query({("a",): KeyAggregate(10**6, 10**5, 0)}, plan)
    for value in release.values:
        assert abs(value.value) < 2**62


@pytest.mark.parametrize("spelling", ["Weighted_Gaussian", "weighted-gaussian", "weighted", True])
def test_a_selection_strategy_is_spelled_exactly_or_refused_with_the_choices(
    spelling: object,
) -> None:
    """A near-miss spelling must not fall back to another rule (whose threshold was planned
    for distinct users while the data carries weights, or the reverse)."""
    with pytest.raises(ConfigError, match="weighted_gaussian"):
        parse_config(_data(selection=spelling))
