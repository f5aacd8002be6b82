"""Choosing k (``max_contributions_per_window``) from a DP histogram (docs/privacy.md#budget).

A small k cuts noise but biases counts (users' extra events are dropped); a large k keeps
the data but every count needs noise proportional to k. The remedy: spend a little
budget on a differentially private histogram of events per user, then take the k that
covers most users.

Histogram: bins 1 … max_k, bin j counts the users with j events in the window; users with more
than max_k events go into the last bin, so the bins are public and fixed. Under the neighbouring
relation of docs/privacy.md#unit-of-privacy (add or remove one user with all their events) one
user changes exactly one bin by one: the L1 sensitivity is 1 and discrete Laplace noise of scale
1/ε makes the whole histogram ε-DP. (The original design divided ε by k for this histogram; that
is not needed — it would only add noise — because the user appears once in the histogram, not
once per event.)

Post-processing (free): k is the smallest value whose cumulative noisy mass reaches
``quantile`` of the total noisy mass. The noisy counts are summed as they are, negative ones
included: the noise has mean zero, so the sums stay unbiased, whereas clamping each bin at 0
would add about E[max(0, Z)] phantom users to every empty bin and, over hundreds of empty
bins up to max_k, push k far too high. If the total noisy mass is not positive, nothing is
known and k = max_k.

This spend is charged like any other query (docs/privacy.md#budget).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

from stream_dp.errors import ConfigError
from stream_dp.privacy.mechanisms import DiscreteLaplace


@dataclass(frozen=True)
class KSuggestion:
    #: Smallest k covering ``quantile`` of the noisy mass.
    k: int
    epsilon_spent: float
    #: Noisy user counts for 1 … max_k events (index i is i + 1 events; the last bin
    #: also holds every user with more than max_k events).
    noisy_histogram: tuple[int, ...]


def suggest_k(
    events_per_user: Mapping[int, int],
    *,
    epsilon: float,
    quantile: float = 0.9,
    max_k: int = 1000,
) -> KSuggestion:
    """A DP suggestion for k from a histogram {events per user → number of users}."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ConfigError(f"epsilon must be > 0, got {epsilon}")
    if not 0 < quantile <= 1:
        raise ConfigError(f"quantile must be in (0, 1], got {quantile}")
    if max_k < 1:
        raise ConfigError(f"max_k must be >= 1, got {max_k}")
    bins = [0] * max_k
    for events, users in events_per_user.items():
        if events < 1:
            raise ConfigError(f"a user in the window has at least 1 event, got {events}")
        if users < 0:
            raise ConfigError(f"user counts are non-negative, got {users} for {events}")
        bins[min(events, max_k) - 1] += users
    noisy = DiscreteLaplace.for_epsilon(l1_sensitivity=1, epsilon=epsilon).sample(bins)
    total = sum(noisy)
    k = max_k
    if total > 0:
        # the decimal the operator wrote (0.9, not 0.9000000000000000222…), exactly
        target = Fraction(repr(quantile)) * total
        running = 0
        for index, value in enumerate(noisy):
            running += value
            if running >= target:
                k = index + 1
                break
    return KSuggestion(k=k, epsilon_spent=epsilon, noisy_histogram=tuple(noisy))
