"""The asyncio TLS layer's close race (stream_dp.kafka_client.tls_close): an unretrieved
APPLICATION_DATA_AFTER_CLOSE_NOTIFY is not logged as an error; every other asyncio error,
other TLS errors included, still is."""

from __future__ import annotations

import asyncio
import gc
import logging
import ssl
from collections.abc import Iterator

import pytest

import stream_dp.kafka_client  # noqa: F401 - installs the filter, as for every client
from stream_dp.kafka_client import tls_close

RACE = ssl.SSLError(
    1, "[SSL: APPLICATION_DATA_AFTER_CLOSE_NOTIFY] application data after close notify"
)
OTHER = ssl.SSLError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed")


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def seen() -> Iterator[list[logging.LogRecord]]:
    """What the asyncio logger passes on to the root's handlers."""
    handler, root, asyncio_log = _Records(), logging.getLogger(), logging.getLogger("asyncio")
    level = asyncio_log.level
    root.addHandler(handler)
    try:
        yield handler.records
    finally:
        root.removeHandler(handler)
        asyncio_log.setLevel(level)


def _unretrieved(exc: BaseException) -> None:
    """A future failed with ``exc`` that nobody awaits, collected inside its loop: asyncio
    reports it through the loop's exception handler, as it does for the TLS shutdown."""

    async def main() -> None:
        future = asyncio.get_running_loop().create_future()
        future.set_exception(exc)
        del future
        gc.collect()

    asyncio.run(main())


def _asyncio_records(records: list[logging.LogRecord]) -> list[tuple[str, str]]:
    """The asyncio logger's records of a failure: (level, the exception's text)."""
    return [
        (r.levelname, str(r.exc_info[1])) for r in records if r.name == "asyncio" and r.exc_info
    ]


def test_the_close_race_is_not_an_error(seen: list[logging.LogRecord]) -> None:
    logging.getLogger("asyncio").setLevel(logging.INFO)
    _unretrieved(RACE)
    assert _asyncio_records(seen) == []


def test_the_close_race_is_kept_at_debug_when_asyncio_logs_debug(
    seen: list[logging.LogRecord],
) -> None:
    logging.getLogger("asyncio").setLevel(logging.DEBUG)
    _unretrieved(RACE)
    assert _asyncio_records(seen) == [("DEBUG", str(RACE))]


def test_any_other_tls_error_is_still_logged_as_an_error(seen: list[logging.LogRecord]) -> None:
    logging.getLogger("asyncio").setLevel(logging.INFO)
    _unretrieved(OTHER)
    assert _asyncio_records(seen) == [("ERROR", str(OTHER))]


def test_the_filter_is_installed_once() -> None:
    tls_close.install()
    tls_close.install()
    filters = logging.getLogger("asyncio").filters
    assert sum(isinstance(f, tls_close._QuietTlsCloseRace) for f in filters) == 1
