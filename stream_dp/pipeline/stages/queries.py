"""A query compiled against the interned event signatures: where-filter, group key, value."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from stream_dp.config.model import BoundsConfig, QueryConfig
from stream_dp.privacy.group_values import canonical_value
from stream_dp.privacy.planner import QueryPlan, plan_query

GroupKey = tuple[Any, ...]
Projection = tuple[GroupKey, int] | None
_UNSET: Any = object()


class CompiledQuery:
    """Maps an interned signature (tuple of the fields the queries need) to (key, units).

    Signatures hold canonical group values (the decoder made them so), and so do the
    ``where`` values and public keys here: ``where: {premium: true}`` never matches 1.
    A key that is not on the query's public list projects to None, like an event the
    ``where`` filter drops: it can never be released, so it must not take one of a user's
    L0 key slots when the user's keys are bounded.

    Values for sum/mean are clamped to [lower, upper] and rounded to multiples of the
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
        self._public: frozenset[GroupKey] | None = None if public is None else frozenset(public)
        self._group = tuple(index[f] for f in query.group_by)
        self._value = index[query.value_field] if query.value_field else None
        if query.statistic in ("sum", "mean"):
            assert query.lower is not None and query.upper is not None
            self._lower, self._upper = query.lower, query.upper
            self._granularity = query.value_granularity
        self._cache: list[Any] = []
        self._signatures: list[tuple[Any, ...]] = []
        # Column form of the projections (see project_columns): per signature id, the key's
        # number (-1: not taken) and the value; keys numbered in order of first projection.
        self._key_of: np.ndarray = np.zeros(0, dtype=np.int64)
        self._value_of: np.ndarray = np.zeros(0, dtype=np.int64)
        self._key_ids: dict[GroupKey, int] = {}
        self._keys: list[GroupKey] = []
        self.has_values = self._value is not None
        #: Stage 1 sums the users' key weights for this query's partition selection.
        self.weighted_selection = query.selection == "weighted_gaussian" and public is None

    def bind(self, signatures: list[tuple[Any, ...]]) -> None:
        """Share the engine's signature table (grows as new signatures are interned)."""
        self._signatures = signatures

    def _compute(self, sig: tuple[Any, ...]) -> Projection:
        for i, allowed in self._where:
            if sig[i] not in allowed:
                return None
        key = tuple(sig[i] for i in self._group)
        if self._public is not None and key not in self._public:
            return None  # never released: must not count against the user's bounds
        if self._value is None:
            return key, 0
        raw = sig[self._value]
        if raw is None:
            return None  # no value: the event does not take part in this sum/mean
        clamped = min(max(float(raw), self._lower), self._upper)
        return key, round(clamped / self._granularity)

    def forget_projections(self) -> None:
        """The signature table was renumbered: cached projections no longer apply."""
        self._cache = []
        self._key_of = np.zeros(0, dtype=np.int64)
        self._value_of = np.zeros(0, dtype=np.int64)
        self._key_ids = {}
        self._keys = []

    def project_columns(self, items: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[GroupKey]]:
        """:meth:`project` for a column of signature ids: per item the number of its key
        (-1 when the query does not take it) and its value in units, and the keys by
        number. Each signature is projected once (then looked up by array indexing)."""
        n = len(self._signatures)
        done = len(self._key_of)
        if done < n:
            key_of = np.empty(n - done, dtype=np.int64)
            value_of = np.zeros(n - done, dtype=np.int64)
            ids, keys = self._key_ids, self._keys
            for j, sid in enumerate(range(done, n)):
                p = self.project(sid)
                if p is None:
                    key_of[j] = -1
                    continue
                key, units = p
                kid = ids.get(key)
                if kid is None:
                    kid = ids[key] = len(keys)
                    keys.append(key)
                key_of[j] = kid
                value_of[j] = units
            self._key_of = np.concatenate((self._key_of, key_of))
            self._value_of = np.concatenate((self._value_of, value_of))
        return self._key_of[items], self._value_of[items], self._keys

    def project(self, signature_id: int) -> Projection:
        cache = self._cache
        if signature_id >= len(cache):
            cache.extend([_UNSET] * (len(self._signatures) - len(cache)))
        p = cache[signature_id]
        if p is _UNSET:
            p = cache[signature_id] = self._compute(self._signatures[signature_id])
        result: Projection = p
        return result


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
