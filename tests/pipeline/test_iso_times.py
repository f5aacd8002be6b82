"""The batch ISO-8601 reader gives exactly what the per-string reader gives, or declines."""

from __future__ import annotations

import datetime as dt

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

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
    ):
        assert iso_epoch_seconds([good, bad]) is None, bad
    assert iso_epoch_seconds([]) is None
