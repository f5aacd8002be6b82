"""A query compiled against the interned event signatures: where-filter, group key, value."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stream_dp.config.model import BoundsConfig, QueryConfig
from stream_dp.errors import ConfigError
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
        if query.cumulative:
            # Until the release stage and the ledger persist continual state (see
            # stream_dp/privacy/continual/__init__.py), refuse at start, never mid-stream.
            raise ConfigError(
                f"query {query.name}: release: cumulative is planned by `stream-dp plan` and "
                "implemented in the privacy core, but the worker and replay do not publish "
                "running totals yet; use release: window for now (README, Continual release)"
            )
        self.config = query
        self.name = query.name
        # the first window's plan (under bounds: auto every window has its own: see
        # ReleaseStage.plan_for)
        self.plan: QueryPlan = plan_query(query, bounds.start_bounds())
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
