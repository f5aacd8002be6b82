"""Charges before state: which draws of a window the budget pays for, decided once, up front.

A window's budget is spent in one order — the ``bounds: auto`` histograms first, then the
queries in configuration order — and a draw that does not fit is refused. Whatever uses a
window's exact data must know the outcome *before* it uses the data: a cumulative query's
running-total state takes the window's exact totals into every later running total of its
horizon, so those totals may go in only if the window's release of the query was charged
(otherwise they go in as zeros, and the chain continues without the window's data).

:class:`WindowCharges` makes that decision once per window, the first time anything asks
(the cumulative state before its draw, or the release itself), and charges the accountant
right away: a charge is spent the moment it is decided, whether or not the draw it pays for
is ever published (a window released by another owner meanwhile keeps the charge: counting
it twice only over-states the spend). The release takes each charged draw once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from stream_dp.config.model import QueryConfig
from stream_dp.ops.metrics import Metrics
from stream_dp.privacy.budget import BOUNDS_CHARGE, BudgetAccountant
from stream_dp.windows.tumbling import iso_utc

log = logging.getLogger(__name__)


@dataclass
class _Window:
    #: charged, not drawn yet
    charged: set[str] = field(default_factory=set)
    #: refused for budget (logged and counted once)
    refused: set[str] = field(default_factory=set)


class WindowCharges:
    """Per window: the draws charged to its budget and not yet drawn (module docstring)."""

    def __init__(
        self,
        accountant: BudgetAccountant,
        queries: Sequence[QueryConfig],
        *,
        bounds_epsilon: float | None,
        metrics: Metrics,
    ) -> None:
        self.accountant = accountant
        self.queries = list(queries)
        #: ``bounds: auto``: the ε of a window's histograms; None without automatic bounds
        self.bounds_epsilon = bounds_epsilon
        self.metrics = metrics
        self._windows: dict[int, _Window] = {}

    def charge(self, window_start_s: int, *, ledgered: Callable[[str], bool]) -> frozenset[str]:
        """Charge, in order, every draw of the window not yet charged, drawn or ledgered
        (``ledgered(name)``: the ledger has its release), as far as the budget allows.
        Returns the draws charged and not yet drawn (``#bounds`` for the histograms)."""
        window = self._windows.setdefault(window_start_s, _Window())
        shares: list[tuple[str, float, float]] = []
        if self.bounds_epsilon is not None:
            shares.append((BOUNDS_CHARGE, self.bounds_epsilon, 0.0))
        shares.extend((q.name, q.epsilon, q.delta) for q in self.queries)
        for name, epsilon, delta in shares:
            if name in window.charged or name in window.refused or ledgered(name):
                continue
            if self.accountant.query_spent(window_start_s, name) != (0.0, 0.0):
                continue  # drawn by this process already (its draw lost, or is in flight)
            if self.accountant.can_charge(window_start_s, name, epsilon, delta):
                self.accountant.charge(window_start_s, name, epsilon, delta)
                window.charged.add(name)
                continue
            window.refused.add(name)
            self._report_refused(window_start_s, name)
        return frozenset(window.charged)

    def take(self, window_start_s: int, name: str) -> bool:
        """Whether ``name``'s draw of the window is charged and not drawn yet; it is now."""
        window = self._windows.get(window_start_s)
        if window is None or name not in window.charged:
            return False
        window.charged.discard(name)
        return True

    def forget(self, done: Callable[[int], bool]) -> None:
        """Drop what is kept of the windows ``done`` says are released."""
        for ws in [ws for ws in self._windows if done(ws)]:
            del self._windows[ws]

    def _report_refused(self, window_start_s: int, name: str) -> None:
        if name == BOUNDS_CHARGE:
            log.error(
                "budget exhausted: the window's bounds histograms are not drawn (the next "
                "window keeps this one's bounds)",
                extra={"window": iso_utc(window_start_s)},
            )
            return
        self.metrics.budget_exhausted.labels(query=name).inc()
        cumulative = any(q.name == name and q.cumulative for q in self.queries)
        log.error(
            "budget exhausted: release suppressed%s",
            " (its running total continues without this window's data)" if cumulative else "",
            extra={"query": name, "window": iso_utc(window_start_s)},
        )
