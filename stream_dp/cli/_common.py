"""Helpers shared by the commands: signals, the broker to use, text tables."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Iterator

from stream_dp.config import Config
from stream_dp.errors import ConfigError


@contextlib.contextmanager
def stop_on_signals(stop: asyncio.Event) -> Iterator[list[int]]:
    """Within the running event loop: the first SIGINT/SIGTERM sets ``stop`` (the command
    winds down cleanly), a second one exits at once. Yields the signals received."""
    loop = asyncio.get_running_loop()
    received: list[int] = []

    def on_signal(signum: int) -> None:
        if stop.is_set():
            os._exit(128 + signum)
        received.append(signum)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        yield received
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def running_broker(config: Config, override: str | None, command: str) -> str:
    """The address of a running broker for a client command; ConfigError (exit 2) when the
    config says ``embedded``, which exists only inside the process that starts it."""
    if override:
        return override
    if config.kafka.embedded:
        raise ConfigError(
            f'{command} needs a running broker, but kafka.bootstrap_servers is "embedded": '
            "that broker lives only inside the `stream-dp run` process that starts it. Start "
            "one with `stream-dp broker` and pass its address with --bootstrap-servers, or set "
            "kafka.bootstrap_servers to your cluster's host:port"
        )
    return config.kafka.bootstrap_servers


def text_table(rows: list[list[str]]) -> list[str]:
    """Rows as aligned text columns, the first row a header underlined with dashes."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines
