"""The column aggregation's totals are exact integers, however large the values: a value sum
is released with noise calibrated to its bound, so a total rounded on the way (through
binary64, 53 bits) would be a different number from the one the noise was added to."""

from __future__ import annotations

import numpy as np

from stream_dp.privacy.bounding import bounded_totals_columns
from stream_dp.privacy.user_samples import new_sampling_generator


def test_value_sums_stay_exact_beyond_the_53_bits_of_a_float() -> None:
    big = 2**53 + 1  # the first integer binary64 cannot hold
    users = np.array([0, 1, 2], dtype=np.int64)
    keys = np.array([0, 0, 1], dtype=np.int64)
    values = np.array([big, 2, big + 2], dtype=np.int64)
    events, users_per_key, value_sums, _ = bounded_totals_columns(
        users,
        keys,
        values,
        n_keys=2,
        max_keys=None,
        max_per_key=None,
        rng=new_sampling_generator(),
    )
    assert events.tolist() == [2, 1] and users_per_key.tolist() == [2, 1]
    assert value_sums.dtype == np.int64
    assert [int(v) for v in value_sums] == [big + 2, big + 2]


def test_each_kept_pair_keeps_its_own_rows_when_rows_arrive_out_of_key_order() -> None:
    """L0 and Linf together, rows of each user in shuffled key order (as a sample gives
    them): user u has exactly 3 + key rows of each of 6 keys. A kept (user, key) pair keeps
    min(3 + key, Linf) rows of that key, a dropped pair none — so per key, events are
    exactly users × min(3 + key, Linf), and every user keeps exactly L0 keys. Rows counted
    for the wrong pair (a row→pair map in sorted rather than arrival order) break both."""
    rng = np.random.default_rng(4)
    n_users, n_keys, max_keys, max_per_key = 200, 6, 2, 5
    users_col, keys_col = [], []
    for u in range(n_users):
        rows = np.repeat(np.arange(n_keys), 3 + np.arange(n_keys))
        rng.shuffle(rows)
        users_col.append(np.full(len(rows), u))
        keys_col.append(rows)
    events, users_per_key, _, _ = bounded_totals_columns(
        np.concatenate(users_col),
        np.concatenate(keys_col),
        None,
        n_keys=n_keys,
        max_keys=max_keys,
        max_per_key=max_per_key,
        rng=new_sampling_generator(),
    )
    assert users_per_key.sum() == n_users * max_keys
    per_pair = np.minimum(3 + np.arange(n_keys), max_per_key)
    assert events.tolist() == (users_per_key * per_pair).tolist()
