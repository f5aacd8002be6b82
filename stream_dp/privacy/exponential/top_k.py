"""Private top-k: at most N keys of a window, chosen by the peeling exponential mechanism.

``top_k: N`` on a count or distinct-users query keeps at most N keys per window. The N keys
are chosen by N rounds of the exponential mechanism on the keys' bounded counts (each round
picks one key among those not yet chosen with probability ∝ exp(count/b), b = N·Δ/ε_sel),
sampled exactly (:mod:`stream_dp.privacy.exponential.sampler`). The keys come out in the
order they were chosen. Durfee & Rogers 2019 ("Practical Differentially Private Top-k
Selection with Pay-what-you-get Composition", Lemma 4.2) show this peeling is the same law as
one-shot Gumbel top-k (add Gumbel noise of scale b to every count and keep the N largest),
which is how OpenDP's ``make_noisy_top_k`` under zCDP draws, and how
:meth:`TopKPlan.selection_probability` is derived. docs/privacy-top-k-quantiles.md has the
argument and the choice.

Accounting (pure ε):

* Δ is the largest change one user makes to one key's count: Linf
  (``max_contributions_per_partition``) for event counts, 1 for distinct users. The
  exponential mechanism needs only this per-candidate bound (an L∞ sensitivity), not L1.
* Counts are monotone: adding a user never lowers a count, removing one never raises one.
  For monotone utilities the exponential mechanism with P ∝ exp(ε'·u/Δ) is ε'-DP (McSherry &
  Talwar 2007; Dwork & Roth 2014, Remark 3.1), not only with exp(ε'·u/(2Δ)). Each round is
  therefore (Δ/b)-DP, and N rounds compose to ε_sel = N·Δ/b (basic, adaptive composition).
* The candidate set must not depend on one user: it is a public key list or the keys kept by
  partition selection (whose own (ε, δ) is charged as for any private-key query); the
  counts then are the exact bounded counts of those keys.
* The values released for the chosen keys are a separate mechanism: its charge adds
  (:func:`top_k_privacy`); one user touches at most min(L0, N) of the chosen keys
  (:func:`top_k_value_l1_sensitivity`).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from stream_dp.errors import ConfigError
from stream_dp.privacy.exact_laplace import WordSource, os_words
from stream_dp.privacy.exponential.sampler import exact_scale, sample_exponential_mechanism

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class TopKPlan:
    """The selection of at most ``top_k`` keys with ``epsilon`` (pure ε, all N rounds)."""

    top_k: int
    epsilon: float
    #: Δ: the most one user adds to one key's count (Linf; 1 for distinct users).
    max_contributions_per_partition: int

    def __post_init__(self) -> None:
        if type(self.top_k) is not int or self.top_k < 1:
            raise ConfigError(f"top_k must be an integer of at least 1, got {self.top_k!r}")
        if not (self.epsilon > 0 and math.isfinite(self.epsilon)):
            raise ConfigError(f"top-k selection epsilon must be > 0, got {self.epsilon!r}")
        delta = self.max_contributions_per_partition
        if type(delta) is not int or delta < 1:
            raise ConfigError(f"max_contributions_per_partition must be >= 1, got {delta!r}")
        exact_scale(self.scale, what=f"top_k {self.top_k} with epsilon {self.epsilon:g}")

    @property
    def scale(self) -> float:
        """b = N·Δ/ε: each round's exponential mechanism draws with P ∝ exp(count/b)."""
        return self.top_k * self.max_contributions_per_partition / self.epsilon

    @property
    def epsilon_per_round(self) -> float:
        """Δ/b = ε/N."""
        return self.max_contributions_per_partition / self.scale

    def selection_probability(self, lead: float, competitors: int) -> float:
        """A lower bound on the probability that a key is among the N chosen when its count
        leads the (N+1)-th largest count by ``lead`` and ``competitors`` keys (m) are outside
        the true top N: 1 / (1 + m·exp(−lead/b)).

        In the Gumbel form the key is missed only if some key outside the true top N gets a
        larger noisy count (the N − 1 others can take N − 1 places at most); by Gumbel
        max-stability it beats all m of them with probability e^{c/b} / (e^{c/b} + Σ e^{c_j/b})
        ≥ 1/(1 + m·e^{−lead/b}). Tight: equality when the other N − 1 are far ahead and the m
        outsiders all have the (N+1)-th count.
        """
        if competitors < 0:
            raise ValueError("competitors must be >= 0")
        if competitors == 0:
            return 1.0
        return 1.0 / (1.0 + competitors * math.exp(-lead / self.scale))

    def lead_for_probability(self, probability: float, competitors: int) -> int:
        """The smallest integer lead (≥ 0) over the (N+1)-th count at which
        :meth:`selection_probability` reaches ``probability``: ⌈b·ln(m·p/(1 − p))⌉."""
        if not 0 < probability < 1:
            raise ValueError("probability must lie in (0, 1)")
        if competitors == 0:
            return 0
        lead = max(
            0, math.ceil(self.scale * math.log(competitors * probability / (1 - probability)))
        )
        while lead > 0 and self.selection_probability(lead - 1, competitors) >= probability:
            lead -= 1
        while self.selection_probability(lead, competitors) < probability:
            lead += 1
        return lead

    def describe(self) -> dict[str, Any]:
        return {
            "mechanism": "peeling exponential mechanism (= one-shot Gumbel top-k)",
            "top_k": self.top_k,
            "epsilon": self.epsilon,
            "epsilon_per_round": self.epsilon_per_round,
            "sensitivity": self.max_contributions_per_partition,
            "scale": self.scale,
            "lead_for_95_percent_among_1000_competitors": self.lead_for_probability(0.95, 1000),
        }


def top_k_privacy(
    selection: TopKPlan, *, value_epsilon: float, value_delta: float
) -> tuple[float, float]:
    """(ε, δ) of choosing the keys and releasing their values (basic composition): the
    selection is pure ε, so (ε_sel + ε_values, δ_values). Partition selection, when the keys
    are private, is charged on top as for any private-key query."""
    if value_epsilon < 0 or value_delta < 0:
        raise ValueError("value_epsilon and value_delta must be >= 0")
    return selection.epsilon + value_epsilon, value_delta


def top_k_value_l1_sensitivity(
    *,
    top_k: int,
    max_partitions_contributed: int,
    max_contributions_per_partition: int,
    max_contributions_per_window: int,
) -> int:
    """L1 sensitivity of the values released for the chosen keys: one user adds to at most
    min(L0, N) of them, at most Linf each, at most k in all."""
    return min(
        max_contributions_per_window,
        min(max_partitions_contributed, top_k) * max_contributions_per_partition,
    )


def select_top_k_rows(
    counts: np.ndarray, plan: TopKPlan, *, words: WordSource = os_words
) -> np.ndarray:
    """Per row of ``counts`` (int64, rows × n; each row one independent selection) the
    indices chosen by min(N, n) peeling rounds, in the order chosen."""
    counts = np.asarray(counts, dtype=np.int64)
    if counts.ndim != 2:
        raise ValueError("counts must be a 2-d array (one row per selection)")
    rows, n = counts.shape
    rounds = min(plan.top_k, n)
    available = np.ones(counts.shape, dtype=bool)
    chosen = np.empty((rows, rounds), dtype=np.int64)
    for r in range(rounds):
        picked = sample_exponential_mechanism(counts, plan.scale, available=available, words=words)
        chosen[:, r] = picked
        available[np.arange(rows), picked] = False
    return chosen


def select_top_k(
    counts: Mapping[K, int], plan: TopKPlan, *, words: WordSource = os_words
) -> list[K]:
    """At most N keys of ``counts`` (key → bounded count, over a candidate set that does not
    depend on one user), in the order the peeling exponential mechanism chose them."""
    keys = list(counts)
    if not keys:
        return []
    values = np.array([[int(counts[key]) for key in keys]], dtype=np.int64)
    order = select_top_k_rows(values, plan, words=words)[0]
    return [keys[i] for i in order.tolist()]
