"""The batch ISO-8601 reader gives exactly what the per-string reader gives, or declines."""

from __future__ import annotations

import datetime as dt

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_dp.pipeline.formats import iso_times
from stream_dp.pipeline.formats.decode import parse_event_time
from stream_dp.pipeline.formats.iso_times import iso_epoch_seconds

#: Naive times: each gets one of the offsets below.
_NAIVE_FIRST = dt.datetime(1700, 1, 1)  # noqa: DTZ001
_NAIVE_LAST = dt.datetime(2250, 12, 31)  # noqa: DTZ001
_times = st.datetimes(min_value=_NAIVE_FIRST, max_value=_NAIVE_LAST)
_offsets = st.integers(-(24 * 60 - 1), 24 * 60 - 1).map(
    lambda m: dt.timezone(dt.timedelta(minutes=m))
)
_specs = st.sampled_from(["seconds", "milliseconds", "microseconds"])


def _spell(t: dt.datetime, tz: dt.tzinfo, spec: str, zulu: bool) -> str:
    text = t.replace(tzinfo=tz).isoformat(timespec=spec)
    return text.replace("+00:00", "Z") if zulu else text


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_times, _offsets, _specs, st.booleans()), min_size=1, max_size=40))
def test_valid_layouts_are_read_at_once_and_equal_the_per_string_reader(
    stamps: list[tuple[dt.datetime, dt.tzinfo, str, bool]],
) -> None:
    values = [_spell(*s) for s in stamps]
    fast = iso_epoch_seconds(values)
    assert fast is not None, values  # every one of these layouts takes the batch path
    assert fast.dtype == np.float64
    assert fast.tolist() == [parse_event_time(v) for v in values]  # the same floats


_fields = st.tuples(
    st.sampled_from([0, 1, 4, 1600, 1900, 2000, 2023, 2024, 2100, 2400]),
    st.integers(0, 13),
    st.integers(0, 32),
    st.integers(0, 25),
    st.integers(0, 61),
    st.integers(0, 61),
    st.sampled_from(["", ".5", ".123", ".000001", ".1234567", ",123"]),
    st.sampled_from(
        [
            "Z",
            "z",
            "",
            "+00:00",
            "-00:00",
            "+05:30",
            "-23:59",
            "+24:00",
            "+00:60",
            "+0530",
            "+05:30:00",
        ]
    ),
    st.sampled_from("TTTt "),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_fields, min_size=1, max_size=5))
def test_any_string_is_read_as_the_per_string_reader_reads_it_or_declined(
    parts: list[tuple[int, int, int, int, int, int, str, str, str]],
) -> None:
    values = [
        f"{y:04d}-{mo:02d}-{d:02d}{sep}{h:02d}:{mi:02d}:{s:02d}{frac}{off}"
        for y, mo, d, h, mi, s, frac, off, sep in parts
    ]
    fast = iso_epoch_seconds(values)
    expected = [parse_event_time(v) for v in values]
    if fast is not None:  # only ever for strings the per-string reader takes, and equal
        assert fast.tolist() == expected, values


def test_what_it_declines() -> None:
    good = "2024-02-29T23:59:59.999+01:00"
    assert iso_epoch_seconds([good]) is not None
    for bad in (
        "2023-02-29T00:00:00Z",  # no 29 February in 2023
        "2024-04-31T00:00:00Z",
        "2024-01-01T24:00:00Z",
        "2024-01-01T00:00:60Z",
        "2024-01-01T00:00:00+24:00",
        "0000-01-01T00:00:00Z",
        "2024-01-01 00:00:00Z",  # a layout the batch reader leaves to the per-string one
        "2024-01-01T00:00:00.1234567Z",
        "2024-01-01T00:00:0٣Z",  # a non-ASCII digit
        "2024-01-01T00:00:00",  # no offset
        "2300-01-01T00:00:00Z",  # beyond 2⁵³ µs: float64 would not be exact
        "2024-01-01t00:00:00Z",
        "2024-01-01T00:00:00z",
        "2024-01-01T00:00:00+05:60",
        "2024-13-01T00:00:00Z",
        "2024-00-10T00:00:00Z",
        "2024-01-00T00:00:00Z",
        "2024-01-01T00:60:00.000Z",
        "2024-01-01T00:00:00.000*01:00",
        "2024-01-01T00:00:00.000+01-00",
        "2024/01-01T00:00:00Z",
    ):
        assert iso_epoch_seconds([good, bad]) is None, bad
        # first in its batch, or alone: the string whose hour a batch would share
        assert iso_epoch_seconds([bad]) is None, bad
        assert iso_epoch_seconds([bad, good]) is None, bad
    assert iso_epoch_seconds([]) is None


# -- strings sharing their hour: the first string's date, hour and offset, read once --------
_HOURS = st.tuples(
    st.sampled_from([0, 1, 1969, 1970, 2023, 2024, 2100, 2300]),
    st.integers(0, 13),
    st.integers(0, 32),
    st.integers(0, 25),
    st.sampled_from(["Z", "+00:00", "-00:00", "+05:30", "-23:59", "+24:00", "+00:60", "-12:07"]),
)
#: (which hour, minute, second, microseconds)
_CLOCKS = st.tuples(
    st.integers(0, 1), st.integers(0, 61), st.integers(0, 61), st.integers(0, 999_999)
)
#: One character of one string replaced, or one deleted and one added (lengths still sum up).
_DAMAGE = st.one_of(
    st.none(),
    st.tuples(
        st.just("replace"),
        st.integers(0, 99),
        st.integers(0, 40),
        st.sampled_from("0956:.-+TZ\n ٣"),
    ),
    st.tuples(st.just("shift"), st.integers(0, 99), st.integers(0, 99), st.sampled_from("0:")),
)


def _hour_batch(
    hours: list[tuple[int, int, int, int, str]],
    clocks: list[tuple[int, int, int, int]],
    fraction: int,
) -> list[str]:
    """Strings of one layout; string i in hour ``hours[i's pick]``."""
    out = []
    for pick, minute, second, micros in clocks:
        y, mo, d, h, off = hours[pick % len(hours)]
        frac = f".{micros:06d}"[: 1 + fraction] if fraction else ""
        out.append(f"{y:04d}-{mo:02d}-{d:02d}T{h:02d}:{minute:02d}:{second:02d}{frac}{off}")
    return out


def _damaged(values: list[str], damage: tuple[str, int, int, str] | None) -> list[str]:
    values = list(values)
    if damage is None:
        return values
    kind, row, at, char = damage
    i = row % len(values)
    if kind == "replace":
        s = values[i]
        values[i] = s[: at % len(s)] + char + s[at % len(s) + 1 :]
    elif len(values) > 1:  # one string a character shorter, another one longer
        j = (i + 1 + at % (len(values) - 1)) % len(values)
        values[i] = values[i][:-2] + values[i][-1]
        values[j] = values[j][:5] + char + values[j][5:]
    return values


@settings(max_examples=600, deadline=None)
@given(
    st.lists(_HOURS, min_size=1, max_size=2),
    st.lists(_CLOCKS, min_size=1, max_size=30),
    st.sampled_from([0, 3, 6]),
    _DAMAGE,
)
def test_strings_of_one_hour_read_at_once_equal_the_field_by_field_reader(
    hours: list[tuple[int, int, int, int, str]],
    clocks: list[tuple[int, int, int, int]],
    fraction: int,
    damage: tuple[str, int, int, str] | None,
) -> None:
    """The whole reader against the field-by-field one (the reader before the shared-hour
    path): the same floats, or both decline; and the same as the per-string reader. A batch
    of one hour, valid and undamaged, is read by the shared-hour path itself."""
    values = _damaged(_hour_batch(hours, clocks, fraction), damage)
    fast = iso_epoch_seconds(values)
    by_field = iso_times._by_length(values)
    if by_field is None:
        assert fast is None, values
    else:
        assert fast is not None, values
        assert fast.tolist() == by_field.tolist(), values
        assert fast.tolist() == [parse_event_time(v) for v in values], values
    one_hour = len({v[: iso_times._HOUR_END] + v[-1:] for v in values}) == 1
    if by_field is not None and damage is None and one_hour and len(hours) == 1:
        chars = iso_times._equal_length_chars(values, len(values[0]))
        assert chars is not None
        layout = iso_times._LAYOUTS[len(values[0])]
        assert iso_times._shared_hour_seconds(chars, *layout) is not None
