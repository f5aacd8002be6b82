"""Key totals are exact integers, also the selection weights of a query that has none; the
columns read back as the mapping they were built from, and merging the partials of several
source partitions sums each key exactly (a key seen in one partition only keeps its totals,
none is lost or counted twice): the counts τ and the noise are applied to."""

from __future__ import annotations

import pickle
import random

import numpy as np
import pytest

from stream_dp.privacy.key_totals import KeyAggregate, KeyTotals


def test_a_query_without_selection_weights_has_integer_zero_weights() -> None:
    totals = KeyTotals([("a",), ("b",)], np.array([3, 1]), np.array([2, 1]), np.array([9, 4]))
    assert totals.selection_weights.dtype == np.int64
    assert totals.selection_weights.tolist() == [0, 0]
    assert all(type(w) is int for w in totals.selection_weights.tolist())


def _random_totals(rng: random.Random, keys: list[tuple[str, ...]]) -> dict:
    """A plain dict of aggregates with distinct values in every field (so a field read
    from another column, or a sum that misses a part, shows)."""
    return {
        k: KeyAggregate(
            events=rng.randrange(1, 10**6),
            users=rng.randrange(1, 10**4),
            value_sum=rng.randrange(-(10**12), 10**12),
            selection_weight=rng.randrange(0, 2**40),
        )
        for k in keys
    }


def test_columns_read_back_as_the_mapping_they_were_built_from() -> None:
    rng = random.Random(7)
    plain = _random_totals(rng, [("k", str(i)) for i in range(50)])
    totals = KeyTotals.of(plain)
    assert len(totals) == 50
    assert list(totals) == list(plain)  # key order kept
    assert dict(totals.items()) == plain
    for key, aggregate in plain.items():
        assert key in totals
        got = totals[key]
        assert got == aggregate
        numbers = {k: v for k, v in vars(got).items() if k != "value_bins"}
        assert all(type(v) is int for v in numbers.values())
        assert got.value_bins == ()  # a quantile's histogram: none here
    assert ("k", "missing") not in totals
    with pytest.raises(KeyError):
        totals[("k", "missing")]
    assert list(totals.rows()) == [(k, a.events, a.users, a.value_sum) for k, a in plain.items()]
    assert all(type(v) is int for row in totals.rows() for v in row[1:])
    assert totals.index() == {k: i for i, k in enumerate(plain)}
    assert KeyTotals.of(totals) is totals
    assert dict(KeyTotals.of({}).items()) == {}


def test_the_columns_are_int64_whatever_integer_type_is_passed() -> None:
    """int64 columns (the module's promise): a caller's uint8 or int32 counts are widened,
    so sums and noise added downstream cannot wrap around."""
    small = np.array([200, 250], dtype=np.uint8)
    totals = KeyTotals([("a",), ("b",)], small, small.astype(np.int32), small, small)
    for column in (totals.events, totals.users, totals.value_sums, totals.selection_weights):
        assert column.dtype == np.int64
    assert (totals.events + totals.events).tolist() == [400, 500]
    assert (totals.value_sums * 2**40).tolist() == [200 * 2**40, 250 * 2**40]


@pytest.mark.parametrize("bad", ["events", "users", "value_sums", "selection_weights"])
def test_a_column_of_the_wrong_length_is_refused(bad: str) -> None:
    names = ("events", "users", "value_sums", "selection_weights")
    columns = {name: np.arange(3) for name in names}
    columns[bad] = np.arange(2)
    with pytest.raises(ValueError, match="one events, users, value sum and weight"):
        KeyTotals([("a",), ("b",), ("c",)], **columns)


def test_merging_partitions_sums_each_key_exactly() -> None:
    rng = random.Random(11)
    universe = [("g", str(i)) for i in range(40)]
    for _ in range(20):
        parts = [
            _random_totals(rng, rng.sample(universe, rng.randrange(0, 25)))
            for _ in range(rng.randrange(2, 5))
        ]
        expected: dict = {}
        for part in parts:
            for k, a in part.items():
                e = expected.get(k, KeyAggregate(0, 0, 0, 0))
                expected[k] = KeyAggregate(
                    e.events + a.events,
                    e.users + a.users,
                    e.value_sum + a.value_sum,
                    e.selection_weight + a.selection_weight,
                )
        # some parts as columns already, some as plain mappings
        inputs = [KeyTotals.of(p) if i % 2 else p for i, p in enumerate(parts)]
        merged = KeyTotals.merge(inputs)
        assert dict(merged.items()) == expected
        assert list(merged) == list(expected)  # first appearance order
        for key in expected:
            assert key in merged
            assert merged.index()[key] == list(expected).index(key)
        for column in (merged.events, merged.users, merged.value_sums, merged.selection_weights):
            assert column.dtype == np.int64


def test_merging_one_or_no_partition() -> None:
    plain = _random_totals(random.Random(3), [("x",), ("y",)])
    assert dict(KeyTotals.merge([plain]).items()) == plain
    empty = KeyTotals.merge([])
    assert len(empty) == 0 and list(empty.rows()) == []


def test_concat_puts_disjoint_key_sets_side_by_side() -> None:
    rng = random.Random(5)
    parts = [
        _random_totals(rng, [("p", str(j), str(i)) for i in range(rng.randrange(0, 6))])
        for j in range(4)
    ]
    joined = KeyTotals.concat([KeyTotals.of(p) for p in parts])
    expected = {k: a for p in parts for k, a in p.items()}
    assert dict(joined.items()) == expected and list(joined) == list(expected)
    one = KeyTotals.of(parts[0])
    assert KeyTotals.concat([one]) is one
    none = KeyTotals.concat([])
    assert len(none) == 0 and none.events.dtype == np.int64


def test_totals_survive_pickling_with_their_weights() -> None:
    """Totals cross a process boundary by pickle (__reduce__): every column comes back."""
    plain = _random_totals(random.Random(9), [("a",), ("b",), ("c",)])
    back = pickle.loads(pickle.dumps(KeyTotals.of(plain)))  # noqa: S301 (our own bytes)
    assert isinstance(back, KeyTotals)
    assert dict(back.items()) == plain
    assert back.selection_weights.tolist() == [a.selection_weight for a in plain.values()]


def test_totals_beyond_float_precision_stay_exact() -> None:
    """Exact integers (module doc), also above 2^53 where a float64 step would round: a
    value sum in fine granularity units over many users gets there. Built from a mapping,
    merged and read back, every field keeps its last unit."""
    big = 2**53 + 1
    part = {("k",): KeyAggregate(big, big + 2, -big - 4, big + 6), ("j",): KeyAggregate(1, 1, 1, 1)}
    totals = KeyTotals.of(part)
    assert totals[("k",)] == part[("k",)]
    merged = KeyTotals.merge([part, {("k",): KeyAggregate(2, 2, 2, 2)}])
    assert merged[("k",)] == KeyAggregate(big + 2, big + 4, -big - 2, big + 8)
    assert merged[("j",)] == KeyAggregate(1, 1, 1, 1)
