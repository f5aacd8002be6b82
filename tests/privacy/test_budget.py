"""Budget accounting: exact arithmetic, refusals that name the numbers (invariant 4)."""

from __future__ import annotations

import pytest

from stream_dp.errors import BudgetExceededError
from stream_dp.privacy.budget import (
    BudgetAccountant,
    QueryShare,
    check_horizon_budget,
    check_window_budget,
)


def _accountant(**kw: float) -> BudgetAccountant:
    params = {
        "window_size_s": 3600,
        "epsilon_per_window": 1.0,
        "delta_per_window": 1e-6,
        "horizon_windows": 3,
        "max_epsilon_per_horizon": 2.5,
    }
    params.update(kw)
    return BudgetAccountant(**params)  # type: ignore[arg-type]


def test_shares_that_sum_to_the_budget_fit() -> None:
    shares = [QueryShare("a", 0.1, 0), QueryShare("b", 0.2, 5e-7), QueryShare("c", 0.7, 5e-7)]
    check_window_budget(shares, epsilon_per_window=1.0, delta_per_window=1e-6)
    check_horizon_budget(shares, horizon_windows=24, max_epsilon_per_horizon=24.0)


def test_window_refusal_names_queries_and_numbers() -> None:
    shares = [QueryShare("visits", 0.6, 0), QueryShare("users", 0.5, 0)]
    with pytest.raises(BudgetExceededError) as err:
        check_window_budget(shares, epsilon_per_window=1.0, delta_per_window=1e-6)
    assert "ε = 1.1" in str(err.value) and "visits=0.6" in str(err.value)
    assert "epsilon_per_window is 1" in str(err.value)


def test_delta_refusal() -> None:
    with pytest.raises(BudgetExceededError, match="δ = 2e-06"):
        check_window_budget(
            [QueryShare("a", 0.1, 1e-6), QueryShare("b", 0.1, 1e-6)],
            epsilon_per_window=1,
            delta_per_window=1e-6,
        )


def test_horizon_refusal_names_numbers() -> None:
    with pytest.raises(BudgetExceededError, match=r"25 windows × ε 1 per window = 25"):
        check_horizon_budget(
            [QueryShare("a", 1.0, 0)], horizon_windows=25, max_epsilon_per_horizon=24
        )


def test_accountant_exact_window_and_horizon_totals() -> None:
    acc = _accountant()
    acc.charge(0, "a", 0.25, 1e-7)
    acc.charge(0, "b", 0.5, 0)
    assert acc.window_spent(0) == (0.75, 1e-7)
    assert acc.query_spent(0, "a") == (0.25, 1e-7)
    acc.charge(3600, "a", 1.0, 0)
    assert acc.horizon_spent(3600) == 1.75
    acc.charge(7200, "a", 0.75, 0)
    assert acc.horizon_spent(7200) == 2.5  # windows 0, 3600, 7200
    assert acc.horizon_spent(10800) == 1.75  # window 0 has left the horizon


def test_accountant_refuses_overdraw_and_double_charge() -> None:
    acc = _accountant()
    acc.charge(0, "a", 0.75, 0)
    with pytest.raises(BudgetExceededError, match="already spent"):
        acc.charge(0, "a", 0.1, 0)
    with pytest.raises(BudgetExceededError, match="would exceed"):
        acc.charge(0, "b", 0.5, 0)  # window budget 1.0
    assert not acc.can_charge(0, "b", 0.5, 0)
    assert acc.window_spent(0) == (0.75, 0)


def test_accountant_refuses_horizon_overdraw_in_any_rolling_horizon() -> None:
    acc = _accountant(max_epsilon_per_horizon=2.0)
    acc.charge(7200, "a", 1.0, 0)
    acc.charge(0, "a", 1.0, 0)
    # Window 3600 lies in the horizon {0, 3600, 7200}, which already holds 2.0.
    assert not acc.can_charge(3600, "a", 0.1, 0)
    # Window 10800's horizons are {3600,7200,10800} (1.0), {7200..14400}, {10800..18000}.
    assert acc.can_charge(10800, "a", 1.0, 0)


def test_restored_charges_count() -> None:
    acc = _accountant()
    acc.record(0, "a", 1.0, 1e-6)
    assert not acc.can_charge(0, "b", 0.01, 0)


def test_accountant_state_and_cost_do_not_grow_with_history() -> None:
    """Per-minute windows over a one-day horizon: the old accountant scanned every window
    ever charged for each horizon sum, in a loop over the horizon — seconds per charge after
    a day, and growing (issue 13, item 12). It now keeps about two horizons of windows, and
    its horizon totals stay exact."""
    h = 1440
    acc = _accountant(
        window_size_s=60, horizon_windows=h, max_epsilon_per_horizon=float(h), epsilon_per_window=1
    )
    for w in range(5 * h):
        acc.charge(w * 60, "q", 1.0, 0.0)
    assert len(acc) <= 3 * h + 16  # pruned in chunks: about two to three horizons kept
    last = (5 * h - 1) * 60
    assert acc.horizon_spent(last) == h
    assert not acc.can_charge(last, "other", 0.5, 0.0)  # window full
    # One more window: the rolling horizon is exactly full, so nothing more fits in it.
    assert acc.can_charge(last + 60, "q", 1.0, 0.0)
    assert not acc.can_charge(last + 60, "q", 1.5, 0.0)


def test_horizon_counts_windows_released_elsewhere_at_the_configured_epsilon() -> None:
    """Other workers release the windows this one did not: with every covered window
    released, a window nothing was charged to here still spent the per-window ε."""
    acc = _accountant()
    acc.record(7200, "a", 0.5, 0.0)  # the only window this worker knows
    assert acc.horizon_spent(7200) == 0.5
    assert acc.horizon_spent(7200, first_window_s=0, per_window_epsilon=0.75) == 0.5 + 2 * 0.75
    assert acc.horizon_spent(7200, first_window_s=3600, per_window_epsilon=0.75) == 0.5 + 0.75


def test_a_query_charged_in_a_window_cannot_be_charged_there_again() -> None:
    """Each query's share of a window is spent once, even with budget to spare; the same
    query in the next window is a new charge."""
    acc = _accountant()
    charge = acc.charge(0, "a", 0.25, 0)
    assert (charge.window_start_s, charge.query, charge.epsilon, charge.delta) == (0, "a", 0.25, 0)
    assert not acc.can_charge(0, "a", 0.25, 0)
    assert acc.can_charge(0, "b", 0.25, 0)
    assert acc.can_charge(3600, "a", 0.25, 0)
