"""Decode and validate one input record (docs/topics.md#input-records).

Anything that is not a usable event becomes a :class:`BadRecord` with a reason code from
:data:`REASONS`; the caller sends it to the dead-letter topic. Details never quote values
(they could be raw ids).

The values of the fields queries group and filter on are put in canonical form here, in the
object itself (:mod:`stream_dp.privacy.group_values`: JSON ``true`` stays a boolean distinct
from 1, ``1.0`` becomes 1); strings, integers and missing fields — the common case — pass
with the same one type test as before.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import orjson

from stream_dp.privacy.group_values import JSON_FALSE, JSON_TRUE, canonical_float

#: Every dead-letter reason the worker writes (the dead-letter schema's enum and the
#: pre-initialised ``stream_dp_bad_records_total`` series list exactly these).
REASONS: Final = (
    "not_utf8",
    "not_json",
    "not_object",
    "too_large",
    "missing_user",
    "bad_user",
    "missing_timestamp",
    "bad_timestamp",
    "timestamp_out_of_range",
    "bad_field",
    "not_keyed_by_user",
    "misplaced_key",
    "bad_internal_record",
    "bad_erasure_request",
    "key_check_mismatch",
)

#: Epoch numbers below this are seconds, at or above it milliseconds (docs/topics.md#input-records).
EPOCH_MS_CUTOFF = 1e11
#: Earliest accepted event time (1990-01-01): older stamps are absurd for live streams.
MIN_EVENT_TIME_S = 631_152_000.0
MAX_USER_ID_CHARS = 1024

#: Group values already in canonical form. orjson yields exact types (no subclasses), so an
#: exact-type test is an ``isinstance`` test; bool and float are the other scalars.
_CANONICAL_SCALAR_TYPES = frozenset((str, int, type(None)))
_INFINITIES = (math.inf, -math.inf)
_MISSING: Any = object()


@dataclass(frozen=True, slots=True)
class Event:
    user: str | int
    event_time_s: float
    fields: dict[str, Any]


@dataclass(frozen=True, slots=True)
class BadRecord:
    reason: str
    detail: str


def parse_event_time(value: object) -> float | str:
    """Event time in epoch seconds, or the reason it is bad ("missing"/"bad")."""
    if isinstance(value, bool):
        return "bad"
    if isinstance(value, int | float):
        t = float(value)
        if not math.isfinite(t):
            return "bad"
        return t / 1000.0 if abs(t) >= EPOCH_MS_CUTOFF else t
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            return "bad"
        if parsed.tzinfo is None:
            return "bad"
        return parsed.timestamp()
    return "bad"


class Decoder:
    """Validates records for one input configuration; cheap enough for the hot path."""

    def __init__(
        self,
        *,
        user_field: str,
        time_field: str,
        max_record_bytes: int,
        max_future_s: float,
        scalar_fields: Sequence[str] = (),
        numeric_fields: Sequence[str] = (),
    ) -> None:
        self.user_field = user_field
        self.time_field = time_field
        self.max_record_bytes = max_record_bytes
        self.max_future_s = max_future_s
        self.scalar_fields = tuple(scalar_fields)
        self.numeric_fields = tuple(numeric_fields)

    def decode(self, value: bytes | None, now_s: float) -> Event | BadRecord:
        parts = self.decode_parts(value, now_s)
        if isinstance(parts, BadRecord):
            return parts
        return Event(*parts)

    def decode_parts(
        self, value: bytes | None, now_s: float
    ) -> tuple[str | int, float, dict[str, Any]] | BadRecord:
        """:meth:`decode` without building the :class:`Event`: (user, event time, fields).

        The hot path of the engine: the common case (a JSON object with a string or integer
        user and an epoch-number timestamp) takes exact-type fast paths; anything else falls
        through to the same checks, so results are identical to :meth:`decode`.
        """
        if value is None:
            return BadRecord("not_json", "record has no value (tombstone)")
        if len(value) > self.max_record_bytes:
            return BadRecord(
                "too_large",
                f"{len(value)} bytes > input.max_record_bytes {self.max_record_bytes}",
            )
        try:
            obj = orjson.loads(value)
        except orjson.JSONDecodeError:
            try:
                value.decode("utf-8")
            except UnicodeDecodeError:
                return BadRecord("not_utf8", "value is not valid UTF-8")
            return BadRecord("not_json", "value is not valid JSON")
        if type(obj) is not dict:  # orjson builds plain dicts only
            return BadRecord("not_object", f"JSON value is a {type(obj).__name__}, not an object")
        user = obj.get(self.user_field, _MISSING)
        tu = type(user)
        if tu is str:
            if not (0 < len(user) <= MAX_USER_ID_CHARS):
                return BadRecord(
                    "bad_user",
                    f"field {self.user_field!r} must be 1..{MAX_USER_ID_CHARS} characters",
                )
        elif tu is not int:
            if user is _MISSING:
                return BadRecord("missing_user", f"field {self.user_field!r} is missing")
            return BadRecord("bad_user", f"field {self.user_field!r} must be a string or integer")
        raw_time = obj.get(self.time_field, _MISSING)
        tt = type(raw_time)
        t: float | str
        if tt is int or tt is float:
            t = float(raw_time)
            if t != t or t in _INFINITIES:  # not finite (orjson never yields these)
                t = "bad"
            elif abs(t) >= EPOCH_MS_CUTOFF:
                t = t / 1000.0
        elif raw_time is _MISSING:
            return BadRecord("missing_timestamp", f"field {self.time_field!r} is missing")
        else:
            t = parse_event_time(raw_time)
        if isinstance(t, str):
            return BadRecord(
                "bad_timestamp",
                f"field {self.time_field!r} must be ISO-8601 with a UTC offset or epoch s/ms",
            )
        if t < MIN_EVENT_TIME_S or t > now_s + self.max_future_s:
            return BadRecord(
                "timestamp_out_of_range",
                f"field {self.time_field!r} is before 1990 or more than "
                f"input.max_future_s={self.max_future_s:g} s ahead of the clock",
            )
        for name in self.scalar_fields:
            tv: type[Any] = type(obj.get(name))
            if tv not in _CANONICAL_SCALAR_TYPES:
                if tv is bool:
                    obj[name] = JSON_TRUE if obj[name] else JSON_FALSE
                elif tv is float:
                    obj[name] = canonical_float(obj[name])
                else:
                    return BadRecord(
                        "bad_field", f"field {name!r} must be a string, number or bool"
                    )
        for name in self.numeric_fields:
            v = obj.get(name)
            if v is not None and (
                isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)
            ):
                return BadRecord("bad_field", f"field {name!r} must be a finite number")
        return user, t, obj
