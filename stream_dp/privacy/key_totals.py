"""Exact bounded totals per group key, held as columns (internal: never published).

A window with 100,000 keys has 100,000 (events, users, value sum) triples: one Python object
per key and per step (seal, partial encoding, merge, release) was most of a release's time.
:class:`KeyTotals` keeps the keys in a list and the three numbers in int64 arrays, and is a
read-only ``Mapping[GroupKey, KeyAggregate]`` for code that wants one key at a time.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stream_dp.privacy.exponential.bin_counts import BinCounts
from stream_dp.privacy.statistics.released_values import GroupKey

_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class KeyAggregate:
    """Exact bounded values for one group key in one window (internal, never published)."""

    #: Bounded event count (≤ Linf per user, ≤ k per user over all keys).
    events: int
    #: Distinct users contributing to the key.
    users: int
    #: Bounded sum of the values, in granularity units.
    value_sum: int
    #: ``selection: weighted_gaussian``: the sum of the users' fixed-point key weights
    #: (0 for the other strategies, which do not compute it).
    selection_weight: int = 0
    #: ``statistic: variance``: Σ (v − c)² over the bounded values v in units, c the
    #: query's centre (:func:`stream_dp.privacy.statistics.variance.center_units`); 0 for
    #: the other statistics, which do not compute it.
    value_squares: int = 0
    #: ``statistic: quantile``: the kept values' counts per histogram bin (empty for the
    #: other statistics, which do not compute it).
    value_bins: tuple[int, ...] = ()


class KeyTotals(Mapping[GroupKey, KeyAggregate]):
    """Distinct group keys and their exact bounded events, distinct users, value sums,
    selection weight sums (all zero unless the query's selection is weighted) and centred
    value squares (all zero unless the query's statistic is a variance)."""

    __slots__ = (
        "_index",
        "events",
        "groups",
        "selection_weights",
        "users",
        "value_bins",
        "value_squares",
        "value_sums",
    )

    def __init__(
        self,
        groups: Sequence[GroupKey],
        events: np.ndarray,
        users: np.ndarray,
        value_sums: np.ndarray,
        selection_weights: np.ndarray | None = None,
        value_squares: np.ndarray | None = None,
        value_bins: np.ndarray | BinCounts | None = None,
    ) -> None:
        self.groups: list[GroupKey] = list(groups)
        self.events = np.asarray(events, dtype=np.int64)
        self.users = np.asarray(users, dtype=np.int64)
        self.value_sums = np.asarray(value_sums, dtype=np.int64)
        n = len(self.groups)
        self.selection_weights = (
            np.zeros(n, dtype=np.int64)
            if selection_weights is None
            else np.asarray(selection_weights, dtype=np.int64)
        )
        self.value_squares = (
            np.zeros(n, dtype=np.int64)
            if value_squares is None
            else np.asarray(value_squares, dtype=np.int64)
        )
        columns = (self.events, self.users, self.value_sums, self.selection_weights)
        if {c.shape for c in (*columns, self.value_squares)} != {(n,)}:
            raise ValueError("one events, users, value sum and weight (and square) per group key")
        #: Per key, a quantile's histogram, sparse (bins 0 for other statistics); a dense
        #: keys × bins array is taken too (tests).
        self.value_bins = _sparse_bins(value_bins, n)
        self._index: dict[GroupKey, int] | None = None

    @classmethod
    def empty(cls) -> KeyTotals:
        return cls([], _EMPTY, _EMPTY, _EMPTY)

    @classmethod
    def of(cls, totals: Mapping[GroupKey, KeyAggregate]) -> KeyTotals:
        """Columns of any mapping (itself if it already is)."""
        if isinstance(totals, KeyTotals):
            return totals
        aggregates = list(totals.values())
        return cls(
            list(totals),
            np.fromiter((a.events for a in aggregates), np.int64, len(aggregates)),
            np.fromiter((a.users for a in aggregates), np.int64, len(aggregates)),
            np.fromiter((a.value_sum for a in aggregates), np.int64, len(aggregates)),
            np.fromiter((a.selection_weight for a in aggregates), np.int64, len(aggregates)),
            np.fromiter((a.value_squares for a in aggregates), np.int64, len(aggregates)),
            BinCounts.of_rows([a.value_bins for a in aggregates]),
        )

    @classmethod
    def concat(cls, parts: Sequence[KeyTotals]) -> KeyTotals:
        """Totals of disjoint key sets side by side (the parts of one partial)."""
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return cls.empty()
        return cls(
            list(itertools.chain.from_iterable(p.groups for p in parts)),
            np.concatenate([p.events for p in parts]),
            np.concatenate([p.users for p in parts]),
            np.concatenate([p.value_sums for p in parts]),
            np.concatenate([p.selection_weights for p in parts]),
            np.concatenate([p.value_squares for p in parts]),
            BinCounts.concat([p.value_bins for p in parts]),
        )

    @classmethod
    def merge(cls, parts: Sequence[Mapping[GroupKey, KeyAggregate]]) -> KeyTotals:
        """Per-key sums over several totals (one per source partition)."""
        columns = [cls.of(p) for p in parts]
        if len(columns) == 1:
            return columns[0]
        index: dict[GroupKey, int] = {}
        groups: list[GroupKey] = []
        positions = []
        for c in columns:
            pos = np.empty(len(c.groups), dtype=np.int64)
            for i, g in enumerate(c.groups):
                j = index.get(g)
                if j is None:
                    j = index[g] = len(groups)
                    groups.append(g)
                pos[i] = j
            positions.append(pos)
        n = len(groups)
        sums = []
        for name in ("events", "users", "value_sums", "selection_weights", "value_squares"):
            out = np.zeros(n, dtype=np.int64)
            for c, pos in zip(columns, positions, strict=True):
                np.add.at(out, pos, getattr(c, name))
            sums.append(out)
        bins = BinCounts.summed([c.value_bins for c in columns], positions, n)
        events, users, value_sums, weights, squares = sums
        merged = cls(groups, events, users, value_sums, weights, squares, bins)
        merged._index = index
        return merged

    # -- Mapping --------------------------------------------------------------------------
    def index(self) -> dict[GroupKey, int]:
        """Group key → its position in the columns."""
        if self._index is None:
            self._index = {g: i for i, g in enumerate(self.groups)}
        return self._index

    def __getitem__(self, key: GroupKey) -> KeyAggregate:
        i = self.index()[key]
        return KeyAggregate(
            int(self.events[i]),
            int(self.users[i]),
            int(self.value_sums[i]),
            int(self.selection_weights[i]),
            int(self.value_squares[i]),
            tuple(self.value_bins.row(i).tolist()),
        )

    def __iter__(self) -> Iterator[GroupKey]:
        return iter(self.groups)

    def __len__(self) -> int:
        return len(self.groups)

    def __contains__(self, key: object) -> bool:
        return key in self.index()

    def rows(self) -> Iterator[tuple[GroupKey, int, int, int]]:
        """(group key, events, users, value sum) per key, as Python integers."""
        return zip(
            self.groups,
            self.events.tolist(),
            self.users.tolist(),
            self.value_sums.tolist(),
            strict=True,
        )

    def __repr__(self) -> str:
        return f"KeyTotals({dict(self.items())!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            KeyTotals,
            (
                self.groups,
                self.events,
                self.users,
                self.value_sums,
                self.selection_weights,
                self.value_squares,
                self.value_bins,
            ),
        )


def _sparse_bins(value_bins: np.ndarray | BinCounts | None, n: int) -> BinCounts:
    """The histograms column of n keys: none (width 0), sparse as given, or of a dense
    keys × bins array."""
    if isinstance(value_bins, BinCounts):
        if len(value_bins) != n:
            raise ValueError("one histogram per group key")
        return value_bins
    dense = None if value_bins is None else np.asarray(value_bins, dtype=np.int64)
    if dense is None or dense.size == 0:
        return BinCounts.empty(n)
    return BinCounts.of_dense(dense.reshape(n, -1))
