"""A window's exact totals per key as sealed (:func:`bounded_totals`): when every key of
the query has data (a public list's keys, often) they are the bounded columns themselves,
with no copy; they are the same totals as when some key has none and is left out."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from stream_dp.pipeline.stages.ingest import bounded_totals
from stream_dp.privacy.user_samples import SamplingGenerator


def _query(keys: np.ndarray, values: np.ndarray, groups: list[tuple[str]]) -> Any:
    """What :func:`bounded_totals` reads of a compiled query: items are their own key."""
    return SimpleNamespace(
        project_columns=lambda items: (keys[items], values[items], groups),
        has_values=True,
        weighted_selection=False,
        squares_center=None,
        bin_of=None,
    )


def _columns(totals: Any) -> dict[str, Any]:
    return {
        "groups": totals.groups,
        **{
            name: getattr(totals, name).tolist()
            for name in ("events", "users", "value_sums", "selection_weights", "value_squares")
        },
        "bins": (totals.value_bins.starts.tolist(), totals.value_bins.index.tolist()),
    }


def test_every_key_present_gives_the_totals_of_the_keys_with_data() -> None:
    rng = np.random.default_rng(7)  # test data only
    n_items = 400
    users = rng.integers(0, 60, n_items)
    keys = rng.integers(0, 30, n_items)
    keys[:30] = np.arange(30)  # every key has data
    values = rng.integers(0, 9, n_items)
    groups = [(f"k{i}",) for i in range(31)]
    items = np.arange(n_items)
    generator: SamplingGenerator = np.random.default_rng(1)
    # 30 keys with data of 30: the fast path; 31 keys, one without data: the general one
    every = bounded_totals(
        _query(keys, values, groups[:30]), users, items, (0, None, None), generator
    )
    some = bounded_totals(_query(keys, values, groups), users, items, (0, None, None), generator)
    assert len(every.groups) == 30
    assert _columns(every) == _columns(some)
    assert every.events.tolist() == np.bincount(keys, minlength=30).tolist()
    assert every.value_sums.tolist() == np.bincount(keys, values, minlength=30).astype(int).tolist()


def test_the_totals_keep_their_own_keys_when_the_query_learns_more() -> None:
    # A query's key list grows as new keys are seen: sealed totals must not follow it
    # (KeyTotals takes its own list of the keys).
    keys = np.array([0, 1, 1])
    groups = [("a",), ("b",)]
    generator: SamplingGenerator = np.random.default_rng(1)
    totals = bounded_totals(
        _query(keys, np.zeros(3, np.int64), groups),
        np.array([0, 0, 1]),
        np.arange(3),
        (0, None, None),
        generator,
    )
    groups.append(("c",))
    assert totals.groups == [("a",), ("b",)] and totals.events.tolist() == [1, 2]
