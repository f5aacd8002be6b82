"""The counting behind ``false_refusal_bound`` (how often a truly random key is refused),
checked independently of the module's own algorithms on cases small enough to enumerate:

- the dictionary rule's union bound (``_coverage_bound``, a dynamic programme) equals the
  sum its docstring defines, enumerated here placement set by placement set, and that sum
  covers the exact probability of the rule, enumerated string by string;
- the distinct-values bound (``_occupancy_at_most``) equals the union over the value sets,
  enumerated set by set;
- ``_words_in`` counts exactly the listed words spelt with the given letters (also words
  using every one of them: "dead" with a, d, e).

All checks are exact (``Fraction``): no tolerance and no randomness.
"""

from __future__ import annotations

import itertools
import math
import re
import string
from collections import Counter
from fractions import Fraction

import pytest

from stream_dp.privacy.key_strength import (
    MAX_WORD_COVERAGE,
    WORDS,
    _coverage_bound,
    _occupancy_at_most,
    _words_in,
)


def _target(n: int) -> int:
    """Characters words must cover for the rule to refuse: half of n or more."""
    return math.ceil(MAX_WORD_COVERAGE * n)


def _union_by_enumeration(
    n: int, match: Fraction, words: dict[int, int], last: Fraction
) -> Fraction:
    """Σ over every set of non-overlapping placements (start, length) covering ≥ half of n
    characters of Π count(length) · P(the placement's characters match), the last
    character matching with probability ``last``: enumerated set by set."""
    spans = [(s, length) for length in words for s in range(n - length + 1)]
    shortest = min(words) if words else 1
    total = Fraction(0)
    for size in range(1, n // shortest + 1):
        for chosen in itertools.combinations(spans, size):
            cells = [c for s, length in chosen for c in range(s, s + length)]
            if len(cells) != len(set(cells)) or len(cells) < _target(n):
                continue
            weight = Fraction(1)
            for s, length in chosen:
                weight *= words[length] * match ** (length - 1)
                weight *= last if s + length == n else match
            total += weight
    return total


CASES = (
    [
        # (n, match, words per length, last_match)
        (n, Fraction(1, 3), {2: 2, 3: 1}, last)
        for n in range(1, 10)
        for last in (Fraction(1, 3), Fraction(1, 2))
    ]
    + [(n, Fraction(1, 16), _words_in("abcdef"), Fraction(1, 16)) for n in range(4, 15)]
    + [(n, Fraction(2, 64), {4: 198, 5: 150}, Fraction(1, 8)) for n in range(4, 13)]
)


@pytest.mark.parametrize(("n", "match", "words", "last"), CASES)
def test_the_coverage_bound_is_the_union_over_placement_sets(
    n: int, match: Fraction, words: dict[int, int], last: Fraction
) -> None:
    expected = _union_by_enumeration(n, match, words, last)
    assert _coverage_bound(n, match, words, last_match=last) == expected
    if last == match:
        assert _coverage_bound(n, match, words) == expected


def _max_coverage(text: str, vocabulary: set[str]) -> int:
    """Most characters non-overlapping vocabulary words cover in text: every set of
    placements tried."""
    spans = [(s, len(w)) for w in vocabulary for s in range(len(text)) if text.startswith(w, s)]
    best = 0
    for size in range(1, len(spans) + 1):
        for chosen in itertools.combinations(spans, size):
            cells = [c for s, length in chosen for c in range(s, s + length)]
            if len(cells) == len(set(cells)):
                best = max(best, len(cells))
    return best


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7])
def test_the_coverage_bound_covers_the_exact_probability_of_the_rule(n: int) -> None:
    """Random strings over {a, b, c} (the last character over {a, b} only): the exact
    probability that words cover half of them or more, counted string by string, is at
    most the bound (the union bound over-counts, never under-counts)."""
    vocabulary = {"ab", "ba", "cab"}
    words = dict(Counter(len(w) for w in vocabulary))
    refused = Fraction(0)
    for head in itertools.product("abc", repeat=n - 1):
        for tail in "ab":
            if _max_coverage("".join(head) + tail, vocabulary) >= _target(n):
                refused += Fraction(1, 3 ** (n - 1) * 2)
    bound = _coverage_bound(n, Fraction(1, 3), words, last_match=Fraction(1, 2))
    assert refused <= bound


@pytest.mark.parametrize(
    ("alphabet", "draws", "distinct"),
    [(4, 5, 1), (4, 5, 2), (5, 6, 3), (6, 4, 2), (7, 3, 3), (8, 6, 5), (3, 9, 3)],
)
def test_the_occupancy_bound_is_the_union_over_value_sets(
    alphabet: int, draws: int, distinct: int
) -> None:
    """Σ over every set S of at most ``distinct`` values of P(every draw falls in S)."""
    expected = sum(
        (
            Fraction(len(values), alphabet) ** draws
            for size in range(1, distinct + 1)
            for values in itertools.combinations(range(alphabet), size)
        ),
        Fraction(0),
    )
    assert _occupancy_at_most(alphabet, draws, distinct) == expected


@pytest.mark.parametrize(
    "letters", ["abcdef", "aeiou", "abcdefghij", string.ascii_lowercase, "ade", "acdef"]
)
def test_words_in_counts_the_words_spelt_with_the_letters(letters: str) -> None:
    spelt = [w for w in WORDS if re.fullmatch(f"[{letters}]+", w)]
    assert _words_in(letters) == dict(Counter(len(w) for w in spelt))
    assert sum(_words_in(letters).values()) == len(spelt)
