"""Generalisation of quasi-identifiers used as group keys (date of birth → year).

Coarser group keys mean more users per key, so fewer keys fall below the selection
threshold and the released keys say less about any one person.
"""

from __future__ import annotations

import math
from datetime import UTC, date, datetime
from typing import Literal

DateGranularity = Literal["year", "month"]


def generalize_date(value: str | date | datetime, to: DateGranularity) -> str:
    """``"1984-07-21"`` → ``"1984"`` (year) or ``"1984-07"`` (month)."""
    if isinstance(value, str):
        parsed = datetime.fromisoformat(value).date() if "T" in value else date.fromisoformat(value)
    elif isinstance(value, datetime):
        parsed = value.date()
    else:
        parsed = value
    if to == "year":
        return f"{parsed.year:04d}"
    if to == "month":
        return f"{parsed.year:04d}-{parsed.month:02d}"
    raise ValueError(f"unknown date granularity {to!r}; use 'year' or 'month'")


def bucket_number(value: float, width: float, origin: float = 0.0) -> str:
    """The bucket ``[lo, hi)`` of ``width`` that holds ``value``: age 37, width 10 → "30-40"."""
    if width <= 0 or not math.isfinite(width):
        raise ValueError("bucket width must be a positive finite number")
    if not math.isfinite(value):
        raise ValueError("cannot bucket a non-finite number")
    lo = origin + math.floor((value - origin) / width) * width
    return f"{lo:g}-{lo + width:g}"


def generalize_timestamp(epoch_s: float, to: DateGranularity) -> str:
    """An epoch-seconds timestamp's UTC year or month: ``1596240000`` → ``"2020-08"``."""
    if not math.isfinite(epoch_s):
        raise ValueError("cannot generalize a non-finite timestamp")
    return generalize_date(datetime.fromtimestamp(epoch_s, tz=UTC), to)


def prefix_text(value: str, length: int) -> str:
    """The first ``length`` characters of a text (postcode ``"75011"``, 2 → ``"75"``)."""
    if length < 1:
        raise ValueError("a prefix keeps at least one character")
    return value[:length]
