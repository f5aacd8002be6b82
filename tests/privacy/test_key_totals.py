"""Key totals are exact integers, also the selection weights of a query that has none."""

from __future__ import annotations

import numpy as np

from stream_dp.privacy.key_totals import KeyTotals


def test_a_query_without_selection_weights_has_integer_zero_weights() -> None:
    totals = KeyTotals([("a",), ("b",)], np.array([3, 1]), np.array([2, 1]), np.array([9, 4]))
    assert totals.selection_weights.dtype == np.int64
    assert totals.selection_weights.tolist() == [0, 0]
    assert all(type(w) is int for w in totals.selection_weights.tolist())
