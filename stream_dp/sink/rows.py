"""Output records → database rows: pure, no I/O.

One record of the output topic becomes a :class:`ReleaseRow` (``"kind": "release"``), a
:class:`WindowRow` (``"kind": "window"``) or a :class:`BadRecord` (anything else — the sink
stores its position and reason and goes on, it never crashes on a record).

The mapping renames what SQL cannot use as is: the record's ``group`` becomes
``group_key`` (canonical JSON, part of the primary key), ``group_values`` (JSONB) and
``group_label`` (the values joined for legends); ``value`` stays ``value``. Both the record
format of today and the leaner one (``selection`` holding only its parameters) map alike:
``selection`` is stored as it comes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal

import orjson

from stream_dp.pipeline.formats.records import SCHEMA_VERSION, canonical_group
from stream_dp.privacy.statistics import STATISTICS

#: Why a record could not be stored (the ``reason`` label of the bad-records metric).
BadReason = Literal[
    "not_json",
    "not_an_object",
    "unsupported_schema_version",
    "unknown_kind",
    "missing_field",
    "invalid_field",
    "rejected_by_database",
]
BAD_REASONS: Final[tuple[str, ...]] = (
    "not_json",
    "not_an_object",
    "unsupported_schema_version",
    "unknown_kind",
    "missing_field",
    "invalid_field",
    "rejected_by_database",  # parsed, but PostgreSQL refused it (see stream_dp.sink.service)
)

#: PostgreSQL's btree entries hold at most ~2,700 bytes: a group (canonical JSON) larger than
#: this cannot be part of the primary key and is refused as ``invalid_field``.
MAX_GROUP_KEY_BYTES: Final = 2000
#: ``released_keys`` is stored as a PostgreSQL integer.
MAX_RELEASED_KEYS: Final = 2**31 - 1

#: A (query, window start) pair: one row of the windows table.
WindowId = tuple[str, datetime]


@dataclass(frozen=True)
class ReleaseRow:
    """One row of ``stream_dp.releases``; primary key (query, window_start, group_key)."""

    query: str
    window_start: datetime
    window_end: datetime
    group_key: str
    group_values: str  #: canonical JSON, stored as JSONB
    group_label: str
    statistic: str
    value: float
    #: In the value's units; None (NULL, and so the band ``ci95_low``/``ci95_high``) when the
    #: record's is not (a quantile's, in ranks: :func:`_ci95_in_value_units`).
    ci95: float | None
    epsilon: float
    delta: float
    mechanism: str
    noise_scale: float
    selection: str | None  #: canonical JSON or None (public keys), stored as JSONB
    clamped: bool
    release_id: str
    #: ``window`` (value is this window's statistic) or ``cumulative`` (value is the running
    #: total from ``horizon_start`` to ``window_end``: never add these up).
    release: str = "window"
    horizon_start: datetime | None = None
    #: cumulative: windows of the horizon covered by ``value`` (1 … T).
    horizon_step: int | None = None
    #: ``statistic: quantile``: the record's list of {quantile, value} as canonical JSON
    #: (stored as JSONB; ``value`` holds the first listed quantile's value); None otherwise.
    quantiles: str | None = None

    @property
    def window_id(self) -> WindowId:
        return (self.query, self.window_start)

    @property
    def primary_key(self) -> tuple[str, datetime, str]:
        return (self.query, self.window_start, self.group_key)


@dataclass(frozen=True)
class WindowRow:
    """The window record's part of a ``stream_dp.windows`` row (key: query, window_start)."""

    query: str
    window_start: datetime
    window_end: datetime
    release_id: str
    released_keys: int
    epsilon_spent: float
    delta_spent: float
    horizon_epsilon_spent: float

    @property
    def window_id(self) -> WindowId:
        return (self.query, self.window_start)


@dataclass(frozen=True)
class BadRecord:
    reason: BadReason
    #: What is wrong, naming fields, never their values.
    detail: str


class _Invalid(Exception):
    def __init__(self, reason: BadReason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def parse_output_record(value: bytes | None) -> ReleaseRow | WindowRow | BadRecord:
    """Map one output-topic value to its row, or say why it cannot be stored."""
    if value is None:
        return BadRecord("not_an_object", "the record has no value (a tombstone)")
    try:
        record = orjson.loads(value)
    except orjson.JSONDecodeError:
        return BadRecord("not_json", "the value is not UTF-8 JSON")
    if not isinstance(record, dict):
        return BadRecord("not_an_object", f"the value is a JSON {type(record).__name__}")
    if _holds_nul(record):
        # PostgreSQL text and JSONB cannot hold NUL characters.
        return BadRecord("invalid_field", "a string holds a NUL character (\\u0000)")
    try:
        version = record.get("schema_version")
        if version != SCHEMA_VERSION or isinstance(version, bool):
            raise _Invalid(
                "unsupported_schema_version",
                f"schema_version is not {SCHEMA_VERSION}; upgrade the sink to the worker's version",
            )
        kind = record.get("kind")
        if kind == "release":
            return _release(record)
        if kind == "window":
            return _window(record)
        raise _Invalid("unknown_kind", 'kind is neither "release" nor "window"')
    except _Invalid as exc:
        return BadRecord(exc.reason, exc.detail)


def _release(record: Mapping[str, Any]) -> ReleaseRow:
    group = _field(record, "group", dict)
    for name, item in group.items():
        if not (item is None or isinstance(item, str | int | float | bool)):
            raise _Invalid("invalid_field", f"group field {name!r} is not a scalar")
    selection = record.get("selection")
    if selection is not None and not isinstance(selection, dict):
        raise _Invalid("invalid_field", "selection is neither an object nor null")
    group_key = canonical_group(group)
    if len(group_key.encode("utf-8")) > MAX_GROUP_KEY_BYTES:
        raise _Invalid(
            "invalid_field",
            f"group is larger than {MAX_GROUP_KEY_BYTES} bytes of JSON: too large to index",
        )
    clamped = record.get("clamped", False)
    if not isinstance(clamped, bool):
        raise _Invalid("invalid_field", "clamped is not a boolean")
    release = record.get("release", "window")
    horizon_start: datetime | None = None
    horizon_step: int | None = None
    if release == "cumulative":
        horizon_start = _timestamp(record, "horizon_start")
        horizon_step = _field(record, "horizon_step", int)
        if not 1 <= horizon_step <= MAX_RELEASED_KEYS:
            raise _Invalid("invalid_field", "horizon_step is out of range")
    elif release != "window":
        raise _Invalid("invalid_field", 'release is neither "window" nor "cumulative"')
    value, quantiles = _value_and_quantiles(record)
    statistic = _text(record, "statistic")
    return ReleaseRow(
        query=_text(record, "query"),
        window_start=_timestamp(record, "window_start"),
        window_end=_timestamp(record, "window_end"),
        group_key=group_key,
        group_values=group_key,
        group_label=group_label(group),
        statistic=statistic,
        value=value,
        ci95=_ci95_in_value_units(record, statistic),
        epsilon=_number(record, "epsilon", minimum=0.0),
        delta=_number(record, "delta", minimum=0.0),
        mechanism=_text(record, "mechanism"),
        noise_scale=_number(record, "noise_scale", minimum=0.0),
        selection=None if selection is None else canonical_group(selection),
        clamped=clamped,
        release_id=_text(record, "release_id"),
        release=release,
        horizon_start=horizon_start,
        horizon_step=horizon_step,
        quantiles=quantiles,
    )


def _window(record: Mapping[str, Any]) -> WindowRow:
    released_keys = _field(record, "released_keys", int)
    if not 0 <= released_keys <= MAX_RELEASED_KEYS:
        raise _Invalid("invalid_field", "released_keys is out of range")
    return WindowRow(
        query=_text(record, "query"),
        window_start=_timestamp(record, "window_start"),
        window_end=_timestamp(record, "window_end"),
        release_id=_text(record, "release_id"),
        released_keys=released_keys,
        epsilon_spent=_number(record, "epsilon_spent", minimum=0.0),
        delta_spent=_number(record, "delta_spent", minimum=0.0),
        horizon_epsilon_spent=_number(record, "horizon_epsilon_spent", minimum=0.0),
    )


def _holds_nul(item: Any) -> bool:
    if isinstance(item, str):
        return "\x00" in item
    if isinstance(item, dict):
        return any(_holds_nul(k) or _holds_nul(v) for k, v in item.items())
    if isinstance(item, list):
        return any(_holds_nul(v) for v in item)
    return False


def group_label(group: Mapping[str, Any]) -> str:
    """The group's values for a legend: strings as they are, other values as JSON
    (``true``, ``1``, ``null``), joined by ", "; ``(all)`` for a query without group_by."""
    parts = [v if isinstance(v, str) else orjson.dumps(v).decode() for v in group.values()]
    return ", ".join(parts) or "(all)"


def _field(record: Mapping[str, Any], name: str, kind: type) -> Any:
    if name not in record:
        raise _Invalid("missing_field", f"{name} is missing")
    item = record[name]
    if not isinstance(item, kind) or (kind is int and isinstance(item, bool)):
        raise _Invalid("invalid_field", f"{name} is not a {kind.__name__}")
    return item


def _text(record: Mapping[str, Any], name: str) -> str:
    text: str = _field(record, name, str)
    if not text:
        raise _Invalid("invalid_field", f"{name} is empty")
    return text


def _number(record: Mapping[str, Any], name: str, *, minimum: float | None = None) -> float:
    if name not in record:
        raise _Invalid("missing_field", f"{name} is missing")
    item = record[name]
    if isinstance(item, bool) or not isinstance(item, int | float):
        raise _Invalid("invalid_field", f"{name} is not a number")
    number = float(item)
    if not math.isfinite(number) or (minimum is not None and number < minimum):
        raise _Invalid("invalid_field", f"{name} is out of range")
    return number


def _timestamp(record: Mapping[str, Any], name: str) -> datetime:
    text = _text(record, name)
    if not text.endswith("Z"):
        raise _Invalid("invalid_field", f"{name} is not an ISO-8601 UTC time ending in Z")
    try:
        moment = datetime.fromisoformat(text[:-1] + "+00:00")
    except ValueError:
        raise _Invalid("invalid_field", f"{name} is not an ISO-8601 UTC time") from None
    return moment.astimezone(UTC)


def _ci95_in_value_units(record: Mapping[str, Any], statistic: str) -> float | None:
    """The record's ``ci95`` (checked either way); None when it is not in the value's units,
    so that ``value ± ci95`` (the stored band) would mean nothing: the record names another
    unit (``ci95_unit``: a quantile's ranks), or it is a statistic whose interval is in
    another unit written before records named it (a quantile's)."""
    ci95 = _number(record, "ci95", minimum=0.0)
    unit = record.get("ci95_unit")
    if unit is not None and not isinstance(unit, str):
        raise _Invalid("invalid_field", "ci95_unit is not a string")
    known = STATISTICS.get(statistic)  # type: ignore[call-overload]
    if unit is not None or (known is not None and known.error_unit is not None):
        return None
    return ci95


def _value_and_quantiles(record: Mapping[str, Any]) -> tuple[float, str | None]:
    """A number's ``value``; or a quantile record's list of {quantile, value} (non-empty,
    quantiles in (0, 1), values numbers): its first value and the list as canonical JSON."""
    listed = record.get("value")
    if not isinstance(listed, list):
        return _number(record, "value"), None
    if not listed:
        raise _Invalid("invalid_field", "value is an empty list")
    for item in listed:
        if not isinstance(item, dict) or set(item) != {"quantile", "value"}:
            raise _Invalid("invalid_field", "a value list item is not {quantile, value}")
        alpha = item["quantile"]
        if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 < alpha < 1:
            raise _Invalid("invalid_field", "a value list item's quantile is not in (0, 1)")
        number = item["value"]
        if isinstance(number, bool) or not isinstance(number, int | float):
            raise _Invalid("invalid_field", "a value list item's value is not a number")
        if not math.isfinite(number):
            raise _Invalid("invalid_field", "a value list item's value is not finite")
    return float(listed[0]["value"]), orjson.dumps(listed).decode()
