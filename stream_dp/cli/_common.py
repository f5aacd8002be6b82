"""Helpers shared by the commands: the configuration file, signals, the broker to use, text
tables."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
from collections.abc import Iterator, Mapping
from pathlib import Path

from stream_dp.config import Config
from stream_dp.errors import ConfigError

#: The configuration file when ``--config`` is not given: this variable's, else
#: :data:`DEFAULT_CONFIG_FILE` in the working directory.
CONFIG_ENV = "STREAM_DP_CONFIG"
DEFAULT_CONFIG_FILE = "stream-dp.yaml"


def add_config_option(parser: argparse.ArgumentParser) -> None:
    """``--config FILE`` of a command that reads the configuration; when it is not given,
    :func:`resolve_config` (called by ``main``) fills it in."""
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help=f"YAML configuration file (default: ${CONFIG_ENV}, else ./{DEFAULT_CONFIG_FILE})",
    )
    parser.set_defaults(reads_config=True)


def resolve_config(args: argparse.Namespace, environ: Mapping[str, str], cwd: Path) -> None:
    """Fill in ``args.config`` of a command that reads the configuration and was given no
    ``--config``: ``$STREAM_DP_CONFIG``, else ``./stream-dp.yaml``; ConfigError (exit 2)
    saying the three ways when none applies."""
    if not getattr(args, "reads_config", False) or args.config is not None:
        return
    named = environ.get(CONFIG_ENV, "").strip()
    if named:
        args.config = Path(named)
        return
    local = cwd / DEFAULT_CONFIG_FILE
    if local.is_file():
        args.config = local
        return
    raise ConfigError(
        f"no configuration file: pass --config FILE, set {CONFIG_ENV}=FILE, or put "
        f"{DEFAULT_CONFIG_FILE} in the working directory ({cwd}); `stream-dp examples DIR` "
        "writes configurations to adapt"
    )


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
