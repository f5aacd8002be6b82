"""What a sample of input events says about a configuration, before the first run.

Used by ``stream-dp check`` (a sample of the input topic) and ``stream-dp produce --file``
(the lines of a file). Each event goes through the worker's own decoder
(:mod:`stream_dp.pipeline.formats.decode`), then is checked against what the queries need and
against the windows the worker will cover. The report holds counts, field names, type
names and window starts only: never a user id or a field value.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from stream_dp.config.model import Config
from stream_dp.pipeline.formats.decode import BadRecord, Decoder
from stream_dp.pipeline.stages.queries import needed_fields
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
class InputReport:
    """Counts over a sample of input events (see the module docstring)."""

    coverage_start_s: int
    start_at_set: bool
    window_size_s: int
    events: int = 0
    usable: int = 0
    bad: Counter[str] = field(default_factory=Counter)
    fields: dict[str, FieldReport] = field(default_factory=dict)
    before_coverage: int = 0
    earliest_window_s: int | None = None
    latest_window_s: int | None = None

    def problems(self) -> list[str]:
        """Each problem in a sentence that says what to change; empty when none."""
        out: list[str] = []
        if self.events == 0:
            out.append(
                "the sample holds no events: is input.topic the topic your producers write to?"
            )
            return out
        for reason, n in self.bad.most_common():
            hint = _BAD_HINTS.get(reason, "see the dead-letter reasons in docs/topics.md")
            out.append(f"{n} of {self.events} events are not usable ({reason}): {hint}")
        for report in self.fields.values():
            if report.missing:
                out.append(
                    f"field {report.name!r}, which a query groups or filters on, is missing in "
                    f"{report.missing} of {self.usable} usable events (they count under null); "
                    "check the queries' field names"
                )
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

    def add(self, decoded: tuple[str | int, float, dict[str, object]] | BadRecord) -> None:
        self.events += 1
        if isinstance(decoded, BadRecord):
            self.bad[decoded.reason] += 1
            return
        _, event_time_s, values = decoded
        self.usable += 1
        for report in self.fields.values():
            value = values.get(report.name)
            if value is None:
                report.missing += 1
            else:
                report.types[_type_name(value)] += 1
        window_s = math.floor(event_time_s / self.window_size_s) * self.window_size_s
        if window_s < self.coverage_start_s:
            self.before_coverage += 1
        if self.earliest_window_s is None or window_s < self.earliest_window_s:
            self.earliest_window_s = window_s
        if self.latest_window_s is None or window_s > self.latest_window_s:
            self.latest_window_s = window_s


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
    report = InputReport(
        coverage_start_s=coverage_start_s(config, now_s),
        start_at_set=config.window.start_at is not None,
        window_size_s=config.window.size_s,
        fields={name: FieldReport(name) for name in fields},
    )
    decoder = decoder_for(config)
    for value in values:
        report.add(decoder.decode_parts(value, now_s))
    return report
