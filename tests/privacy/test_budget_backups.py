"""The accountant's run-time refusals, tested directly (issue 37).

The configuration checks refuse queries whose shares overdraw a window or a horizon, so with
one unchanged configuration the run-time accountant never has to refuse anything: its
refusals are the backup for what the load-time checks cannot see (a ledger restored from a
deployment with other shares, charges restored from the ledger, windows released elsewhere).
Each test here charges the accountant itself, so a backup that stopped working is seen
even while the load-time checks hide it. Everything is exact arithmetic.
"""

from __future__ import annotations

import pytest

from stream_dp.errors import BudgetExceededError
from stream_dp.privacy.budget import BudgetAccountant

SIZE_S = 3600
DELTA_W = 1e-6


def _accountant(*, horizon_windows: int = 3, cap: float = 2.5) -> BudgetAccountant:
    return BudgetAccountant(
        window_size_s=SIZE_S,
        epsilon_per_window=1.0,
        delta_per_window=DELTA_W,
        horizon_windows=horizon_windows,
        max_epsilon_per_horizon=cap,
    )


def test_a_charge_that_overdraws_only_delta_is_refused_and_changes_nothing() -> None:
    """ε to spare, δ not: the charge is refused, and the window's spend is unchanged."""
    acc = _accountant()
    acc.charge(0, "a", 0.1, 6e-7)
    assert not acc.can_charge(0, "b", 0.1, 5e-7)  # 6e-7 + 5e-7 > 1e-6; ε 0.2 of 1.0
    with pytest.raises(BudgetExceededError) as refused:
        acc.charge(0, "b", 0.1, 5e-7)
    assert str(refused.value) == (
        "charging query b (ε=0.1, δ=5e-07) to window 0 would exceed a budget: window has "
        "spent ε=0.1, δ=6e-07 of (1, 1e-06); horizon cap 2.5"
    )
    assert acc.window_spent(0) == (0.1, 6e-7)
    assert acc.query_spent(0, "b") == (0.0, 0.0)
    # the rest of the δ budget still fits, exactly up to it
    assert acc.charge(0, "c", 0.1, 4e-7).delta == 4e-7
    assert acc.window_spent(0)[0] == pytest.approx(0.2, rel=1e-15)
    assert acc.window_spent(0)[1] == 1e-6
    assert not acc.can_charge(0, "d", 0.0, 1e-12)  # δ exhausted, ε 0.8 left
    assert acc.can_charge(0, "d", 0.8, 0.0)
    # another window's δ is its own
    assert acc.can_charge(SIZE_S, "b", 0.1, 1e-6)


def test_a_restored_charge_s_delta_counts_against_the_window() -> None:
    """A charge read back from the ledger (``record``) counts its δ as a charge made here
    does: a later charge that overdraws only δ is refused."""
    acc = _accountant()
    acc.record(0, "restored", 0.0, 7e-7)
    assert acc.window_spent(0) == (0.0, 7e-7)
    assert acc.query_spent(0, "restored") == (0.0, 7e-7)
    assert not acc.can_charge(0, "a", 0.1, 4e-7)
    assert acc.can_charge(0, "a", 0.1, 3e-7)


def test_the_horizon_rolls_over_exactly_when_a_window_leaves_it() -> None:
    """Horizons of 3 windows, a cap of 2, windows 0 and 1 charged 1 each: every horizon
    holding window 2 includes {0, 1, 2}, which is full; window 3's horizons hold at most
    window 1's charge, so window 3 may spend exactly 1 more. A charge counts in every horizon
    that contains it, also those ending after it (window 2, between charged windows)."""
    acc = _accountant(cap=2.0)
    acc.charge(0, "a", 1.0, 0.0)
    acc.charge(SIZE_S, "a", 1.0, 0.0)
    assert acc.horizon_spent(2 * SIZE_S) == 2.0
    assert not acc.can_charge(2 * SIZE_S, "a", 0.01, 0.0)
    assert acc.can_charge(2 * SIZE_S, "a", 0.0, 0.0)
    assert not acc.can_charge(3 * SIZE_S, "a", 1.01, 0.0)  # {1, 2, 3}: 1 + 1.01
    acc.charge(3 * SIZE_S, "a", 1.0, 0.0)
    assert acc.horizon_spent(3 * SIZE_S) == 2.0  # window 0 left; windows 1 and 3 count
    assert acc.horizon_spent(4 * SIZE_S) == 1.0  # window 1 left too
    assert acc.horizon_spent(6 * SIZE_S) == 0.0  # and window 3
    # window 2 now also lies in {1, 2, 3} and {2, 3, 4}: still nothing fits
    assert not acc.can_charge(2 * SIZE_S, "b", 0.01, 0.0)
    # window 4: {2, 3, 4}, {3, 4, 5} hold window 3's 1, {4, 5, 6} nothing
    assert acc.can_charge(4 * SIZE_S, "a", 1.0, 0.0)
    assert not acc.can_charge(4 * SIZE_S, "a", 1.01, 0.0)
    acc.charge(5 * SIZE_S, "a", 1.0, 0.0)
    # now {3, 4, 5} holds 2: window 4 is full, window 6 ({4, 5, 6}: 1) is not
    assert not acc.can_charge(4 * SIZE_S, "a", 0.01, 0.0)
    assert acc.can_charge(6 * SIZE_S, "a", 1.0, 0.0)
    assert not acc.can_charge(6 * SIZE_S, "a", 1.01, 0.0)
