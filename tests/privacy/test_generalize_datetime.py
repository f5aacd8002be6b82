"""Generalising a date or a datetime (not only a string) keeps only its year or month."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from stream_dp.privacy.generalize import DateGranularity, generalize_date


@pytest.mark.parametrize("value", [date(1984, 7, 21), datetime(1984, 7, 21, 23, 59, tzinfo=UTC)])
@pytest.mark.parametrize(("to", "expected"), [("year", "1984"), ("month", "1984-07")])
def test_a_date_or_datetime_is_generalised_by_its_date(
    value: date, to: DateGranularity, expected: str
) -> None:
    assert generalize_date(value, to) == expected
