"""The Python-integer finish of Algorithm 1 (a lane whose counter reached COUNTER_LIMIT).

`_bernoulli_exp_tail(num, den, k)` continues CKS20 Algorithm 1 from counter K = k: while
Bernoulli(γ/K) succeeds (γ = num/den), K ← K + 1; the result is "K is odd". Started at
K = 1 it is Bernoulli(exp(−γ)); started at K = k its law is the tail of the same series,
computed exactly below. A lane reaches it with probability below 2⁻¹⁰⁰⁰⁰, so no
end-to-end test ever runs it: these check its law directly.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from stream_dp.privacy.exact_laplace import _bernoulli_exp_tail

#: Draws per case. Hoeffding: P(|p̂ − p| ≥ 0.03) ≤ 2·exp(−2·20000·0.03²) = 4.6e-16 per
#: case, so a correct sampler fails this file with probability below 1e-15.
DRAWS = 20_000
TOLERANCE = 0.03


def _odd_probability_from(gamma: Fraction, k: int) -> float:
    """P(the final K is odd | Algorithm 1 is at K = k), summed until the terms vanish."""
    total = Fraction(0)
    reach = Fraction(1)  # P(the loop reaches K = j | it is at K = k)
    j = k
    while reach > Fraction(1, 10**30):
        stop = reach * (1 - gamma / j)
        if j % 2 == 1:
            total += stop
        reach *= gamma / j
        j += 1
    return float(total)


@pytest.mark.parametrize(
    ("num", "den", "k"),
    [(1, 1, 1), (1, 2, 1), (1, 1, 3), (3, 4, 2)],
    ids=["gamma=1 from K=1", "gamma=1/2 from K=1", "gamma=1 from K=3", "gamma=3/4 from K=2"],
)
def test_the_tail_draws_the_series_law_from_its_counter(num: int, den: int, k: int) -> None:
    expected = _odd_probability_from(Fraction(num, den), k)
    if k == 1:  # CKS20 Proposition 3: from K = 1 the law is exactly Bernoulli(exp(−γ))
        assert expected == pytest.approx(math.exp(-num / den), abs=1e-12)
    frequency = sum(_bernoulli_exp_tail(num, den, k) for _ in range(DRAWS)) / DRAWS
    assert abs(frequency - expected) < TOLERANCE
