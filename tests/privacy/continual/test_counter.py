"""The streaming counters: unbiased, the noise enters with exactly the planned coefficients,
and a restore from persisted draws gives identical values without drawing anything again."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from jsonschema import Draft202012Validator

from stream_dp.privacy.continual import binary_tree
from stream_dp.privacy.continual.counter import (
    ContinualStateError,
    WindowDraws,
    make_counter,
    merge_draws,
    restore_counter,
    split_draws,
)
from stream_dp.privacy.continual.planning import ContinualOption, ContinualPlan, plan_continual
from stream_dp.privacy.continual.sqrt_factorization import quantized_coefficients
from stream_dp.privacy.mechanisms import NoiseMechanism
from tests.privacy.continual.noise import FastNoise, Impulse, Recorder, forbidden

SCHEMA = json.loads(
    (
        Path(__file__).resolve().parents[3] / "stream_dp/privacy/continual/draws.schema.json"
    ).read_text(encoding="utf-8")
)
OPTIONS: list[tuple[ContinualOption, str]] = [
    ("per_window_sum", "discrete_laplace"),
    ("tree", "discrete_laplace"),
    ("tree_honaker", "discrete_laplace"),
    ("per_window_sum", "discrete_gaussian"),
    ("tree", "discrete_gaussian"),
    ("tree_honaker", "discrete_gaussian"),
    ("sqrt_factorization", "discrete_gaussian"),
]


def make_plan(option: ContinualOption, family: str, horizon: int) -> ContinualPlan:
    return plan_continual(
        option,
        family=family,  # type: ignore[arg-type]
        horizon_windows=horizon,
        l1_sensitivity=3,
        l2_sensitivity=3.0,
        epsilon=0.7,
        delta=1e-6 if family == "discrete_gaussian" else 0.0,
    )


def identity(mechanism: NoiseMechanism, values: np.ndarray) -> np.ndarray:
    return values.copy()


class Script:
    """Returns given noisy rows in order (another run's draws), checking the exact values."""

    def __init__(self, draws: list[WindowDraws], key_count: int) -> None:
        self.rows = [d.noisy for d in draws]
        self.key_count = key_count

    def __call__(self, mechanism: NoiseMechanism, values: np.ndarray) -> np.ndarray:
        noisy = self.rows.pop(0).reshape(-1)
        assert noisy.shape == values.shape
        return noisy.copy()


@pytest.mark.parametrize(("option", "family"), OPTIONS)
@pytest.mark.parametrize("horizon", [2, 13, 64])
def test_without_noise_the_running_totals_are_exact(
    option: ContinualOption, family: str, horizon: int
) -> None:
    plan = make_plan(option, family, horizon)
    rng = np.random.default_rng(3)
    totals = rng.integers(-50, 5000, size=(horizon, 6))
    counter = make_counter(plan, list("abcdef"), noise=identity)
    for t in range(horizon):
        step = counter.advance(totals[t])
        assert step.step == t + 1
        assert step.values.tolist() == totals[: t + 1].sum(axis=0).tolist()


@pytest.mark.parametrize(("option", "family"), OPTIONS)
@pytest.mark.parametrize("horizon", [16, 45])
def test_noise_enters_with_the_planned_coefficients_at_every_step(
    option: ContinualOption, family: str, horizon: int
) -> None:
    """Key k's k-th draw is a large impulse M and every other draw 0, on zero data, so key
    k's running total at t is M × (coefficient of draw k at t): Σ_k coef² and Σ_k coef⁴ are
    then the exact variance and fourth-cumulant factors the plan predicts."""
    plan = make_plan(option, family, horizon)
    draws = plan.draws_per_key()
    magnitude = 1 << (40 if option == "sqrt_factorization" else 30)
    counter = make_counter(plan, list(range(draws)), noise=Impulse(draws, magnitude))
    second, fourth = plan._moments
    for t in range(1, horizon + 1):
        values = counter.advance(np.zeros(draws, dtype=np.int64)).values
        coefficients = values / magnitude
        assert np.sum(coefficients**2) == pytest.approx(second[t - 1], rel=1e-6)
        assert np.sum(coefficients**4) == pytest.approx(fourth[t - 1], rel=1e-5)
        # no draw of a later step can matter yet
        completed = sum(plan_rows(plan, s) for s in range(1, t + 1))
        assert np.all(coefficients[completed:] == 0)


def plan_rows(plan: ContinualPlan, step: int) -> int:
    if plan.option in ("tree", "tree_honaker"):
        return binary_tree.completed_levels(step)
    return 1


@pytest.mark.parametrize(("option", "family"), OPTIONS)
@pytest.mark.parametrize("horizon", [1 + 1, 23, 32])
def test_restore_gives_identical_values_and_never_draws_again(
    option: ContinualOption, family: str, horizon: int
) -> None:
    plan = make_plan(option, family, horizon)
    keys = [("mail.com",), ("bank.com",), ("news.com",), ("x.org",)]
    rng = np.random.default_rng()
    totals = rng.integers(0, 1000, size=(horizon, len(keys)))
    recorder = Recorder(FastNoise())
    original = make_counter(plan, keys, noise=recorder)
    steps = [original.advance(totals[t]) for t in range(horizon)]
    expected_draws = len(keys) * sum(plan_rows(plan, t) for t in range(1, horizon + 1))
    assert recorder.draws == expected_draws and recorder.calls == horizon  # one call a window
    with pytest.raises(ContinualStateError, match="all released"):
        original.advance(totals[0])

    for cut in sorted({1, horizon // 2, horizon - 1}):
        # persisted as JSON and read back, in shuffled order
        persisted = [
            WindowDraws.from_json(json.loads(json.dumps(s.draws.to_json()))) for s in steps[:cut]
        ]
        restored = restore_counter(plan, keys, persisted[::-1], noise=forbidden)
        assert restored.values is not None
        assert np.array_equal(restored.values, steps[cut - 1].values)
        assert restored.counter.step == cut
        # continue with the original run's noise: every later value and draw is identical
        later = Script([s.draws for s in steps[cut:]], len(keys))
        restored.counter._noise = later
        for t in range(cut, horizon):
            again = restored.counter.advance(totals[t])
            assert np.array_equal(again.values, steps[t].values)
            assert again.draws == steps[t].draws
        assert later.rows == []


@pytest.mark.parametrize(("option", "family"), OPTIONS)
def test_a_crash_before_or_after_persisting_the_draws(option: ContinualOption, family: str) -> None:
    """kill -9 between the draw and the store write: the lost draw was never published, the
    window is drawn afresh from the persisted state. After the write: the restore derives
    exactly the values computed before the crash, with no draw."""
    horizon, keys = 12, ["a", "b"]
    plan = make_plan(option, family, horizon)
    totals = np.random.default_rng().integers(0, 300, size=(horizon, 2))
    counter = make_counter(plan, keys, noise=FastNoise())
    persisted = [counter.advance(totals[t]).draws for t in range(6)]
    lost = counter.advance(totals[6])  # crash before its draws reached the store

    recorder = Recorder(FastNoise())
    restart = restore_counter(plan, keys, persisted, noise=recorder).counter
    assert recorder.draws == 0
    redrawn = restart.advance(totals[6])
    assert recorder.draws == len(keys) * plan_rows(plan, 7)  # only step 7's nodes
    assert redrawn.step == lost.step == 7

    # crash after the draws of step 7 were persisted, before the ledger: same values
    again = restore_counter(plan, keys, [*persisted, redrawn.draws], noise=forbidden)
    assert again.values is not None and np.array_equal(again.values, redrawn.values)


def test_restore_refuses_what_does_not_fit() -> None:
    plan = make_plan("tree_honaker", "discrete_laplace", 8)
    counter = make_counter(plan, ["a", "b"], noise=FastNoise())
    draws = [counter.advance([1, 2]).draws for _ in range(4)]

    with pytest.raises(ContinualStateError, match="another plan or key list"):
        restore_counter(plan, ["a", "c"], draws)
    other = make_plan("tree_honaker", "discrete_laplace", 16)
    with pytest.raises(ContinualStateError, match="another plan or key list"):
        restore_counter(other, ["a", "b"], draws)
    with pytest.raises(ContinualStateError, match="expected the draws of step 2"):
        restore_counter(plan, ["a", "b"], [draws[0], draws[2]])
    changed = WindowDraws(draws[1].fingerprint, 2, draws[1].noisy + 1, draws[1].exact_totals)
    with pytest.raises(ContinualStateError, match="two different draws"):
        restore_counter(plan, ["a", "b"], [*draws, changed])
    assert restore_counter(plan, ["a", "b"], [*draws, draws[1]]).counter.step == 4
    no_exact = WindowDraws(draws[0].fingerprint, 1, draws[0].noisy, None)
    with pytest.raises(ContinualStateError, match="needs the exact totals"):
        restore_counter(plan, ["a", "b"], [no_exact])
    with pytest.raises(ContinualStateError, match="merge the parts"):
        restore_counter(plan, ["a", "b"], [split_draws(draws[0], 1)[0]])
    wrong_rows = WindowDraws(draws[1].fingerprint, 2, draws[1].noisy[:1], draws[1].exact_totals)
    with pytest.raises(ContinualStateError, match="needs 2 rows"):
        restore_counter(plan, ["a", "b"], [draws[0], wrong_rows])


def test_per_window_sum_persists_no_exact_totals() -> None:
    plan = make_plan("per_window_sum", "discrete_laplace", 5)
    counter = make_counter(plan, ["a"], noise=FastNoise())
    steps = [counter.advance([7]) for _ in range(5)]
    assert all(s.draws.exact_totals is None for s in steps)
    restored = restore_counter(plan, ["a"], [s.draws for s in steps]).values
    assert restored is not None and np.array_equal(restored, steps[-1].values)


def test_draws_records_match_their_schema_and_survive_splitting() -> None:
    validator = Draft202012Validator(SCHEMA)
    for option, family in OPTIONS:
        plan = make_plan(option, family, 8)
        counter = make_counter(plan, list(range(7)), noise=FastNoise())
        for _ in range(8):
            draws = counter.advance(np.arange(7)).draws
            validator.validate(draws.to_json())
            parts = split_draws(draws, 3)
            assert [p.key_count for p in parts] == [3, 3, 1]
            for part in parts:
                validator.validate(part.to_json())
            assert merge_draws(parts[::-1]) == draws
    for broken in ({"exact_totals": []}, {"fingerprint": "xyz"}, {"step": 0}, {"noisy": []}):
        assert not validator.is_valid(draws.to_json() | broken), broken
    with pytest.raises(ContinualStateError, match="gap or overlap"):
        merge_draws([parts[0], parts[2]])
    with pytest.raises(ContinualStateError, match="continual_draws"):
        WindowDraws.from_json({"kind": "ledger"})


def test_totals_are_checked() -> None:
    counter = make_counter(make_plan("tree", "discrete_laplace", 4), ["a", "b"], noise=identity)
    with pytest.raises(ValueError, match="expected 2 totals"):
        counter.advance([1])
    with pytest.raises(ValueError, match="integers"):
        counter.advance([1.5, 2])
    assert counter.advance(np.array([1.0, 2.0])).values.tolist() == [1, 2]
    with pytest.raises(ValueError, match="exceeds"):
        counter.advance([2**60, 0])
    assert counter.step == 1


def test_square_root_encodes_large_sums_exactly_at_every_step() -> None:
    """Issue 25: 6,200 users adding 10^7 each per window overflowed the fixed-point encoding
    (int64) at step 989 — ContinualStateError out of the release, and windows release in
    order, so nothing was released after it. The encoded values are exact integers now."""
    horizon, total = 1024, 6_200 * 10**7
    plan = make_plan("sqrt_factorization", "discrete_gaussian", horizon)
    c = quantized_coefficients(horizon).tolist()
    counter = make_counter(plan, ["a"], noise=identity)
    for t in range(1, horizon + 1):
        step = counter.advance([total])
        assert int(step.draws.noisy[0][0]) == total * sum(c[:t])  # Python integers: exact
        assert step.values.tolist() == [total * t]


def shift_by_seven(mechanism: NoiseMechanism, values: np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.int64) + 7


def test_square_root_values_beyond_int64_are_exact_in_draws_records_and_restores() -> None:
    horizon = 64
    plan = make_plan("sqrt_factorization", "discrete_gaussian", horizon)
    c = quantized_coefficients(horizon).tolist()
    big = 1 << 42  # the largest total a counter takes; × Σ ĉ over 64 steps exceeds int64
    counter = make_counter(plan, ["up", "down"], noise=shift_by_seven)
    validator = Draft202012Validator(SCHEMA)
    steps = [counter.advance([big, -big]) for _ in range(horizon)]
    last = steps[-1].draws
    encoded = big * sum(c)
    assert encoded > 2**63
    assert [int(v) for v in last.noisy[0]] == [encoded + 7, -encoded + 7]  # drawn, exactly
    record = last.to_json()
    assert record["noisy"] == [[str(encoded + 7), str(-encoded + 7)]]
    validator.validate(record)
    assert not validator.is_valid(record | {"noisy": [["12x"]]})
    again = WindowDraws.from_json(json.loads(json.dumps(record)))
    assert again == last
    parts = split_draws(last, 1)
    assert merge_draws([WindowDraws.from_json(p.to_json()) for p in parts]) == last
    restored = restore_counter(
        plan, ["up", "down"], [WindowDraws.from_json(s.draws.to_json()) for s in steps]
    )
    assert restored.values is not None
    assert restored.values.tolist() == steps[-1].values.tolist()
    assert abs(steps[-1].values[0] - big * horizon) <= 1  # +7 per draw moves it < 1 unit


def test_the_default_source_is_opendp() -> None:
    plan = make_plan("tree_honaker", "discrete_laplace", 8)
    counter = make_counter(plan, list(range(8)))
    values = [counter.advance([10] * 8).values.tolist() for _ in range(8)]
    assert all(isinstance(v, int) for row in values for v in row)
    # noise was added: each key's last value is exact with probability < 0.023 (sd ≈ 17.7),
    # all eight keys at once with probability < 1e-13
    assert values[-1] != [80] * 8
