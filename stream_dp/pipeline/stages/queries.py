"""A query compiled against the interned event signatures: where-filter, group key, value."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import filterfalse, repeat
from operator import is_not, itemgetter
from typing import Any

import numpy as np

from stream_dp.config.model import BoundsConfig, QueryConfig
from stream_dp.ops.metrics import QUERY_DROP_REASONS
from stream_dp.privacy.group_values import canonical_value
from stream_dp.privacy.planner import QueryPlan, plan_query
from stream_dp.privacy.statistics import statistic_of
from stream_dp.privacy.statistics.quantile import histogram_binning

GroupKey = tuple[Any, ...]
Projection = tuple[GroupKey, int] | None

#: Why a query does not take an event (:meth:`CompiledQuery.dropped_counts`), by fate
#: number 1, 2, …: where (a where value not allowed), missing_group_field (a group_by field
#: missing or null under missing_group: drop), outside_key_list (a key not on the public
#: list), missing_value (a value statistic without a value). Fate 0 is "taken".
DROP_REASONS = QUERY_DROP_REASONS


class CompiledQuery:
    """Maps an interned signature (tuple of the fields the queries need) to (key, units).

    Signatures hold canonical group values (the decoder made them so), and so do the
    ``where`` values and public keys here: ``where: {premium: true}`` never matches 1.
    A key that is not on the query's public list projects to None, like an event the
    ``where`` filter drops: it can never be released, so it must not take one of a user's
    L0 key slots when the user's keys are bounded.

    Values (sum, mean, variance) are clamped to [lower, upper] and rounded to multiples of the
    granularity, as integer units: noise is added to integers only.
    """

    def __init__(self, query: QueryConfig, bounds: BoundsConfig, fields: Sequence[str]) -> None:
        self.config = query
        self.name = query.name
        # the first window's plan (under bounds: auto every window has its own: see
        # AutoBounds.plan_for)
        #: What the planner takes (also for the plans of later windows under bounds: auto).
        self.spec = query.spec()
        self.plan: QueryPlan = plan_query(self.spec, bounds.start_bounds().spec())
        index = {f: i for i, f in enumerate(fields)}
        self._where = [
            (index[f], frozenset(map(canonical_value, v if isinstance(v, list) else [v])))
            for f, v in query.where.items()
        ]
        public = self.plan.public_keys
        self._group = tuple(index[f] for f in query.group_by)
        self._value = index[query.value_field] if query.value_field else None
        statistic = statistic_of(query.statistic)
        if statistic.needs_values:
            assert query.lower is not None and query.upper is not None
            self._lower, self._upper = query.lower, query.upper
            self._granularity = query.value_granularity
        self._signatures: list[tuple[Any, ...]] = []
        # Column form of the projections (see project_columns): per signature id, the key's
        # number (-1: not taken) and the value; keys numbered in order of first projection
        # (a public list's keys: by their place on it).
        self._key_of: np.ndarray = np.zeros(0, dtype=np.int64)
        self._value_of: np.ndarray = np.zeros(0, dtype=np.int64)
        #: Per signature id, why the query does not take it (0: it does; see DROP_REASONS).
        self._fate_of: np.ndarray = np.zeros(0, dtype=np.int64)
        self._drop_missing = query.missing_group == "drop" and bool(query.group_by)
        #: Key number by key (a one-field key: by its value; see :meth:`_project_new`).
        self._key_ids: dict[Any, int] = {}
        self._keys: list[GroupKey] = []
        #: With a public list, keys are numbered by their place on it, once (the numbers
        #: do not depend on the data): one lookup per new signature both tests that its key
        #: is listed and numbers it.
        self._public_ids: dict[Any, int] | None = None
        if public is not None:
            listed = list(public)
            one = len(self._group) == 1
            self._public_ids = {(k[0] if one else k): i for i, k in enumerate(listed)}
            self._keys = listed
        self.has_values = self._value is not None
        #: Stage 1 sums Σ (v − c)² per key around this centre (``statistic: variance``).
        self.squares_center = statistic.squares_center(self.spec)
        #: Stage 1 counts values per histogram bin and key (``statistic: quantile``).
        self.bin_of = histogram_binning(self.spec)
        #: Stage 1 sums the users' key weights for this query's partition selection.
        self.weighted_selection = query.selection == "weighted_gaussian" and public is None

    def bind(self, signatures: list[tuple[Any, ...]]) -> None:
        """Share the engine's signature table (grows as new signatures are interned)."""
        self._signatures = signatures

    def forget_projections(self) -> None:
        """The signature table was renumbered: cached projections no longer apply."""
        self._key_of = np.zeros(0, dtype=np.int64)
        self._value_of = np.zeros(0, dtype=np.int64)
        self._fate_of = np.zeros(0, dtype=np.int64)
        if self._public_ids is None:
            self._key_ids = {}
            self._keys = []

    def project_columns(self, items: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[GroupKey]]:
        """Per item (a column of signature ids) the number of its key (-1 when the query
        does not take it) and its value in units, and the keys by number (in order of first
        projection; a public list's keys by their place on it). Each signature is projected
        once, when first seen (:meth:`_project_new`), then looked up by array indexing."""
        n = len(self._signatures)
        done = len(self._key_of)
        if done < n:
            key_of, value_of, fate_of = self._project_new(self._signatures[done:n])
            self._key_of = np.concatenate((self._key_of, key_of))
            self._value_of = np.concatenate((self._value_of, value_of))
            self._fate_of = np.concatenate((self._fate_of, fate_of))
        return self._key_of[items], self._value_of[items], self._keys

    def dropped_counts(self, items: np.ndarray) -> list[int]:
        """How many of ``items`` (signature ids of events) the query does not take, per
        reason of :data:`DROP_REASONS` (in that order): the raw-input counts of
        ``stream_dp_query_events_dropped_total``."""
        if len(self._key_of) < len(self._signatures):
            self.project_columns(np.zeros(0, dtype=np.int64))
        counts = np.bincount(self._fate_of[items], minlength=len(DROP_REASONS) + 1)
        dropped: list[int] = counts[1:].tolist()
        return dropped

    def project(self, signature_id: int) -> Projection:
        """One signature's (key, value in units), or None when the query does not take it
        (as :meth:`project_columns` numbers it; ``bounds: auto`` histograms use it)."""
        if signature_id >= len(self._key_of):
            self.project_columns(np.zeros(0, dtype=np.int64))
        key = self._key_of.item(signature_id)
        if key < 0:
            return None
        return self._keys[key], self._value_of.item(signature_id)

    def _classify(
        self, signatures: list[tuple[Any, ...]]
    ) -> tuple[np.ndarray, np.ndarray, list[Any], np.ndarray | None, list[Any] | None]:
        """(taken, fate, keys, place on the public list or None, raw values or None) of
        signatures, a column at a time, changing nothing (see :meth:`_project_new`)."""
        m = len(signatures)
        taken = np.ones(m, dtype=bool)
        fate = np.zeros(m, dtype=np.int64)
        for i, allowed in self._where:
            taken &= np.fromiter(map(allowed.__contains__, map(itemgetter(i), signatures)), bool, m)
        fate[~taken] = 1
        group = self._group
        # A one-field key is looked up by its value (hashed once, cached by str), not as a
        # fresh 1-tuple hashed anew at every lookup; it becomes a tuple once, when new.
        keys: list[Any]
        if not group:
            keys = [()] * m
        elif len(group) == 1:
            keys = list(map(itemgetter(group[0]), signatures))
        else:
            keys = list(map(itemgetter(*group), signatures))
        if self._drop_missing:
            whole = np.ones(m, dtype=bool)
            for i in group:
                values = map(itemgetter(i), signatures)
                whole &= np.fromiter(map(is_not, values, repeat(None)), bool, m)
            fate[taken & ~whole] = 2
            taken &= whole
        public = self._public_ids
        listed = None
        if public is not None:
            listed = np.fromiter(map(public.get, keys, repeat(-1)), np.int64, m)
            fate[taken & (listed < 0)] = 3
            taken &= listed >= 0
        raw = None
        if self._value is not None:
            raw = list(map(itemgetter(self._value), signatures))
            present = np.fromiter(map(is_not, raw, repeat(None)), bool, m)
            fate[taken & ~present] = 4
            taken &= present
        return taken, fate, keys, listed, raw

    def _project_new(
        self, signatures: list[tuple[Any, ...]]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Key numbers and values of signatures seen for the first time, a column at a time:
        the ``where`` filter, the key tuple and its membership of the public list are each
        one C-level pass over the signatures (``map``), not a Python call per signature.

        A signature is not taken (-1) when a ``where`` value is not allowed, when a group
        field is missing or null (``missing_group: drop``), when its key is not on the public
        list (never released: it must not count against the user's bounds), or, for
        sum/mean, when it has no value (None); its fate says which, first of these first. A
        value is clamped to [lower, upper] and rounded to a multiple of the granularity, in
        units."""
        m = len(signatures)
        taken, fate, keys, listed, raw = self._classify(signatures)
        value_of = np.zeros(m, dtype=np.int64)
        if raw is not None:
            rows = np.flatnonzero(taken)
            lower, upper, granularity = self._lower, self._upper, self._granularity
            value_of[rows] = [
                round(min(max(float(raw[j]), lower), upper) / granularity) for j in rows.tolist()
            ]
        if listed is not None:
            listed[~taken] = -1
            return listed, value_of, fate
        rows = np.flatnonzero(taken)
        kept = list(map(keys.__getitem__, rows.tolist()))
        ids, known = self._key_ids, self._keys
        fresh = dict.fromkeys(filterfalse(ids.__contains__, kept))  # in order of first use
        ids.update(zip(fresh, range(len(known), len(known) + len(fresh)), strict=True))
        known.extend(zip(fresh, strict=True) if len(self._group) == 1 else fresh)
        key_of = np.full(m, -1, dtype=np.int64)
        key_of[rows] = np.fromiter(map(ids.__getitem__, kept), np.int64, len(kept))
        return key_of, value_of, fate


def needed_fields(queries: Sequence[QueryConfig]) -> tuple[list[str], list[str], list[str]]:
    """(all fields in signature order, fields that must be scalars, fields that must be numbers)."""
    scalar: list[str] = []
    numeric: list[str] = []
    for q in queries:
        for f in [*q.group_by, *q.where]:
            if f not in scalar:
                scalar.append(f)
        if q.value_field and q.value_field not in numeric:
            numeric.append(q.value_field)
    fields = [*scalar, *[f for f in numeric if f not in scalar]]
    return fields, scalar, numeric
