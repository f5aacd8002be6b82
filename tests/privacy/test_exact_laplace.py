"""The vectorised exact discrete Laplace sampler (stream_dp.privacy.exact_laplace).

Exactness pieces are checked deterministically where they can be (the rejection bound of
the uniform integers, the paths a lane takes when its counters grow), the laws by
goodness-of-fit tests against the closed-form pmf and against OpenDP's own sampler of the
same scale. Every statistical test uses a p-value threshold of 1e-8; there are 16 of them,
so the file fails by chance with probability below 1e-6.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator

import numpy as np
import pytest
from scipy.stats import binomtest, chi2_contingency, chisquare

from stream_dp.privacy import exact_laplace
from stream_dp.privacy.exact_laplace import (
    COUNTER_LIMIT,
    add_noise,
    bernoulli_exp,
    discrete_laplace,
    exact_parameters,
    uniform_below,
)
from stream_dp.privacy.mechanisms import DiscreteLaplace

P_THRESHOLD = 1e-8


class Scripted:
    """A word source that hands out fixed words (then fails loudly when it runs out)."""

    def __init__(self, words: list[int]) -> None:
        self._words: Iterator[int] = iter(words)

    def __call__(self, n: int) -> np.ndarray:
        return np.array([next(self._words) for _ in range(n)], dtype=np.uint64)


# -- uniform integers ------------------------------------------------------------------------


def test_uniform_below_rejects_the_words_that_would_bias_the_remainder() -> None:
    # 2^64 mod 3 = 1: the one word 2^64 - 1 must be drawn again, every other word is kept.
    words = Scripted([2**64 - 1, 2**64 - 2, 5])
    assert uniform_below(np.array([3, 3], dtype=np.uint64), words).tolist() == [
        (2**64 - 2) % 3,
        5 % 3,
    ]
    # m = 3·2^62: words from 3·2^62 up (a quarter of them) are rejected.
    m = 3 * 2**62
    words = Scripted([3 * 2**62, 2**64 - 1, 3 * 2**62 - 1])
    assert uniform_below(np.array([m], dtype=np.uint64), words).tolist() == [3 * 2**62 - 1]
    # Powers of two never reject.
    words = Scripted([2**64 - 1])
    assert uniform_below(np.array([2**10], dtype=np.uint64), words).tolist() == [2**10 - 1]


def _width(top: int) -> int:
    """The word width in bits the rule draws moduli up to ``top`` from."""
    return 16 if top <= 2**8 else 32 if top <= 2**24 else 64


def _cut(word: int, bits: int) -> list[int]:
    """A 64-bit word cut into words of ``bits`` in memory order (the machine's byte order)."""
    raw = word.to_bytes(8, sys.byteorder)
    size = bits // 8
    return [int.from_bytes(raw[i : i + size], sys.byteorder) for i in range(0, 8, size)]


def _uniform_rounds(moduli: list[int], taken: Iterator[int]) -> tuple[list[int], int]:
    """The rule written out, on Python integers: the width is that of the largest modulus;
    in each round the lanes still drawing take the next narrow words in lane order (as
    many 64-bit words as they need, each cut in memory order, the rest of the last one
    dropped) and keep w mod m if w < 2^width − (2^width mod m); also the words used."""
    out = [0] * len(moduli)
    bits = _width(max(moduli, default=1))
    pending, used = list(range(len(moduli))), 0
    while pending:
        drawing, pending = pending, []
        narrow: list[int] = []
        while len(narrow) < len(drawing):
            narrow += _cut(next(taken), bits)
            used += 1
        for lane, w in zip(drawing, narrow, strict=False):
            m = moduli[lane]
            if w < 2**bits - 2**bits % m:
                out[lane] = w % m
            else:
                pending.append(lane)
    return out, used


def _uniform_below_lane_by_lane(moduli: list[int], words: list[int]) -> tuple[list[int], int]:
    return _uniform_rounds(moduli, iter(words))


#: Moduli of each word width: 16 bits (up to 2^8), 32 bits (up to 2^24), 64 bits.
_KINDS = (
    [3, 7, 255, 2**8, 1],
    [3, 2**8 + 1, 3 * 2**22, 2**24, 2**20],
    [3 * 2**62, 2**63 + 1, 7, 2**10, 2**53 + 1],
)


@pytest.mark.parametrize("seed", range(24))
def test_uniform_below_is_the_lane_by_lane_rule_on_the_same_words(seed: int) -> None:
    """Same words, same integers, same words used, at every word width, whether every lane
    keeps its first word (the whole vector at once) or some draw again (lanes drawn again
    in order), with one modulus for every lane or several."""
    rng = np.random.default_rng(seed)
    n = [0, 1, 5, 300][seed % 4]
    kinds = _KINDS[(seed // 4) % 3]
    moduli = [kinds[i] for i in rng.integers(0, len(kinds), n).tolist()]
    if seed >= 12:  # one modulus for every lane (the rejecting largest of the width)
        moduli = [kinds[0] if seed % 2 else max(kinds)] * n
    words = rng.integers(0, 2**64, 4 * n + 40, dtype=np.uint64, endpoint=False).tolist()
    words[: n // 2] = [2**64 - 1] * (n // 2)  # rejected by every modulus that rejects any
    expected, used = _uniform_below_lane_by_lane(moduli, words)
    source = Scripted(words)
    drawn = uniform_below(np.array(moduli, dtype=np.uint64), source)
    assert drawn.dtype == np.uint64 and drawn.tolist() == expected
    assert len(list(source._words)) == len(words) - used  # the rest was not drawn


@pytest.mark.parametrize("m", [3, 7, 2**8, 2**8 + 1, 3 * 2**22, 2**24 + 1, 3 * 2**62])
def test_uniform_below_same_rejects_exactly_the_biased_words(m: int) -> None:
    """One modulus for every lane: the words at and above 2^width − (2^width mod m) of its
    width are drawn again, every other word is kept (w mod m), in lane order."""
    bits = _width(m)
    limit = 2**bits - 2**bits % m
    per = 64 // bits
    # lane 0 gets the largest kept word, lane 1 the first rejected one (if any)
    first = [limit - 1, limit if limit < 2**bits else 2**bits - 1] + [5] * (per - 2)
    again = [2**bits - 1] * per  # lane 1 again: rejected again when any word is
    last = [4] * per
    words = [sum(w << (bits * i) for i, w in enumerate(chunk)) for chunk in (first, again, last)]
    if sys.byteorder != "little":  # the cut is in memory order
        words = [int.from_bytes(w.to_bytes(8, "little"), "big") for w in words]
    rejects = limit < 2**bits
    expected = [(limit - 1) % m, 4 % m if rejects else (2**bits - 1) % m]
    if per == 1:
        words = [first[0], first[1], again[0], last[0]]
    source = Scripted(words)
    drawn = exact_laplace.uniform_below_same(2, m, source)
    assert drawn.dtype == np.uint64 and drawn.tolist() == expected
    assert _uniform_below_lane_by_lane([m, m], words)[0] == expected


def test_uniform_below_a_large_modulus_is_uniform() -> None:
    # With m = 3·2^62, a plain "w mod m" lands in [0, 2^62) half of the time instead of a
    # third; the exact sampler must show a third (binomial test, false failure ≤ 1e-8).
    n = 200_000
    m = np.full(n, 3 * 2**62, dtype=np.uint64)
    low = int(np.sum(uniform_below(m) < np.uint64(2**62)))
    assert binomtest(low, n, 1 / 3).pvalue > P_THRESHOLD


def test_uniform_below_small_moduli_are_uniform() -> None:
    # chi-square over the 7 values, false failure ≤ 1e-8
    draws = uniform_below(np.full(140_000, 7, dtype=np.uint64))
    counts = np.bincount(draws.astype(np.int64), minlength=7)
    assert counts.size == 7
    assert chisquare(counts).pvalue > P_THRESHOLD


# -- Bernoulli(exp(−γ)) ------------------------------------------------------------------------


@pytest.mark.parametrize(("num", "den"), [(0, 1), (1, 3), (2, 3), (1, 1), (999_999, 1_000_000)])
def test_bernoulli_exp_matches_exp_minus_gamma(num: int, den: int) -> None:
    # exact binomial test per γ (γ = 0 must always succeed), false failure ≤ 1e-8 each
    n = 100_000
    draws = bernoulli_exp(np.full(n, num, dtype=np.uint64), np.full(n, den, dtype=np.uint64))
    if num == 0:
        assert draws.all()
    else:
        assert binomtest(int(draws.sum()), n, math.exp(-num / den)).pvalue > P_THRESHOLD


def _bernoulli_exp_lane_by_lane(num: list[int], den: list[int], words: list[int]) -> list[bool]:
    """CKS20 Algorithm 1 written out on Python integers, round by round: at K = 1, 2, …
    every lane still going draws a uniform integer below den·K by the rule above (one
    call for the round's lanes, in lane order) and goes on if it is below num, else
    returns whether K is odd; a round at K = 1 with num = den on every lane is certain
    and draws nothing."""
    taken = iter(words)
    result = [False] * len(num)
    going, k = list(range(len(num))), 1
    while going:
        if k == 1 and num == den:
            k += 1
            continue
        draws, _ = _uniform_rounds([den[lane] * k for lane in going], taken)
        result_round = [d < num[lane] for d, lane in zip(draws, going, strict=True)]
        for lane, success in zip(going, result_round, strict=True):
            if not success:
                result[lane] = k % 2 == 1
        going = [lane for lane, success in zip(going, result_round, strict=True) if success]
        k += 1
    return result


@pytest.mark.parametrize("seed", range(12))
def test_bernoulli_exp_is_algorithm_1_lane_by_lane_on_the_same_words(seed: int) -> None:
    """One denominator for every lane (t or 1, the discrete Laplace's), several (the
    exponential mechanism's), γ = 1 everywhere (no word at K = 1): the same results from
    the same words as Algorithm 1 run lane by lane."""
    rng = np.random.default_rng(100 + seed)
    n = [1, 7, 200][seed % 3]
    shape = seed // 3
    if shape == 0:  # one denominator
        den = [10] * n
        num = rng.integers(0, 11, n).tolist()
    elif shape == 1:  # several, up to 32-bit and 64-bit moduli
        den = [int(d) for d in rng.choice([3, 10, 300, 2**30, 2**40 + 1], n)]
        num = [int(rng.integers(0, d + 1)) for d in den]
    elif shape == 2:  # γ = 1 on every lane
        num = den = [1] * n
    else:  # γ = 1 on one lane only: K = 1 is drawn
        den = [5] * n
        num = [5] + [int(x) for x in rng.integers(0, 6, n - 1)]
    words = rng.integers(0, 2**64, 50 * n + 400, dtype=np.uint64, endpoint=False).tolist()
    words[: n // 3] = [2**64 - 1] * (n // 3)  # some rejections in the first round
    expected = _bernoulli_exp_lane_by_lane(num, den, words)
    drawn = bernoulli_exp(
        np.array(num, dtype=np.uint64), np.array(den, dtype=np.uint64), Scripted(words)
    )
    assert drawn.tolist() == expected


def test_bernoulli_exp_with_several_denominators_matches_exp_minus_gamma() -> None:
    # lanes of γ = 1/3, 2/5 and 999/1000 interleaved (each round's moduli differ): an exact
    # binomial test per γ, false failure ≤ 1e-8 each
    n = 60_000
    num = np.tile(np.array([1, 2, 999], dtype=np.uint64), n)
    den = np.tile(np.array([3, 5, 1000], dtype=np.uint64), n)
    draws = bernoulli_exp(num, den)
    for lane, gamma in enumerate((1 / 3, 2 / 5, 999 / 1000)):
        hits = int(draws[lane::3].sum())
        assert binomtest(hits, n, math.exp(-gamma)).pvalue > P_THRESHOLD


def test_fair_bits_are_the_words_bits_in_order() -> None:
    words = [0x8000_0000_0000_0001, 2**64 - 1, 0x0123_4567_89AB_CDEF]
    raw = b"".join(w.to_bytes(8, sys.byteorder) for w in words)
    expected = [bool(byte >> (7 - i) & 1) for byte in raw for i in range(8)]
    for n in (1, 63, 64, 65, 150, 192):
        source = Scripted(words)
        bits = exact_laplace.fair_bits(n, source)
        assert bits.dtype == bool and bits.tolist() == expected[:n]
        assert len(list(source._words)) == len(words) - -(-n // 64)


@pytest.mark.parametrize("successes_after_the_limit", [0, 1, 2, 3])
def test_a_lane_whose_counter_reaches_the_limit_finishes_exactly(
    monkeypatch: pytest.MonkeyPatch, successes_after_the_limit: int
) -> None:
    """With γ = 1 the first Bernoulli(γ/1) is certain (no word), then words of 0 make every
    Bernoulli(γ/K) succeed, so K climbs to the limit in exactly COUNTER_LIMIT − 2 words;
    the lane then continues Algorithm 1 in Python integers from K = COUNTER_LIMIT (draws
    below den·K for K = limit, limit + 1, …, scripted here) and returns whether it stopped
    at an odd K."""
    calls: list[int] = []
    answers = iter([0] * successes_after_the_limit + [1])  # < num = 1 succeeds, 1 stops

    def randbelow(n: int) -> int:
        calls.append(n)
        return next(answers)

    monkeypatch.setattr(exact_laplace.secrets, "randbelow", randbelow)
    words = Scripted([0] * (COUNTER_LIMIT - 2))
    (draw,) = bernoulli_exp(np.array([1], dtype=np.uint64), np.array([1], dtype=np.uint64), words)
    stopped_at = COUNTER_LIMIT + successes_after_the_limit
    assert calls == list(range(COUNTER_LIMIT, stopped_at + 1))  # den·K, K from the limit on
    assert bool(draw) is (stopped_at % 2 == 1)
    assert next(words._words, None) is None  # every scripted word used, none more


def test_lanes_of_one_denominator_reach_the_limit_while_another_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three lanes of γ = 1 (one denominator): lane 0 stops at K = 2, lanes 1 and 2 climb
    to the limit and finish in Python integers, each with its own denominator and draws
    (lane 1 stops at the limit, an even K; lane 2 one step later, an odd K)."""
    calls: list[int] = []
    answers = iter([1, 0, 1])  # lane 1: stops at once; lane 2: one success, then stops

    def randbelow(n: int) -> int:
        calls.append(n)
        return next(answers)

    monkeypatch.setattr(exact_laplace.secrets, "randbelow", randbelow)
    first = (1).to_bytes(2, sys.byteorder) + bytes(6)  # 16-bit words 1, 0, 0 (and one more)
    words = Scripted([int.from_bytes(first, sys.byteorder)] + [0] * (COUNTER_LIMIT - 3))
    ones = np.ones(3, dtype=np.uint64)
    assert bernoulli_exp(ones, ones, words).tolist() == [False, False, True]
    assert calls == [COUNTER_LIMIT, COUNTER_LIMIT, COUNTER_LIMIT + 1]
    assert next(words._words, None) is None


def test_a_geometric_count_at_the_limit_switches_to_python_integers() -> None:
    # Bernoulli(exp(−1)) succeeds when Algorithm 1 stops at an odd K: K = 1 is certain
    # (no word), draws 0 (below 2), 1 (below 3) stop it at K = 3. Scripted so, every trial
    # succeeds until the count reaches the limit.
    words = Scripted([0, 1] * (COUNTER_LIMIT + 5))
    counts = exact_laplace._geometric_exp_minus_one(1, words)
    assert counts.dtype == object and int(counts[0]) >= COUNTER_LIMIT


# -- the discrete Laplace law -----------------------------------------------------------------


def _pmf(scale: float, z: np.ndarray) -> np.ndarray:
    q = math.exp(-1.0 / scale)
    return (1 - q) / (1 + q) * np.exp(-np.abs(z) / scale)


def _fit_pvalue(samples: np.ndarray, scale: float) -> float:
    """Chi-square of the samples against the pmf; bins with ≥ 20 expected, tails pooled."""
    n = len(samples)
    half = 0
    while 2 * half + 3 <= 200 and _pmf(scale, np.array([half + 1]))[0] * n >= 20:
        half += 1
    values = np.arange(-half, half + 1)
    probs = _pmf(scale, values)
    tail = (1.0 - probs.sum()) / 2
    observed = [
        np.sum(samples < -half),
        *np.bincount(samples[np.abs(samples) <= half] + half, minlength=values.size),
        np.sum(samples > half),
    ]
    expected = np.array([tail, *probs, tail]) * n
    keep = expected > 0
    return float(chisquare(np.array(observed)[keep], expected[keep]).pvalue)


@pytest.mark.parametrize("scale", [0.7, 1 / 3, 3.0, 30 / 0.3, 1234.5])
def test_samples_fit_the_discrete_laplace_pmf(scale: float) -> None:
    # 30/0.3 is 100.00000000000001: a scale whose exact rational has a 2^46 denominator.
    params = exact_parameters(scale)
    assert params is not None
    samples = discrete_laplace(200_000, *params)
    assert samples.dtype == np.int64
    assert _fit_pvalue(samples, scale) > P_THRESHOLD


def test_samples_match_opendps_sampler_of_the_same_scale() -> None:
    # chi-square test of homogeneity (contingency table of the two samples' bins), false
    # failure ≤ 1e-8; OpenDP draws by the same algorithms in arbitrary precision.
    scale = 6.0
    mech = DiscreteLaplace(scale)
    ours = np.asarray(mech.sample([0] * 100_000))
    theirs = np.asarray(mech.opendp_measurement()(np.zeros(100_000, dtype=np.int64)))
    edges = np.array([-np.inf, *range(-15, 16), np.inf])
    table = np.array([np.histogram(ours, edges)[0], np.histogram(theirs, edges)[0]])
    assert table.min() >= 5
    assert chi2_contingency(table).pvalue > P_THRESHOLD


def test_the_fit_test_detects_a_small_scale_error() -> None:
    # Samples of scale 3.15 judged against the pmf of scale 3.0 must be rejected (a 5%
    # error; not rejecting would need a deviation of > 10 standard deviations).
    samples = discrete_laplace(400_000, *exact_parameters(3.15))  # type: ignore[misc]
    assert _fit_pvalue(samples, 3.0) < P_THRESHOLD


def test_a_tiny_scale_is_almost_always_zero_and_exact_scales_cover_the_config_range() -> None:
    # scale 0.05: P(Z ≠ 0) = 2e^-20/(1+e^-20) ≈ 4e-9 per draw
    samples = discrete_laplace(100_000, *exact_parameters(0.05))  # type: ignore[misc]
    assert not samples.any()
    for scale in (0.003, 0.05, 1.0, 33.333333333333336, 2**52 + 0.5, 1e12, 1e12 / 3):
        assert exact_parameters(scale) is not None, scale
    # Beyond 64-bit room the scale is OpenDP's, and sampling still works.
    assert exact_parameters(1e-10) is None
    assert exact_parameters(2.0**60) is None
    assert len(DiscreteLaplace(1e-10).sample([3, 4])) == 2


def test_values_plus_noise_saturate_like_64_bit_integers() -> None:
    """... as an int64 array, a lane past int64 (an object noise) too."""
    big = 2**63 - 1
    noise = np.array([5, -5, 0, 7], dtype=np.int64)
    total = add_noise([big - 2, -big, 12, -(2**40)], noise)
    assert total.dtype == np.int64
    assert total.tolist() == [big, -(2**63), 12, -(2**40) + 7]
    wide = add_noise([1, 1], np.array([2**70, -3], dtype=object))
    assert wide.dtype == np.int64
    assert wide.tolist() == [big, -2]


def test_sample_is_sample_array_as_python_ints(monkeypatch: pytest.MonkeyPatch) -> None:
    """The release's int64 array and ``sample``'s list are the same draw from the same
    words: the list is the array's values as Python integers."""
    mech = DiscreteLaplace(3.5)
    values = np.array([0, 5, -(2**63), 2**63 - 1, 40], dtype=np.int64)
    made = []
    for method in (mech.sample_array, mech.sample):
        words = np.random.default_rng(11).bytes
        monkeypatch.setattr("stream_dp.privacy.exact_laplace.secrets.token_bytes", words)
        made.append(method(values))
    assert made[0].dtype == np.int64
    assert isinstance(made[1], list) and all(type(v) is int for v in made[1])
    assert made[0].tolist() == made[1]


def test_a_draw_whose_geometric_count_is_past_int64_is_exact(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CKS20 Algorithm 2's Y = ⌊(U + t·V)/s⌋ in Python integers when V is beyond int64 (the
    counter-limit path): the draw is ±Y exactly, not rounded or clipped."""
    huge = 2**70
    monkeypatch.setattr(
        exact_laplace,
        "_geometric_exp_minus_one",
        lambda n, words: np.array([huge] * n, dtype=object),
    )
    t, s = 3, 2
    possible = {(u + t * huge) // s for u in range(t)}
    draws = discrete_laplace(50, t, s)
    assert draws.dtype == object
    assert all(abs(int(d)) in possible for d in draws)
    assert {int(d) > 0 for d in draws} == {True, False}  # both signs (P(one) = 2^-49)


def test_exact_parameters_hold_the_documented_limits_inclusive() -> None:
    """t ≤ 2⁵³ + 1 and s ≤ 2⁶² are sampled here (every intermediate integer still fits 64
    bits); one step beyond either goes to OpenDP. Binary64 scales reach s = 2⁶² and
    t = 2⁵³ exactly."""
    assert exact_parameters(2.0**-62) == (1, 2**62)
    assert exact_parameters(3 * 2.0**-62) == (3, 2**62)
    assert exact_parameters(2.0**-63) is None
    assert exact_parameters(2.0**53) == (2**53, 1)
    assert exact_parameters(2.0**54) is None
    draws = discrete_laplace(1000, 1, 2**62)  # scale 2⁻⁶²: P(Z ≠ 0) below 1e-300
    assert not draws.any()
