"""The one root of stream-dp's exceptions.

Callers branch on attributes, not on long ``except`` lists: ``retriable`` says whether
trying again later may succeed (a broker that is down), ``exit_code`` is what the CLI
returns (2 for a bad configuration or arguments, 1 for a runtime failure).
"""

from __future__ import annotations


class StreamDPError(Exception):
    """Root of every error stream-dp raises on purpose."""

    retriable: bool = False
    exit_code: int = 1


class ConfigError(StreamDPError):
    """The configuration or the command-line arguments are invalid; the message says the fix."""

    exit_code = 2


class PrivacyError(StreamDPError):
    """A request would break a privacy guarantee (bad parameters, missing secret key)."""


class BudgetExceededError(PrivacyError, ConfigError):
    """Spending would exceed a window or horizon privacy budget."""


class BrokerError(StreamDPError):
    """The Kafka-protocol broker could not be started or reached."""

    retriable = True
