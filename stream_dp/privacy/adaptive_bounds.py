"""Contribution bounds chosen privately, window by window (``bounds: auto``; issue 16).

A fixed bound is a guess, and the guess moves the error more than the mechanism does: too
small and every count loses the events it clips (bias), too large and every count carries
noise for contributions nobody makes. Here each window spends a share ε_h of its budget on
differentially private histograms of how its users contribute, and the bounds that minimise
the expected error estimated from them apply to the **next** window.

Histograms (all over the events a user has in the window, after the stage-1 reservoir at the
cap — the largest k auto may choose — so at most ``cap`` events per user):

- ``events``: bin of n_u, the user's events (chooses k);
- per *projection* p (queries with the same ``group_by``, ``where`` and key list share one):
  ``keys/p``: bin of d_u, the distinct keys the user touches in p (chooses L0), and
  ``per_key/p``: bin of the user's events on one of those keys picked uniformly (chooses
  Linf; one key per user so that the user still moves one bin).

Bins are geometric (1, 2, 3, 4, 6, 8, 12, 16, 24, …, the cap; the last bin holds everything from
the cap up), fixed by the configuration alone. **Sensitivity:** the neighbours of
docs/privacy.md#unit-of-privacy differ in all events of one user. Adding or removing that user
adds or removes exactly one unit in one bin of each of the H histograms (and nothing else: which
key is picked, like which events the reservoir keeps, is a function of that user's events only),
so the concatenated histogram vector has L1 sensitivity H. Discrete Laplace noise of scale H/ε_h
(:mod:`stream_dp.privacy.mechanisms`, exact, CSPRNG) makes it ε_h-DP. (Under "replace one
user" the same vector would move by 2H; the project's relation is add/remove throughout, as
for the counts' sensitivities.) A user's events all live in one stage-1 partition, so the
per-partition exact histograms add up to the window's, and the sum is noised once.

**Composition.** Window w releases M_w = (its queries, noised for bounds θ_w; its
histograms H_w). θ_w is a deterministic function of what windows before w released (H_{w−1}
and the released key counts of w−1; the configured start values for the first covered
window) — never of w's own data. Conditioned on everything released before w, M_w is
therefore an ordinary release with *fixed* bounds: each query's noise is calibrated to the
sensitivity of θ_w exactly as for a configured bound, so the query is ε_q-DP for the user's
events in w, and H_w is ε_h-DP. By adaptive sequential composition (each mechanism may be
chosen from the outputs before it), window w costs Σ_q ε_q + ε_h, and the horizon cap adds
these per-window totals as for fixed bounds. Choosing θ_{w+1} from H_w is post-processing.
What must not happen — and the pipeline refuses — is bounding or calibrating window w with
bounds derived from w's own data: the noise scale would then depend on the data it protects.

**Choice (post-processing).** For every candidate (k, L0, Linf) on the bins' edges up to the
caps, the expected absolute error per released key, summed over queries, is estimated as

    J = Σ_q  D_q(θ)/K_q  +  E|Z_q(θ)|  (+ S_q(L0)/K_q for private keys tested on users)

with D_q the events bounding drops (bias: bounding only ever removes events, so the per-key
biases add up to exactly D_q over all keys), K_q the keys the query released in the window,
E|Z_q| the mean absolute noise for the candidate's sensitivity (``planner``'s sensitivity
rules) and S_q the selection term: L0 also raises the number of users a private key needs
to be released, so S_q sums, over the keys the window released, the probability that the
key is dropped at L0 times its value (its users read off its released value and t̄, the
mean events per user and key). D_q is
read off the histograms: k drops Σ max(0, n_u − k), L0 drops Σ max(0, d_u − L0) keys of
about t̄ events each, Linf drops Σ over kept (user, key) pairs of max(0, c − Linf) — pairs
estimated as (kept pairs / users) × the per-user sample. This is the bias–variance trade-off
of Amin, Kulesza, Muñoz and Vassilvitskii (ICML 2019, "Bounding user contributions"): at the
optimum the number of contributions above the bound equals the noise's marginal cost, K/ε for
Laplace counts — a quantile that depends on the data, the keys and ε, not a fixed one.
J is an estimate for the *next* window, which is not the one measured: the histograms are
stretched by the trend from the window before, averaged with that window's (stretched
twice), and J is averaged over the prediction read 20% lower, as is and 25% higher
(NEXT_WINDOW_SPREAD) — the expected error over where the next window may lie. All of it
reads released values only. Approximations (stated in docs/automatic-bounds.md): values are
taken uniform within a bin; the bounds' drops are added (events two bounds would both drop count
twice); the sampled key stands for the user's keys; where-filters are approximated by the
projection's share of events.

Noisy counts are made consistent before use: tail sums are fitted non-increasing and
non-negative (pool-adjacent-violators), which only post-processes. When the histograms hold
too few users to say anything (their noisy total within 4 standard deviations of zero), the
window's own bounds are kept.
"""

from __future__ import annotations

import bisect
import math
import random  # only the type of the sampling PRNG that picks a user's per-key bin (not a DP draw)
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stream_dp.errors import PrivacyError
from stream_dp.privacy.mechanisms import DiscreteLaplace

#: (k, L0, Linf); None: the bound is not set.
BoundsTriple = tuple[int, int | None, int | None]

EVENTS = "events"
KEYS_PREFIX = "keys/"
PER_KEY_PREFIX = "per_key/"
#: The window's bounds are kept when the histograms' noisy user total is within this many
#: standard deviations of its noise from zero.
MIN_SIGNAL_SDS = 4.0
#: A histogram's support ends where its noisy tail sum stops being this many standard
#: deviations above zero (:func:`fitted_counts`).
SUPPORT_Z = 2.0


#: With events and keys per user (no per-key histograms), the events histogram's share of ε_h.
EVENTS_WEIGHT = 0.7

#: Keys per user are small numbers where one more key matters: their bins are exact up to
#: here (then doubling, like the others).
EXACT_KEY_BINS = 8


def geometric_edges(cap: int, *, exact_up_to: int = 1) -> tuple[int, ...]:
    """Bin edges 1, 2, …, ``exact_up_to`` (each value its own bin), then doubling below
    ``cap``, then ``cap``: the last bin holds every value from the cap up.

    Coarse bins keep the noise of a histogram's sparse upper tail low (every bin carries its
    own noise); exact small values let L0 be chosen to the key.
    """
    if cap < 1:
        raise ValueError(f"cap must be >= 1, got {cap}")
    edges = list(range(1, min(max(exact_up_to, 2), cap) + 1))
    value = edges[-1]
    while True:
        value *= 2
        if value >= cap:
            return (*edges, cap) if edges[-1] != cap else tuple(edges)
        edges.append(value)


def bin_of(edges: Sequence[int], value: int) -> int:
    """Index of the bin holding ``value`` ≥ 1 (the last bin is open above)."""
    return max(0, bisect.bisect_right(edges, value) - 1)


@dataclass(frozen=True)
class HistogramLayout:
    """Which histograms a window releases, and their bins: a function of the configuration.

    ``projections`` maps each projection id to the queries that share it.
    """

    names: tuple[str, ...]
    edges: Mapping[str, tuple[int, ...]]
    projections: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: Share of ε_h each histogram gets (they add up to 1); equal when not given.
    weights: Mapping[str, float] = field(default_factory=dict)

    def weight(self, name: str) -> float:
        if self.weights:
            return self.weights[name]
        return 1.0 / len(self.names)

    @property
    def count(self) -> int:
        """H: how many histograms (the L1 sensitivity of all of them together)."""
        return len(self.names)

    @property
    def bins(self) -> int:
        return sum(len(self.edges[n]) for n in self.names)

    def sizes(self) -> dict[str, int]:
        return {n: len(self.edges[n]) for n in self.names}

    def describe(self) -> dict[str, Any]:
        return {
            "histograms": [
                {"name": n, "bin_edges": list(self.edges[n]), "bins": len(self.edges[n])}
                for n in self.names
            ],
            "projections": {p: list(q) for p, q in self.projections.items()},
            "l1_sensitivity": self.count,
        }


def make_layout(
    *,
    k_cap: int,
    keys_cap: int | None,
    per_key_cap: int | None,
    projections: Mapping[str, Sequence[str]],
    events: bool,
) -> HistogramLayout:
    """The layout: ``events`` if asked, and for every projection ``keys/p`` unless
    ``keys_cap`` is None and ``per_key/p`` unless ``per_key_cap`` is None. Every histogram
    costs budget: release only those the choice needs."""
    names: list[str] = []
    edges: dict[str, tuple[int, ...]] = {}
    if events:
        names.append(EVENTS)
        edges[EVENTS] = geometric_edges(k_cap)
    for p in projections:
        if keys_cap is not None:
            names.append(KEYS_PREFIX + p)
            edges[KEYS_PREFIX + p] = geometric_edges(keys_cap, exact_up_to=EXACT_KEY_BINS)
        if per_key_cap is not None:
            names.append(PER_KEY_PREFIX + p)
            edges[PER_KEY_PREFIX + p] = geometric_edges(per_key_cap)
    weights: dict[str, float] = {}
    keyed = [n for n in names if n.startswith(KEYS_PREFIX)]
    if events and keyed and not any(n.startswith(PER_KEY_PREFIX) for n in names):
        # events and keys per user only: keys per user sit in a few exact bins holding
        # most users, while k is decided in the sparse tail of events per user, which gets
        # the larger share (measured: bench/auto_bounds.py)
        weights = {EVENTS: EVENTS_WEIGHT, **{n: (1 - EVENTS_WEIGHT) / len(keyed) for n in keyed}}
    return HistogramLayout(
        tuple(names), edges, {p: tuple(q) for p, q in projections.items()}, weights
    )


class UserHistograms:
    """Exact histograms of one source partition's users in one window (internal only)."""

    def __init__(self, layout: HistogramLayout, rng: random.Random) -> None:
        self.layout = layout
        self._rng = rng
        self._counts = {n: [0] * len(layout.edges[n]) for n in layout.names}
        self._events = self._counts.get(EVENTS)

    def add_user(self, events: int, key_counts: Mapping[str, Sequence[int]]) -> None:
        """One user: ``events`` kept by the reservoir, and per projection the user's event
        count on each key it touches there (projections the user has no event in: absent
        or empty). Moves at most one bin of each histogram by one."""
        if self._events is not None and events > 0:
            self._events[bin_of(self.layout.edges[EVENTS], events)] += 1
        for p, counts in key_counts.items():
            if not counts:
                continue
            keys = self._counts.get(KEYS_PREFIX + p)
            if keys is not None:
                keys[bin_of(self.layout.edges[KEYS_PREFIX + p], len(counts))] += 1
            per_key = self._counts.get(PER_KEY_PREFIX + p)
            if per_key is not None:
                # which key stands for the user is the user's own business (like the
                # reservoir's choice): it cannot change the sensitivity
                picked = counts[self._rng.randrange(len(counts))]
                per_key[bin_of(self.layout.edges[PER_KEY_PREFIX + p], picked)] += 1

    def counts(self) -> dict[str, list[int]]:
        return {n: list(v) for n, v in self._counts.items()}


def merge_counts(
    layout: HistogramLayout, parts: Sequence[Mapping[str, Sequence[int]]]
) -> dict[str, list[int]]:
    """Bin-wise sums over source partitions (a user is on one partition)."""
    total = {n: [0] * len(layout.edges[n]) for n in layout.names}
    for part in parts:
        check_counts(layout, part)
        for name, values in part.items():
            row = total[name]
            for i, v in enumerate(values):
                row[i] += int(v)
    return total


def check_counts(layout: HistogramLayout, counts: Mapping[str, Sequence[int]]) -> None:
    """Refuse histograms of another layout (:class:`PrivacyError`): a forged or stale
    partial must not change how many bins one user can move."""
    if set(counts) != set(layout.names):
        raise PrivacyError(
            f"histograms {sorted(counts)} do not match the layout {list(layout.names)}"
        )
    for name, values in counts.items():
        if len(values) != len(layout.edges[name]) or any(
            type(v) is not int or v < 0 for v in values
        ):
            raise PrivacyError(
                f"histogram {name} does not match its {len(layout.edges[name])} bins"
            )


@dataclass(frozen=True)
class NoisyHistograms:
    """The released histograms of one window: ε_h-DP."""

    counts: Mapping[str, tuple[int, ...]]
    epsilon: float
    #: Discrete Laplace scale of every bin, per histogram: 1/(its share of ε_h).
    scales: Mapping[str, float]

    def describe(self) -> dict[str, Any]:
        return {
            "histograms": {n: list(v) for n, v in self.counts.items()},
            "epsilon": self.epsilon,
            "mechanism": "discrete_laplace",
            "noise_scales": dict(self.scales),
        }


def noise_scales(layout: HistogramLayout, epsilon: float) -> dict[str, float]:
    """Per histogram b = 1/ε_j, ε_j its share of ε_h: one user moves one bin of each
    histogram by one, so histogram j is ε_j-DP and all of them together Σ ε_j = ε_h."""
    if not layout.weights:
        return {n: layout.count / epsilon for n in layout.names}
    return {n: 1.0 / (epsilon * layout.weight(n)) for n in layout.names}


def release_histograms(
    exact: Mapping[str, Sequence[int]], layout: HistogramLayout, *, epsilon: float
) -> NoisyHistograms:
    """One noise draw per bin, every bin of every histogram of the layout (empty ones too:
    which bins exist never depends on the data)."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise PrivacyError(f"epsilon must be > 0, got {epsilon}")
    check_counts(layout, exact)
    scales = noise_scales(layout, epsilon)
    out = {
        n: tuple(DiscreteLaplace(scales[n]).sample([int(v) for v in exact[n]]))
        for n in layout.names
    }
    return NoisyHistograms(out, epsilon, scales)


# ------------------------------------------------------------------------- estimation


def _pava_non_increasing(values: Sequence[float]) -> list[float]:
    """Least-squares fit of a non-increasing sequence (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight]
    for v in values:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] < blocks[-1][0]:
            m2, w2 = blocks.pop()
            m1, w1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2])
    out: list[float] = []
    for mean, weight in blocks:
        out.extend([mean] * int(weight))
    return out


def fitted_counts(noisy: Sequence[int], *, scale: float, z: float = SUPPORT_Z) -> list[float]:
    """Bin counts consistent with a histogram, from its noisy bins (post-processing):

    1. the support ends at the highest bin from which the noisy tail sum is significant
       (at least ``z`` standard deviations of its noise): bins above it are empty — noise
       in empty high bins would otherwise weigh in proportion to their large values;
    2. tail sums are fitted non-increasing (pool adjacent violators) and non-negative.
    """
    m = len(noisy)
    bin_sd = DiscreteLaplace(scale).standard_deviation
    tails: list[float] = [0.0] * m
    running = 0.0
    support = -1
    for i in range(m - 1, -1, -1):
        running += noisy[i]
        tails[i] = running
        if support < 0 and running >= z * bin_sd * math.sqrt(m - i):
            support = i
    for i in range(support + 1, m):
        tails[i] = 0.0
    kept = tails[: support + 1]
    fitted = [max(0.0, t) for t in _pava_non_increasing(kept)] + [0.0] * (m - support - 1)
    return [fitted[i] - (fitted[i + 1] if i + 1 < m else 0.0) for i in range(m)]


@dataclass(frozen=True)
class Distribution:
    """A fitted histogram: how many users have a value in each bin.

    ``stretch`` scales every value (the trend from the window before: see
    :func:`choose_bounds`); 1 reads the histogram as it is.
    """

    edges: tuple[int, ...]
    counts: tuple[float, ...]
    stretch: float = 1.0

    @property
    def users(self) -> float:
        return math.fsum(self.counts)

    def _offsets(self) -> list[float]:
        e = self.edges
        return [(e[i + 1] - e[i] - 1) / 2 if i + 1 < len(e) else 0.0 for i in range(len(e))]

    @property
    def total(self) -> float:
        """Σ_u v_u (values in the open last bin counted at the cap)."""
        parts = zip(self.counts, self.edges, self._offsets(), strict=True)
        return self.stretch * math.fsum(n * (e + r) for n, e, r in parts)

    @property
    def mean(self) -> float:
        users = self.users
        return self.total / users if users > 0 else 0.0

    def quantile(self, level: float) -> float:
        """The value below which ``level`` of the users lie (log-interpolated in a bin)."""
        users = self.users
        if users <= 0:
            return 0.0
        target = level * users
        running = 0.0
        e = self.edges
        for i, n in enumerate(self.counts):
            if n > 0 and running + n >= target:
                lo = float(e[i])
                hi = float(e[i + 1]) if i + 1 < len(e) else lo
                share = (target - running) / n
                return float(self.stretch * lo * (hi / lo) ** share)
            running += n
        return self.stretch * float(e[-1])

    def excess(self, c: float) -> float:
        """Σ_u max(0, v_u − c): what a bound c removes (values uniform over the integers of
        a bin; the open last bin counted at the cap, which shifts every c ≤ cap alike)."""
        g = self.stretch
        return g * self._raw_excess(c / g)

    def _raw_excess(self, c: float) -> float:
        e = self.edges
        total = 0.0
        for i, n in enumerate(self.counts):
            if n == 0:
                continue
            lo = e[i]
            if i + 1 == len(e):
                total += n * max(0.0, lo - c)
                continue
            hi = e[i + 1] - 1  # values lo … hi, each with probability 1/width
            first = max(lo, math.floor(c) + 1)  # the smallest value above c
            if first > hi:
                continue
            above = hi - first + 1
            total += n * above * ((first + hi) / 2 - c) / (hi - lo + 1)
        return total


#: The trend read from two consecutive windows is clamped to this factor either way.
MAX_TREND = 2.0
#: The next window is not the one measured: its values may lie a little below or above what
#: the trend predicts. The objective is averaged over these stretches of the prediction
#: (−20%, as predicted, +25%), so a bound whose error climbs steeply when the values move
#: (an L0 right at the keys users have) loses to one that is flat there.
NEXT_WINDOW_SPREAD = (0.8, 1.0, 1.25)
#: The trend compares this quantile of each histogram (the bulk of users: the noise in
#: sparse high bins barely moves it).
TREND_QUANTILE = 0.75


def distributions(noisy: NoisyHistograms, layout: HistogramLayout) -> dict[str, Distribution]:
    return {
        n: Distribution(
            tuple(layout.edges[n]), tuple(fitted_counts(noisy.counts[n], scale=noisy.scales[n]))
        )
        for n in layout.names
    }


def trend_stretch(mean_now: float, mean_before: float | None) -> float:
    """How much the values moved from the window before to this one, as a factor (1 when
    unknown), clamped to [1/MAX_TREND, MAX_TREND]."""
    if mean_before is None or mean_before <= 0 or mean_now <= 0:
        return 1.0
    return min(MAX_TREND, max(1 / MAX_TREND, mean_now / mean_before))


# --------------------------------------------------------------------------- the choice


@dataclass(frozen=True)
class QueryModel:
    """What the choice needs to know of one query (from its plan; no data)."""

    name: str
    projection: str
    #: count-like (count, sum, mean: events are the unit) or distinct users
    distinct_users: bool
    mechanism: str  # "discrete_laplace" or "discrete_gaussian"
    #: noise scale per unit of L1 (Laplace) or L2 (Gaussian) sensitivity, in count units
    scale_per_sensitivity: float
    public_keys: int | None
    #: private keys tested on distinct users: (L0, users) → probability the key is kept
    #: (None: public keys, or a selection that tests the released count)
    keep_probability: Callable[[int, int], float] | None = None


@dataclass(frozen=True)
class BoundsChoice:
    bounds: BoundsTriple
    reason: str
    #: Estimated J of the chosen bounds (None when the window's bounds were kept).
    objective: float | None = None
    #: Per histogram, the mean value read from this window's histograms: the next choice
    #: compares its own with these to see the trend (released data: post-processing).
    means: Mapping[str, float] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        k, l0, linf = self.bounds
        return {
            "max_contributions_per_window": k,
            "max_keys_per_user": l0,
            "max_contributions_per_key": linf,
            "reason": self.reason,
            "objective": self.objective,
            "means": dict(self.means),
        }


def mean_abs_noise(mechanism: str, scale: np.ndarray) -> np.ndarray:
    """E|Z| of discrete Laplace (1/sinh(1/b)) or, for the Gaussian, σ·√(2/π)."""
    if mechanism == "discrete_laplace":
        with np.errstate(over="ignore"):
            out: np.ndarray = 1.0 / np.sinh(1.0 / np.maximum(scale, 1e-9))
        return out
    gauss: np.ndarray = scale * math.sqrt(2 / math.pi)
    return gauss


def _count_l2_squared(k: np.ndarray, l0: np.ndarray, linf: np.ndarray) -> np.ndarray:
    full = k // linf
    rest = k - full * linf
    out: np.ndarray = np.where(l0 <= full, l0 * linf * linf, full * linf * linf + rest * rest)
    return out


@dataclass(frozen=True)
class AutoSpec:
    """Which bounds are chosen, their caps, and the fixed values of the others."""

    auto: frozenset[str]  # subset of {"k", "l0", "linf"}
    k: int  # cap when auto, else the fixed value
    l0: int | None
    linf: int | None


def choose_bounds(
    noisy: NoisyHistograms,
    layout: HistogramLayout,
    *,
    spec: AutoSpec,
    current: BoundsTriple,
    queries: Sequence[QueryModel],
    released: Mapping[str, Sequence[float]],
    means_before: Mapping[str, float] | None = None,
    previous: NoisyHistograms | None = None,
) -> BoundsChoice:
    """The next window's bounds from released histograms (post-processing).

    ``released``: per query, the values the window released (K_q is how many; for private
    keys they say how far each key stood above the selection threshold).
    ``means_before``: what the previous window's choice read (its ``means``). The values are
    stretched by the trend from there to here — the next window is expected to move on as
    this one did (events per user growing through a day, say) — clamped to MAX_TREND.
    ``previous``: the previous window's histograms. When given, the estimate is the mean of
    this window's and the previous window's (stretched by the trend twice): two noisy
    estimates of the next window, so half the variance when the stream holds its course.
    Each estimate is also read at NEXT_WINDOW_SPREAD's stretches and the objective averaged
    over all of them: the expected error over where the next window may lie, not the error
    at one guess of it.
    """
    fitted = distributions(noisy, layout)
    means = {n: d.quantile(TREND_QUANTILE) for n, d in fitted.items()}
    if _too_little_signal(noisy, layout):
        return BoundsChoice(current, "kept: too few users in the histograms", means=means)
    before = means_before or {}
    trend = {n: trend_stretch(means[n], before.get(n)) for n in fitted}
    estimates = [(fitted, trend)]
    if previous is not None and before and not _too_little_signal(previous, layout):
        earlier = distributions(previous, layout)
        estimates.append((earlier, {n: min(MAX_TREND, t**2) for n, t in trend.items()}))
    sources = [
        {n: Distribution(d.edges, d.counts, stretch[n] * spread) for n, d in dists.items()}
        for dists, stretch in estimates
        for spread in NEXT_WINDOW_SPREAD
    ]
    grids = _grids(layout, spec, fitted)
    objective = np.mean([_objective(dists, grids, queries, released) for dists in sources], axis=0)
    # The smallest estimate; ties go to the smallest bounds (a larger L0 that costs no
    # noise still raises the users a private key needs). Deterministic: a function of the
    # releases alone.
    K, L0, LINF = grids.K, grids.L0, grids.LINF
    flat = objective.ravel()
    order = np.lexsort((LINF.ravel(), L0.ravel(), K.ravel(), np.round(flat, 9)))
    best = int(order[0])
    k, l0, linf = int(K.ravel()[best]), int(L0.ravel()[best]), int(LINF.ravel()[best])
    chosen: BoundsTriple = (k, l0 or None, linf or None)
    return BoundsChoice(chosen, "min_expected_error", float(flat[best]), means)


@dataclass(frozen=True)
class _Grids:
    """Every candidate (k, L0, Linf) as arrays of one shape (0: the bound is not set)."""

    ks: np.ndarray
    l0s: np.ndarray
    linfs: np.ndarray
    K: np.ndarray
    L0: np.ndarray
    LINF: np.ndarray
    l0_eff: np.ndarray
    l1_count: np.ndarray
    l2_count: np.ndarray


def _grids(layout: HistogramLayout, spec: AutoSpec, dists: Mapping[str, Distribution]) -> _Grids:
    def grid(name: str, hist: str | None, fixed: int | None, cap: int) -> np.ndarray:
        if name not in spec.auto or hist is None:
            return np.array([fixed if fixed is not None else 0], dtype=np.int64)
        if name == "l0":
            # keys: the bins' edges (exact up to 8, then powers of two)
            return np.array([e for e in layout.edges[hist] if e <= cap], dtype=np.int64)
        return np.array(candidates(cap), dtype=np.int64)

    first_p = next(iter(layout.projections), None)
    keys_hist = None if first_p is None else KEYS_PREFIX + first_p
    per_key_hist = None if first_p is None else PER_KEY_PREFIX + first_p
    ks = grid("k", EVENTS if EVENTS in dists else None, spec.k, spec.k)
    l0s = grid("l0", keys_hist if keys_hist in dists else None, spec.l0, spec.l0 or 0)
    linfs = grid("linf", per_key_hist if per_key_hist in dists else None, spec.linf, spec.linf or 0)
    mesh = np.meshgrid(ks, l0s, linfs, indexing="ij")
    K: np.ndarray = mesh[0]
    L0: np.ndarray = mesh[1]
    LINF: np.ndarray = mesh[2]
    l0_eff = np.where(L0 == 0, K, np.minimum(L0, K))
    linf_eff = np.where(LINF == 0, K, np.minimum(LINF, K))
    return _Grids(
        ks,
        l0s,
        linfs,
        K,
        L0,
        LINF,
        l0_eff,
        np.minimum(K, l0_eff * linf_eff),
        np.sqrt(_count_l2_squared(K, l0_eff, linf_eff).astype(np.float64)),
    )


def _objective(
    dists: Mapping[str, Distribution],
    g: _Grids,
    queries: Sequence[QueryModel],
    released: Mapping[str, Sequence[float]],
) -> np.ndarray:
    """J of every candidate (see the module docstring) from one estimate of the data."""
    ks, l0s, linfs, K, l0_eff = g.ks, g.l0s, g.linfs, g.K, g.l0_eff
    events = dists.get(EVENTS)
    drop_k = np.array([events.excess(int(k)) if events else 0.0 for k in ks])
    total_events = events.total if events else 0.0
    objective = np.zeros(K.shape)
    for q in queries:
        keys = dists.get(KEYS_PREFIX + q.projection)
        per_key = dists.get(PER_KEY_PREFIX + q.projection)
        values = released.get(q.name, ())
        n_keys = max(1, q.public_keys if q.public_keys is not None else len(values))
        t_mean, share = 1.0, 1.0
        drop_keys = np.zeros((len(ks), len(l0s)))
        kept_pairs = np.zeros((len(ks), len(l0s)))
        drop_per_key = np.zeros((len(ks), len(linfs)))
        users = 0.0
        if keys is not None:
            pairs = keys.total
            users = keys.users
            # after the reservoir a user has at most k keys and k events on one key:
            # Σ max(0, min(v, k) − c) = excess(c) − excess(k) for c < k, else 0
            drop_keys = _capped_excess(keys, l0s, ks)  # shape (k, l0)
            kept_pairs = pairs - drop_keys
            if per_key is not None and per_key.users > 0:
                t_mean = per_key.mean
                drop_per_key = _capped_excess(per_key, linfs, ks)  # shape (k, linf)
                if total_events > 0:
                    share = min(1.0, pairs * t_mean / total_events)
            elif pairs > 0 and total_events > 0:
                t_mean = max(1.0, total_events / pairs)  # events per (user, key)
        if q.distinct_users:
            dropped = np.broadcast_to(drop_keys[:, :, None], K.shape)
            sensitivity = l0_eff.astype(np.float64)
            if q.mechanism != "discrete_laplace":
                sensitivity = np.sqrt(sensitivity)
        else:
            per_pair = kept_pairs / users if users > 0 else np.zeros(kept_pairs.shape)
            dropped = (
                share * drop_k[:, None, None]
                + t_mean * drop_keys[:, :, None]
                + per_pair[:, :, None] * drop_per_key[:, None, :]
            )
            sensitivity = (
                g.l1_count.astype(np.float64) if q.mechanism == "discrete_laplace" else g.l2_count
            )
        error = dropped / n_keys + mean_abs_noise(
            q.mechanism, sensitivity * q.scale_per_sensitivity
        )
        if q.keep_probability is not None and values:
            options = np.unique(l0_eff)
            costs = np.array(
                [
                    _selection_loss(q, int(v), values, 1.0 if q.distinct_users else t_mean)
                    for v in options
                ]
            )
            error = error + costs[np.searchsorted(options, l0_eff)] / n_keys
        objective = objective + error
    return objective


#: The selection term looks at this many released keys, the smallest (the ones at risk).
MAX_KEYS_AT_RISK = 2000


def _selection_loss(
    q: QueryModel, l0: int, values: Sequence[float], events_per_user: float
) -> float:
    """Σ over released keys of P(dropped at this L0) × the key's value: a larger L0 raises
    the users a private key needs, and a key that is not released is missing all its count.
    The keys' users are read off their released (noisy) values."""
    assert q.keep_probability is not None
    at_risk = sorted(max(0.0, float(v)) for v in values)[:MAX_KEYS_AT_RISK]
    per_user = max(1.0, events_per_user)
    return math.fsum(
        (1.0 - q.keep_probability(l0, max(0, round(v / per_user)))) * v for v in at_risk
    )


def candidates(cap: int) -> list[int]:
    """The values a bound may take: 1 … 16, then steps of 2^(1/4) (about 19%), and the cap.

    Finer than the histograms' bins (the estimate interpolates within a bin): the choice
    is not confined to powers of two.
    """
    out = list(range(1, min(cap, 16) + 1))
    i = 16
    while True:
        value = round(2 ** (i / 4))
        if value >= cap:
            break
        if value > out[-1]:
            out.append(value)
        i += 1
    if out[-1] != cap:
        out.append(cap)
    return out


def _capped_excess(dist: Distribution, bounds: np.ndarray, ks: np.ndarray) -> np.ndarray:
    """Σ_u max(0, min(v_u, k) − c) for every k in ``ks`` and bound c in ``bounds`` (0: the
    bound is not set, nothing dropped): what c removes once the reservoir kept ≤ k."""
    out = np.zeros((len(ks), len(bounds)))
    for i, k in enumerate(ks):
        at_k = dist.excess(int(k))
        for j, c in enumerate(bounds):
            if c and c < k:
                out[i, j] = max(0.0, dist.excess(int(c)) - at_k)
    return out


def _too_little_signal(noisy: NoisyHistograms, layout: HistogramLayout) -> bool:
    """Whether the first histogram's noisy user total is within MIN_SIGNAL_SDS of zero."""
    if not layout.names:
        return True
    first = layout.names[0]
    values = noisy.counts[first]
    sd = DiscreteLaplace(noisy.scales[first]).standard_deviation * math.sqrt(len(values))
    return sum(values) < MIN_SIGNAL_SDS * sd
