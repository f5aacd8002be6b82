from __future__ import annotations

import time

import orjson
import pytest

from stream_dp.pipeline.formats.decode import BadRecord, Decoder, Event, parse_event_time
from stream_dp.privacy.group_values import JSON_FALSE, JSON_TRUE

NOW = time.time()
DEC = Decoder(
    user_field="user_id",
    time_field="timestamp",
    max_record_bytes=200,
    max_future_s=3600,
    scalar_fields=["domain"],
    numeric_fields=["amount"],
)


def _ok(obj: dict[str, object]) -> Event:
    out = DEC.decode(orjson.dumps(obj), NOW)
    assert isinstance(out, Event), out
    return out


def test_times_iso_seconds_millis() -> None:
    assert parse_event_time("2020-08-01T12:00:00Z") == 1596283200
    assert parse_event_time("2020-08-01T14:00:00+02:00") == 1596283200
    assert parse_event_time(1596283200) == 1596283200
    assert parse_event_time(1596283200123) == pytest.approx(1596283200.123)
    assert parse_event_time("2020-08-01T12:00:00") == "bad"  # no offset
    assert parse_event_time(True) == "bad"
    assert parse_event_time(float("nan")) == "bad"


def test_good_record() -> None:
    e = _ok({"user_id": "u1", "timestamp": 1596283200, "domain": "a.com"})
    assert e.user == "u1" and e.event_time_s == 1596283200


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"\xff\xfe", "not_utf8"),
        (b"{not json", "not_json"),
        (b"[1,2]", "not_object"),
        (b"x" * 201, "too_large"),
        (b'{"timestamp": 1596283200}', "missing_user"),
        (b'{"user_id": true, "timestamp": 1596283200}', "bad_user"),
        (b'{"user_id": {"a":1}, "timestamp": 1596283200}', "bad_user"),
        (b'{"user_id": "", "timestamp": 1596283200}', "bad_user"),
        (b'{"user_id": "u"}', "missing_timestamp"),
        (b'{"user_id": "u", "timestamp": "yesterday"}', "bad_timestamp"),
        (b'{"user_id": "u", "timestamp": -5}', "timestamp_out_of_range"),
        (b'{"user_id": "u", "timestamp": 99999999999999}', "timestamp_out_of_range"),
        (b'{"user_id": "u", "timestamp": 1596283200, "domain": [1]}', "bad_field"),
        (b'{"user_id": "u", "timestamp": 1596283200, "amount": "12"}', "bad_field"),
    ],
)
def test_bad_records_have_reasons(raw: bytes, reason: str) -> None:
    out = DEC.decode(raw, NOW)
    assert isinstance(out, BadRecord)
    assert out.reason == reason


def test_details_never_quote_values() -> None:
    out = DEC.decode(b'{"user_id": "alice@example.com", "timestamp": "soon"}', NOW)
    assert isinstance(out, BadRecord)
    assert "alice" not in out.detail and "soon" not in out.detail


def test_group_values_are_decoded_in_canonical_form() -> None:
    """true stays a boolean (never equal to 1), 1.0 and -0.0 become ints; the value field
    is not a group value and keeps its float."""
    e = _ok({"user_id": "u", "timestamp": 1596283200, "domain": True, "amount": 2.0})
    assert e.fields["domain"] is JSON_TRUE and e.fields["domain"] != 1
    assert e.fields["amount"] == 2.0 and type(e.fields["amount"]) is float
    for raw, canonical in [(1.0, 1), (-0.0, 0), (2.5, 2.5), (False, JSON_FALSE), ("1", "1")]:
        value = _ok({"user_id": "u", "timestamp": 1596283200, "domain": raw}).fields["domain"]
        assert value == canonical and type(value) is type(canonical)
    bad = DEC.decode(orjson.dumps({"user_id": "u", "timestamp": 1596283200, "amount": True}), NOW)
    assert isinstance(bad, BadRecord) and bad.reason == "bad_field"


def test_an_event_exactly_max_future_s_ahead_is_the_last_one_accepted() -> None:
    """input.max_future_s is inclusive: an event that far ahead of the clock is decoded,
    one a millisecond further is refused (timestamp_out_of_range)."""
    now_s = 1_700_000_000.0
    for t, accepted in [(now_s + 3600, True), (now_s + 3600.001, False)]:
        out = DEC.decode(orjson.dumps({"user_id": "u", "timestamp": t}), now_s)
        assert isinstance(out, Event) is accepted, (t, out)
        if not accepted:
            assert isinstance(out, BadRecord) and out.reason == "timestamp_out_of_range"


def test_a_tombstone_is_a_dead_letter_that_says_so() -> None:
    """A record without a value (a Kafka tombstone) is refused as not_json, with a detail
    that tells the operator what it was."""
    out = DEC.decode(None, NOW)
    assert isinstance(out, BadRecord)
    assert out.reason == "not_json" and "tombstone" in out.detail
