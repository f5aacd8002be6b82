"""Private results beside the true ones: pure bookkeeping, no I/O.

:class:`ExactTotals` is the worker's ``exact_totals_observer``: it keeps, per (query, window),
the exact bounded totals the noise was added to. That is only acceptable because the demo's
data is synthetic — the worker and replay never pass an observer, and nothing here is
published: the demo prints it on its own console.

:func:`compare_window` joins one window's output records (read back from the output topic)
with those totals; :func:`summarize` aggregates the windows seen.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stream_dp.config import Config, QueryConfig
from stream_dp.demo.scenario import RARE_PREFIX, USERS_QUERY, VISITS_QUERY
from stream_dp.privacy.group_values import canonical_key
from stream_dp.privacy.release import KeyAggregate
from stream_dp.privacy.statistics import statistic_of
from stream_dp.windows.tumbling import iso_utc

#: Keys whose true value is at least this are "large" in the summary.
LARGE_KEY_MIN_TRUE = 100
#: The queries whose large keys the summary checks against their 95% CI: the counts of
#: every kept key (the other queries' values are not counts, or only the top keys').
CI_CHECKED = (VISITS_QUERY, USERS_QUERY)

GroupKey = tuple[Any, ...]


class ExactTotals:
    """``exact_totals_observer`` for the worker: (query, window start) → key → totals."""

    def __init__(self) -> None:
        self._totals: dict[tuple[str, str], dict[GroupKey, KeyAggregate]] = {}

    def __call__(
        self, query: str, window_start_s: int, aggregates: Mapping[GroupKey, KeyAggregate]
    ) -> None:
        self._totals[(query, iso_utc(window_start_s))] = dict(aggregates)

    def get(self, query: str, window_start: str) -> dict[GroupKey, KeyAggregate] | None:
        return self._totals.get((query, window_start))


def true_value(query: QueryConfig, aggregate: KeyAggregate) -> float:
    """The exact bounded statistic of one key (what the released value estimates)."""
    return statistic_of(query.statistic).exact_value(aggregate, query.spec())


def _quantile_rows(
    query: QueryConfig, rec: Mapping[str, Any], group: dict[str, Any], aggregate: KeyAggregate
) -> list[KeyRow]:
    """A quantile record's rows: one per configured quantile, the quantile beside the key."""
    statistic, spec = statistic_of(query.statistic), query.spec()
    return [
        KeyRow(
            group={**group, "quantile": entry["quantile"]},
            true_value=statistic.exact_value(
                aggregate, dataclasses.replace(spec, quantiles=(entry["quantile"],))
            ),
            released=float(entry["value"]),
            ci95=float(rec["ci95"]),
            noise_scale=float(rec["noise_scale"]),
            ci95_in_ranks=True,
        )
        for entry in rec["value"]
    ]


@dataclass(frozen=True)
class KeyRow:
    group: dict[str, Any]
    true_value: float
    released: float
    ci95: float
    noise_scale: float
    #: A quantile's ci95 counts ranks, not the value's units: no ✓ against the true value.
    ci95_in_ranks: bool = False

    @property
    def label(self) -> str:
        return ", ".join(str(v) for v in self.group.values()) or "(all)"

    @property
    def error(self) -> float:
        return self.released - self.true_value

    @property
    def within_ci95(self) -> bool:
        return not self.ci95_in_ranks and abs(self.error) <= self.ci95

    @property
    def relative_error(self) -> float | None:
        return abs(self.error) / self.true_value if self.true_value > 0 else None

    @property
    def rare(self) -> bool:
        return any(str(v).startswith(RARE_PREFIX) for v in self.group.values())


@dataclass(frozen=True)
class QueryWindow:
    """One query's release for one window, beside the true values."""

    query: str
    statistic: str
    public_keys: bool
    rows: list[KeyRow]  #: released keys, largest true value first
    released_keys: int
    #: Keys in the data that partition selection dropped (private keys only). Shown by the
    #: demo because its data is synthetic; the worker never publishes this number.
    suppressed_keys: int | None
    rare_keys_in_data: int
    epsilon_spent: float
    delta_spent: float
    horizon_epsilon_spent: float
    mechanism: str | None
    noise_scale: float | None
    ci95: float | None


@dataclass(frozen=True)
class WindowResult:
    index: int  #: 1-based
    total: int
    window_start: str
    window_end: str
    queries: list[QueryWindow]

    @property
    def epsilon_spent(self) -> float:
        return math.fsum(q.epsilon_spent for q in self.queries)

    @property
    def horizon_epsilon_spent(self) -> float:
        return max((q.horizon_epsilon_spent for q in self.queries), default=0.0)


def compare_query(
    query: QueryConfig,
    releases: Sequence[Mapping[str, Any]],
    window: Mapping[str, Any],
    totals: Mapping[GroupKey, KeyAggregate],
) -> QueryWindow:
    """One query's released records of a window beside its exact totals."""
    rows: list[KeyRow] = []
    for rec in releases:
        group = dict(rec["group"])
        key = canonical_key(group[f] for f in query.group_by)  # as the exact totals hold it
        aggregate = totals.get(key, KeyAggregate(events=0, users=0, value_sum=0))
        if isinstance(rec["value"], list):
            rows.extend(_quantile_rows(query, rec, group, aggregate))
            continue
        rows.append(
            KeyRow(
                group=group,
                true_value=true_value(query, aggregate),
                released=float(rec["value"]),
                ci95=float(rec["ci95"]),
                noise_scale=float(rec["noise_scale"]),
            )
        )
    if query.statistic == "quantile":
        rows.sort(key=lambda r: r.label)  # each key's quantiles together, in order
    else:
        rows.sort(key=lambda r: (-r.true_value, r.label))
    released = int(window["released_keys"])
    rare_in_data = sum(1 for key in totals if any(str(v).startswith(RARE_PREFIX) for v in key))
    first = releases[0] if releases else None
    return QueryWindow(
        query=query.name,
        statistic=query.statistic,
        public_keys=query.public_keys,
        rows=rows,
        released_keys=released,
        suppressed_keys=None if query.public_keys else max(0, len(totals) - released),
        rare_keys_in_data=rare_in_data,
        epsilon_spent=float(window["epsilon_spent"]),
        delta_spent=float(window["delta_spent"]),
        horizon_epsilon_spent=float(window["horizon_epsilon_spent"]),
        mechanism=None if first is None else str(first["mechanism"]),
        noise_scale=None if first is None else float(first["noise_scale"]),
        ci95=None if first is None else float(first["ci95"]),
    )


@dataclass(frozen=True)
class Summary:
    windows_expected: int
    windows_seen: int
    large_key_min: int
    large_values: int
    large_within_ci95: int
    mean_relative_error_large: float | None
    rare_keys_in_data: int
    rare_keys_released: int
    epsilon_spent_total: float
    horizon_epsilon_spent: float
    max_epsilon_per_horizon: float
    elapsed_s: float

    @property
    def complete(self) -> bool:
        return self.windows_seen >= self.windows_expected


def summarize(
    results: Sequence[WindowResult], config: Config, *, windows_expected: int, elapsed_s: float
) -> Summary:
    rows = [row for w in results for q in w.queries for row in q.rows]
    counted = [row for w in results for q in w.queries if q.query in CI_CHECKED for row in q.rows]
    large = [r for r in counted if r.true_value >= LARGE_KEY_MIN_TRUE]
    relative = [r.relative_error for r in large if r.relative_error is not None]
    return Summary(
        windows_expected=windows_expected,
        windows_seen=len(results),
        large_key_min=LARGE_KEY_MIN_TRUE,
        large_values=len(large),
        large_within_ci95=sum(1 for r in large if r.within_ci95),
        mean_relative_error_large=math.fsum(relative) / len(relative) if relative else None,
        rare_keys_in_data=sum(q.rare_keys_in_data for w in results for q in w.queries),
        rare_keys_released=sum(1 for r in rows if r.rare),
        epsilon_spent_total=math.fsum(w.epsilon_spent for w in results),
        horizon_epsilon_spent=max((w.horizon_epsilon_spent for w in results), default=0.0),
        max_epsilon_per_horizon=config.privacy.max_epsilon_per_horizon,
        elapsed_s=elapsed_s,
    )
