"""Contribution bounding: uniform reservoirs, uniform L0 choice, correct merges.

Statistical tests use exact binomial tests with a Bonferroni split: each test below has an
overall false-failure probability of at most 1e-6 (stated per test), and each would fail
for the biased "first k" rule.
"""

from __future__ import annotations

import random
from collections import Counter

from scipy.stats import binomtest

from stream_dp.privacy.bounding import (
    Reservoirs,
    aggregate_bounded,
    bound_user_keys,
    merge_reservoirs,
)

ALPHA_TOTAL = 1e-6


def _assert_inclusion(counts: Counter[int], n_items: int, trials: int, p: float) -> None:
    per_test = ALPHA_TOTAL / n_items  # Bonferroni: overall false failure ≤ 1e-6
    for item in range(n_items):
        result = binomtest(counts[item], trials, p)
        assert result.pvalue > per_test, (item, counts[item], trials * p)


def test_reservoir_keeps_at_most_k_and_counts_seen() -> None:
    r = Reservoirs(3, random.Random(1))
    for i in range(10):
        r.add(b"u", i)
    r.add(b"v", 99)
    items = {p: (seen, kept) for p, seen, kept in r.items()}
    assert items[b"u"][0] == 10 and len(items[b"u"][1]) == 3
    assert items[b"v"] == (1, [99])
    assert r.events_seen == 11 and r.events_retained == 4 and r.users == 2


def test_reservoir_keeps_each_event_with_probability_k_over_n() -> None:
    # False-failure probability ≤ 1e-6 (10 binomial tests at 1e-7 each).
    n, k, trials = 10, 3, 20_000
    rng = random.Random(2024)
    counts: Counter[int] = Counter()
    for _ in range(trials):
        r = Reservoirs(k, rng)
        for i in range(n):
            r.add(b"user", i)
        for _, _, kept in r.items():
            counts.update(kept)
    _assert_inclusion(counts, n, trials, k / n)


def test_l0_chooses_keys_uniformly_and_linf_caps() -> None:
    # False-failure probability ≤ 1e-6 (6 binomial tests).
    keys = ["a", "b", "c", "d", "e", "f"]
    rng = random.Random(7)
    trials = 30_000
    chosen: Counter[int] = Counter()
    for _ in range(trials):
        out = bound_user_keys(
            [(k, 1) for k in keys for _ in range(5)], max_keys=2, max_per_key=3, rng=rng
        )
        assert len(out) == 2 and all(len(v) == 3 for v in out.values())
        chosen.update(keys.index(k) for k in out)
    _assert_inclusion(chosen, len(keys), trials, 2 / 6)


def test_merge_of_partition_reservoirs_is_uniform() -> None:
    # One user seen on two partitions (5 + 15 events), k = 4: every event kept with 4/20.
    # False-failure probability ≤ 1e-6 (20 binomial tests).
    k, trials = 4, 20_000
    rng = random.Random(11)
    counts: Counter[int] = Counter()
    for _ in range(trials):
        a, b = Reservoirs(k, rng), Reservoirs(k, rng)
        for i in range(5):
            a.add(b"u", i)
        for i in range(5, 20):
            b.add(b"u", i)
        merged = merge_reservoirs([a, b], k, rng)
        assert len(merged[b"u"]) == k
        counts.update(merged[b"u"])
    _assert_inclusion(counts, 20, trials, k / 20)


def test_aggregate_bounded_exact_totals() -> None:
    # items are (key, units) directly; project is the identity on a lookup table.
    table = {0: ("a", 2), 1: ("b", 5), 2: None}
    users = [[0, 0, 1, 2], [1], [2]]
    totals = aggregate_bounded(users, table.__getitem__, max_keys=None, max_per_key=None)
    assert {k: (t.events, t.users, t.value_sum) for k, t in totals.items()} == {
        "a": (2, 1, 4),
        "b": (2, 2, 10),
    }


def test_aggregate_bounded_applies_linf() -> None:
    table = {0: ("a", 1)}
    totals = aggregate_bounded([[0] * 50], table.__getitem__, max_keys=None, max_per_key=10)
    assert totals["a"].events == 10 and totals["a"].users == 1
