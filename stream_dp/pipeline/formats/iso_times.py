"""ISO-8601 event times of a whole batch at once, exactly as :func:`parse_event_time` reads them.

``datetime.fromisoformat(s).timestamp()`` costs about 0.65 µs per string, as much as the rest
of a record's decode. Real producers write one layout for every event —
``YYYY-MM-DDTHH:MM:SS``, then no fraction, 3 or 6 fraction digits, then ``Z`` or
``±HH:MM`` — so a batch's strings are bytes at fixed positions: :func:`iso_epoch_seconds`
checks every character of them with numpy (digits where digits go, the exact separators
elsewhere), checks each field's range as ``fromisoformat`` does (month, the day within its
month in that year, hour ≤ 23, minute and second ≤ 59, year ≥ 1, offset under 24 h), and
computes the epoch microseconds in integers; the seconds are that integer divided by 10⁶,
the same correctly rounded division ``timedelta.total_seconds`` does, so the result is the
same float. Anything else (another layout, a space or comma, non-ASCII, mixed lengths in a
group no layout covers) is not guessed at: the function returns None and the caller parses
string by string.

Within a batch the strings usually share their date, hour and offset (a producer's events
arrive in time order): :func:`_shared_hour_seconds` then checks and converts that part once,
from the first string, and only the minutes, seconds and fraction of each string with numpy
— every character still checked against the layout (the shared part against the first
string's, byte for byte) and the same integer microseconds computed. A batch where that does
not hold (strings of several lengths, another hour, an invalid time) is read field by field
as above, so the answer is the same either way.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from collections.abc import Sequence

import numpy as np

#: Positions of the date and time digits in ``YYYY-MM-DDTHH:MM:SS`` and its separators.
_DIGITS = (0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18)
_SEPARATORS = ((4, ord("-")), (7, ord("-")), (10, ord("T")), (13, ord(":")), (16, ord(":")))
_BASE = 19
#: Integers up to 2⁵³ are exact in float64, so the division rounds as Python's int / int.
_EXACT_US = 2**53
_DAYS_IN_MONTH = np.array([0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], dtype=np.int64)


def _layouts() -> dict[int, tuple[int, bool]]:
    """String length → (fraction digits, offset written as ±HH:MM rather than Z)."""
    out: dict[int, tuple[int, bool]] = {}
    for fraction in (0, 3, 6):
        for numeric_offset in (False, True):
            length = _BASE + (fraction + 1 if fraction else 0) + (6 if numeric_offset else 1)
            out[length] = (fraction, numeric_offset)
    return out


_LAYOUTS = _layouts()
#: ``YYYY-MM-DDTHH:``: what strings of one hour (and offset) share.
_HOUR_END = 14
_EPOCH_ORDINAL = dt.date(1970, 1, 1).toordinal()
_NEWLINE = ord("\n")


def iso_epoch_seconds(values: Sequence[str]) -> np.ndarray | None:
    """Epoch seconds of every string of ``values`` (all ``str``), or None if one is not of
    the layouts above or not a valid time (the caller then parses one by one)."""
    n = len(values)
    if n == 0:
        return None
    layout = _LAYOUTS.get(len(values[0]))
    if layout is None:
        return None
    chars = _equal_length_chars(values, len(values[0]))
    if chars is not None:
        seconds = _shared_hour_seconds(chars, *layout)
        if seconds is not None:
            return seconds
    return _by_length(values)


def _by_length(values: Sequence[str]) -> np.ndarray | None:
    """:func:`iso_epoch_seconds` of any batch: its strings grouped by length (a layout
    each), every field of every string checked and converted (:func:`_group_seconds`)."""
    n = len(values)
    lengths = np.fromiter(map(len, values), np.int64, n)
    shortest, longest = int(lengths.min()), int(lengths.max())
    out = np.empty(n, dtype=np.float64)
    for length in [shortest] if shortest == longest else np.unique(lengths).tolist():
        layout = _LAYOUTS.get(length)
        if layout is None:
            return None
        rows = np.flatnonzero(lengths == length)
        group = values if rows.size == n else [values[i] for i in rows.tolist()]
        try:
            joined = "".join(group).encode("ascii")
        except UnicodeEncodeError:
            return None
        chars = np.frombuffer(joined, dtype=np.uint8).reshape(rows.size, length)
        seconds = _group_seconds(chars, *layout)
        if seconds is None:
            return None
        out[rows] = seconds
    return out


def _group_seconds(chars: np.ndarray, fraction: int, numeric_offset: bool) -> np.ndarray | None:
    """Seconds of strings of one layout (rows of ``chars``), or None if one is not valid."""
    for position, char in _SEPARATORS:
        if not (chars[:, position] == char).all():
            return None
    digit_columns = list(_DIGITS)
    at = _BASE
    if fraction:
        if not (chars[:, at] == ord(".")).all():
            return None
        digit_columns += range(at + 1, at + 1 + fraction)
        at += 1 + fraction
    if numeric_offset:
        signs = chars[:, at]
        if not ((signs == ord("+")) | (signs == ord("-"))).all():
            return None
        if not (chars[:, at + 3] == ord(":")).all():
            return None
        digit_columns += (at + 1, at + 2, at + 4, at + 5)
    elif not (chars[:, at] == ord("Z")).all():
        return None
    digits = chars - np.uint8(ord("0"))  # wraps below "0": any non-digit is above 9
    if (digits[:, digit_columns] > 9).any():
        return None
    fields = _fields(digits, fraction, numeric_offset)
    year, month, day, hour, minute, second, micros, offset_hour, offset_minute = fields
    if not ((year >= 1) & (month >= 1) & (month <= 12)).all():
        return None
    leap = (year % 4 == 0) & ((year % 100 != 0) | (year % 400 == 0))
    days_in_month = _DAYS_IN_MONTH[month] + (leap & (month == 2))
    if not ((day >= 1) & (day <= days_in_month)).all():
        return None
    if (hour > 23).any() or (minute > 59).any() or (second > 59).any():
        return None
    if (offset_hour > 23).any() or (offset_minute > 59).any():
        return None
    offset_s = offset_hour * 3600 + offset_minute * 60
    if numeric_offset:
        offset_s = np.where(chars[:, at] == ord("-"), -offset_s, offset_s)
    clock_s = _days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second
    total_us = (clock_s - offset_s) * 1_000_000 + micros
    if (np.abs(total_us) > _EXACT_US).any():  # beyond 2255 or before 1685: float64 inexact
        return None
    seconds: np.ndarray = total_us / 1_000_000
    return seconds


def _fields(digits: np.ndarray, fraction: int, numeric_offset: bool) -> list[np.ndarray]:
    """Each row's year, month, day, hour, minute, second, microseconds, offset hours and
    offset minutes from its digit values: per field one integer matrix-vector product
    (numpy's own loop, no BLAS threads)."""
    spans = [(0, 4, 1), (5, 2, 1), (8, 2, 1), (11, 2, 1), (14, 2, 1), (17, 2, 1)]
    spans.append((_BASE + 1, fraction, 10 ** (6 - fraction)))
    offset_at = _BASE + (fraction + 1 if fraction else 0)
    if numeric_offset:
        spans += [(offset_at + 1, 2, 1), (offset_at + 4, 2, 1)]
    values = digits.astype(np.int64)
    fields = [
        values[:, first : first + count] @ _weights(count, scale) for first, count, scale in spans
    ]
    zeros = np.zeros(digits.shape[0], dtype=np.int64)
    return fields + [zeros] * (9 - len(fields))


@functools.cache
def _weights(count: int, scale: int) -> np.ndarray:
    return scale * 10 ** np.arange(count - 1, -1, -1, dtype=np.int64)


def _days_from_civil(year: np.ndarray, month: np.ndarray, day: np.ndarray) -> np.ndarray:
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm)."""
    y = year - (month <= 2)
    era = np.floor_divide(y, 400)
    year_of_era = y - era * 400
    shifted_month = (month + 9) % 12
    day_of_year = (153 * shifted_month + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    result: np.ndarray = era * 146_097 + day_of_era - 719_468
    return result


def _equal_length_chars(values: Sequence[str], length: int) -> np.ndarray | None:
    """The strings' bytes as rows of ``length + 1``, each row ending in a newline, if the
    batch is ASCII and as long as ``len(values)`` strings of ``length`` joined by newlines;
    else None. Whether every string is of that length, the newline column tells (no other
    character of a layout is a newline): :func:`_shared_hour_seconds` checks it."""
    n = len(values)
    joined = "\n".join(values)
    if len(joined) != n * (length + 1) - 1:
        return None
    try:
        raw = (joined + "\n").encode("ascii")
    except UnicodeEncodeError:
        return None
    return np.frombuffer(raw, dtype=np.uint8).reshape(n, length + 1)


@functools.cache
def _first_string(fraction: int, numeric_offset: bool) -> re.Pattern[bytes]:
    """A whole string of the layout (ASCII digits: ``\\d`` of a bytes pattern)."""
    fraction_part = rb"\.\d{%d}" % fraction if fraction else b""
    offset = rb"[+-]\d\d:\d\d" if numeric_offset else b"Z"
    return re.compile(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d" + fraction_part + offset)


@functools.cache
def _minutes_on(fraction: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For ``MM:SS`` and the fraction (``[.fff]``) of a layout: the characters expected
    (``0`` where a digit goes), how far above it each may be (a digit 9, the tens of the
    minute and second 5 — so both are at most 59 —, a separator 0) and each digit's weight
    in microseconds."""
    template = list(b"00:00") + (list(b"." + b"0" * fraction) if fraction else [])
    limits = [5, 9, 0, 5, 9] + ([0] + [9] * fraction if fraction else [])
    weights = [600_000_000, 60_000_000, 0, 10_000_000, 1_000_000]
    if fraction:
        weights += [0] + [10 ** (5 - k) for k in range(fraction)]
    return (
        np.array(template, dtype=np.uint8),
        np.array(limits, dtype=np.uint8),
        np.array(weights, dtype=np.int64),
    )


def _shared_hour_seconds(
    chars: np.ndarray, fraction: int, numeric_offset: bool
) -> np.ndarray | None:
    """Seconds of rows of ``chars`` (:func:`_equal_length_chars`) of one layout that share
    the first row's date, hour and offset, or None if a row is not such a valid time (the
    caller then reads the batch field by field). The first row is checked as
    ``_group_seconds`` checks a row (the layout, month, day in its month, year ≥ 1, hour ≤
    23, offset under 24 h); every row's shared part is the first's byte for byte, its
    ``MM:SS[.fff]`` digits and separators checked, minute and second ≤ 59; the microseconds
    are the same integers, divided as there."""
    n, width = chars.shape
    length = width - 1
    first = chars[0, :length].tobytes()
    if _first_string(fraction, numeric_offset).fullmatch(first) is None:
        return None
    try:  # month 1-12, the day within its month, year >= 1: as _group_seconds checks them
        date = dt.date(int(first[0:4]), int(first[5:7]), int(first[8:10]))
    except ValueError:
        return None
    hour = int(first[11:13])
    offset_at = _BASE + (fraction + 1 if fraction else 0)
    offset_s = 0
    if numeric_offset:
        offset_hour, offset_minute = (
            int(first[offset_at + 1 : offset_at + 3]),
            int(first[offset_at + 4 : offset_at + 6]),
        )
        if offset_hour > 23 or offset_minute > 59:
            return None
        offset_s = offset_hour * 3600 + offset_minute * 60
        if first[offset_at] == ord("-"):
            offset_s = -offset_s
    if hour > 23:
        return None
    minutes, minute_limits, weights = _minutes_on(fraction)
    template = np.empty(width, dtype=np.uint8)
    template[:_HOUR_END] = chars[0, :_HOUR_END]
    template[_HOUR_END:offset_at] = minutes
    template[offset_at:length] = chars[0, offset_at:length]
    template[length] = _NEWLINE  # every row's last: each string is of this length
    limits = np.zeros(width, dtype=np.uint8)
    limits[_HOUR_END:offset_at] = minute_limits
    # XOR with the template: 0 where a row has the expected byte; at a digit's place, the
    # digit's value (only "0"-"9" give 0-9), which must not exceed its limit.
    x = chars.reshape(-1) ^ np.tile(template, n)
    if (x > np.tile(limits, n)).any():
        return None
    clock_us = x.reshape(n, width)[:, _HOUR_END:offset_at].astype(np.int64) @ weights
    base_us = ((date.toordinal() - _EPOCH_ORDINAL) * 86_400 + hour * 3600 - offset_s) * 10**6
    total_us = clock_us + base_us
    if (np.abs(total_us) > _EXACT_US).any():  # beyond 2255 or before 1685: float64 inexact
        return None
    seconds: np.ndarray = total_us / 1_000_000
    return seconds
