"""What a sample of input events says about a configuration, before the first run.

Used by ``stream-dp check`` (a sample of the input topic) and ``stream-dp produce --file``
(the lines of a file). Each event goes through the worker's own decoder
(:mod:`stream_dp.pipeline.formats.decode`), then is checked against what the queries need and
against the windows the worker will cover. The report holds counts, field names, type
names and window starts only: never a user id or a field value.
"""

from __future__ import annotations

import difflib
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from stream_dp.config.model import Config, QueryConfig
from stream_dp.pipeline.formats.decode import BadRecord, Decoder
from stream_dp.pipeline.stages.queries import needed_fields
from stream_dp.privacy.group_values import canonical_value
from stream_dp.windows.tumbling import iso_utc


def coverage_start_s(config: Config, now_s: float) -> int:
    """The first window a worker started now would cover: ``window.start_at``'s, else the
    window of the wall clock (a worker already running covers from its own first start)."""
    configured = config.window.first_window_start()
    if configured is not None:
        return configured
    size = config.window.size_s
    return math.floor(now_s / size) * size


@dataclass
class FieldReport:
    """One field a query needs: in how many usable events it is missing, and its types."""

    name: str
    missing: int = 0
    types: Counter[str] = field(default_factory=Counter)


@dataclass
class KeyListReport:
    """One public key list of a query: usable events whose value is not on it, and how many
    of those match a listed value in another letter case."""

    query: str
    field: str
    #: Listed values by their case-folded form (public: they are in the configuration).
    listed: dict[str, Any]
    allowed: frozenset[Any]
    outside: int = 0
    other_case: int = 0
    #: A listed value that matched in another case (the configuration's spelling).
    example: Any = None

    def add(self, value: Any) -> None:
        if value is None or value in self.allowed:
            return  # a missing value is reported as a missing group field
        self.outside += 1
        if isinstance(value, str):
            match = self.listed.get(value.casefold())
            if match is not None:
                self.other_case += 1
                if self.example is None:
                    self.example = match


@dataclass
class InputReport:
    """Counts over a sample of input events (see the module docstring)."""

    coverage_start_s: int
    start_at_set: bool
    window_size_s: int
    user_field: str = "user_id"
    time_field: str = "timestamp"
    #: Per query, the fields it groups by and its missing_group setting.
    groups: dict[str, tuple[list[str], str]] = field(default_factory=dict)
    key_lists: list[KeyListReport] = field(default_factory=list)
    #: The per-user bound k (None: auto, no single value).
    max_contributions_per_window: int | None = None
    events: int = 0
    usable: int = 0
    #: Records that are JSON objects, and per field name in how many it holds a non-null value.
    objects: int = 0
    present: Counter[str] = field(default_factory=Counter)
    bad: Counter[str] = field(default_factory=Counter)
    fields: dict[str, FieldReport] = field(default_factory=dict)
    before_coverage: int = 0
    earliest_window_s: int | None = None
    latest_window_s: int | None = None
    #: Usable events per (window, user), batch-local (never printed: only their sum).
    _per_user: Counter[tuple[int, Any]] = field(default_factory=Counter)

    def absent(self, name: str) -> int:
        """JSON-object records in which the field is missing or null."""
        return self.objects - self.present[name]

    def similar_names(self, name: str) -> list[str]:
        """Field names of the sample close to ``name`` (names only, never values)."""
        names = [n for n in self.present if n != name]
        close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
        for n in names:  # "user" for "user_id", "ts" for "timestamp"-like prefixes
            if n not in close and (n in name or name in n) and len(close) < 3:
                close.append(n)
        return close

    def over_bound(self) -> int:
        """Usable events of the sample beyond the per-user bound in their window."""
        k = self.max_contributions_per_window
        if k is None:
            return 0
        return sum(n - k for n in self._per_user.values() if n > k)

    def _named(self, name: str) -> str:
        similar = self.similar_names(name)
        if similar:
            return " (the sample has " + ", ".join(repr(n) for n in similar) + ")"
        used = {self.user_field, self.time_field, *self.fields}
        for group_by, _ in self.groups.values():
            used.update(group_by)
        unused = sorted(n for n in self.present if n not in used)[:8]
        if not unused:
            return ""
        return " (fields of the sample no setting names: " + ", ".join(map(repr, unused)) + ")"

    def _field_problems(self) -> list[str]:
        out: list[str] = []
        for role, name in (("user_field", self.user_field), ("time_field", self.time_field)):
            if self.objects and self.absent(name):
                out.append(
                    f"input.{role} {name!r} is missing or null in {self.absent(name)} of "
                    f"{self.objects} events{self._named(name)}: set input.{role} to the field "
                    "that holds the " + ("user id" if role == "user_field" else "event time")
                )
        for query, (group_by, setting) in self.groups.items():
            for name in group_by:
                n = self.absent(name)
                if not n:
                    continue
                fate = (
                    "counted under a null key (missing_group: null_key)"
                    if setting == "null_key"
                    else "dropped and counted in stream_dp_query_events_dropped_total"
                    '{reason="missing_group_field"}'
                )
                out.append(
                    f"query {query} groups by {name!r}, which is missing or null in {n} of "
                    f"{self.objects} events{self._named(name)}: they are {fate}; set "
                    "group_by to the field that holds it"
                )
        return out

    def problems(self) -> list[str]:
        """Each problem in a sentence that says what to change; empty when none. Every
        class is reported at once: fields under another name, events not usable, values
        outside a key list, events before the first covered window."""
        out: list[str] = []
        if self.events == 0:
            out.append(
                "the sample holds no events: is input.topic the topic your producers write to?"
            )
            return out
        out.extend(self._field_problems())
        for reason, n in self.bad.most_common():
            if reason in ("missing_user", "missing_timestamp") and self.objects:
                continue  # named above, with the fields the sample has
            hint = _BAD_HINTS.get(reason, "see the dead-letter reasons in docs/topics.md")
            out.append(f"{n} of {self.events} events are not usable ({reason}): {hint}")
        for keys in self.key_lists:
            if not keys.outside:
                continue
            line = (
                f"query {keys.query}: {keys.outside} of {self.usable} usable events have a "
                f"{keys.field!r} value not on its key list (dropped and counted in "
                'stream_dp_query_events_dropped_total{reason="outside_key_list"})'
            )
            if keys.other_case:
                line += (
                    f"; {keys.other_case} of them match a listed value in another letter case "
                    f"(listed {keys.example!r}): list the values as the events spell them"
                )
            else:
                line += "; add the values to keys, or use keys: private"
            out.append(line)
        if self.before_coverage:
            origin = "window.start_at" if self.start_at_set else "a worker started now"
            out.append(
                f"{self.before_coverage} of {self.usable} usable events are stamped before the "
                f"first window {origin} covers ({iso_utc(self.coverage_start_s)}): the worker "
                "drops them as late. To count them set window.start_at (e.g. "
                f"window.start_at: {iso_utc(self.earliest_window_s or self.coverage_start_s)}) "
                "before the first run — every window from it on is released — or use "
                "`stream-dp replay` for a recorded file"
            )
        return out

    def add(
        self,
        decoded: tuple[str | int, float, dict[str, object]] | BadRecord,
        raw: bytes | None = None,
    ) -> None:
        """Count one decoded record; ``raw``, its bytes, tells which field names it holds
        (also when the decoder refused it)."""
        self.events += 1
        if raw is not None:
            self._look(raw)
        if isinstance(decoded, BadRecord):
            self.bad[decoded.reason] += 1
            return
        user, event_time_s, values = decoded
        self.usable += 1
        for keys in self.key_lists:
            keys.add(values.get(keys.field))
        for report in self.fields.values():
            value = values.get(report.name)
            if value is None:
                report.missing += 1
            else:
                report.types[_type_name(value)] += 1
        window_s = math.floor(event_time_s / self.window_size_s) * self.window_size_s
        self._per_user[(window_s, user)] += 1
        if window_s < self.coverage_start_s:
            self.before_coverage += 1
        if self.earliest_window_s is None or window_s < self.earliest_window_s:
            self.earliest_window_s = window_s
        if self.latest_window_s is None or window_s > self.latest_window_s:
            self.latest_window_s = window_s

    def _look(self, value: bytes) -> None:
        """Which field names a raw record holds (any record that is a JSON object)."""
        try:
            obj = orjson.loads(value)
        except orjson.JSONDecodeError:
            return
        if type(obj) is not dict:
            return
        self.objects += 1
        self.present.update(name for name, v in obj.items() if v is not None)


_BAD_HINTS = {
    "missing_user": "set input.user_field to the field that holds the user id",
    "missing_timestamp": "set input.time_field to the field that holds the event time",
    "bad_timestamp": "input.time_field must hold epoch seconds or milliseconds, or an "
    "ISO-8601 time with offset",
    "timestamp_out_of_range": "event times must be after 1990 and not ahead of the clock by "
    "more than input.max_future_s",
    "not_json": "the worker reads JSON objects, one per record",
    "not_object": "the worker reads JSON objects, one per record",
    "bad_field": "a field a query groups or filters on must hold a string, number, boolean or "
    "null (value fields a number)",
    "too_large": "raise input.max_record_bytes or send smaller records",
}


def _type_name(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return type(value).__name__


def decoder_for(config: Config) -> Decoder:
    """The worker's decoder for this configuration."""
    _, scalar, numeric = needed_fields(config.queries)
    return Decoder(
        user_field=config.input.user_field,
        time_field=config.input.time_field,
        max_record_bytes=config.input.max_record_bytes,
        max_future_s=config.input.max_future_s,
        scalar_fields=scalar,
        numeric_fields=numeric,
    )


def check_values(config: Config, values: Iterable[bytes | None], now_s: float) -> InputReport:
    """The report on raw record values (one JSON event each), decoded as the worker would."""
    fields, _, _ = needed_fields(config.queries)
    k = config.bounds.max_contributions_per_window
    report = InputReport(
        coverage_start_s=coverage_start_s(config, now_s),
        start_at_set=config.window.start_at is not None,
        window_size_s=config.window.size_s,
        user_field=config.input.user_field,
        time_field=config.input.time_field,
        groups={q.name: (list(q.group_by), q.missing_group) for q in config.queries},
        key_lists=[kl for q in config.queries for kl in _key_lists(q)],
        max_contributions_per_window=k if isinstance(k, int) else None,
        fields={name: FieldReport(name) for name in fields},
    )
    decoder = decoder_for(config)
    for value in values:
        report.add(decoder.decode_parts(value, now_s), value)
    return report


def _key_lists(query: QueryConfig) -> list[KeyListReport]:
    """The query's public key lists, one per group field (values canonical, as the worker
    compares them)."""
    if isinstance(query.keys, str):
        return []
    out = []
    for name, listed in query.keys.items():
        allowed = frozenset(map(canonical_value, listed))
        folded = {v.casefold(): v for v in listed if isinstance(v, str)}
        out.append(KeyListReport(query.name, name, folded, allowed))
    return out
