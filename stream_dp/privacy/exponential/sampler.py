"""The exponential mechanism on integer utilities, sampled exactly from the OS CSPRNG.

Given integer utilities u_1 … u_n and a scale b > 0, :func:`sample_exponential_mechanism`
returns index i with probability exactly exp(u_i/b) / Σ_j exp(u_j/b) (McSherry & Talwar
2007). It is the selection step of private top-k (:mod:`.top_k`, one draw per peeling round)
and of private quantiles (:mod:`.quantiles`, one draw per quantile). Many independent
problems of equal size are sampled at once (one row each), so a window's groups share the
vectorised loops.

Why the draw is exact (no floating-point operation touches it)
--------------------------------------------------------------
* The scale b (a binary64 float) is exactly the rational t/s of ``Fraction(b)``, with
  t ≤ 2⁵³ + 1 (:func:`~stream_dp.privacy.exact_laplace.exact_parameters`).
* Rejection sampling: propose an index J uniformly (an exact uniform integer,
  :func:`~stream_dp.privacy.exact_laplace.uniform_below`), accept it with probability
  exp(−g_J/b), where g_J = max_j u_j − u_J ≥ 0 is an integer gap; otherwise propose again.
  The accepted index has probability ∝ exp(−g_i/b) ∝ exp(u_i/b): the exponential
  mechanism's law. At least the top index is accepted with probability 1, so each proposal
  succeeds with probability ≥ 1/n and the loop ends with probability 1.
* Proposals are drawn in batches of independent lanes; the first accepted lane of the first
  batch with any acceptance is the sample (the first success of an i.i.d. sequence), so
  batching changes nothing in the law.
* exp(−g/b) = exp(−g·s/t) = exp(−1)^w · exp(−r/t) with w = ⌊g·s/t⌋ and r = g·s mod t
  (integers): w successive Bernoulli(exp(−1)) successes, then one Bernoulli(exp(−r/t)),
  each CKS20 Algorithm 1 (:func:`~stream_dp.privacy.exact_laplace.bernoulli_exp`) on
  rationals in [0, 1]. g·s is computed in Python integers where it would not fit 64 bits;
  lanes needing more than :data:`WHOLE_LIMIT` successes (probability below e⁻⁵¹²) finish
  in Python integers, which have no limit, so the law is exact on every path.
* Unavailable candidates (already chosen by an earlier peeling round) are proposed too and
  always rejected: the proposal is then uniform over the available ones, still exact.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from fractions import Fraction

import numpy as np

from stream_dp.errors import ConfigError
from stream_dp.privacy.exact_laplace import (
    WordSource,
    bernoulli_exp,
    exact_parameters,
    os_words,
    uniform_below,
)

#: Lanes whose acceptance needs more Bernoulli(exp(−1)) successes than this finish in Python
#: integers (LIMIT · t stays below 2⁶³ for t ≤ 2⁵³ + 1).
WHOLE_LIMIT = 512
#: Largest |utility|: gaps stay below 2⁶³.
MAX_UTILITY = 2**61
#: Most proposals drawn at once per row.
MAX_LANES = 1 << 16

_U64 = np.uint64


def exact_scale(scale: float, *, what: str) -> tuple[int, int]:
    """(t, s) with t/s exactly ``scale``; a ConfigError naming ``what`` if the exact sampler
    cannot hold it (scales below about 2⁻¹⁰ or above 2⁵³)."""
    if not (scale > 0 and np.isfinite(scale)):
        raise ConfigError(f"{what}: the scale must be a positive finite number, got {scale}")
    params = exact_parameters(scale)
    if params is None:
        raise ConfigError(
            f"{what}: scale {scale:g} is outside what the exact sampler holds (about 2^-10 to "
            "2^53); lower epsilon or raise the bounds"
        )
    return params


def bernoulli_exp_of_gap(
    gaps: np.ndarray, t: int, s: int, words: WordSource = os_words
) -> np.ndarray:
    """Per lane Bernoulli(exp(−g·s/t)) for integer gaps g ≥ 0 (int64), exactly."""
    n = len(gaps)
    # Lanes with g·s ≥ WHOLE_LIMIT·t need at least WHOLE_LIMIT successes ("big" lanes).
    big_from = -(-(WHOLE_LIMIT * t) // s)  # ⌈LIMIT·t/s⌉
    big = gaps >= big_from
    small = ~big
    scaled = gaps[small].astype(_U64) * _U64(s)  # < LIMIT·t ≤ 2^62 + 2^9: fits
    whole = np.full(n, WHOLE_LIMIT, dtype=np.int64)
    rest = np.zeros(n, dtype=_U64)
    whole[small] = (scaled // _U64(t)).astype(np.int64)
    rest[small] = scaled % _U64(t)
    alive = np.ones(n, dtype=bool)
    pending = np.flatnonzero(whole > 0)
    step = 0
    while pending.size:
        ones = np.ones(pending.size, dtype=_U64)
        success = bernoulli_exp(ones, ones, words)
        alive[pending[~success]] = False
        pending = pending[success]
        step += 1
        pending = pending[whole[pending] > step]
    for lane in np.flatnonzero(alive & big).tolist():
        alive[lane] = _finish_big_lane(int(gaps[lane]) * s, t)
    last = np.flatnonzero(alive & small)
    if last.size:
        alive[last] = bernoulli_exp(rest[last], np.full(last.size, _U64(t)), words)
    return alive


def _finish_big_lane(numerator: int, t: int) -> bool:
    """A lane that had WHOLE_LIMIT Bernoulli(exp(−1)) successes: the rest of
    Bernoulli(exp(−numerator/t)) in Python integers (reached with probability < e⁻⁵¹²)."""
    whole, rest = divmod(numerator, t)
    for _ in range(whole - WHOLE_LIMIT):
        if not _bernoulli_exp_fraction(Fraction(1)):
            return False
    return _bernoulli_exp_fraction(Fraction(rest, t))


def _bernoulli_exp_fraction(gamma: Fraction) -> bool:
    """Bernoulli(exp(−γ)) for rational γ ∈ [0, 1] (CKS20 Algorithm 1, Python integers)."""
    k = 1
    while secrets.randbelow(gamma.denominator * k) < gamma.numerator:
        k += 1
    return k % 2 == 1


def sample_exponential_mechanism(
    utilities: np.ndarray,
    scale: float,
    *,
    available: np.ndarray | None = None,
    words: WordSource = os_words,
) -> np.ndarray:
    """Per row of ``utilities`` (int64, shape rows × n) an index i drawn with probability
    exp(u_i/b) / Σ_j exp(u_j/b) over the row's available candidates (all when ``available``
    is None); −1 for a row with none available. Exact (module docstring)."""
    t, s = exact_scale(scale, what="exponential mechanism")
    u = np.asarray(utilities, dtype=np.int64)
    if u.ndim != 2:
        raise ValueError("utilities must be a 2-d array (one row per problem)")
    rows, n = u.shape
    mask = np.ones(u.shape, dtype=bool) if available is None else np.asarray(available, bool)
    if u.size and int(np.abs(u).max()) > MAX_UTILITY:
        raise ValueError(f"utilities must lie within ±{MAX_UTILITY}")
    if n == 0:
        return np.full(rows, -1, dtype=np.int64)
    top = np.where(mask, u, -MAX_UTILITY - 1).max(axis=1)
    gaps = top[:, None] - u  # ≥ 0 where available
    return sample_by_gaps(
        rows,
        n,
        lambda r, i: gaps[r, i],
        t,
        s,
        pending=np.flatnonzero(mask.any(axis=1)),
        available=None if available is None else (lambda r, i: mask[r, i]),
        words=words,
    )


def sample_by_gaps(
    rows: int,
    n: int,
    gap_of: Callable[[np.ndarray, np.ndarray], np.ndarray],
    t: int,
    s: int,
    *,
    pending: np.ndarray | None = None,
    available: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
    words: WordSource = os_words,
) -> np.ndarray:
    """:func:`sample_exponential_mechanism` of ``rows`` problems of n candidates each, the
    gaps max_j u_j − u_i (integers ≥ 0) read only where proposed: ``gap_of(rows, indices)``
    (and ``available(rows, indices)``, all when None). The draw and the words it takes are
    those of the full table's; no rows × n table is built (a quantile's histograms are
    sparse: :mod:`.bin_counts`). ``pending``: the rows to draw (every row by default);
    the others get −1. ``t/s``: the scale, exactly (:func:`exact_scale`)."""
    chosen = np.full(rows, -1, dtype=np.int64)
    pending = np.arange(rows, dtype=np.int64) if pending is None else pending
    lanes = 1
    while pending.size:
        proposals = uniform_below(np.full(pending.size * lanes, _U64(n)), words)
        idx = proposals.astype(np.int64).reshape(pending.size, lanes)
        row_idx = np.repeat(pending, lanes).reshape(pending.size, lanes)
        ok = np.ones(idx.shape, dtype=bool) if available is None else available(row_idx, idx)
        accepted = np.zeros(idx.shape, dtype=bool)
        accepted[ok] = bernoulli_exp_of_gap(gap_of(row_idx[ok], idx[ok]), t, s, words)
        hit = accepted.any(axis=1)
        first = accepted.argmax(axis=1)
        done = pending[hit]
        chosen[done] = idx[hit, first[hit]]
        pending = pending[~hit]
        lanes = min(2 * lanes, n, MAX_LANES)
    return chosen
