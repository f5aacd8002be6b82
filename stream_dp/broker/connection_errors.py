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


#: Texts of a refused authentication or TLS handshake, and the settings that fix each: the
#: broker is up and reachable, so "check that the broker is up" would send the user astray.
_SECURITY_FIXES: tuple[tuple[str, str], ...] = (
    ("SaslAuthenticationFailed", "the broker refused the SASL credentials: check "
     "kafka.sasl_username and kafka.sasl_password (or kafka.sasl_password_file), and "
     "kafka.sasl_mechanism against the mechanisms the listener enables"),
    ("CERTIFICATE_VERIFY_FAILED", "this client does not trust the broker's certificate: "
     "set kafka.ssl_cafile to the CA that signed it (the certificate must name the host of "
     "kafka.bootstrap_servers)"),
    ("UnsupportedSaslMechanism", "the listener does not enable kafka.sasl_mechanism: set it to "
     "one the broker's sasl.enabled.mechanisms lists"),
)  # fmt: skip


def what_to_check(reason: str, default: str) -> str:
    """What the user should check for a failure described by ``reason``: the security
    settings when the broker refused them, else ``default``."""
    for text, fix in _SECURITY_FIXES:
        if text in reason:
            return fix
    return default


def connection_reason(held: _HeldConnectionErrors, exc: BaseException) -> str:
    """Why a start failed: the held aiokafka lines, else the exception described once."""
    return "; ".join(held.messages) or describe_error(exc)
