"""``top_k: N`` on a count or distinct-users query: the planning and release step.

The mechanism is :mod:`stream_dp.privacy.exponential.top_k` (the peeling exponential
mechanism); this module wires it into a query's plan and release
(docs/privacy-top-k-quantiles.md#top-k):

- **Budget.** ``top_k_epsilon_share``·ε (default half) of the query's ε chooses the keys
  (pure ε, no δ); the query is otherwise planned with the rest, ε_rest = ε − ε_sel, exactly
  as without top_k (partition selection for private keys, then the values' noise). The
  charges are those of the rest plus ``selection:top_k``; the query's whole ε is what every
  window is charged, so the ledger's charge includes the selection.
- **Candidates.** The keys partition selection kept (private keys) or the public key list —
  never every key seen: a candidate only one user produced would make the choice depend on
  that user's presence with unbounded loss.
- **Utilities.** The candidates' exact bounded counts: events (Δ = Linf) or distinct users
  (Δ = 1).
- **Values.** Noised as without top_k (same sensitivity: a valid, conservative bound) for the
  chosen keys only; the other candidates are dropped before any noise is drawn.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

from stream_dp.privacy.exact_laplace import WordSource, os_words
from stream_dp.privacy.exponential.top_k import TopKPlan, select_top_k_rows

if TYPE_CHECKING:
    from stream_dp.privacy.specs import QuerySpec
    from stream_dp.privacy.statistics.sensitivity import Sensitivity

#: The selection probabilities ``stream-dp plan`` states the lead for.
PLAN_PROBABILITIES = (0.9, 0.99)
#: Competitor counts (keys outside the true top N) ``plan`` states for private keys.
PLAN_COMPETITORS = (10, 100, 1000, 10000)

__all__ = [
    "PLAN_COMPETITORS",
    "PLAN_PROBABILITIES",
    "choose_top_k",
    "describe_top_k",
    "split_top_k",
    "top_k_plan",
]


def split_top_k(query: QuerySpec) -> tuple[QuerySpec, float]:
    """The query planned without top_k and with ε_rest, and ε_sel (ε_sel + ε_rest = ε)."""
    assert query.top_k is not None
    selection_epsilon = query.top_k_epsilon_share * query.epsilon
    rest = dataclasses.replace(query, epsilon=query.epsilon - selection_epsilon, top_k=None)
    return rest, selection_epsilon


def top_k_plan(query: QuerySpec, primary: Sensitivity, selection_epsilon: float) -> TopKPlan:
    """The selection of at most ``top_k`` keys with ε_sel; Δ is the most one user adds to
    one key's count (Linf for events, 1 for distinct users: ``primary``'s per-key bound)."""
    assert query.top_k is not None
    return TopKPlan(
        top_k=query.top_k,
        epsilon=selection_epsilon,
        max_contributions_per_partition=primary.max_contributions_per_partition,
    )


def describe_top_k(plan: TopKPlan, public_key_count: int | None) -> dict[str, Any]:
    """The plan figures: N, ε_sel, the scale, and the lead over the (N+1)-th count a key
    needs to be chosen with probability 0.9 and 0.99 among m competitors (m: the public
    keys outside the top N, or for private keys each of :data:`PLAN_COMPETITORS`)."""
    competitors = (
        PLAN_COMPETITORS if public_key_count is None else (max(0, public_key_count - plan.top_k),)
    )
    return {
        "top_k": plan.top_k,
        "epsilon": plan.epsilon,
        "sensitivity": plan.max_contributions_per_partition,
        "scale": plan.scale,
        "leads": [
            {
                "competitors": m,
                "probability": p,
                "lead": plan.lead_for_probability(p, m),
            }
            for m in competitors
            for p in PLAN_PROBABILITIES
        ],
    }


def choose_top_k(
    exact_counts: np.ndarray, plan: TopKPlan, *, words: WordSource = os_words
) -> np.ndarray:
    """Positions (into ``exact_counts``, the candidates' exact bounded counts) of the at most
    N candidates chosen, in ascending position order (the release orders keys itself)."""
    if len(exact_counts) == 0:
        return np.zeros(0, dtype=np.int64)
    chosen = select_top_k_rows(np.asarray(exact_counts, dtype=np.int64)[None, :], plan, words=words)
    return np.sort(chosen[0])
