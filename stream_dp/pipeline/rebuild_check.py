"""What ``ledger rebuild`` checks before it writes: that its configuration released the
windows on the output topic.

A rebuilt ledger makes every window found on the output topic released under the rebuild's
configuration, and records that configuration's deployment fingerprint. If another
configuration released them (10-second windows, rebuilt with ``size_s: 5``; another k, ε or
query list), the workers started on that ledger would release windows overlapping the
released ones — the same events released twice, each charged as a fresh window — or noise
calibrated for other bounds. So every window found is compared with the configuration's
plan, field by field, and one mismatch refuses the whole rebuild before anything is written.

The records carry no fingerprint; what they state is compared:

* the window: its length (``window_end − window_start`` is ``window.size_s``, in every
  record) and its start on the epoch-aligned grid of that size. Windows that end at or
  before ``window.start_at`` belong to an earlier deployment sharing the output topic:
  they are neither checked nor restored.
* per query: the records' ``statistic``, ``mechanism``, ``epsilon`` and ``delta`` (and the
  window record's ``epsilon_spent``, ``delta_spent``) equal the query's; the ``group`` fields
  are its ``group_by``; the ``selection`` parameters (strategy, its ε and δ, L0, Linf,
  threshold) equal the plan's; ``noise_scale`` equals the plan's scale for the window's
  bounds (the configured ones, or under ``bounds: auto`` those the window record states,
  each within its cap, fixed ones as configured). A mean's per-key scale is the sum's scale
  over that key's noisy count, which the record does not carry: the configured sum's scale
  divided by a whole number must give it exactly, and the mean lies within
  [``lower``, ``upper``]. A cumulative query's records state its horizon and option.
* the query list: a query on the output topic that the configuration lacks, in the span of
  the deployment's windows, or a configured query on none of its windows.

Numbers are compared exactly: the records are canonical JSON, whose floats read back to the
very values the worker computed from the same configuration with the same planner.
Settings the records do not show (``where`` filters, user and time fields, public key lists,
internal partition counts) cannot be checked here: they are the operator's to keep.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import orjson

from stream_dp.config.model import BOUND_NAMES, Config, QueryConfig
from stream_dp.errors import ConfigError
from stream_dp.privacy.planner import QueryPlan, plan_query
from stream_dp.privacy.specs import BoundsSpec
from stream_dp.privacy.statistics import stated_mechanism, statistic_of
from stream_dp.windows.tumbling import epoch_of_iso, iso_utc

#: The release record fields :class:`_QueryCheck` compares besides the ``group``'s field
#: names (for a ratio, a mean or variance, also its value).
_CHECKED: Final = (
    "epsilon",
    "delta",
    "statistic",
    "mechanism",
    "release",
    "selection",
    "noise_scale",
    "horizon_windows",
    "continual_mechanism",
)
_CHECKED_RATIO: Final = (*_CHECKED, "value", "clamped")
#: Mismatches printed in the refusal (the rest are counted).
SHOWN_MISMATCHES: Final = 6
#: The window record's ``bounds`` field names, in the order (k, L0, Linf).
_BOUND_FIELDS: Final = BOUND_NAMES


class ReleasedWindow(Protocol):
    """One (query, window) as the output topic shows it
    (:class:`stream_dp.pipeline.kafka.output_scan.ReleasedWindow`)."""

    query: str
    window_start_s: int
    window_end_s: int
    #: Output key → release record.
    releases: dict[str, dict[str, Any]]
    #: The window record (key, value), if it reached the topic.
    window: tuple[str, dict[str, Any]] | None


class ReleasedUnderOtherSettingsError(ConfigError):
    """The output topic holds windows another configuration released."""


@dataclass(frozen=True)
class Mismatch:
    """One field where a window on the output topic differs from the configuration."""

    window_start_s: int | None
    query: str | None
    #: The configuration's field (``window.size_s``, ``queries.visits.epsilon``, …) or the
    #: record's (``noise_scale``, ``selection.threshold``) with the settings behind it.
    field: str
    found: str
    configured: str


def _describe(group: Sequence[Mismatch]) -> str:
    """One line for mismatches that differ only in their window."""
    m = group[0]
    starts = sorted({g.window_start_s for g in group if g.window_start_s is not None})
    where = []
    if starts:
        first, last = iso_utc(starts[0]), iso_utc(starts[-1])
        where.append(
            f"window {first}"
            if len(starts) == 1
            else f"{len(starts)} windows from {first} to {last}"
        )
    if m.query is not None:
        where.append(f"query {m.query}")
    return (
        f"{', '.join(where)}: {m.field}: {m.found} on the output topic, {m.configured} "
        "in this configuration"
    )


def _json(value: Any) -> Any:
    """``value`` as a record states it once written and read back (canonical JSON)."""
    return orjson.loads(orjson.dumps(value))


def _num(value: Any) -> str:
    return "missing" if value is None else orjson.dumps(value).decode()


class _QueryCheck:
    """The plan of one configured query (per window's bounds under ``bounds: auto``) and
    the comparison of its records with it."""

    def __init__(self, config: Config, query: QueryConfig) -> None:
        self.config = config
        self.query = query
        self.spec = query.spec()
        self._plans: dict[tuple[int, int | None, int | None], QueryPlan] = {}
        #: Per plan (kept in ``_plans``), its selection parameters as a record states them.
        self._selections: dict[int, Any] = {}

    def plan(self, bounds: tuple[int, int | None, int | None]) -> QueryPlan:
        found = self._plans.get(bounds)
        if found is None:
            found = self._plans[bounds] = plan_query(self.spec, BoundsSpec(*bounds))
        return found

    def check(
        self, window: ReleasedWindow, bounds: tuple[int, int | None, int | None] | None
    ) -> list[Mismatch]:
        """Every field of the window's records that this query's plan does not give."""
        q = self.query
        out: list[Mismatch] = []
        # A window may hold 1,000,000 keys whose checked fields are all alike: each distinct
        # combination of them is checked once.
        checked_fields = _CHECKED_RATIO if statistic_of(q.statistic).ratio else _CHECKED
        seen: dict[bytes, dict[str, Any]] = {}
        for record in window.releases.values():
            group = record.get("group")
            names = list(group) if isinstance(group, dict) else group
            alike = orjson.dumps([names, *map(record.get, checked_fields)], default=repr)
            seen.setdefault(alike, record)
        distinct = list(seen.values())
        # ε and δ as each release record and the window record (what a window is charged)
        # state them
        for name, configured in (("epsilon", q.epsilon), ("delta", q.delta)):
            stated = {_num(r.get(name)) for r in distinct}
            if window.window is not None:
                stated.add(_num(window.window[1].get(f"{name}_spent")))
            for found in sorted(stated - {_num(_json(configured))}):
                out.append(
                    Mismatch(
                        window.window_start_s,
                        q.name,
                        f"queries.{q.name}.{name}",
                        found,
                        _num(configured),
                    )
                )
        plan = None if bounds is None else self.plan(bounds)
        for record in distinct:
            out.extend(self._record(window, record, plan))
            if len(out) > SHOWN_MISMATCHES:
                break
        return _distinct(out)

    def _record(
        self, window: ReleasedWindow, record: Mapping[str, Any], plan: QueryPlan | None
    ) -> list[Mismatch]:
        q = self.query
        out: list[Mismatch] = []

        def differ(field: str, found: Any, configured: Any) -> None:
            out.append(
                Mismatch(window.window_start_s, q.name, field, _num(found), _num(configured))
            )

        if record.get("statistic") != q.statistic:
            differ(f"queries.{q.name}.statistic", record.get("statistic"), q.statistic)
        # A statistic with its own mechanism (a quantile's exponential) names it; versions
        # before named the query's mechanism there: the same configuration released both.
        stated = stated_mechanism(q.statistic, q.mechanism)
        if record.get("mechanism") not in (stated, q.mechanism):
            differ(f"queries.{q.name}.mechanism", record.get("mechanism"), stated)
        group = record.get("group")
        if not isinstance(group, Mapping) or sorted(group) != sorted(q.group_by):
            found = sorted(group) if isinstance(group, Mapping) else group
            differ(f"queries.{q.name}.group_by", found, sorted(q.group_by))
        mode = record.get("release", "window")
        if mode != q.release:
            differ(f"queries.{q.name}.release", mode, q.release)
        if plan is None:  # bounds: auto without the window record: its bounds are unknown
            return out
        out.extend(self._selection(window, record, plan))
        out.extend(self._noise(window, record, plan))
        return out

    def _selection(
        self, window: ReleasedWindow, record: Mapping[str, Any], plan: QueryPlan
    ) -> list[Mismatch]:
        q = self.query
        if id(plan) not in self._selections:
            self._selections[id(plan)] = (
                None if plan.selection is None else _json(plan.selection.record_parameters())
            )
        configured = self._selections[id(plan)]
        found = record.get("selection")
        if found == configured:
            return []
        if not isinstance(found, Mapping) or not isinstance(configured, Mapping):
            return [
                Mismatch(
                    window.window_start_s,
                    q.name,
                    f"queries.{q.name}.keys / selection (public keys or a selection)",
                    "none" if found is None else "a selection",
                    "none" if configured is None else "a selection",
                )
            ]
        return [
            Mismatch(
                window.window_start_s,
                q.name,
                f"selection.{name} (set by queries.{q.name}.selection, its ε, δ and the bounds)",
                _num(found.get(name)),
                _num(configured.get(name)),
            )
            for name in sorted(found.keys() | configured.keys())
            if found.get(name) != configured.get(name)
        ]

    def _noise(
        self, window: ReleasedWindow, record: Mapping[str, Any], plan: QueryPlan
    ) -> list[Mismatch]:
        q = self.query
        field = (
            "noise_scale (set by the bounds and the query's ε, δ, mechanism, lower, upper, "
            "granularity)"
        )
        scale = record.get("noise_scale")
        if not isinstance(scale, int | float) or isinstance(scale, bool):
            return [Mismatch(window.window_start_s, q.name, field, _num(scale), "a number")]
        if statistic_of(plan.statistic).ratio:
            return self._ratio(window, record, plan, float(scale), field)
        out = []
        if scale != plan.noise_scale:
            out.append(
                Mismatch(window.window_start_s, q.name, field, _num(scale), _num(plan.noise_scale))
            )
        if plan.continual is not None:
            c = plan.continual
            for name, configured in (
                ("horizon_windows", c.horizon_windows),
                ("continual_mechanism", c.option),
            ):
                if record.get(name) != configured:
                    out.append(
                        Mismatch(
                            window.window_start_s,
                            q.name,
                            f"queries.{q.name}.{name}",
                            _num(record.get(name)),
                            _num(configured),
                        )
                    )
        return out

    def _ratio(
        self,
        window: ReleasedWindow,
        record: Mapping[str, Any],
        plan: QueryPlan,
        scale: float,
        field: str,
    ) -> list[Mismatch]:
        """A ratio's (mean's, variance's) scale is its first component's over
        ``max(1, noisy count)``; its value lies in the statistic's range (a mean's
        [lower, upper])."""
        q = self.query
        out = []
        count = round(plan.noise_scale / scale) if scale > 0 else 0
        if count < 1 or plan.noise_scale / count != scale:
            out.append(
                Mismatch(
                    window.window_start_s,
                    q.name,
                    field,
                    _num(scale),
                    f"{_num(plan.noise_scale)} over a whole noisy count",
                )
            )
        value = record.get("value")
        found = statistic_of(plan.statistic).released_range(plan)
        assert found is not None
        lower, upper = found
        within = isinstance(value, int | float) and lower <= value <= upper
        if not within and not (record.get("clamped") is True and value == 0):
            out.append(
                Mismatch(
                    window.window_start_s,
                    q.name,
                    f"queries.{q.name}.lower / upper (a {plan.statistic} lies within them)",
                    _num(value),
                    f"[{_num(lower)}, {_num(upper)}]",
                )
            )
        return out


def _distinct(mismatches: list[Mismatch]) -> list[Mismatch]:
    """Each (window, query, field, found, configured) once (many keys say the same)."""
    return list(dict.fromkeys(mismatches))


def _window_bounds(
    config: Config, window: ReleasedWindow
) -> tuple[tuple[int, int | None, int | None] | None, list[Mismatch]]:
    """The bounds the window was released under as far as this configuration decides them
    (None: ``bounds: auto`` and no window record to read them from), and how the window
    record's ``bounds`` field disagrees with the configuration."""
    bounds = config.bounds
    stated = None if window.window is None else window.window[1].get("bounds")
    if not bounds.is_auto:
        fixed = bounds.values()
        if stated is not None:
            return fixed, [
                Mismatch(
                    window.window_start_s,
                    window.query,
                    "bounds (auto or fixed)",
                    "bounds chosen automatically (the window record states them)",
                    f"fixed bounds {list(fixed)}",
                )
            ]
        return fixed, []
    if window.window is None:
        return None, []
    if not isinstance(stated, Mapping):
        return None, [
            Mismatch(
                window.window_start_s,
                window.query,
                "bounds (auto or fixed)",
                "fixed bounds (the window record states none)",
                f"bounds: auto for {', '.join(bounds.auto_fields)}",
            )
        ]
    settings = bounds.auto_settings
    values: list[Any] = []
    out: list[Mismatch] = []
    for name in _BOUND_FIELDS:
        value = stated.get(name)
        values.append(value)
        configured = getattr(bounds, name)
        if configured == "auto":
            cap = settings.cap_value(name)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= cap:
                out.append(
                    Mismatch(
                        window.window_start_s,
                        window.query,
                        f"bounds.auto.cap.{name}",
                        _num(value),
                        f"auto, at most {cap}",
                    )
                )
        elif value != configured:
            out.append(
                Mismatch(
                    window.window_start_s,
                    window.query,
                    f"bounds.{name}",
                    _num(value),
                    _num(configured),
                )
            )
    if stated.get("epsilon") != _json(config.bounds_epsilon):
        out.append(
            Mismatch(
                window.window_start_s,
                window.query,
                "bounds.auto.epsilon_share (ε of the bounds' histograms per window)",
                _num(stated.get("epsilon")),
                _num(config.bounds_epsilon),
            )
        )
    if out:
        return None, out
    k, l0, linf = values
    return (int(k), l0, linf), []


def _grid(config: Config, window: ReleasedWindow) -> list[Mismatch]:
    """The window's length and its place on the grid (windows that end after
    ``window.start_at`` on the grid start at or after it: the start is floored to it)."""
    size = config.window.size_s
    out: list[Mismatch] = []
    # every record's end (each parsed when the output was decoded; distinct ones once here)
    records = [*window.releases.values(), *([window.window[1]] if window.window else [])]
    stated = {str(record["window_end"]) for record in records}
    ends = {window.window_end_s, *map(epoch_of_iso, stated)}
    if ends != {window.window_start_s + size}:
        lengths = sorted(end - window.window_start_s for end in ends)
        out.append(
            Mismatch(
                window.window_start_s,
                window.query,
                "window.size_s",
                f"windows of {', '.join(map(str, lengths))} s",
                f"{size} s",
            )
        )
    elif window.window_start_s % size:
        out.append(
            Mismatch(
                window.window_start_s,
                window.query,
                "window.size_s (the grid)",
                f"a window starting {window.window_start_s % size} s after a grid point",
                f"windows of {size} s aligned to the Unix epoch",
            )
        )
    return out


def _query_list(
    config: Config,
    released: Sequence[ReleasedWindow],
    foreign: Mapping[str, set[tuple[int, int]]],
) -> list[Mismatch]:
    """Queries on the output topic this configuration lacks (within the span of the
    deployment's windows), and configured queries on none of its windows."""
    out: list[Mismatch] = []
    if not released:
        return out
    span_start = min(w.window_start_s for w in released)
    span_end = max(w.window_end_s for w in released)
    for name, windows in sorted(foreign.items()):
        inside = sorted(ws for ws, we in windows if we > span_start and ws < span_end)
        if inside:
            out.append(
                Mismatch(
                    inside[0],
                    name,
                    "queries",
                    f"a query {name!r} released in {len(inside)} of the deployment's windows",
                    "no such query",
                )
            )
    found = {w.query for w in released}
    for q in config.queries:
        if q.name not in found:
            out.append(
                Mismatch(
                    None,
                    q.name,
                    "queries",
                    "no window of it",
                    f"a query {q.name!r}",
                )
            )
    return out


def check_released(
    config: Config,
    released: Sequence[ReleasedWindow],
    foreign: Mapping[str, set[tuple[int, int]]],
) -> list[Mismatch]:
    """Every mismatch between the windows on the output topic and the configuration's
    plan (empty: this configuration released them as far as their records show)."""
    checks = {q.name: _QueryCheck(config, q) for q in config.queries}
    out = _query_list(config, released, foreign)
    for window in released:
        grid = _grid(config, window)
        bounds, disagree = _window_bounds(config, window)
        out.extend(grid)
        out.extend(disagree)
        if not grid:
            out.extend(checks[window.query].check(window, bounds))
    return _distinct(out)


def refuse_mismatches(
    config: Config,
    mismatches: Sequence[Mismatch],
    released: Sequence[ReleasedWindow],
) -> None:
    """Raise :class:`ReleasedUnderOtherSettingsError` naming the mismatches (the first
    few), how many windows they touch, and the way out."""
    if not mismatches:
        return
    found = {(w.query, w.window_start_s) for w in released}
    windows = {(m.query, m.window_start_s) for m in mismatches} & found
    fields = sorted({m.field.split(" ")[0] for m in mismatches})
    groups: dict[tuple[str | None, str, str, str], list[Mismatch]] = {}
    for m in mismatches:
        groups.setdefault((m.query, m.field, m.found, m.configured), []).append(m)
    lines = [f"  {_describe(g)}" for g in list(groups.values())[:SHOWN_MISMATCHES]]
    if len(groups) > SHOWN_MISMATCHES:
        lines.append(f"  (and {len(groups) - SHOWN_MISMATCHES} more)")
    last_end = max(w.window_end_s for w in released)
    raise ReleasedUnderOtherSettingsError(
        f"the ledger {config.output.ledger_topic} cannot be rebuilt with this configuration: "
        f"{len(windows)} of the {len(released)} (query, window) releases on the output topic "
        f"{config.output.topic} were released under other settings "
        f"({', '.join(fields)}):\n"
        + "\n".join(lines)
        + "\nWorkers started on a ledger rebuilt with it would release windows that overlap "
        "released ones (the same events released twice, each charged as a fresh window) or "
        "add noise calibrated for other settings. Nothing was written to the ledger. Run the "
        "rebuild with the configuration that released these windows, or start a new "
        "deployment: a new kafka.group_id (or a new output topic) with window.start_at at or "
        f"after {iso_utc(last_end)} (after the last window the output topic holds), once its "
        "workers are stopped (see the operations guide, changing a meaning-bearing setting)"
    )
