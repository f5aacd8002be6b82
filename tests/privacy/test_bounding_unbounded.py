"""With neither an L0 nor a Linf bound :func:`bounded_columns` takes every row by a plain
sort of the (user, key) pairs; its columns are those the bounded path gives with bounds no
user reaches."""

from __future__ import annotations

import numpy as np
import pytest

from stream_dp.privacy.bounding import bounded_columns


@pytest.mark.parametrize("seed", range(6))
def test_no_bound_is_a_bound_no_user_reaches(seed: int) -> None:
    data = np.random.default_rng(seed)  # test data only
    n = int(data.integers(0, 300))
    users = np.sort(data.integers(0, 40, n))
    keys = data.integers(0, 25, n)
    values = data.integers(-5, 9, n)

    def columns(bound: int | None) -> list[list[int]]:
        found = bounded_columns(
            users,
            keys,
            values,
            n_keys=25,
            max_keys=bound,
            max_per_key=bound,
            rng=np.random.default_rng(0),
            weights=True,
            squares_center=2,
            bin_of=(4, lambda v: np.clip(v, 0, 3)),
        )
        bins = found.value_bins
        return [
            *(c.tolist() for c in found[:5]),
            bins.starts.tolist(),
            bins.index.tolist(),
            bins.counts.tolist(),
        ]

    assert columns(None) == columns(10**6)
