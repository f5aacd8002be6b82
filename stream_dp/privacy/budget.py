"""Budget accounting by basic composition (PRIVACY.md, "Budget").

Two checks run when the configuration loads: the queries of one window must fit the
window budget (ε_w, δ_w), and a user's loss over any rolling horizon of windows must fit
``max_epsilon_per_horizon``. At run time :class:`BudgetAccountant` records what each window
actually spent, refuses a charge that would overdraw, and reports the horizon totals.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from stream_dp.errors import BudgetExceededError

#: Relative slack for float sums: 0.1 + 0.2 + 0.7 must fit a budget of 1.0.
_REL_TOLERANCE = 1e-9


@dataclass(frozen=True)
class QueryShare:
    """What one query draws from each window's budget."""

    query: str
    epsilon: float
    delta: float


def _fits(total: float, budget: float) -> bool:
    return total <= budget * (1 + _REL_TOLERANCE) + 1e-15


def _listing(shares: Iterable[QueryShare], attr: str) -> str:
    return ", ".join(f"{s.query}={getattr(s, attr):g}" for s in shares)


def check_window_budget(
    shares: Sequence[QueryShare], *, epsilon_per_window: float, delta_per_window: float
) -> None:
    """Refuse queries whose ε or δ shares add up to more than one window's budget."""
    total_epsilon = math.fsum(s.epsilon for s in shares)
    total_delta = math.fsum(s.delta for s in shares)
    if not _fits(total_epsilon, epsilon_per_window):
        raise BudgetExceededError(
            f"queries spend ε = {total_epsilon:g} per window ({_listing(shares, 'epsilon')}) "
            f"but privacy.epsilon_per_window is {epsilon_per_window:g}; lower the queries' "
            "epsilon or raise the window budget"
        )
    if not _fits(total_delta, delta_per_window):
        raise BudgetExceededError(
            f"queries spend δ = {total_delta:g} per window ({_listing(shares, 'delta')}) "
            f"but privacy.delta_per_window is {delta_per_window:g}; lower the queries' "
            "delta or raise the window budget"
        )


def check_horizon_budget(
    shares: Sequence[QueryShare], *, horizon_windows: int, max_epsilon_per_horizon: float
) -> None:
    """Refuse a configuration whose windows would exceed the horizon budget (basic composition)."""
    per_window = math.fsum(s.epsilon for s in shares)
    total = per_window * horizon_windows
    if not _fits(total, max_epsilon_per_horizon):
        raise BudgetExceededError(
            f"{horizon_windows} windows × ε {per_window:g} per window = {total:g} over the "
            f"horizon, but privacy.max_epsilon_per_horizon is {max_epsilon_per_horizon:g}; "
            "lower the queries' epsilon, shorten privacy.horizon_windows or raise the cap"
        )


@dataclass(frozen=True)
class Charge:
    window_start_s: int
    query: str
    epsilon: float
    delta: float


class BudgetAccountant:
    """Per-window ledger of (ε, δ) spent per query, with the rolling horizon total.

    Windows are identified by their start in seconds; the horizon ending at window ``w``
    covers the ``horizon_windows`` windows ``w - (h-1)·S … w``.
    """

    def __init__(
        self,
        *,
        window_size_s: int,
        epsilon_per_window: float,
        delta_per_window: float,
        horizon_windows: int,
        max_epsilon_per_horizon: float,
    ) -> None:
        self.window_size_s = window_size_s
        self.epsilon_per_window = epsilon_per_window
        self.delta_per_window = delta_per_window
        self.horizon_windows = horizon_windows
        self.max_epsilon_per_horizon = max_epsilon_per_horizon
        self._spent: dict[int, dict[str, tuple[float, float]]] = {}

    def window_spent(self, window_start_s: int) -> tuple[float, float]:
        """(ε, δ) already spent in one window, all queries together."""
        charges = self._spent.get(window_start_s, {}).values()
        return math.fsum(e for e, _ in charges), math.fsum(d for _, d in charges)

    def query_spent(self, window_start_s: int, query: str) -> tuple[float, float]:
        return self._spent.get(window_start_s, {}).get(query, (0.0, 0.0))

    def horizon_spent(self, window_start_s: int) -> float:
        """Σ ε over the horizon that ends with this window."""
        first = window_start_s - (self.horizon_windows - 1) * self.window_size_s
        return math.fsum(
            self.window_spent(w)[0] for w in self._spent if first <= w <= window_start_s
        )

    def _horizon_totals_with(self, window_start_s: int, epsilon: float) -> float:
        """Worst rolling-horizon total over every horizon that contains this window."""
        worst = 0.0
        for h in range(self.horizon_windows):
            end = window_start_s + h * self.window_size_s
            worst = max(worst, self.horizon_spent(end))
        return worst + epsilon

    def can_charge(self, window_start_s: int, query: str, epsilon: float, delta: float) -> bool:
        if query in self._spent.get(window_start_s, {}):
            return False
        eps, dlt = self.window_spent(window_start_s)
        return (
            _fits(eps + epsilon, self.epsilon_per_window)
            and _fits(dlt + delta, self.delta_per_window)
            and _fits(
                self._horizon_totals_with(window_start_s, epsilon), self.max_epsilon_per_horizon
            )
        )

    def charge(self, window_start_s: int, query: str, epsilon: float, delta: float) -> Charge:
        """Record a query's spend in a window; refuse it if any budget would be exceeded."""
        if query in self._spent.get(window_start_s, {}):
            raise BudgetExceededError(
                f"query {query} already spent its share of window {window_start_s}; "
                "a window's release is computed once"
            )
        if not self.can_charge(window_start_s, query, epsilon, delta):
            eps, dlt = self.window_spent(window_start_s)
            raise BudgetExceededError(
                f"charging query {query} (ε={epsilon:g}, δ={delta:g}) to window "
                f"{window_start_s} would exceed a budget: window has spent ε={eps:g}, "
                f"δ={dlt:g} of ({self.epsilon_per_window:g}, {self.delta_per_window:g}); "
                f"horizon cap {self.max_epsilon_per_horizon:g}"
            )
        self._spent.setdefault(window_start_s, {})[query] = (epsilon, delta)
        return Charge(window_start_s, query, epsilon, delta)

    def record(self, window_start_s: int, query: str, epsilon: float, delta: float) -> None:
        """Restore a charge read back from the release ledger (already validated when made)."""
        self._spent.setdefault(window_start_s, {})[query] = (epsilon, delta)
