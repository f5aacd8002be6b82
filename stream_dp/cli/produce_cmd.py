"""``stream-dp produce --config FILE (--synthetic browser-logs [--live] | --file F.jsonl)``.

Load generator and file loader for the input topic: records keyed by user id (as producers
should), sent in batches with every acknowledgement awaited; ``--rate`` paces them,
``--events`` caps them. ``--live`` generates events stamped *now*, continuously, until
stopped (the docker-compose stack's producer). Progress goes to stderr (on a terminal), the
final report to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import orjson

from stream_dp.cli._common import add_config_option, running_broker, stop_on_signals
from stream_dp.clients.producer import KeyValue, ProduceReport, produce_records
from stream_dp.config import Config, load_config
from stream_dp.errors import ConfigError
from stream_dp.pipeline.kafka.input_check import check_values
from stream_dp.pipeline.stages.ingest import user_key
from stream_dp.privacy.pseudonymize import UserIdNormalization
from stream_dp.synthetic.browser_logs import (
    BrowserLogSpec,
    browser_log_events,
    live_browser_log_events,
)

DEFAULT_USERS = 1000
DEFAULT_WINDOWS = 4
#: --live without --rate: events per second.
DEFAULT_LIVE_RATE = 100.0
#: --file: the lines read before sending to check event times against coverage.
CHECK_MAX_LINES = 100_000
#: Loads at least this large get a progress bar (on a terminal).
PROGRESS_MIN_RECORDS = 10_000


def _positive(kind: type[int] | type[float]) -> Any:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be above 0, not {text}")
        return value

    return parse


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "produce",
        help="load synthetic or recorded events into the input topic",
        description="Produce events to input.topic of the config, keyed by user id: synthetic "
        "browser logs (employees visiting domains, event-time windows of window.size_s) or "
        "the lines "
        "of a JSON-lines file (sent as they are). Needs a running broker and an existing "
        "input topic (`stream-dp topics apply --config FILE` creates it).",
    )
    add_config_option(p)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--synthetic", choices=["browser-logs"], help="generate events of this kind"
    )
    source.add_argument("--file", type=Path, metavar="F.jsonl", help="one JSON event per line")
    p.add_argument(
        "--users",
        type=_positive(int),
        metavar="N",
        help=f"synthetic: employees (default {DEFAULT_USERS})",
    )
    p.add_argument(
        "--windows",
        type=_positive(int),
        metavar="N",
        help=f"synthetic: event-time windows (default {DEFAULT_WINDOWS}; with --events: as "
        "many as it takes)",
    )
    p.add_argument(
        "--live",
        action="store_true",
        help="synthetic: events stamped now, continuously, until Ctrl-C / SIGTERM (or "
        f"--events); --rate R per second (default {DEFAULT_LIVE_RATE:g})",
    )
    p.add_argument("--seed", type=int, default=0, help="synthetic: random seed (default 0)")
    p.add_argument(
        "--start",
        type=_start_time,
        metavar="ISO|now",
        help="synthetic: event time of the first window, rounded down to window.size_s "
        "(default 2020-08-01T00:00:00Z)",
    )
    p.add_argument("--events", type=_positive(int), metavar="N", help="send at most N events")
    p.add_argument("--rate", type=_positive(float), metavar="R", help="at most R events per second")
    p.add_argument(
        "--bootstrap-servers", metavar="HOST:PORT", help="override kafka.bootstrap_servers"
    )
    p.add_argument("--json", action="store_true", help="print the final report as JSON")
    p.set_defaults(func=run)


# -- sources ------------------------------------------------------------------------------
def _start_time(text: str) -> float:
    if text == "now":
        return time.time()
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: use now or an ISO-8601 time with offset, e.g. 2020-08-01T00:00:00Z"
        ) from None
    if moment.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} needs a UTC offset, e.g. ...T00:00:00Z")
    return moment.timestamp()


def synthetic_records(
    config: Config, *, users: int, windows: int, seed: int, start_s: float | None = None
) -> Iterator[KeyValue]:
    """Browser logs in the config's field names, keyed by user id; windows of
    ``window.size_s`` from ``start_s`` (rounded down to a window start)."""
    size = config.window.size_s
    spec = BrowserLogSpec(users=users, windows=windows, window_size_s=size, seed=seed)
    if start_s is not None:
        spec = replace(spec, start_s=math.floor(start_s / size) * size)
    user_field, time_field = config.input.user_field, config.input.time_field
    for event in browser_log_events(spec):
        uid = event.pop("user_id")
        event[user_field] = uid
        event[time_field] = event.pop("timestamp")
        yield user_key(uid, config.input.user_id_normalization), orjson.dumps(event)


def live_records(config: Config, *, users: int, seed: int) -> Iterator[KeyValue]:
    """Endless browser logs in the config's field names, keyed by user id, each stamped with
    the wall clock (epoch ms) when the producer takes it."""
    spec = BrowserLogSpec(users=users, window_size_s=config.window.size_s, seed=seed)
    user_field, time_field = config.input.user_field, config.input.time_field
    for event in live_browser_log_events(spec, lambda: int(time.time() * 1000)):
        uid = event.pop("user_id")
        event[user_field] = uid
        event[time_field] = event.pop("timestamp")
        yield str(uid).encode(), orjson.dumps(event)


class FileRecords:
    """Lines of a JSON-lines file, sent as they are, keyed by the user field when present
    (the id as ``input.user_id_normalization`` normalises it: what the worker expects of
    keyed input)."""

    def __init__(
        self, path: Path, user_field: str, normalization: UserIdNormalization = "none"
    ) -> None:
        self.path = path
        self.user_field = user_field
        self.normalization: UserIdNormalization = normalization
        self.unkeyed = 0
        self.bytes_read = 0
        try:
            self.size = path.stat().st_size
        except OSError as exc:
            raise ConfigError(f"--file {path}: cannot read it ({exc.strerror})") from None

    def __iter__(self) -> Iterator[KeyValue]:
        # Opened when sending starts: a load that fails before (no broker) leaves no file open.
        try:
            opened: IO[bytes] = self.path.open("rb")
        except OSError as exc:
            raise ConfigError(f"--file {self.path}: cannot read it ({exc.strerror})") from None
        with opened as handle:
            for raw in handle:
                self.bytes_read += len(raw)
                line = raw.strip()
                if not line:
                    continue
                yield self._key(line), line

    def _key(self, line: bytes) -> bytes | None:
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            obj = None
        uid = obj.get(self.user_field) if isinstance(obj, dict) else None
        if isinstance(uid, str | int) and not isinstance(uid, bool):
            return user_key(uid, self.normalization)
        self.unkeyed += 1  # the worker dead-letters it; send it anyway, unkeyed
        return None


def warn_before_coverage(
    config: Config, path: Path, *, max_lines: int = CHECK_MAX_LINES
) -> str | None:
    """On stderr (and returned): how many of the file's first lines the worker would drop
    as stamped before the first window it covers, and what to change."""
    try:
        with path.open("rb") as handle:
            lines = [raw.strip() for raw, _ in zip(handle, range(max_lines), strict=False)]
    except OSError as exc:
        raise ConfigError(f"--file {path}: cannot read it ({exc.strerror})") from None
    report = check_values(config, (line for line in lines if line), time.time())
    if not report.before_coverage:
        return None
    problem = next(p for p in report.problems() if "before the first window" in p)
    message = f"stream-dp produce: warning: in {path}, {problem}"
    print(message, file=sys.stderr)
    return message


# -- progress -----------------------------------------------------------------------------
class Progress:
    """A one-line bar with the rate on a terminal; silent elsewhere and for small loads."""

    def __init__(self, stream: IO[str] | None, total: int | None, files: FileRecords | None):
        self.stream = stream if stream is not None and stream.isatty() else None
        self.total = total
        self.files = files
        self._last = 0.0
        self._shown = False

    def __call__(self, sent: int, sent_bytes: int, elapsed_s: float) -> None:
        if self.stream is None or (time.monotonic() - self._last < 0.1):
            return
        if self.total is not None and self.total < PROGRESS_MIN_RECORDS:
            return
        self._last = time.monotonic()
        fraction: float | None = None
        if self.total:
            fraction = sent / self.total
        elif self.files is not None and self.files.size:
            fraction = self.files.bytes_read / self.files.size
        rate = sent / elapsed_s if elapsed_s > 0 else 0.0
        bar = ""
        if fraction is not None:
            filled = int(30 * min(1.0, fraction))
            bar = f"[{'#' * filled}{'.' * (30 - filled)}] {100 * min(1.0, fraction):3.0f}% "
        self.stream.write(
            f"\r\x1b[K{bar}{sent:,} events · {sent_bytes / 1e6:.1f} MB · {rate:,.0f} events/s"
        )
        self.stream.flush()
        self._shown = True

    def close(self) -> None:
        if self.stream is not None and self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


# -- command ------------------------------------------------------------------------------
def _check_live(args: argparse.Namespace) -> None:
    if not args.live:
        return
    if args.synthetic is None:
        raise ConfigError("--live generates synthetic events: use it with --synthetic")
    if args.windows is not None or args.start is not None:
        raise ConfigError(
            "--live stamps every event with the current time: remove --windows and --start"
        )


def run(args: argparse.Namespace) -> int:
    if args.file is not None and (args.users or args.windows):
        raise ConfigError("--users and --windows apply to --synthetic only; remove them")
    _check_live(args)
    config = load_config(args.config)
    bootstrap = running_broker(config, args.bootstrap_servers, "produce")
    files: FileRecords | None = None
    rate: float | None = args.rate
    if args.file is not None:
        warn_before_coverage(config, args.file)
        files = FileRecords(args.file, config.input.user_field, config.input.user_id_normalization)
        records: Any = files
        total: int | None = args.events
    elif args.live:
        records = live_records(config, users=args.users or DEFAULT_USERS, seed=args.seed)
        total = args.events
        rate = rate if rate is not None else DEFAULT_LIVE_RATE
    else:
        users = args.users or DEFAULT_USERS
        windows = args.windows or (
            DEFAULT_WINDOWS if args.events is None else math.ceil(args.events / users) + 1
        )
        records = synthetic_records(
            config, users=users, windows=windows, seed=args.seed, start_s=args.start
        )
        total = args.events
    progress = Progress(sys.stderr, total, files)
    report, signum = asyncio.run(_produce(config, bootstrap, records, rate, args.events, progress))
    progress.close()
    if args.json:
        extra = {"unkeyed": files.unkeyed} if files is not None else {}
        print(orjson.dumps({**report.describe(), **extra, "interrupted": bool(signum)}).decode())
    else:
        print(
            f"sent {report.records:,} events ({report.bytes / 1e6:.2f} MB) to {report.topic} "
            f"on {bootstrap} in {report.seconds:.2f} s ({report.rate:,.0f} events/s)"
        )
        if files is not None and files.unkeyed:
            print(
                f"{files.unkeyed:,} lines had no usable {config.input.user_field}: sent "
                "unkeyed (the worker dead-letters them)"
            )
    if signum:
        print(
            "stream-dp produce: interrupted; the report counts what was acknowledged",
            file=sys.stderr,
        )
        return 128 + signum
    return 0


async def _produce(
    config: Config,
    bootstrap: str,
    records: Any,
    rate: float | None,
    limit: int | None,
    progress: Progress,
) -> tuple[ProduceReport, int]:
    """The report and the signal that interrupted the load (0 if none)."""
    stop = asyncio.Event()
    with stop_on_signals(stop) as received:
        report = await produce_records(
            config.kafka,
            config.input.topic,
            records,
            bootstrap_servers=bootstrap,
            rate=rate,
            limit=limit,
            progress=progress,
            stop=stop,
        )
    return report, received[0] if received else 0
