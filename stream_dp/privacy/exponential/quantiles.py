"""Private quantiles of a group's values, from its histogram, by the exponential mechanism.

``statistic: quantile`` with ``lower``, ``upper`` and ``quantiles: [0.5, 0.9, 0.99]``: per
window and group the values are counted in B equal bins over [lower, upper) (the histogram is
the accumulator: it merges by addition), and each requested quantile α is released as one of
the B + 1 bin edges, chosen by the exponential mechanism with OpenDP's quantile score
(Smith 2011; OpenDP ``make_private_quantile``): for the edge e_j with r_j values below it and
n − r_j at or above it,

    score_j = |(den − num)·r_j − num·(n − r_j)| = den·|r_j − α̃·n|,   α̃ = num/den,

integers, with α̃ = α exactly when α is a fraction of denominator below 10,000, else
round(α·10,000)/10,000 (OpenDP's ``score_candidates_constants``). The edge is drawn with
P ∝ exp(−score_j / b_α), exactly (:mod:`stream_dp.privacy.exponential.sampler`).

Accounting (pure ε), with Linf = ``max_contributions_per_partition`` the values one user
adds to one group and L0 = ``max_partitions_contributed`` the groups one user reaches:

* One user moves every r_j by at most Linf, so each score by at most
  Δ_α = Linf·max(num, den − num). The score is not monotone (it can rise for some edges and
  fall for others), so each quantile's exponential mechanism is (2Δ_α/b_α)-DP: the factor
  2 of the general mechanism. b_α = 2Δ_α/ε_q. OpenDP's privacy map of
  ``make_private_quantile`` gives the same ε for the same scale (tested).
* The Q quantiles of a group compose (ε_q each), and one user reaches at most L0 groups:
  ε_q = ε / (L0·Q).
* Monotone across the list: the Q chosen edges are sorted and paired with the sorted α's
  (post-processing: no cost). Sorting never increases the largest rank error against
  sorted targets, so the bound below holds for the sorted values.

Rank error (:meth:`QuantilePlan.rank_error`): the exponential mechanism puts probability at
most B·exp(−t/b_α) on edges whose score exceeds the best edge's by more than t, so with
probability ≥ 1 − β each of the Q draws of a group has |r(drawn) − α̃·n| ≤ OPT_α + E with
E = max_α (b_α/den)·ln(B·Q/β) (a union bound over the Q draws), where OPT_α, the best edge's
distance, is at most half the count of the bin that holds rank α̃·n (the histogram's
resolution). Sorting is a contraction for sorted targets (if |a_j − t_j| ≤ c for all j and
t is sorted, then |a_(j) − t_j| ≤ c), so every released (sorted) quantile has
|r(released) − α̃·n| ≤ max_α OPT_α + E.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from stream_dp.errors import ConfigError
from stream_dp.privacy.exact_laplace import WordSource, os_words
from stream_dp.privacy.exponential.bin_counts import BinCounts
from stream_dp.privacy.exponential.sampler import MAX_UTILITY, exact_scale, sample_by_gaps

#: OpenDP's default α granularity (``score_candidates_constants`` without a known size).
ALPHA_DENOMINATOR = 10_000
#: Most bins per histogram (B + 1 candidates per exponential mechanism).
MAX_BINS = 1 << 16


def alpha_fraction(alpha: float) -> tuple[int, int]:
    """(num, den) of α as OpenDP scores it: the exact fraction of the binary64 α when its
    denominator is below 10,000, else (round(α·10,000), 10,000)."""
    if not 0.0 <= alpha <= 1.0:
        raise ConfigError(f"a quantile must lie in [0, 1], got {alpha!r}")
    exact = Fraction(alpha)
    if exact.denominator < ALPHA_DENOMINATOR:
        return exact.numerator, exact.denominator
    return round(alpha * ALPHA_DENOMINATOR), ALPHA_DENOMINATOR


def quantile_scores(bin_counts: np.ndarray, alpha: float) -> np.ndarray:
    """Per row of bin counts (groups × B, int64) the B + 1 edge scores (groups × (B + 1),
    int64): den·|r_j − α̃·n| as OpenDP's integer score; lower is better."""
    counts = np.asarray(bin_counts, dtype=np.int64)
    num, den = alpha_fraction(alpha)
    below = np.zeros((counts.shape[0], counts.shape[1] + 1), dtype=np.int64)
    np.cumsum(counts, axis=1, out=below[:, 1:])
    total = below[:, -1:]
    scores: np.ndarray = np.abs((den - num) * below - num * (total - below))
    return scores


@dataclass(frozen=True)
class QuantileValue:
    """One released quantile: the α it estimates and the chosen bin edge."""

    quantile: float
    value: float
    edge_index: int


@dataclass(frozen=True)
class QuantilePlan:
    """Quantiles of one query: the histogram, the α's and the ε of all its groups."""

    lower: float
    upper: float
    bins: int
    #: The requested α's, strictly increasing.
    quantiles: tuple[float, ...]
    #: The query's ε per window, for all groups together.
    epsilon: float
    #: L0: groups one user may reach in a window.
    max_partitions_contributed: int
    #: Linf: values one user may add to one group.
    max_contributions_per_partition: int

    def __post_init__(self) -> None:
        if not (math.isfinite(self.lower) and math.isfinite(self.upper)) or not (
            self.lower < self.upper
        ):
            raise ConfigError(
                f"quantiles need finite lower < upper, got {self.lower}, {self.upper}"
            )
        if type(self.bins) is not int or not 1 <= self.bins <= MAX_BINS:
            raise ConfigError(f"bins must be an integer in [1, {MAX_BINS}], got {self.bins!r}")
        qs = self.quantiles
        if not qs or any(b <= a for a, b in itertools.pairwise(qs)):
            raise ConfigError(f"quantiles must be a non-empty increasing list, got {list(qs)}")
        for alpha in qs:
            alpha_fraction(alpha)
        if not (self.epsilon > 0 and math.isfinite(self.epsilon)):
            raise ConfigError(f"quantile epsilon must be > 0, got {self.epsilon!r}")
        for name in ("max_partitions_contributed", "max_contributions_per_partition"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ConfigError(f"{name} must be an integer of at least 1, got {value!r}")
        for alpha in qs:
            exact_scale(self.scale(alpha), what=f"quantile {alpha} with epsilon {self.epsilon:g}")

    @property
    def epsilon_per_quantile(self) -> float:
        """ε_q = ε / (L0·Q)."""
        return self.epsilon / (self.max_partitions_contributed * len(self.quantiles))

    def score_sensitivity(self, alpha: float) -> int:
        """Δ_α = Linf·max(num, den − num), in score units."""
        num, den = alpha_fraction(alpha)
        return self.max_contributions_per_partition * max(num, den - num)

    def scale(self, alpha: float) -> float:
        """b_α = 2Δ_α/ε_q in score units (P ∝ exp(−score/b_α))."""
        return 2 * self.score_sensitivity(alpha) / self.epsilon_per_quantile

    def rank_scale(self, alpha: float) -> float:
        """b_α/den: the scale in ranks (P ∝ exp(−|r − α̃n| / this)); OpenDP's ``scale``."""
        return self.scale(alpha) / alpha_fraction(alpha)[1]

    def edges(self) -> tuple[float, ...]:
        """The B + 1 candidate values lower + j·(upper − lower)/B."""
        return tuple(map(self.edge, range(self.bins + 1)))

    def edge(self, j: int) -> float:
        """Candidate j of :meth:`edges` (``upper`` itself for j = B), without the B + 1."""
        if j == self.bins:
            return self.upper
        return self.lower + j * ((self.upper - self.lower) / self.bins)

    def bin_index(self, value: float) -> int:
        """The bin a value is counted in: ⌊(value − lower)/width⌋, values below lower in bin
        0 and at or above upper in bin B − 1 (clamping: the bound on what a value can move
        holds whatever the value)."""
        if math.isnan(value):
            raise ValueError("a quantile's value may not be NaN")
        position = (value - self.lower) / (self.upper - self.lower) * self.bins
        return (
            min(self.bins - 1, max(0, math.floor(position)))
            if math.isfinite(position)
            else (0 if position < 0 else self.bins - 1)
        )

    def rank_error(self, beta: float) -> float:
        """E = max_α (b_α/den)·ln(B·Q/β): with probability ≥ 1 − β every released quantile
        of a group has |r(released) − α̃·n| ≤ max_α OPT_α + E, OPT_α the best edge's distance
        to rank α̃·n (at most half the count of the bin that holds it)."""
        if not 0 < beta < 1:
            raise ValueError("beta must lie in (0, 1)")
        spread = math.log(self.bins * len(self.quantiles) / beta)
        return max(self.rank_scale(alpha) for alpha in self.quantiles) * max(spread, 0.0)

    def describe(self) -> dict[str, Any]:
        return {
            "mechanism": "exponential mechanism per quantile (OpenDP's score), sorted",
            "lower": self.lower,
            "upper": self.upper,
            "bins": self.bins,
            "quantiles": list(self.quantiles),
            "epsilon": self.epsilon,
            "epsilon_per_quantile": self.epsilon_per_quantile,
            "rank_scales": [self.rank_scale(alpha) for alpha in self.quantiles],
            "rank_error_95": self.rank_error(0.05),
        }


def release_quantile_rows(
    bin_counts: np.ndarray | BinCounts, plan: QuantilePlan, *, words: WordSource = os_words
) -> np.ndarray:
    """Per group's histogram (a groups × B array of counts, or :class:`BinCounts`) the chosen
    edge index of each α, sorted so that column j (the j-th α) is non-decreasing in j
    (groups × Q, int64).

    The scores are read from the sparse histograms only at the edges the sampler proposes
    (:func:`sparse_scores`), so memory follows the histograms' nonzero bins, not groups × B;
    the draw, and the words it takes, are those of the full score table's
    (:func:`~stream_dp.privacy.exponential.sampler.sample_exponential_mechanism` on
    −:func:`quantile_scores`)."""
    if isinstance(bin_counts, BinCounts):
        counts = bin_counts
    else:
        dense = np.asarray(bin_counts, dtype=np.int64)
        if dense.ndim != 2 or dense.shape[1] != plan.bins:
            raise ValueError(f"bin_counts must have shape (groups, {plan.bins})")
        if dense.size and int(dense.min()) < 0:
            raise ValueError("bin counts must be >= 0")
        counts = BinCounts.of_dense(dense)
    if counts.bins != plan.bins:
        raise ValueError(f"bin_counts must have shape (groups, {plan.bins})")
    groups = len(counts)
    chosen = np.empty((groups, len(plan.quantiles)), dtype=np.int64)
    for j, alpha in enumerate(plan.quantiles):
        t, s = exact_scale(plan.scale(alpha), what="exponential mechanism")
        gap_of = quantile_gaps(counts, alpha)
        chosen[:, j] = sample_by_gaps(groups, plan.bins + 1, gap_of, t, s, words=words)
    return np.sort(chosen, axis=1)


def quantile_gaps(
    counts: BinCounts, alpha: float
) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """gap(groups, edges): an edge's score minus its group's lowest score, the sampler's
    integer gap max u − u for the utilities u = −score (:func:`sparse_scores`)."""
    best, score_at = sparse_scores(counts, alpha)

    def gap_of(rows: np.ndarray, edges: np.ndarray) -> np.ndarray:
        out: np.ndarray = score_at(rows, edges) - best[rows]
        return out

    return gap_of


def sparse_scores(
    counts: BinCounts, alpha: float
) -> tuple[np.ndarray, Callable[[np.ndarray, np.ndarray], np.ndarray]]:
    """(per group the lowest score over its B + 1 edges, score(groups, edges)): the entries
    of :func:`quantile_scores`'s table, from sparse histograms. The score den·|r − α̃n| is
    convex in r, and r runs over 0 and the running counts at the nonzero bins: the lowest
    is the least of those; the highest, n·max(num, den − num) at edge 0 or B, must stay
    within the sampler's utility range (as the table's)."""
    num, den = alpha_fraction(alpha)
    n = counts.totals()
    if n.size and int(n.max()) * max(num, den - num) > MAX_UTILITY:
        raise ValueError(f"utilities must lie within ±{MAX_UTILITY}")
    best = num * n  # r = 0 (edge 0)
    if counts.index.size:
        owners = counts.owners()
        running = np.cumsum(counts.counts, dtype=np.int64)
        running -= np.concatenate(([0], running))[counts.starts[:-1]][owners]
        np.minimum.at(best, owners, np.abs((den - num) * running - num * (n[owners] - running)))

    def score_at(rows: np.ndarray, edges: np.ndarray) -> np.ndarray:
        below = counts.below(rows, edges)
        out: np.ndarray = np.abs((den - num) * below - num * (n[rows] - below))
        return out

    return best, score_at


def release_quantiles(
    bin_counts: Sequence[int], plan: QuantilePlan, *, words: WordSource = os_words
) -> list[QuantileValue]:
    """The group's quantiles, one per requested α in order, values non-decreasing."""
    row = release_quantile_rows(np.array([list(bin_counts)], dtype=np.int64), plan, words=words)
    edges = plan.edges()
    return [
        QuantileValue(quantile=alpha, value=edges[i], edge_index=i)
        for alpha, i in zip(plan.quantiles, row[0].tolist(), strict=True)
    ]
