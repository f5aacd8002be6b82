"""Near the rolling-horizon cap the accountant sums exactly the h windows of each horizon:
a charge that fits every horizon is accepted, however close two charges are outside one."""

from __future__ import annotations

from stream_dp.privacy.budget import BudgetAccountant

H = 3600


def _accountant() -> BudgetAccountant:
    return BudgetAccountant(
        window_size_s=H,
        epsilon_per_window=1.0,
        delta_per_window=1e-6,
        horizon_windows=3,
        max_epsilon_per_horizon=2.5,
    )


def test_a_charge_that_fits_every_horizon_of_three_windows_is_accepted_near_the_cap() -> None:
    acc = _accountant()
    acc.charge(0, "a", 1.0, 0)
    acc.charge(3 * H, "a", 1.0, 0)
    # Window 2's horizons {0,1,2}, {1,2,3}, {2,3,4} would hold 2.0 each; the five windows
    # 0…4 around it hold 3.0 > 2.5, so the exact per-horizon sums decide.
    assert acc.can_charge(2 * H, "a", 1.0, 0)
    acc.charge(2 * H, "a", 1.0, 0)
    assert acc.horizon_spent(2 * H) == 2.0 and acc.horizon_spent(3 * H) == 2.0
    assert not acc.can_charge(H, "a", 0.6, 0)  # {0,1,2} would hold 2.6
