"""An ISO-8601 timestamp with a UTC offset is read as that instant (not only epoch numbers)."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
import pytest

from stream_dp.pipeline.formats.decode import Decoder, Event

DEC = Decoder(user_field="user_id", time_field="timestamp", max_record_bytes=200, max_future_s=60)
NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("written", "instant"),
    [
        ("2024-05-01T11:30:00Z", datetime(2024, 5, 1, 11, 30, tzinfo=UTC)),
        ("2024-05-01T13:30:00+02:00", datetime(2024, 5, 1, 11, 30, tzinfo=UTC)),
    ],
)
def test_an_iso_timestamp_is_read_as_its_instant(written: str, instant: datetime) -> None:
    event = DEC.decode(orjson.dumps({"user_id": "u", "timestamp": written}), NOW)
    assert isinstance(event, Event)
    assert event.event_time_s == instant.timestamp()
