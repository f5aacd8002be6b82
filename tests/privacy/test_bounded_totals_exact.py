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
