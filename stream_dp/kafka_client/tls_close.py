"""A TLS connection's close race, not reported as an error.

When a client closes a TLS connection to a broker that is still sending (a fetch answer in
flight as a command stops its consumer), Python's asyncio TLS layer sends its close
notification, then reads the broker's late data, and fails the shutdown with
``SSLError: [SSL: APPLICATION_DATA_AFTER_CLOSE_NOTIFY]``. Nothing waits for that shutdown,
so asyncio logs "Future exception was never retrieved" with the traceback, at ERROR, on the
``asyncio`` logger: a command such as ``stream-dp tail`` on a SASL_SSL or mTLS listener
ended with a traceback on stderr now and then, although it had read and printed everything.
The connection was being closed by this side; the late data was for a request nobody waits
for any more. It is a known race of the asyncio TLS layer (other asyncio clients ignore it
the same way).

:class:`_QuietTlsCloseRace` is a filter on the ``asyncio`` logger, installed when
:mod:`stream_dp.kafka_client` is imported (every client is built through it). It lowers
exactly that record to DEBUG, dropped unless the ``asyncio`` logger logs DEBUG. Any other
asyncio error, other TLS errors included, is logged as before.
"""

from __future__ import annotations

import logging
import ssl
from typing import Final

#: The OpenSSL reason of the race.
RACE_REASON: Final = "APPLICATION_DATA_AFTER_CLOSE_NOTIFY"

_ASYNCIO_LOGGER: Final = "asyncio"


def is_close_race(exc: BaseException | None) -> bool:
    """Whether ``exc`` is the TLS close race of the module docstring."""
    return isinstance(exc, ssl.SSLError) and (
        getattr(exc, "reason", None) == RACE_REASON or RACE_REASON in str(exc)
    )


class _QuietTlsCloseRace(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not is_close_race(exc):
            return True
        if not logging.getLogger(_ASYNCIO_LOGGER).isEnabledFor(logging.DEBUG):
            return False
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


def install() -> None:
    """Add the filter to the ``asyncio`` logger (once, however often called)."""
    logger = logging.getLogger(_ASYNCIO_LOGGER)
    if not any(isinstance(f, _QuietTlsCloseRace) for f in logger.filters):
        logger.addFilter(_QuietTlsCloseRace())


install()
