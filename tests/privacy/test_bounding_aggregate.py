"""aggregate_bounded: every user after one with nothing to count is counted, and L0 holds."""

from __future__ import annotations

import random

from stream_dp.privacy.bounding import aggregate_bounded

TABLE = {0: ("a", 1), 1: ("b", 1), 2: ("c", 1), 3: ("d", 1), 9: None}


def test_a_user_whose_items_are_all_filtered_out_does_not_end_the_count() -> None:
    users = [[9, 9], [0], [9], [0, 1]]
    totals = aggregate_bounded(users, TABLE.__getitem__, max_keys=None, max_per_key=None)
    assert {k: (t.events, t.users) for k, t in totals.items()} == {"a": (2, 2), "b": (1, 1)}


def test_each_user_reaches_at_most_max_keys_keys() -> None:
    # Four users on all four keys, one on one key: with max_keys = 2 exactly 2 + 2 + 2 + 2 + 1
    # (user, key) pairs remain, whichever keys each user keeps.
    users = [[0, 1, 2, 3]] * 4 + [[3, 3]]
    totals = aggregate_bounded(
        users, TABLE.__getitem__, max_keys=2, max_per_key=None, rng=random.Random(7)
    )
    assert sum(t.users for t in totals.values()) == 9
    assert sum(t.events for t in totals.values()) == 10
