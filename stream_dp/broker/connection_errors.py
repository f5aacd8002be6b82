"""aiokafka's connection failures as one line of ours.

aiokafka logs its own ERROR line for every address it cannot connect to while it
bootstraps, and the text of its exceptions repeats their class name
("KafkaConnectionError: KafkaConnectionError: ..."). While a client or admin client starts,
those lines are held back (:func:`held_connection_errors`) and folded into the single error
the command prints (:func:`connection_reason`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

#: The aiokafka logger that reports a failed connection attempt during bootstrap.
_CONNECTION_LOGGER = "aiokafka"
_CONNECTION_FAILED = "Unable connect to"


class _HeldConnectionErrors(logging.Filter):
    """Drops aiokafka's "Unable connect to ..." records and keeps their text."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith(_CONNECTION_FAILED):
            if message not in self.messages:
                self.messages.append(message)
            return False
        return True


@contextlib.contextmanager
def held_connection_errors() -> Iterator[_HeldConnectionErrors]:
    """Within the block, aiokafka's connection-failure lines are collected, not logged."""
    held = _HeldConnectionErrors()
    logger = logging.getLogger(_CONNECTION_LOGGER)
    logger.addFilter(held)
    try:
        yield held
    finally:
        logger.removeFilter(held)


def describe_error(exc: BaseException) -> str:
    """``Name: text`` once, whether or not the exception's text already starts with its name."""
    name = type(exc).__name__
    text = str(exc).strip()
    while text.startswith(f"{name}:"):
        text = text[len(name) + 1 :].strip()
    return f"{name}: {text}" if text else name


def connection_reason(held: _HeldConnectionErrors, exc: BaseException) -> str:
    """Why a start failed: the held aiokafka lines, else the exception described once."""
    return "; ".join(held.messages) or describe_error(exc)
