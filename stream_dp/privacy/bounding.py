"""Contribution bounding (docs/privacy.md#bounding).

Per (window, user) a reservoir keeps at most ``k`` = ``max_contributions_per_window`` of the
user's events, uniformly at random over all of them (Algorithm R — never "first k", which
biases toward early events). Items are compact integers (ids of interned event signatures),
not whole events. At release, each query may bound further: at most ``L0`` =
``max_keys_per_user`` distinct keys per user (chosen uniformly) and at most ``Linf`` =
``max_contributions_per_key`` events per key.

Which events are kept is drawn from a fast PRNG seeded from the OS: any choice of at most
``k`` of a user's own events bounds the sensitivity, so this sampler affects accuracy, never
the privacy guarantee. Noise and partition selection use a CSPRNG elsewhere.
"""

from __future__ import annotations

import os
import random  # reservoir and L0 sampling only, seeded from os.urandom (see new_sampling_rng)
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, TypeVar

import numpy as np

from stream_dp.privacy.exponential.bin_counts import BinCounts
from stream_dp.privacy.partition_selection import user_key_weight

if TYPE_CHECKING:
    from stream_dp.privacy.user_samples import SamplingGenerator

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
Pseudonym = bytes


def new_sampling_rng() -> random.Random:
    """A fast PRNG for choosing which of a user's events are kept, seeded from the OS."""
    # Not a DP draw: any choice of a user's own events bounds the sensitivity (see module doc).
    return random.Random(os.urandom(32))  # noqa: S311


class Reservoirs:
    """Reservoirs of one window (and one source partition): pseudonym → ≤ k items.

    Each entry is a list ``[seen, item, item, ...]``: the number of the user's events seen so
    far, then the kept items. One list per user keeps the state to a few bytes per event.
    """

    __slots__ = ("_rng", "_state", "events_seen", "k")

    def __init__(self, k: int, rng: random.Random | None = None) -> None:
        if k < 1:
            raise ValueError("max_contributions_per_window must be at least 1")
        self.k = k
        self._rng = rng if rng is not None else new_sampling_rng()
        self._state: dict[Pseudonym, list[int]] = {}
        self.events_seen = 0

    def add(self, pseudonym: Pseudonym, item: int) -> None:
        """Offer one event (Algorithm R): kept with probability k / (events seen so far)."""
        self.add_many((pseudonym,), (item,))

    def add_many(self, pseudonyms: Sequence[Pseudonym], items: Sequence[int]) -> None:
        """Offer events in order (Algorithm R): each kept with probability k / (seen so far)."""
        state = self._state
        get = state.get
        k = self.k
        rand = self._rng.random
        self.events_seen += len(items)
        for pseudonym, item in zip(pseudonyms, items, strict=True):
            entry = get(pseudonym)
            if entry is None:
                state[pseudonym] = [1, item]
                continue
            seen = entry[0] + 1
            entry[0] = seen
            if seen <= k:
                entry.append(item)
                continue
            j = int(rand() * seen)  # uniform in [0, seen)
            if j < k:
                entry[j + 1] = item

    @property
    def users(self) -> int:
        return len(self._state)

    @property
    def events_retained(self) -> int:
        return sum(len(e) - 1 for e in self._state.values())

    def item_ids(self) -> Iterator[int]:
        """Every kept item (with repeats)."""
        for entry in self._state.values():
            yield from entry[1:]

    def remap(self, mapping: dict[int, int]) -> None:
        """Renumber kept items (the caller compacted the table the items index)."""
        for entry in self._state.values():
            entry[1:] = [mapping[i] for i in entry[1:]]

    def remove(self, pseudonym: Pseudonym) -> int:
        """Forget one user entirely (an erasure): the reservoirs are then exactly what they
        would be had the user sent nothing — every other user's sample is their own.
        Returns how many of the user's events had been seen (0: none)."""
        entry = self._state.pop(pseudonym, None)
        if entry is None:
            return 0
        self.events_seen -= entry[0]
        return entry[0]

    def seen(self, pseudonym: Pseudonym) -> int:
        entry = self._state.get(pseudonym)
        return 0 if entry is None else entry[0]

    def items(self) -> Iterator[tuple[Pseudonym, int, list[int]]]:
        """(pseudonym, events seen, kept items) per user."""
        for pseudonym, entry in self._state.items():
            yield pseudonym, entry[0], entry[1:]


def merge_samples(
    seen_a: int,
    items_a: Sequence[V],
    seen_b: int,
    items_b: Sequence[V],
    k: int,
    rng: random.Random,
) -> list[V]:
    """Merge two uniform reservoirs of one user into a uniform sample of ≤ k of all events.

    ``items_a`` is a uniform sample of min(k, seen_a) of A's events, likewise B. The merged
    sample takes x events from A where x is how many of k positions drawn without
    replacement from seen_a + seen_b land in A (hypergeometric), then a uniform x-subset of
    A's sample and a uniform (k - x)-subset of B's.
    """
    if seen_a + seen_b <= k:
        return [*items_a, *items_b]
    chosen = rng.sample(range(seen_a + seen_b), k)
    x = sum(1 for c in chosen if c < seen_a)
    return rng.sample(list(items_a), x) + rng.sample(list(items_b), k - x)


def merge_reservoirs(
    parts: Iterable[Reservoirs], k: int, rng: random.Random | None = None
) -> dict[Pseudonym, list[int]]:
    """One uniform ≤ k sample per user over several reservoirs (e.g. one per partition)."""
    rng = rng if rng is not None else new_sampling_rng()
    merged: dict[Pseudonym, tuple[int, list[int]]] = {}
    for part in parts:
        for pseudonym, seen, items in part.items():
            prior = merged.get(pseudonym)
            if prior is None:
                merged[pseudonym] = (seen, items)
            else:
                merged[pseudonym] = (
                    prior[0] + seen,
                    merge_samples(prior[0], prior[1], seen, items, k, rng),
                )
    return {p: items for p, (_, items) in merged.items()}


def bound_user_keys(
    keyed_values: Iterable[tuple[K, V]],
    *,
    max_keys: int | None,
    max_per_key: int | None,
    rng: random.Random,
) -> dict[K, list[V]]:
    """Apply L0 (keys per user, chosen uniformly) and Linf (values per key) to one user."""
    per_key: dict[K, list[V]] = {}
    for key, value in keyed_values:
        per_key.setdefault(key, []).append(value)
    if max_keys is not None and len(per_key) > max_keys:
        kept = rng.sample(list(per_key), max_keys)
        per_key = {key: per_key[key] for key in kept}
    if max_per_key is not None:
        for key, values in per_key.items():
            if len(values) > max_per_key:
                per_key[key] = rng.sample(values, max_per_key)
    return per_key


@dataclass
class BoundedTotals:
    """Exact bounded totals of one group key: events, distinct users, value sum (in units)."""

    events: int = 0
    users: int = 0
    value_sum: int = 0


def aggregate_bounded(
    users: Iterable[Sequence[int]],
    project: Callable[[int], tuple[K, int] | None],
    *,
    max_keys: int | None,
    max_per_key: int | None,
    rng: random.Random | None = None,
) -> dict[K, BoundedTotals]:
    """Exact per-key totals of one query over users' kept items, after L0/Linf bounding.

    ``project`` maps an item to (group key, value in units), or None when the query's
    ``where`` filter excludes it. Internal only: these exact counts are never published.
    """
    rng = rng if rng is not None else new_sampling_rng()
    totals: dict[K, BoundedTotals] = {}
    for items in users:
        keyed = [p for p in map(project, items) if p is not None]
        if not keyed:
            continue
        for key, values in bound_user_keys(
            keyed, max_keys=max_keys, max_per_key=max_per_key, rng=rng
        ).items():
            t = totals.get(key)
            if t is None:
                t = totals[key] = BoundedTotals()
            t.events += len(values)
            t.users += 1
            t.value_sum += sum(values)
    return totals


class BoundedColumns(NamedTuple):
    """Exact bounded totals per key number (int64 arrays of one length)."""

    events: np.ndarray
    users: np.ndarray
    value_sums: np.ndarray
    weight_sums: np.ndarray
    #: Σ (v − center)² per key (``statistic: variance``); zeros without a center.
    value_squares: np.ndarray
    #: Kept values per key and histogram bin (``statistic: quantile``), sparse: the bins
    #: hit (width 0 without ``bin_of``).
    value_bins: BinCounts


def bounded_totals_columns(
    users: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray | None,
    *,
    n_keys: int,
    max_keys: int | None,
    max_per_key: int | None,
    rng: SamplingGenerator,
    weights: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(events, users, value sums, weight sums) of :func:`bounded_columns`."""
    found = bounded_columns(
        users,
        keys,
        values,
        n_keys=n_keys,
        max_keys=max_keys,
        max_per_key=max_per_key,
        rng=rng,
        weights=weights,
    )
    return found.events, found.users, found.value_sums, found.weight_sums


def bounded_columns(
    users: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray | None,
    *,
    n_keys: int,
    max_keys: int | None,
    max_per_key: int | None,
    rng: SamplingGenerator,
    weights: bool = False,
    squares_center: int | None = None,
    bin_of: tuple[int, Callable[[np.ndarray], np.ndarray]] | None = None,
) -> BoundedColumns:
    """:func:`aggregate_bounded` on columns: exact (events, users, value sums, weight sums)
    per key.

    One row per kept event that the query takes: ``users`` (0, 1, … grouped, each user's
    rows in uniformly random order — what :meth:`UserSamples.sample` gives), ``keys`` in
    [0, n_keys), ``values`` in units (None: all 0). L0 keeps ``max_keys`` of a user's
    distinct keys chosen uniformly (a random priority per (user, key) pair); Linf keeps the
    first ``max_per_key`` rows of each (user, key) in the rows' random order — a uniform
    subset. Integer arithmetic throughout: the totals are exact.

    With ``squares_center`` c (``statistic: variance``) the fifth holds Σ (v − c)² per key
    over the kept values; otherwise zeros. With ``bin_of`` (bins, f) (``statistic:
    quantile``) the sixth counts the kept values per key in bin f(values) ∈ [0, bins).

    With ``weights`` the fourth array holds, per key, the sum over its users of
    :func:`~stream_dp.privacy.partition_selection.user_key_weight` of the number of keys the
    user kept (after L0) — what ``selection: weighted_gaussian`` tests; otherwise zeros.
    """
    zeros = np.zeros(n_keys, dtype=np.int64)
    if len(keys) == 0:
        return BoundedColumns(
            zeros,
            zeros.copy(),
            zeros.copy(),
            zeros.copy(),
            zeros.copy(),
            BinCounts.empty(n_keys, 0 if bin_of is None else bin_of[0]),
        )
    pair = users.astype(np.int64) * n_keys + keys.astype(np.int64)
    distinct, keep, kept_pairs = _kept_pairs(pair, n_keys, max_keys, max_per_key, rng)
    taken = keys[keep].astype(np.int64)
    events = np.bincount(taken, minlength=n_keys).astype(np.int64)
    users_per_key = np.bincount(distinct[kept_pairs] % n_keys, minlength=n_keys).astype(np.int64)
    value_sums = zeros.copy()
    if values is not None:
        np.add.at(value_sums, taken, values[keep].astype(np.int64))
    weight_sums = zeros.copy()
    if weights:
        kept = distinct[kept_pairs]
        owners = kept // n_keys
        keys_of_user = np.bincount(owners)  # users are small integers (see above)
        table = np.array(
            [0, *(user_key_weight(d) for d in range(1, int(keys_of_user.max()) + 1))],
            dtype=np.int64,
        )
        np.add.at(weight_sums, kept % n_keys, table[keys_of_user[owners]])
    value_squares = zeros.copy()
    if values is not None and squares_center is not None:
        centred = values[keep].astype(np.int64) - squares_center
        np.add.at(value_squares, taken, centred * centred)
    value_bins = BinCounts.empty(n_keys, 0 if bin_of is None else bin_of[0])
    if values is not None and bin_of is not None:
        # sparse: memory follows the kept values, not keys × bins (bin_counts module)
        value_bins = BinCounts.of_values(
            taken, bin_of[1](values[keep]), n_keys=n_keys, bins=bin_of[0]
        )
    return BoundedColumns(events, users_per_key, value_sums, weight_sums, value_squares, value_bins)


def _kept_pairs(
    pair: np.ndarray,
    n_keys: int,
    max_keys: int | None,
    max_per_key: int | None,
    rng: SamplingGenerator,
) -> tuple[np.ndarray, np.ndarray | slice, np.ndarray | slice]:
    """The distinct (user, key) pairs of the rows (ascending, as np.unique), which rows
    L0 and Linf keep and which pairs keep a row (masks; with neither bound ``[:]``, all
    of them, indexing a column as itself with no copy).

    One stable sort gives the distinct pairs, each row's pair and, within a pair, its rows
    in their random order (Linf). With neither bound only the distinct pairs are needed:
    a plain sort of the pairs gives them, without the rows' order, places and ranks (five
    arrays as long as the window's events)."""
    if max_keys is None and max_per_key is None:
        sorted_pairs = np.sort(pair, kind="stable")  # runs: the rows come user by user
        every = slice(None)
        return sorted_pairs[_boundaries(sorted_pairs)], every, every
    keep = np.ones(len(pair), dtype=bool)
    by_pair = np.argsort(pair, kind="stable")
    sorted_pairs = pair[by_pair]
    boundary = _boundaries(sorted_pairs)
    run = np.cumsum(boundary) - 1
    distinct = sorted_pairs[boundary]
    kept_pairs = np.ones(len(distinct), dtype=bool)
    if max_keys is not None:
        inverse = np.empty(len(pair), dtype=np.int64)
        inverse[by_pair] = run
        pair_user = distinct // n_keys
        priority = rng.random(len(distinct))
        order = np.lexsort((priority, pair_user))
        _, first, counts = np.unique(pair_user[order], return_index=True, return_counts=True)
        rank = np.arange(len(order)) - np.repeat(first, counts)
        kept_pairs[order] = rank < max_keys
        keep &= kept_pairs[inverse]
    if max_per_key is not None:
        starts = np.flatnonzero(boundary)
        rank = np.arange(len(by_pair)) - starts[run]
        within = np.empty(len(by_pair), dtype=bool)
        within[by_pair] = rank < max_per_key
        keep &= within
    return distinct, keep, kept_pairs


def _boundaries(sorted_pairs: np.ndarray) -> np.ndarray:
    """Where each run of equal sorted pairs starts."""
    return np.concatenate(([True], sorted_pairs[1:] != sorted_pairs[:-1]))
