"""bounds: auto cuts a sealed sample (of the k cap) to the window's k with
:func:`first_k_per_user`: each user's first k events of :meth:`UserSamples.sample`. That is
a uniform k-subset only because the sample lists a user's events in random-priority order;
these tests fail if the cut keeps arrival order or lets a user keep more than k."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np

from stream_dp.privacy.user_samples import UserSamples, first_k_per_user, per_user_items

A = bytes([1]) * 16
B = bytes([2]) * 16


def test_the_cut_keeps_at_most_k_per_user_and_all_of_a_light_user() -> None:
    samples = UserSamples(k=10, rng=np.random.default_rng(1))
    samples.add_many([A] * 7 + [B] * 2, list(range(9)))
    users, items = samples.sample()
    cut_users, cut_items = first_k_per_user(users, items, 3)
    per_user = Counter(cut_users.tolist())
    assert sorted(per_user.values()) == [2, 3]  # B keeps both, A three of its seven
    lists = per_user_items(cut_users, cut_items)
    assert sorted(map(len, lists)) == [2, 3]
    kept = {i for lst in lists for i in lst}
    assert {7, 8} <= kept and len(kept & set(range(7))) == 3
    assert per_user_items(*first_k_per_user(users[:0], items[:0], 3)) == []


def test_the_cut_is_a_uniform_subset_of_the_users_events() -> None:
    """One user, 5 events in arrival order 0..4, a cap sample of 5 cut to k = 2: each event
    is kept with probability 2/5. Over 20,000 independent samples a count lies within 5.5
    standard deviations of 8,000 except with probability < 4e-8 per event (< 2e-7 for
    all five); keeping arrival order would keep events 0 and 1 every time."""
    trials, k, n = 20_000, 2, 5
    seeder = random.Random(20261124)
    kept: Counter[int] = Counter()
    for _ in range(trials):
        samples = UserSamples(k=n, rng=np.random.default_rng(seeder.getrandbits(64)))
        samples.add_many([A] * n, list(range(n)))
        users, items = samples.sample()
        _, cut = first_k_per_user(users, items, k)
        assert len(cut) == k
        kept.update(cut.tolist())
    p = k / n
    mean, sd = trials * p, (trials * p * (1 - p)) ** 0.5
    for event in range(n):
        assert abs(kept[event] - mean) <= 5.5 * sd, (event, kept[event])
