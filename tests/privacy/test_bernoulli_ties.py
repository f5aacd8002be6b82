"""The exact Bernoulli's tie rule: when the 64 random bits equal ⌊p·2⁶⁴⌋, the draw is
settled by the exact remainder p·2⁶⁴ − ⌊p·2⁶⁴⌋ (probability 2⁻⁶⁴ per draw, so only
scripted bits reach it)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from stream_dp.privacy import mechanisms

P = 2.0**-14 + 3 * 2.0**-66  # exact in binary64; p·2⁶⁴ = 2⁵⁰ + 3/4: a remainder of 3/4
WHOLE, REST = divmod(Fraction(P).numerator << 64, Fraction(P).denominator)
REMAINDER = Fraction(REST, Fraction(P).denominator)


@pytest.mark.parametrize(
    ("uniform", "kept"),
    [(0, True), (2, True), (3, False)],
)
def test_a_tie_keeps_the_draw_exactly_when_a_uniform_below_the_remainder_falls(
    monkeypatch: pytest.MonkeyPatch, uniform: int, kept: bool
) -> None:
    assert Fraction(3, 4) == REMAINDER
    asked: list[int] = []

    def tie_bits(n: int) -> bytes:
        return np.full(n // 8, WHOLE, dtype=np.uint64).tobytes()

    def randbelow(m: int) -> int:
        asked.append(m)
        return uniform

    monkeypatch.setattr(mechanisms.secrets, "token_bytes", tie_bits)
    monkeypatch.setattr(mechanisms.secrets, "randbelow", randbelow)
    assert mechanisms.bernoulli([P, 1.0, 0.0]) == [kept, True, False]
    assert asked == [REMAINDER.denominator]  # one tie, settled on the exact remainder


def test_a_tie_on_a_probability_with_no_remainder_is_not_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """p = 1/2 is exactly 2⁶³/2⁶⁴: bits equal to ⌊p·2⁶⁴⌋ make U = p + (the further bits) ≥ p,
    so the draw is not kept, and nothing is left to settle."""
    asked: list[int] = []

    def tie_bits(n: int) -> bytes:
        return np.full(n // 8, 2**63, dtype=np.uint64).tobytes()

    def randbelow(m: int) -> int:
        asked.append(m)
        return 0

    monkeypatch.setattr(mechanisms.secrets, "token_bytes", tie_bits)
    monkeypatch.setattr(mechanisms.secrets, "randbelow", randbelow)
    assert mechanisms.bernoulli([0.5, 0.5]) == [False, False]
    assert asked == []
