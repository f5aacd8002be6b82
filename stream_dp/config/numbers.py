"""Strict numbers and timestamps for the configuration model: no value is read as a number
it was not written as.

YAML 1.1 (what PyYAML reads) makes booleans of unquoted ``yes``, ``no``, ``on``, ``off``,
``true`` and ``false``, and pydantic's lax mode turns a boolean into 1 or 0, the text ``"24"``
into 24 and an integral ``3600.0`` into 3600 — so ``privacy.horizon_windows: yes`` was a
horizon of one window (and the horizon cap then capped nothing), ``epsilon: on`` was 1.0 and
``window.size_s: true`` one second; a number where a timestamp belongs (``window.start_at:
0``) was the Unix epoch. The annotated types here refuse all of that with a message that says
what to write instead:

- :data:`Integer` (and :data:`OptionalInteger`): an integer only — no boolean, no text, no
  decimal (``3600.0`` is refused with "write 3600").
- :data:`Number` (and :data:`OptionalNumber`), for ε, δ, shares, budgets and value ranges: an
  integer or a decimal — no boolean, no text.
- :data:`Timestamp` (optional): an ISO 8601 timestamp with its UTC offset (the text, or the
  timestamp YAML reads from an unquoted one) — no number, no date without a time.

Environment variables arrive as text: :func:`env_value` turns a variable meant for a number
field into that number when it is written as one (digits for an integer; digits, a decimal
point or an exponent for a number) and leaves anything else (``yes``) as text, which the
field then refuses.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import date, datetime
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator
from pydantic.fields import FieldInfo

#: An integer as an environment variable writes it.
_INTEGER_TEXT = re.compile(r"^[-+]?[0-9]+$")
#: A decimal number as an environment variable writes it (no nan, no inf).
_NUMBER_TEXT = re.compile(r"^[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?$")

YAML_BOOLEANS = "YAML reads unquoted yes, no, on, off, true and false as booleans"


def describe_value(value: Any) -> str:
    """What a refused value is, as the user wrote it."""
    if isinstance(value, bool):
        return f"the boolean {'true' if value else 'false'} ({YAML_BOOLEANS})"
    if isinstance(value, str):
        return f"the text {value!r}"
    if isinstance(value, float):
        return f"the decimal {value!r}"
    if isinstance(value, int):
        return f"the number {value}"
    if isinstance(value, datetime):
        return f"the timestamp {value.isoformat()}"
    if isinstance(value, date):
        return f"the date {value.isoformat()} (no time of day)"
    return f"a {type(value).__name__}"


def _integer(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    fix = "write it as digits, without quotes or a decimal point (e.g. 3600)"
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        fix = f"write {int(value)}"
    elif isinstance(value, str) and _INTEGER_TEXT.match(value.strip()):
        fix = f"write {int(value)} without quotes"
    raise ValueError(f"expects an integer, got {describe_value(value)}; {fix}")


def _number(value: Any) -> Any:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    fix = "write it as a number without quotes (e.g. 0.5 or 1.0e-6)"
    if isinstance(value, str) and _NUMBER_TEXT.match(value.strip()):
        fix = f"write {value.strip()} without quotes"
    raise ValueError(f"expects a number, got {describe_value(value)}; {fix}")


def _optional_integer(value: Any) -> Any:
    return None if value is None else _integer(value)


def _optional_number(value: Any) -> Any:
    return None if value is None else _number(value)


def _timestamp(value: Any) -> Any:
    if value is None:
        return None
    example = "e.g. 2020-08-01T00:00:00Z"
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.strip())
        except ValueError:
            raise ValueError(
                f"expects an ISO 8601 timestamp with its UTC offset ({example}), got "
                f"{describe_value(value)}"
            ) from None
    else:
        why = (
            " (a number would be read as seconds since 1970)"
            if isinstance(value, int | float) and not isinstance(value, bool)
            else ""
        )
        raise ValueError(
            f"expects an ISO 8601 timestamp with its UTC offset ({example}), got "
            f"{describe_value(value)}{why}"
        )
    if parsed.tzinfo is None:
        raise ValueError(
            f"needs a UTC offset: write the timestamp with it ({example}), not "
            f"{describe_value(value)}"
        )
    return parsed


@dataclass(frozen=True)
class ValueKind:
    """Marks a field's type with the kind of value it takes (see :func:`field_kind`)."""

    name: Literal["integer", "number", "timestamp"]


INTEGER, NUMBER, TIMESTAMP = ValueKind("integer"), ValueKind("number"), ValueKind("timestamp")

#: An integer: no boolean, no text, no decimal.
Integer = Annotated[int, BeforeValidator(_integer), INTEGER]
OptionalInteger = Annotated[int | None, BeforeValidator(_optional_integer), INTEGER]
#: A number (ε, δ, a share, a budget, a value range): an integer or a decimal, no boolean or text.
Number = Annotated[float, BeforeValidator(_number), NUMBER]
OptionalNumber = Annotated[float | None, BeforeValidator(_optional_number), NUMBER]
#: A timestamp with its UTC offset, or unset.
Timestamp = Annotated[datetime | None, BeforeValidator(_timestamp), TIMESTAMP]


def field_kind(field: FieldInfo) -> str | None:
    """``integer``, ``number`` or ``timestamp`` for a field whose type carries a
    :class:`ValueKind` (the types above, and the contribution bounds), else None."""
    for item in field.metadata:
        if isinstance(item, ValueKind):
            return item.name
    return None


def env_value(kind: str | None, raw: str) -> Any:
    """An environment variable's text as the value a field of ``kind`` takes: digits → an
    integer, a decimal → a float (for number fields); anything else stays text, which a
    number field refuses with its message."""
    text = raw.strip()
    if kind in ("integer", "number") and _INTEGER_TEXT.match(text):
        return int(text)
    if kind == "number" and _NUMBER_TEXT.match(text):
        return float(text)
    return raw
