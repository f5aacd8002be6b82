"""Output records → rows: both record formats, and every kind of bad record."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
import pytest

from stream_dp.sink.rows import (
    MAX_GROUP_KEY_BYTES,
    BadRecord,
    ReleaseRow,
    WindowRow,
    group_label,
    parse_output_record,
)
from tests.sink.support import window_records


def _release(**changes: object) -> bytes:
    _, value = window_records("visits", 0, ["mail.com"])[0]
    record = orjson.loads(value)
    record.update(changes)
    return orjson.dumps(record)


@pytest.mark.parametrize("lean", [False, True])
def test_a_release_maps_to_its_row(lean: bool) -> None:
    _, value = window_records("visits", 2, ["mail.com"], lean=lean)[0]
    row = parse_output_record(value)
    assert isinstance(row, ReleaseRow)
    assert row.query == "visits"
    assert row.window_start == datetime(2020, 8, 1, 0, 0, 20, tzinfo=UTC)
    assert row.window_end == datetime(2020, 8, 1, 0, 0, 30, tzinfo=UTC)
    assert row.group_key == '{"domain":"mail.com"}' == row.group_values
    assert row.group_label == "mail.com"
    assert (row.value, row.ci95, row.epsilon, row.delta) == (98.0, 18.0, 0.5, 1e-6)
    assert (row.mechanism, row.noise_scale, row.statistic) == ("discrete_laplace", 6.0, "count")
    assert row.release_id == "visits-2" and row.clamped is False
    selection = orjson.loads(row.selection or "null")
    assert selection["strategy"] == "truncated_geometric"
    assert ("description" in selection) is not lean


def test_a_window_record_maps_to_its_row() -> None:
    _, value = window_records("visits", 1, ["a", "b", "c"])[-1]
    row = parse_output_record(value)
    assert row == WindowRow(
        query="visits",
        window_start=datetime(2020, 8, 1, 0, 0, 10, tzinfo=UTC),
        window_end=datetime(2020, 8, 1, 0, 0, 20, tzinfo=UTC),
        release_id="visits-1",
        released_keys=3,
        epsilon_spent=0.5,
        delta_spent=1e-6,
        horizon_epsilon_spent=1.0,
    )


def test_public_keys_clamped_and_multi_field_groups() -> None:
    row = parse_output_record(
        _release(group={"country": "DE", "mobile": True, "n": 1}, selection=None, clamped=True)
    )
    assert isinstance(row, ReleaseRow)
    assert row.selection is None and row.clamped is True
    assert row.group_key == '{"country":"DE","mobile":true,"n":1}'
    assert row.group_label == "DE, true, 1"
    assert group_label({}) == "(all)"


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"not json", "not_json"),
        (b"\xff\xfe", "not_json"),
        (b"[1, 2]", "not_an_object"),
        (None, "not_an_object"),
        (_release(schema_version=2), "unsupported_schema_version"),
        (_release(schema_version=True), "unsupported_schema_version"),
        (_release(kind="ledger"), "unknown_kind"),
        (orjson.dumps({"schema_version": 1, "kind": "release"}), "missing_field"),
        (_release(value="12"), "invalid_field"),
        (_release(value=True), "invalid_field"),
        (_release(ci95=-1), "invalid_field"),
        (_release(window_start="2020-08-01 00:00:00"), "invalid_field"),
        (_release(window_start="yesterdayZ"), "invalid_field"),
        (_release(group=["mail.com"]), "invalid_field"),
        (_release(group={"domain": {"nested": 1}}), "invalid_field"),
        (_release(selection="truncated_geometric"), "invalid_field"),
        (_release(query=""), "invalid_field"),
        (_release(group={"domain": "a\u0000b"}), "invalid_field"),
        (_release(group={"domain": "x" * MAX_GROUP_KEY_BYTES}), "invalid_field"),
        (_release(clamped="yes"), "invalid_field"),
    ],
)
def test_bad_records_say_why(value: bytes | None, reason: str) -> None:
    bad = parse_output_record(value)
    assert isinstance(bad, BadRecord)
    assert bad.reason == reason
    assert bad.detail


def test_a_bad_window_record() -> None:
    _, value = window_records("visits", 0, ["a"])[-1]
    record = orjson.loads(value)
    for bad_value in (-1, 2**31, 1.5, True):
        broken = parse_output_record(orjson.dumps({**record, "released_keys": bad_value}))
        assert isinstance(broken, BadRecord) and broken.reason == "invalid_field"
    del record["horizon_epsilon_spent"]
    missing = parse_output_record(orjson.dumps(record))
    assert isinstance(missing, BadRecord) and missing.reason == "missing_field"


def test_details_never_quote_values() -> None:
    rare = "only-one-person-visits-this.example"
    bad = parse_output_record(_release(group={"domain": {"x": rare}}, value=rare))
    assert isinstance(bad, BadRecord)
    assert rare not in bad.detail


def test_a_running_total_keeps_its_continual_release_fields() -> None:
    row = parse_output_record(
        _release(release="cumulative", horizon_start="2020-08-01T00:00:00Z", horizon_step=3)
    )
    assert isinstance(row, ReleaseRow)
    assert row.release == "cumulative" and row.horizon_step == 3
    assert row.horizon_start == datetime(2020, 8, 1, tzinfo=UTC)
    per_window = parse_output_record(_release(release="window"))
    assert isinstance(per_window, ReleaseRow)
    assert (per_window.release, per_window.horizon_start, per_window.horizon_step) == (
        "window", None, None,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"release": "cumulative", "horizon_step": 2}, "missing_field"),
        ({"release": "cumulative", "horizon_start": "2020-08-01T00:00:00Z"}, "missing_field"),
        (
            {"release": "cumulative", "horizon_start": "2020-08-01T00:00:00Z", "horizon_step": 0},
            "invalid_field",
        ),
        ({"release": "rolling"}, "invalid_field"),
    ],
)
def test_a_running_total_without_its_fields_is_refused(
    changes: dict[str, object], reason: str
) -> None:
    row = parse_output_record(_release(**changes))
    assert isinstance(row, BadRecord) and row.reason == reason


def test_a_variance_release_maps_to_the_same_columns() -> None:
    """statistic: variance needs no column of its own: its value, interval and scale are
    numbers like any statistic's (the sink's table has no list of statistics to extend)."""
    value = _release(statistic="variance", value=8.921875, ci95=3.5, noise_scale=0.25)
    row = parse_output_record(value)
    assert isinstance(row, ReleaseRow)
    numbers = (row.value, row.ci95, row.noise_scale)
    assert (row.statistic, numbers) == ("variance", (8.921875, 3.5, 0.25))


QUANTILE_VALUE = [{"quantile": 0.5, "value": 40.0}, {"quantile": 0.9, "value": 90.0}]


def test_a_quantile_release_keeps_its_list_and_the_first_value() -> None:
    """statistic: quantile: the record's list of {quantile, value} goes to ``quantiles`` as
    canonical JSON, ``value`` holds the first listed quantile's value."""
    row = parse_output_record(_release(statistic="quantile", value=QUANTILE_VALUE))
    assert isinstance(row, ReleaseRow)
    assert (row.statistic, row.value) == ("quantile", 40.0)
    assert row.quantiles is not None and orjson.loads(row.quantiles) == QUANTILE_VALUE
    plain = parse_output_record(_release())
    assert isinstance(plain, ReleaseRow) and plain.quantiles is None


def test_a_quantile_row_has_no_ci95_in_the_values_units() -> None:
    """A quantile's ci95 is in ranks (``ci95_unit: ranks``; records written before the
    field are quantiles too): the row's ci95 is None, so its band is NULL. A record naming a
    unit that is not a string is refused; a count keeps its ci95."""
    ranks = {"mechanism": "exponential", "ci95_unit": "ranks", "ci95": 12.5}
    for changes in ({"statistic": "quantile", **ranks}, {"statistic": "quantile"}):
        row = parse_output_record(_release(value=QUANTILE_VALUE, **changes))
        assert isinstance(row, ReleaseRow) and row.ci95 is None, changes
    count = parse_output_record(_release(ci95=3.5))
    assert isinstance(count, ReleaseRow) and (count.statistic, count.ci95) == ("count", 3.5)
    bad = parse_output_record(_release(statistic="quantile", value=QUANTILE_VALUE, ci95_unit=1))
    assert isinstance(bad, BadRecord)
    assert (bad.reason, bad.detail) == ("invalid_field", "ci95_unit is not a string")


@pytest.mark.parametrize(
    ("value", "detail"),
    [
        ([], "value is an empty list"),
        ([{"quantile": 0.5}], "a value list item is not {quantile, value}"),
        ([{"quantile": 1.5, "value": 1.0}], "a value list item's quantile is not in (0, 1)"),
        ([{"quantile": 0.5, "value": "x"}], "a value list item's value is not a number"),
        ([3.0], "a value list item is not {quantile, value}"),
    ],
)
def test_a_bad_quantile_list_is_refused(value: object, detail: str) -> None:
    row = parse_output_record(_release(statistic="quantile", value=value))
    assert isinstance(row, BadRecord)
    assert (row.reason, row.detail) == ("invalid_field", detail)
