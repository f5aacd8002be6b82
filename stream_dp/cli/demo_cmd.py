"""``stream-dp demo [--fast] [--windows N] [--epsilon E] [--users N] [--json] [--html FILE]``."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

from stream_dp.broker.process import resolve_binary
from stream_dp.cli._common import stop_on_signals
from stream_dp.config.model import MAX_SAFE_EPSILON
from stream_dp.demo import DemoInterrupted, DemoOptions, run_demo
from stream_dp.demo.html_report import HtmlReporter, TeeReporter
from stream_dp.demo.render import ConsoleReporter, JsonReporter
from stream_dp.demo.runner import Reporter
from stream_dp.demo.scenario import (
    DEFAULT_USERS,
    DEFAULT_WINDOWS,
    FAST_USERS,
    FAST_WINDOWS,
    WINDOW_SIZE_S,
)
from stream_dp.errors import ConfigError

MAX_USERS = 100_000
MAX_WINDOWS = 100


def _bounded_int(low: int, high: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"use a value from {low} to {high}, not {value}")
        return value

    return parse


def _epsilon(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value <= MAX_SAFE_EPSILON:
        raise argparse.ArgumentTypeError(
            f"ε must be above 0 and at most {MAX_SAFE_EPSILON:g}, not {text}"
        )
    return value


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "demo",
        help="embedded broker + synthetic browser logs + worker: private vs true results",
        description="Start an embedded broker, produce synthetic browser logs ("
        f"employees, rare domains, an employee on leave) in {WINDOW_SIZE_S} s "
        "event-time windows, run the worker with an ephemeral pseudonym key, and print each "
        "window's private results beside the true ones. Ctrl-C stops it cleanly.",
    )
    p.add_argument(
        "--fast",
        action="store_true",
        help=f"a smaller run ({FAST_USERS} employees, {FAST_WINDOWS} windows unless given)",
    )
    p.add_argument(
        "--windows",
        type=_bounded_int(1, MAX_WINDOWS),
        metavar="N",
        help=f"event-time windows (default {DEFAULT_WINDOWS})",
    )
    p.add_argument(
        "--users",
        type=_bounded_int(10, MAX_USERS),
        metavar="N",
        help=f"employees (default {DEFAULT_USERS})",
    )
    p.add_argument(
        "--epsilon",
        type=_epsilon,
        default=1.0,
        metavar="E",
        help="privacy budget ε per window, shared ¾ / ¼ by the two queries (default 1)",
    )
    p.add_argument("--json", action="store_true", help="JSON lines (start, window…, summary)")
    p.add_argument(
        "--html",
        type=Path,
        metavar="FILE",
        help="also write a self-contained HTML report with charts (inline SVG, works offline)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    resolve_binary()  # the embedded extra: say so before generating any data
    options = DemoOptions.resolve(
        fast=args.fast, users=args.users, windows=args.windows, epsilon=args.epsilon
    )
    reporter: Reporter
    if args.json:
        reporter = JsonReporter(sys.stdout)
    else:
        reporter = ConsoleReporter(sys.stdout, sys.stderr if sys.stderr.isatty() else None)
    if args.html is not None:
        if not args.html.parent.is_dir():
            raise ConfigError(
                f"--html {args.html}: the folder {args.html.parent} does not exist; create it "
                "or write the report elsewhere"
            )
        html = HtmlReporter(args.html)
        code = asyncio.run(_main(options, TeeReporter(reporter, html)))
        if html.path.exists():
            print(f"stream-dp demo: HTML report written to {html.path}", file=sys.stderr)
        return code
    return asyncio.run(_main(options, reporter))


async def _main(options: DemoOptions, reporter: Reporter) -> int:
    """Exit code: 0 done; 128 + signal number after Ctrl-C / SIGTERM (stopped cleanly)."""
    stop = asyncio.Event()
    with stop_on_signals(stop) as received:
        try:
            await run_demo(options, reporter, stop=stop)
        except DemoInterrupted as exc:
            reporter.interrupted(exc.summary)
            return 128 + (received[0] if received else signal.SIGINT)
    return 0
