"""A released mean lies in [lower, upper], and its stated 95% interval holds even when the
noisy count is ≤ 0 (issue 12, utility fixes). The noise draws are replaced by fixed values
where a test needs a particular draw; the last test uses real noise."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from scipy.stats import binomtest

from stream_dp.config import BoundsConfig, QueryConfig
from stream_dp.privacy.mechanisms import DiscreteLaplace
from stream_dp.privacy.planner import QueryPlan, plan_query
from stream_dp.privacy.release import KeyAggregate, release_query

BOUNDS = BoundsConfig(max_contributions_per_window=5)
LOWER, UPPER = 2.0, 10.0


def _plan(**kw: Any) -> QueryPlan:
    base: dict[str, Any] = {
        "name": "m",
        "statistic": "mean",
        "group_by": ["domain"],
        "value_field": "v",
        "lower": LOWER,
        "upper": UPPER,
        "granularity": 0.5,
        "epsilon": 1.0,
        "keys": {"domain": ["a"]},
    }
    base.update(kw)
    return plan_query(QueryConfig(**base).spec(), BOUNDS.spec())


def _fixed_draws(monkeypatch: pytest.MonkeyPatch, noisy_sum: int, noisy_count: int) -> None:
    """The next release draws this noisy sum (in units of 0.5) and this noisy count."""
    draws: Iterator[list[int]] = iter([[noisy_sum], [noisy_count]])
    monkeypatch.setattr(DiscreteLaplace, "sample_array", lambda self, values: np.array(next(draws)))


@pytest.mark.parametrize(
    ("noisy_sum", "noisy_count", "released"),
    [(400, 2, UPPER), (-400, 2, LOWER), (13, 1, 6.5), (-9, 3, LOWER)],
)
def test_released_mean_is_clamped_to_lower_upper(
    monkeypatch: pytest.MonkeyPatch, noisy_sum: int, noisy_count: int, released: float
) -> None:
    """On main a noisy ratio 400·0.5/2 = 100 was released for values known to be ≤ 10."""
    _fixed_draws(monkeypatch, noisy_sum, noisy_count)
    (value,) = release_query({("a",): KeyAggregate(2, 2, 12)}, _plan()).values
    assert value.value == released
    assert value.ci95 <= UPPER - LOWER


@pytest.mark.parametrize("noisy_count", [0, -1, -40])
def test_mean_interval_is_the_whole_range_when_the_noisy_count_is_not_positive(
    monkeypatch: pytest.MonkeyPatch, noisy_count: int
) -> None:
    """With a noisy count ≤ 0 the ratio means nothing: main stated the interval of a count
    of 1; now the interval is [lower, upper] itself (upper − lower around any value in it).
    At ε = 50 the interval of a noisy count of 1 is narrower than the range (checked first),
    so the interval of a count of 1 stated for a count ≤ 0 would fail the last assert."""
    plan = _plan(epsilon=50.0)
    _fixed_draws(monkeypatch, 7, 1)
    (at_one,) = release_query({("a",): KeyAggregate(1, 1, 8)}, plan).values
    assert at_one.ci95 < UPPER - LOWER
    _fixed_draws(monkeypatch, 7, noisy_count)
    (value,) = release_query({("a",): KeyAggregate(1, 1, 8)}, plan).values
    assert LOWER <= value.value <= UPPER
    assert value.ci95 == UPPER - LOWER


def test_mean_of_tiny_counts_stays_in_range_and_its_interval_covers_the_truth() -> None:
    """20,000 keys of one user with value 4 (8 units), real noise at ε = 0.2: noisy counts
    are often ≤ 0. Every value must lie in [lower, upper] (main: ~all far outside), and the
    interval must cover 4 at least 95% of the time: one-sided exact binomial test,
    false failure ≤ 1e-7 when coverage is ≥ 95%."""
    n = 20_000
    p = _plan(epsilon=0.2, keys={"domain": list(range(n))})
    out = release_query({(i,): KeyAggregate(1, 1, 8) for i in range(n)}, p)
    values = [v.value for v in out.values]
    assert min(values) >= LOWER and max(values) <= UPPER
    covered = sum(abs(v.value - 4.0) <= v.ci95 + 1e-9 for v in out.values)
    assert binomtest(covered, n, 0.95, alternative="less").pvalue > 1e-7


def test_mean_interval_and_scale_shrink_as_the_noisy_count_grows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The mean's noise is the sum's over the noisy count: twice the count, half the scale
    and half the 95% half-width (below the whole range here)."""
    released = []
    for noisy_count in (1000, 2000):
        _fixed_draws(monkeypatch, 12 * noisy_count, noisy_count)
        (value,) = release_query({("a",): KeyAggregate(2, 2, 12)}, _plan()).values
        released.append(value)
    first, second = released
    assert 0 < first.ci95 < UPPER - LOWER
    assert second.ci95 == pytest.approx(first.ci95 / 2, rel=1e-12)
    assert second.noise_scale == pytest.approx(first.noise_scale / 2, rel=1e-12)


def test_a_released_sum_states_the_noise_scale_of_its_plan() -> None:
    plan = _plan(statistic="sum")
    (value,) = release_query({("a",): KeyAggregate(2, 2, 12)}, plan).values
    assert value.noise_scale == plan.noise[0].scale > 0
    assert value.ci95 == plan.noise[0].ci95


@pytest.mark.parametrize(("noisy_sum", "released", "clamped"), [(-6, 0.0, True), (8, 2.0, False)])
def test_a_clamped_mean_says_it_was_clamped(
    monkeypatch: pytest.MonkeyPatch, noisy_sum: int, released: float, clamped: bool
) -> None:
    """With clamp_negative a negative noisy mean is released as 0 and flagged (the sink's
    NOT NULL boolean column): a reader must be told the 0 is not the noisy value."""
    _fixed_draws(monkeypatch, noisy_sum, 2)  # a mean of ±6·0.5/2 or 8·0.5/2
    plan = _plan(lower=-4.0, upper=10.0, clamp_negative=True)
    (value,) = release_query({("a",): KeyAggregate(2, 2, 1)}, plan).values
    assert value.value == released
    assert value.clamped is clamped


def test_a_gaussian_mean_splits_epsilon_and_delta_between_its_sum_and_count() -> None:
    """The two noisy components of a mean are composed: their (ε, δ) add up to the query's,
    and each Gaussian σ is calibrated to its own share (σ from (ε_i, δ_i) by zCDP)."""
    from stream_dp.privacy.calibration import zcdp_rho

    plan = _plan(mechanism="discrete_gaussian", delta=1e-6)
    assert [c.target for c in plan.noise] == ["sum", "count"]
    assert sum(c.epsilon for c in plan.noise) == pytest.approx(plan.epsilon)
    assert sum(c.delta for c in plan.noise) == pytest.approx(plan.delta)
    for c in plan.noise:
        assert 0 < c.delta < plan.delta
        assert c.rho == pytest.approx(zcdp_rho(c.epsilon, c.delta))


@pytest.mark.parametrize(("noisy_sum", "released"), [(0, 0.0), (1, 0.25), (-1, 0.0)])
def test_clamp_negative_flags_only_a_mean_that_was_negative(
    monkeypatch: pytest.MonkeyPatch, noisy_sum: int, released: float
) -> None:
    """``clamped`` says a negative value was replaced by 0: a mean of exactly 0, or
    between 0 and 1, is released as it is and not flagged."""
    _fixed_draws(monkeypatch, noisy_sum, 2)
    plan = _plan(lower=-10.0, upper=10.0, clamp_negative=True)
    (value,) = release_query({("a",): KeyAggregate(events=2, users=2, value_sum=0)}, plan).values
    assert (value.value, value.clamped) == (released, noisy_sum < 0)


def test_clamp_negative_flags_only_a_count_that_was_negative(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    draws = iter([[0, -1, 1]])
    monkeypatch.setattr(DiscreteLaplace, "sample_array", lambda self, values: np.array(next(draws)))
    plan = plan_query(
        QueryConfig(
            name="c",
            group_by=["domain"],
            epsilon=1.0,
            keys={"domain": ["a", "b", "c"]},
            clamp_negative=True,
        ).spec(),
        BOUNDS.spec(),
    )
    released = release_query({}, plan).values
    assert [(v.value, v.clamped) for v in released] == [(0, False), (0, True), (1, False)]
