"""``stream-dp tail --config FILE [--from-beginning] [--json] [--max-windows N]
[--idle-timeout S]``: the output topic, one block per (query, window).

Reads with manual partition assignment (no consumer group, nothing committed). A block is
printed once its window record and all the releases it announces have arrived (they may
come from different partitions in any order); duplicates republished after a crash are
dropped. Started from the end, the first window may have begun before tail did: it is
printed after a short wait with the number of releases that were missed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from typing import Any, TextIO

from stream_dp.cli._common import add_config_option, running_broker, stop_on_signals
from stream_dp.clients.output import OutputAssembler, OutputReader, WindowGroup
from stream_dp.config import load_config

#: How long a window record waits for releases announced but not (yet) read.
INCOMPLETE_WAIT_S = 2.0
POLL_S = 0.2
#: Longest a complete group waits for the reader to catch up before it is printed.
READY_MAX_WAIT_S = 1.0


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0, not {text}")
    return value


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "tail",
        help="print the output topic, one table per query and window",
        description="Read output.topic of the config and print each (query, window) once its "
        "window record and releases have arrived. Starts at the end of the topic unless "
        "--from-beginning. Ctrl-C, --max-windows or --idle-timeout end it (exit 0).",
    )
    add_config_option(p)
    p.add_argument("--from-beginning", action="store_true", help="read the whole topic")
    p.add_argument(
        "--json",
        action="store_true",
        help="the records as stored, one JSON object per line (releases, then the window record)",
    )
    p.add_argument(
        "--max-windows",
        type=_non_negative_int,
        metavar="N",
        help="exit after N (query, window) blocks",
    )
    p.add_argument(
        "--idle-timeout",
        type=_seconds,
        metavar="S",
        help="exit when nothing arrives for S seconds",
    )
    p.add_argument(
        "--bootstrap-servers", metavar="HOST:PORT", help="override kafka.bootstrap_servers"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    bootstrap = running_broker(config, args.bootstrap_servers, "tail")
    reader = OutputReader(
        config.kafka,
        config.output.topic,
        bootstrap_servers=bootstrap,
        from_beginning=args.from_beginning,
    )
    printer = _Printer(sys.stdout, json_lines=args.json)
    return asyncio.run(_tail(reader, printer, args.max_windows, args.idle_timeout))


async def _tail(
    reader: OutputReader, printer: _Printer, max_windows: int | None, idle_timeout: float | None
) -> int:
    stop = asyncio.Event()
    assembler = OutputAssembler()
    ready = _Ready()
    with stop_on_signals(stop):
        async with reader:
            last_activity = time.monotonic()
            announced = told = False
            while not stop.is_set() and not printer.enough(max_windows):
                now = time.monotonic()
                if idle_timeout is not None and now - last_activity >= idle_timeout:
                    break
                if not await reader.try_assign():
                    if not announced:
                        print(
                            f"stream-dp tail: waiting for topic {reader.topic} on "
                            f"{reader.bootstrap_servers} to appear",
                            file=sys.stderr,
                            flush=True,
                        )
                        announced = True
                    await _wait(stop, POLL_S)
                    continue
                if not told:
                    where = "the beginning" if reader.from_beginning else "the end"
                    print(
                        f"stream-dp tail: reading {reader.topic} on {reader.bootstrap_servers} "
                        f"from {where} (Ctrl-C stops)",
                        file=sys.stderr,
                        flush=True,
                    )
                    told = True
                records = await reader.poll(POLL_S)
                now = time.monotonic()
                if records:
                    last_activity = now
                for key, value in records:
                    group = assembler.add(key, value, now=now)
                    if group is not None:
                        ready.add(group, now)
                for group in assembler.stale(now=now, wait_s=INCOMPLETE_WAIT_S):
                    ready.add(group, now)
                if not records or ready.waited(now) >= READY_MAX_WAIT_S:
                    printer.groups(ready.take(), max_windows)
    # Idle timeout, --max-windows or Ctrl-C: show what is ready and what has its window
    # record (complete or not).
    printer.groups(ready.take() + assembler.flush(), max_windows)
    if assembler.unreadable:
        print(
            f"stream-dp tail: skipped {assembler.unreadable} records that are not stream-dp "
            "output records",
            file=sys.stderr,
        )
    return 0


class _Ready:
    """Complete groups held until the reader has caught up, then handed out in window order
    (partitions deliver them in any order)."""

    def __init__(self) -> None:
        self._groups: list[WindowGroup] = []
        self._since: float | None = None

    def add(self, group: WindowGroup, now: float) -> None:
        if self._since is None:
            self._since = now
        self._groups.append(group)

    def waited(self, now: float) -> float:
        return 0.0 if self._since is None else now - self._since

    def take(self) -> list[WindowGroup]:
        groups = sorted(self._groups, key=lambda g: (g.window_start, g.query))
        self._groups, self._since = [], None
        return groups


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)


def _fmt(value: Any) -> str:
    if isinstance(value, list):  # a quantile's: [{"quantile": q, "value": v}, …]
        return ", ".join(_quantile(item) for item in value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        value = int(value)
    return f"{value:,}" if isinstance(value, int) else f"{value:,.4g}"


class _Printer:
    def __init__(self, out: TextIO, *, json_lines: bool) -> None:
        self.out = out
        self.json_lines = json_lines
        self.printed = 0

    def enough(self, max_windows: int | None) -> bool:
        return max_windows is not None and self.printed >= max_windows

    def groups(self, groups: list[WindowGroup], max_windows: int | None) -> None:
        for group in groups:
            if self.enough(max_windows):
                return
            self.group(group)

    def group(self, group: WindowGroup) -> None:
        """Print one (query, window). A partial one (its first releases came before the
        reading position) is shown as a table with a note, skipped in JSON lines, and never
        counted toward --max-windows."""
        if group.missing:
            if not self.json_lines:
                self._table(group)
                self.out.flush()
            return
        self.printed += 1
        if self.json_lines:
            for line in group.raw_lines():
                self.out.write(line.decode("utf-8", "replace") + "\n")
        else:
            self._table(group)
        self.out.flush()

    def _table(self, group: WindowGroup) -> None:
        w = group.window or {}
        releases = sorted(group.release_values(), key=lambda r: -_as_number(r.get("value")))
        first = releases[0] if releases else {}
        head = (
            f"{group.query} · {group.window_start} → {group.window_end or '?'} · "
            f"{_keys(int(w.get('released_keys', len(releases))))} · "
            f"ε {_fmt(w.get('epsilon_spent'))}"
        )
        if w.get("delta_spent"):
            head += f" δ {w['delta_spent']:g}"
        head += f" (horizon ε {_fmt(w.get('horizon_epsilon_spent'))})"
        lines = [head]
        if first:
            detail = f"  {first.get('statistic')} · {first.get('mechanism')}, noise scale " + _fmt(
                first.get("noise_scale")
            )
            if isinstance(first.get("ci95_unit"), str):  # a quantile's: in ranks
                detail += f" {first['ci95_unit']} (95% CI in {first['ci95_unit']})"
            selection = first.get("selection")
            if isinstance(selection, dict) and selection.get("strategy"):
                detail += f" · keys chosen by {selection['strategy']}"
            lines.append(detail)
            fields = list(first.get("group", {})) or ["group"]
            label_width = max(len(", ".join(fields)), *(len(_label(r)) for r in releases))
            lines.append(f"  {', '.join(fields):<{label_width}}  {'value':>12}  {'95% CI':>10}")
            for r in releases:
                clamped = "  (clamped to 0)" if r.get("clamped") else ""
                ci = "±" + _fmt(r.get("ci95"))
                lines.append(
                    f"  {_label(r):<{label_width}}  {_fmt(r.get('value')):>12}  {ci:>10}{clamped}"
                )
        elif w.get("released_keys", 0) == 0:
            lines.append("  (no key released)")
        if group.missing:
            lines.append(
                f"  … {group.missing} release(s) of this window were published before tail "
                "started (use --from-beginning)"
            )
        self.out.write("\n".join(lines) + "\n\n")


def _keys(n: int) -> str:
    return f"{n} key" if n == 1 else f"{n} keys"


def _label(record: dict[str, Any]) -> str:
    group = record.get("group") or {}
    return ", ".join(str(v) for v in group.values()) or "(all)"


def _quantile(item: Any) -> str:
    """One released quantile as ``q0.5 = 3``; anything else as it is."""
    if isinstance(item, dict) and isinstance(item.get("quantile"), int | float):
        return f"q{item['quantile']:g} = {_fmt(item.get('value'))}"
    return str(item)


def _as_number(value: Any) -> float:
    """What a row sorts by: the value, or a quantile release's first quantile."""
    if isinstance(value, list) and value and isinstance(value[0], dict):
        value = value[0].get("value")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0
