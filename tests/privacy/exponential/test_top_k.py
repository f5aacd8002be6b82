"""Private top-k (stream_dp.privacy.exponential.top_k): calibration against closed forms and
OpenDP's privacy map, the peeling law against the exponential mechanism's closed form and OpenDP's
Gumbel top-k, the plan figure (selection probability for a lead), composition, and an
empirical privacy test that detects a doubled ε.

Every statistical test states its false-failure probability; each is at most 1e-7
(thresholds from exact binomial tails or the χ² distribution), so the file fails by chance
with probability below 1e-6.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from typing import Any

import numpy as np
import opendp.prelude as opendp_prelude
import pytest
from scipy.stats import binom, binomtest, chi2, chi2_contingency

from stream_dp.errors import ConfigError
from stream_dp.privacy.exponential.top_k import (
    TopKPlan,
    select_top_k,
    select_top_k_rows,
    top_k_privacy,
    top_k_value_l1_sensitivity,
)

P_FALSE = 1e-7
#: OpenDP, the reference (untyped: its measurements are built at run time).
dp: Any = opendp_prelude
dp.enable_features("contrib")


def peeling_law(counts: list[int], scale: float, rounds: int) -> dict[tuple[int, ...], float]:
    """Exact probability of every ordered outcome of ``rounds`` exponential-mechanism rounds
    without replacement (P ∝ exp(count/b) among the keys not yet chosen)."""
    weights = [math.exp(c / scale) for c in counts]
    law: dict[tuple[int, ...], float] = {}
    for order in itertools.permutations(range(len(counts)), rounds):
        p, left = 1.0, math.fsum(weights)
        for i in order:
            p *= weights[i] / left
            left -= weights[i]
        law[order] = p
    return law


def chi_square_fits(
    observed: Counter[tuple[int, ...]], law: dict[tuple[int, ...], float], draws: int
) -> float:
    """p-value of Pearson's χ² test of the observed outcomes against the exact law."""
    expected = np.array([law[o] * draws for o in law])
    counts = np.array([observed.get(o, 0) for o in law])
    assert sum(observed.values()) == counts.sum() == draws  # no outcome outside the law
    stat = float(((counts - expected) ** 2 / expected).sum())
    return float(chi2.sf(stat, len(law) - 1))


# ---------------------------------------------------------------- calibration


def test_the_scale_is_n_times_linf_over_epsilon() -> None:
    plan = TopKPlan(top_k=3, epsilon=1.0, max_contributions_per_partition=2)
    assert plan.scale == 6.0
    assert plan.epsilon_per_round == pytest.approx(1 / 3, rel=1e-15)
    plan = TopKPlan(top_k=10, epsilon=0.5, max_contributions_per_partition=1)
    assert plan.scale == 20.0
    assert plan.describe()["scale"] == 20.0


@pytest.mark.parametrize(("top_k", "epsilon", "linf"), [(3, 1.0, 2), (10, 0.5, 1), (7, 2.3, 5)])
def test_the_selection_epsilon_is_opendps_privacy_map_of_the_same_scale(
    top_k: int, epsilon: float, linf: int
) -> None:
    """OpenDP's noisy top-k on monotone counts (L∞ distance, ``monotonic=True``) under pure
    DP charges k·Δ/scale: the ε our plan states for its scale."""
    plan = TopKPlan(top_k=top_k, epsilon=epsilon, max_contributions_per_partition=linf)
    space = dp.vector_domain(dp.atom_domain(T=int)), dp.linf_distance(T=int, monotonic=True)
    reference = dp.m.make_noisy_top_k(*space, dp.max_divergence(), k=top_k, scale=plan.scale)
    assert reference.map(linf) == pytest.approx(epsilon, rel=1e-12)


def test_bad_settings_are_refused_with_the_field() -> None:
    with pytest.raises(ConfigError, match="top_k"):
        TopKPlan(top_k=0, epsilon=1.0, max_contributions_per_partition=1)
    with pytest.raises(ConfigError, match="epsilon"):
        TopKPlan(top_k=2, epsilon=0.0, max_contributions_per_partition=1)
    with pytest.raises(ConfigError, match="max_contributions_per_partition"):
        TopKPlan(top_k=2, epsilon=1.0, max_contributions_per_partition=0)


def test_composition_adds_the_selection_to_the_values() -> None:
    plan = TopKPlan(top_k=5, epsilon=0.25, max_contributions_per_partition=3)
    assert top_k_privacy(plan, value_epsilon=0.75, value_delta=1e-6) == (1.0, 1e-6)
    assert top_k_value_l1_sensitivity(
        top_k=5, max_partitions_contributed=3, max_contributions_per_partition=4,
        max_contributions_per_window=100,
    ) == 12  # fmt: skip
    assert top_k_value_l1_sensitivity(
        top_k=2, max_partitions_contributed=3, max_contributions_per_partition=4,
        max_contributions_per_window=100,
    ) == 8  # fmt: skip
    assert top_k_value_l1_sensitivity(
        top_k=5, max_partitions_contributed=3, max_contributions_per_partition=4,
        max_contributions_per_window=10,
    ) == 10  # fmt: skip


# ---------------------------------------------------------------- the law


def test_peeling_draws_the_exponential_mechanism_law_round_after_round() -> None:
    """60,000 independent top-2 selections over 5 keys against the exact law of every
    ordered pair (20 cells, each expected ≥ 200 draws); χ² false failure ≤ 1e-7."""
    counts = [0, 2, 3, 5, 9]
    plan = TopKPlan(top_k=2, epsilon=1.0, max_contributions_per_partition=2)  # b = 4
    draws = 60_000
    rows = select_top_k_rows(np.tile(counts, (draws, 1)), plan)
    observed = Counter(tuple(r) for r in rows.tolist())
    assert chi_square_fits(observed, peeling_law(counts, plan.scale, 2), draws) > P_FALSE


def test_peeling_matches_opendps_gumbel_top_k_of_the_same_scale() -> None:
    """Durfee & Rogers: peeling is one-shot Gumbel top-k. OpenDP's noisy top-k under zCDP
    adds Gumbel noise; 3,000 draws of each, χ² homogeneity over the ordered outcomes with
    expected count ≥ 5 (the rest pooled); false failure ≤ 1e-7."""
    counts = [0, 1, 2, 3, 4]
    plan = TopKPlan(top_k=2, epsilon=1.0, max_contributions_per_partition=1)  # b = 2
    space = dp.vector_domain(dp.atom_domain(T=int)), dp.linf_distance(T=int, monotonic=True)
    reference = dp.m.make_noisy_top_k(
        *space, dp.zero_concentrated_divergence(), k=2, scale=plan.scale
    )
    draws = 3_000
    theirs = Counter(tuple(reference(counts)) for _ in range(draws))
    ours = Counter(tuple(r) for r in select_top_k_rows(np.tile(counts, (draws, 1)), plan).tolist())
    law = peeling_law(counts, plan.scale, 2)
    big = [o for o, p in law.items() if p * draws >= 5]
    table = np.array(
        [
            [c.get(o, 0) for o in big] + [draws - sum(c.get(o, 0) for o in big)]
            for c in (ours, theirs)
        ]
    )
    table = table[:, table.sum(axis=0) > 0]  # the pooled rest may be empty
    assert chi2_contingency(table).pvalue > P_FALSE


def test_keys_come_out_in_the_order_chosen_and_never_twice() -> None:
    counts = {"a.com": 10_000, "b.com": 5_000, "c.com": 0, "d.com": 1}
    plan = TopKPlan(top_k=2, epsilon=1.0, max_contributions_per_partition=1)  # b = 2
    # a.com leads b.com by 5,000 counts = 2,500 scales: P(other order) < e^-2400.
    assert select_top_k(counts, plan) == ["a.com", "b.com"]
    everything = select_top_k(counts, TopKPlan(4, 1e-3, 1))  # b = 4,000: near uniform
    assert sorted(everything) == sorted(counts)
    assert select_top_k({"only": 3}, plan) == ["only"]
    assert select_top_k({}, plan) == []


# ---------------------------------------------------------------- plan figures


def worst_case_counts(lead: int, competitors: int, insiders: int, scale: float) -> list[int]:
    """The key under test (index 0) with count c, N − 1 keys 60 scales ahead (they are
    chosen first with probability 1 − O(e⁻⁶⁰)), and m keys at c − lead."""
    c = 10_000
    far = c + round(60 * scale)
    return [c] + [far] * insiders + [c - lead] * competitors


def test_the_selection_probability_is_met_exactly_in_the_worst_case() -> None:
    """N = 3, m = 20 competitors at c − lead: the bound 1/(1 + m·e^{−lead/b}) is the exact
    probability (up to e⁻⁶⁰); 40,000 selections, two-sided exact binomial test, false
    failure ≤ 1e-7."""
    plan = TopKPlan(top_k=3, epsilon=1.5, max_contributions_per_partition=2)  # b = 4
    lead, m, draws = 12, 20, 40_000
    p = plan.selection_probability(lead, m)
    assert p == pytest.approx(1 / (1 + 20 * math.exp(-3)))  # ≈ 0.501
    counts = worst_case_counts(lead, m, plan.top_k - 1, plan.scale)
    rows = select_top_k_rows(np.tile(counts, (draws, 1)), plan)
    hits = int((rows == 0).any(axis=1).sum())
    assert binomtest(hits, draws, p).pvalue > P_FALSE


def test_the_selection_probability_is_a_lower_bound_away_from_the_worst_case() -> None:
    """Competitors spread below c − lead and an insider close to the key: selected at
    least as often as the bound says (one-sided exact binomial test against the bound,
    false failure ≤ 1e-7)."""
    plan = TopKPlan(top_k=2, epsilon=1.0, max_contributions_per_partition=1)  # b = 2
    lead, draws = 4, 40_000
    counts = [100, 101] + [100 - lead - j for j in range(10)]
    p = plan.selection_probability(lead, 10)
    rows = select_top_k_rows(np.tile(counts, (draws, 1)), plan)
    hits = int((rows == 0).any(axis=1).sum())
    assert binom.cdf(hits, draws, p) > P_FALSE


def test_lead_for_probability_is_the_smallest_integer_lead() -> None:
    plan = TopKPlan(top_k=10, epsilon=1.0, max_contributions_per_partition=1)  # b = 10
    for probability, m in [(0.95, 1000), (0.5, 1), (0.99, 50_000), (0.2, 1)]:
        lead = plan.lead_for_probability(probability, m)
        assert plan.selection_probability(lead, m) >= probability
        assert lead == 0 or plan.selection_probability(lead - 1, m) < probability
    # closed form: ⌈b·ln(m·p/(1 − p))⌉ = ⌈10·ln(19,000)⌉ = ⌈98.52⌉
    assert plan.lead_for_probability(0.95, 1000) == 99
    assert plan.lead_for_probability(0.5, 1) == 0
    assert plan.selection_probability(0, 0) == 1.0


# ---------------------------------------------------------------- empirical privacy


def _share_in_event(plan: TopKPlan, draws: int) -> tuple[int, int]:
    """Neighbours: D has 10 keys of count 0; D' adds one user with Linf = 3 events on keys
    0 and 1 (counts only rise: monotone). The event S: keys (0, 1) chosen in that order.
    Returns (draws of D' in S, draws of D in S)."""
    linf = plan.max_contributions_per_partition
    d = np.zeros((draws, 10), dtype=np.int64)
    d_prime = d.copy()
    d_prime[:, :2] = linf
    in_s = [
        int(((rows[:, 0] == 0) & (rows[:, 1] == 1)).sum())
        for rows in (select_top_k_rows(d_prime, plan), select_top_k_rows(d, plan))
    ]
    return in_s[0], in_s[1]


def test_empirical_privacy_holds_for_top_k_and_detects_a_doubled_epsilon() -> None:
    """ε-DP bounds P_D'(S) ≤ e^ε·P_D(S), so of the draws in S (from D' or D, equally many
    runs) the share from D' is Binomial(n, π) with π ≤ e^ε/(1 + e^ε) = 0.731 (ε = 1);
    a one-sided exact binomial test at 1e-7 is the detector (its false-alarm probability).
    Exact ratios: the planned mechanism (N = 2, b = 6) has P_D'(S)/P_D(S) = 2.24 (share
    0.692); drawn with half the scale (ε doubled) 4.62 (share 0.822): over ≈ 2,500 draws in
    S a deviation of ≈ 10 standard deviations from 0.731 (miss probability ≪ 1e-12)."""
    draws = 40_000
    pi0 = math.e / (1 + math.e)
    plan = TopKPlan(top_k=2, epsilon=1.0, max_contributions_per_partition=3)
    x, y = _share_in_event(plan, draws)
    assert binomtest(x, x + y, pi0, alternative="greater").pvalue > P_FALSE
    doubled = TopKPlan(top_k=2, epsilon=2.0, max_contributions_per_partition=3)
    x, y = _share_in_event(doubled, draws)
    assert binomtest(x, x + y, pi0, alternative="greater").pvalue < P_FALSE
