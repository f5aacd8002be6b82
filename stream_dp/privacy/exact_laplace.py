"""Exact discrete Laplace samples for whole vectors at once, from the OS CSPRNG.

The sampler is Canonne, Kamath & Steinke 2020 ("The Discrete Gaussian for Differential
Privacy"), Algorithms 1 and 2, run on every lane of a vector in lock step with numpy, on
unsigned integers of at most 64 bits. OpenDP's ``make_laplace`` implements the same two
algorithms with arbitrary-precision rationals, one value at a time (~9 µs a value here);
this module draws 100,000 values in a few tens of milliseconds, which a 100,000-key
release needs.

Why the samples are exact
-------------------------
* The scale b (a binary64 float) is exactly the rational t/s of ``Fraction(b)``; b > 0 and
  finite, so t, s ≥ 1 with s a power of two. Scales whose t or s do not fit the bounds below
  (b below about 2⁻¹⁰ or above 2⁵³ — far outside the configurable noise scales) are left to
  OpenDP by the caller.
* Every random integer is drawn uniformly and exactly: a word w of β random bits is
  accepted when w < 2^β − (2^β mod m), so that ``w mod m`` is uniform on {0, …, m − 1},
  and drawn again otherwise (rejection sampling). The words are cut in order from 64-bit
  words of ``secrets.token_bytes`` (the OS CSPRNG): β = 16 for moduli up to 2⁸, 32 up to
  2²⁴, else 64 (the bits of those words are independent and uniform, so are the narrow
  words cut from them; at most 2⁻⁸ of the words are rejected). Whatever the width, each
  integer is exactly uniform and independent of every other draw, so a width chosen from
  the moduli of the lanes still drawing changes no law. A round of lanes with one modulus
  (the scale's t, Algorithm 1's K) keeps it as one number.
* Bernoulli(n/m) is "a uniform integer below m is below n": exact.
* Bernoulli(exp(−γ)) for rational γ = n/m ∈ [0, 1] is Algorithm 1: K ← 1; while
  Bernoulli(γ/K) succeeds, K ← K + 1; the result is "K is odd", whose probability is
  Σ_k (−γ)^k/k! = exp(−γ) exactly (CKS20, Proposition 3). γ/K = n/(m·K): integers again.
  With γ = 1 the first trial, Bernoulli(1), succeeds with certainty and draws nothing.
* Algorithm 2 (CKS20, Proposition 5): U uniform on {0, …, t − 1}, kept with probability
  exp(−U/t) (else start again); V the number of successes of Bernoulli(exp(−1)) before the
  first failure; X = U + t·V is then geometric, P(X = x) ∝ exp(−x/t); Y = ⌊X/s⌋ is
  geometric with P(Y ≥ y) = exp(−y·s/t); a fair sign B (one bit of a random word per
  lane), rejecting (B = 1, Y = 0) so that 0 is not counted twice, gives
  P(Z = z) ∝ exp(−|z|·s/t) = exp(−|z|/b): the discrete Laplace law of scale b, with no
  floating-point operation anywhere.
* Lanes are independent: each consumes its own random words, and a lane's loops end by its
  own draws only (no lane is truncated, capped or conditioned on another). Intermediate
  integers stay below 2⁶⁴: t ≤ 2⁵³ + 1 and the loop counters K (Algorithm 1) and V
  (the geometric count) stay below 2¹⁰ except with probability below 2⁻¹⁰⁰⁰⁰; a lane that
  gets there anyway is finished in Python integers, which have no limit, so the law is
  exact on every path.

Released values are ``value + Z`` on 64-bit integers, saturating at the int64 limits like
OpenDP's (far outside any bounded count).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

#: Largest t (numerator of the scale) and s (its denominator) handled here: U + t·V and
#: the products m·K of Algorithm 1 must fit 64 bits while K, V < COUNTER_LIMIT.
MAX_NUMERATOR = 2**53 + 1
MAX_DENOMINATOR = 2**62
#: Loop counters of lanes that reach this finish in Python integers (never, in practice).
COUNTER_LIMIT = 1024
#: Largest moduli drawn from 16-bit and 32-bit words (:func:`uniform_below`): at most
#: 2⁻⁸ of the words are then rejected and drawn again.
NARROW_16_MAX = 2**8
NARROW_32_MAX = 2**24

_U64 = np.uint64
_ZERO = _U64(0)
_ONE = _U64(1)

#: n → n uniformly random 64-bit words (the test suite substitutes scripted words).
WordSource = Callable[[int], np.ndarray]


def os_words(n: int) -> np.ndarray:
    """n random 64-bit words from the OS CSPRNG."""
    return np.frombuffer(secrets.token_bytes(8 * n), dtype=np.uint64).copy()


def exact_parameters(scale: float) -> tuple[int, int] | None:
    """(t, s) with t/s exactly the scale, if this module can sample it; else None."""
    exact = Fraction(scale)
    t, s = exact.numerator, exact.denominator
    if t < 1 or t > MAX_NUMERATOR or s > MAX_DENOMINATOR:
        return None
    return t, s


def uniform_below(m: np.ndarray, words: WordSource = os_words) -> np.ndarray:
    """Per lane an exactly uniform integer in [0, m_i) (m_i ≥ 1, uint64), by rejection.

    The word width is the narrowest of 16, 32 and 64 bits whose rejection rate is small for
    the call's largest modulus (:data:`NARROW_16_MAX`, :data:`NARROW_32_MAX`): a w-bit word
    is kept when it is below 2^w − (2^w mod m), then w mod m is uniform on [0, m) for that
    width as for any other. Narrow words are cut from the 64-bit words in order (four or
    two per word, the last word's unused part dropped): the same bits, fewer of them."""
    n = len(m)
    top = int(m.max()) if n else 1
    if n and int(m.min()) == top:
        return uniform_below_same(n, top, words)
    narrow = _word_type(top)
    mw = m.astype(narrow)  # every modulus fits the words' type
    zero = narrow(0)
    # 2^bits mod m, in the words' arithmetic: (2^bits − m) mod m.
    excess = (zero - mw) % mw
    out = np.empty(n, dtype=np.uint64)
    todo = np.arange(n)
    mm, ex = mw, excess  # the lanes still drawing: every lane, in order, at first
    while todo.size:
        w = narrow_words(todo.size, narrow, words)
        ok = (ex == zero) | (w < zero - ex)  # w < 2^bits − excess
        if todo.size == n and ok.all():  # every lane kept its word (nearly always)
            result: np.ndarray = (w % mm).astype(np.uint64)
            return result
        done = todo[ok]
        out[done] = w[ok] % mm[ok]
        todo = todo[~ok]
        mm, ex = mw[todo], excess[todo]
    return out


def uniform_below_same(n: int, m: int, words: WordSource = os_words) -> np.ndarray:
    """n exactly uniform integers in [0, m) (1 ≤ m < 2⁶⁴), as :func:`uniform_below` draws
    them for n lanes of the same modulus — the same words, used the same way — with the
    modulus and the rejection limit one number instead of a vector."""
    narrow = _word_type(m)
    bits = 8 * np.dtype(narrow).itemsize
    limit = 2**bits - 2**bits % m  # 2^bits when m is a power of two: no word is rejected
    modulus = narrow(m)
    below = narrow(limit) if limit < 2**bits else None
    w = narrow_words(n, narrow, words)
    ok = np.ones(0, dtype=bool) if below is None else w < below
    if below is None or ok.all():  # every lane kept its word (nearly always)
        kept: np.ndarray = (w % modulus).astype(np.uint64)
        return kept
    out = np.empty(n, dtype=np.uint64)
    out[ok] = w[ok] % modulus
    todo = np.flatnonzero(~ok)
    while todo.size:  # the lanes that drew again, in order
        w = narrow_words(todo.size, narrow, words)
        ok = w < below
        out[todo[ok]] = w[ok] % modulus
        todo = todo[~ok]
    return out


def _word_type(top: int) -> type[np.unsignedinteger[Any]]:
    """The word width :func:`uniform_below` draws moduli up to ``top`` from."""
    if top <= NARROW_16_MAX:
        return np.uint16
    return np.uint32 if top <= NARROW_32_MAX else np.uint64


def narrow_words(
    n: int, narrow: type[np.unsignedinteger[Any]], words: WordSource = os_words
) -> np.ndarray:
    """n random words of the dtype ``narrow`` (uint16, uint32 or uint64), cut in order
    from ⌈n / (64 / width)⌉ 64-bit words (the last word's unused part dropped)."""
    per = 8 // np.dtype(narrow).itemsize
    if per == 1:
        return words(n)
    drawn = np.ascontiguousarray(words(-(-n // per)), dtype=np.uint64)
    narrowed: np.ndarray = drawn.view(narrow)[:n]
    return narrowed


def bernoulli_exp(num: np.ndarray, den: np.ndarray, words: WordSource = os_words) -> np.ndarray:
    """Per lane Bernoulli(exp(−num/den)), 0 ≤ num ≤ den (CKS20 Algorithm 1), exactly.

    Every lane starts at K = 1 and a lane still going has drawn once per K before, so the
    lanes of a round share their K: one counter, the lanes still going kept as columns.
    With one denominator for every lane (the discrete Laplace's t, or 1) a round's
    modulus den·K is one number (:func:`uniform_below_same`). When γ = 1 on every lane
    (Bernoulli(exp(−1)), the geometric count's trial) the first round's Bernoulli(γ/1)
    succeeds with certainty and draws nothing."""
    n = len(num)
    result = np.zeros(n, dtype=bool)
    same = n > 0 and int(den.min()) == int(den.max())
    sure = n > 0 and bool(np.array_equal(num, den))
    lanes, num_k, den_k = np.arange(n), num, den
    k = 1
    while lanes.size:
        if k >= COUNTER_LIMIT:
            dens = [int(den[0])] * lanes.size if same else den_k.tolist()
            for lane, a, b in zip(lanes.tolist(), num_k.tolist(), dens, strict=True):
                result[lane] = _bernoulli_exp_tail(a, b, k)
            break
        if k == 1 and sure:  # Bernoulli(γ/1) with γ = 1 on every lane: certain, no draw
            k += 1
            continue
        if same:
            u = uniform_below_same(lanes.size, int(den[0]) * k, words)
        else:
            u = uniform_below(den_k * _U64(k), words)
        success = u < num_k
        if k % 2 == 1:  # the lanes that stop here stopped at an odd K
            result[lanes[~success]] = True
        lanes, num_k = lanes[success], num_k[success]
        if not same:
            den_k = den_k[success]
        k += 1
    return result


def _bernoulli_exp_tail(num: int, den: int, k: int) -> bool:
    """Algorithm 1 continued from counter k, in Python integers."""
    while secrets.randbelow(den * k) < num:
        k += 1
    return k % 2 == 1


def discrete_laplace(n: int, t: int, s: int, words: WordSource = os_words) -> np.ndarray:
    """n independent draws of the discrete Laplace law of scale t/s (CKS20 Algorithm 2).

    int64 values; an object array of Python integers in the (never seen) case that a lane's
    geometric count reached :data:`COUNTER_LIMIT`.
    """
    out = np.zeros(n, dtype=np.int64)
    wide: np.ndarray | None = None
    pending = np.arange(n)
    t64, s64 = _U64(t), _U64(s)
    while pending.size:
        m = pending.size
        u = uniform_below_same(m, t, words)
        keep = bernoulli_exp(u, np.full(m, t64, dtype=np.uint64), words)
        kept = np.flatnonzero(keep)
        lanes, u = pending[kept], u[kept]
        v = _geometric_exp_minus_one(lanes.size, words)
        negative = fair_bits(lanes.size, words)  # B = 1
        if v.dtype == object:
            y = (u.astype(object) + t * v) // s
            accepted = ~(negative & (y == 0))
            if wide is None:
                wide = out.astype(object)
            values = y[accepted]
            values[negative[accepted]] *= -1
            wide[lanes[accepted]] = values
        else:
            y = ((u + t64 * v) // s64).astype(np.int64)  # < 2^63: U + t·V < 2^63
            accepted = ~(negative & (y == 0))
            values = y[accepted]
            values[negative[accepted]] *= -1
            out[lanes[accepted]] = values
            if wide is not None:
                wide[lanes[accepted]] = values.astype(object)
        finished = np.zeros(m, dtype=bool)
        finished[kept[accepted]] = True
        pending = pending[~finished]
    return wide if wide is not None else out


def fair_bits(n: int, words: WordSource = os_words) -> np.ndarray:
    """n independent fair bits (bool), the bits of ⌈n/64⌉ words in order (each byte's
    bits from the most significant; the last word's unused bits dropped)."""
    drawn = np.ascontiguousarray(words(-(-n // 64)), dtype=np.uint64)
    bits: np.ndarray = np.unpackbits(drawn.view(np.uint8), count=n).astype(bool)
    return bits


def _geometric_exp_minus_one(n: int, words: WordSource) -> np.ndarray:
    """Per lane the number of Bernoulli(exp(−1)) successes before the first failure
    (uint64; an object array if a lane reached :data:`COUNTER_LIMIT`)."""
    v = np.zeros(n, dtype=np.uint64)
    active = np.arange(n)
    while active.size:
        ones = np.ones(active.size, dtype=np.uint64)
        active = active[bernoulli_exp(ones, ones, words)]
        v[active] += _ONE
        if active.size and int(v[active].max()) >= COUNTER_LIMIT:
            wide = v.astype(object)
            for lane in active.tolist():
                count = int(v[lane])
                while _bernoulli_exp_tail(1, 1, 1):
                    count += 1
                wide[lane] = count
            return wide
    return v


_I64 = np.iinfo(np.int64)


def add_noise(values: Sequence[int] | np.ndarray, noise: np.ndarray) -> np.ndarray:
    """value + noise per lane on 64-bit integers, saturating at the int64 limits (as
    OpenDP's ``saturating_add``): an int64 array (no Python object per value; a release
    of 1,000,000 keys keeps it so up to its records' encoding)."""
    if noise.dtype == object:
        return np.array(
            [
                max(_I64.min, min(_I64.max, int(v) + int(z)))
                for v, z in zip(values, noise, strict=True)
            ],
            dtype=np.int64,
        )
    v = np.asarray(values, dtype=np.int64)
    with np.errstate(over="ignore"):
        total: np.ndarray = v + noise
    total[(noise > 0) & (total < v)] = _I64.max
    total[(noise < 0) & (total > v)] = _I64.min
    return total
