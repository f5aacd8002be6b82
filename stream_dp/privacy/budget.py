"""Budget accounting by basic composition (docs/privacy.md#budget).

Two checks run when the configuration loads: the queries of one window must fit the
window budget (ε_w, δ_w), and a user's loss over any rolling horizon of windows must fit
``max_epsilon_per_horizon``. At run time :class:`BudgetAccountant` records what each window
actually spent, refuses a charge that would overdraw, and reports the horizon totals.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from stream_dp.errors import BudgetExceededError

#: The charge of the histograms that choose automatic bounds (``bounds: auto``), in budget
#: checks, the accountant and the ledger. Query names cannot start with "#".
BOUNDS_CHARGE = "#bounds"

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
    """Per-window record of (ε, δ) spent per query, with rolling-horizon totals.

    Windows are identified by their start in seconds; the horizon ending at window ``w``
    covers the ``horizon_windows`` windows ``w - (h-1)·S … w``. Cost is independent of
    history: windows that left every horizon a new charge could touch are pruned (about the
    last ``2·h`` windows behind the newest are kept, pruned in chunks), and horizon sums come
    from prefix sums kept up to date as windows are charged (appending a window is O(1),
    a range sum two binary searches), not from a scan of every window ever charged.
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
        #: Kept window starts in increasing order, and the cumulative ε up to each:
        #: ``_prefix[i]`` is the ε of every window before ``_starts[i]`` ever kept (a running
        #: total, so pruning the front needs no rebasing: sums are differences).
        self._starts: list[int] = []
        self._prefix: list[float] = [0.0]

    def __len__(self) -> int:
        """Windows currently kept (bounded by about twice the horizon)."""
        return len(self._spent)

    def window_spent(self, window_start_s: int) -> tuple[float, float]:
        """(ε, δ) already spent in one window, all queries together."""
        charges = self._spent.get(window_start_s, {}).values()
        return math.fsum(e for e, _ in charges), math.fsum(d for _, d in charges)

    def query_spent(self, window_start_s: int, query: str) -> tuple[float, float]:
        return self._spent.get(window_start_s, {}).get(query, (0.0, 0.0))

    def _range(self, first_s: int, last_s: int) -> tuple[float, int]:
        """(Σ ε, number of charged windows) over windows starting in [first_s, last_s]."""
        lo = bisect.bisect_left(self._starts, first_s)
        hi = bisect.bisect_right(self._starts, last_s)
        return self._prefix[hi] - self._prefix[lo], hi - lo

    def horizon_spent(
        self,
        window_start_s: int,
        *,
        first_window_s: int | None = None,
        per_window_epsilon: float = 0.0,
    ) -> float:
        """Σ ε over the horizon that ends with this window.

        With ``first_window_s`` (the first covered window), windows of the horizon at or
        after it that nothing was charged to here count ``per_window_epsilon`` each: every
        covered window is released, so a window another worker releases spends it too.
        """
        h, size = self.horizon_windows, self.window_size_s
        first = window_start_s - (h - 1) * size
        total, charged = self._range(first, window_start_s)
        if first_window_s is not None and window_start_s >= first_window_s:
            covered = (window_start_s - max(first, first_window_s)) // size + 1
            total += max(0, covered - charged) * per_window_epsilon
        return total

    def _worst_horizon_with(self, window_start_s: int, epsilon: float) -> float:
        """The largest rolling-horizon total, over every horizon containing this window, if
        ``epsilon`` were added to it."""
        h, size = self.horizon_windows, self.window_size_s
        span_first = window_start_s - (h - 1) * size
        span_last = window_start_s + (h - 1) * size
        bound, _ = self._range(span_first, span_last)
        if _fits(bound + epsilon, self.max_epsilon_per_horizon):
            return bound + epsilon  # every such horizon lies within the span: no more needed
        # Near the cap: the exact maximum. A horizon's total changes only where a charged
        # window enters it, so horizons ending at charged windows (or at this one) suffice.
        lo = bisect.bisect_left(self._starts, window_start_s)
        hi = bisect.bisect_right(self._starts, span_last)
        ends = {window_start_s, *self._starts[lo:hi]}
        worst = max(self._range(end - (h - 1) * size, end)[0] for end in ends)
        return worst + epsilon

    def can_charge(self, window_start_s: int, query: str, epsilon: float, delta: float) -> bool:
        if query in self._spent.get(window_start_s, {}):
            return False
        eps, dlt = self.window_spent(window_start_s)
        return (
            _fits(eps + epsilon, self.epsilon_per_window)
            and _fits(dlt + delta, self.delta_per_window)
            and _fits(
                self._worst_horizon_with(window_start_s, epsilon), self.max_epsilon_per_horizon
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
        self.record(window_start_s, query, epsilon, delta)
        return Charge(window_start_s, query, epsilon, delta)

    def record(self, window_start_s: int, query: str, epsilon: float, delta: float) -> None:
        """Restore a charge read back from the release ledger (already validated when made)."""
        charges = self._spent.get(window_start_s)
        starts, prefix = self._starts, self._prefix
        if charges is None:
            charges = self._spent[window_start_s] = {}
            index = bisect.bisect_left(starts, window_start_s)
            starts.insert(index, window_start_s)
            prefix.insert(index + 1, prefix[index])  # then raised below with the new ε
        else:
            index = bisect.bisect_left(starts, window_start_s)
        added = epsilon - charges.get(query, (0.0, 0.0))[0]
        charges[query] = (epsilon, delta)
        # Windows are charged nearly in order: only the few prefixes after this one move.
        for i in range(index + 1, len(prefix)):
            prefix[i] += added
        self._prune()

    def _prune(self) -> None:
        """Forget windows no horizon containing a window near the newest can reach, in
        chunks (once three horizons are kept, down to two), so pruning costs O(1) amortised."""
        starts = self._starts
        if len(starts) < 3 * self.horizon_windows + 16:
            return
        keep_from = starts[-1] - 2 * self.horizon_windows * self.window_size_s
        cut = bisect.bisect_left(starts, keep_from)
        if cut:
            for w in starts[:cut]:
                del self._spent[w]
            del starts[:cut]
            del self._prefix[:cut]
