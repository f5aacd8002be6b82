"""Entry point of ``stream-dp``. Exit codes: 0 ok, 2 bad config or arguments, 1 runtime failure."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

from stream_dp.cli._common import resolve_config
from stream_dp.errors import StreamDPError
from stream_dp.ops.build_info import build_description
from stream_dp.ops.logging import configure_logging

Command = Callable[[argparse.Namespace], int]


def _command_modules() -> list[ModuleType]:
    from stream_dp.cli import (
        access_cmd,
        broker_cmd,
        check_cmd,
        demo_cmd,
        erase_cmd,
        examples_cmd,
        keygen_cmd,
        ledger_cmd,
        plan_cmd,
        produce_cmd,
        records_cmd,
        replay_cmd,
        run_cmd,
        schema_cmd,
        sink_cmd,
        tail_cmd,
        topics_cmd,
    )

    return [
        run_cmd,
        replay_cmd,
        plan_cmd,
        check_cmd,
        demo_cmd,
        produce_cmd,
        tail_cmd,
        sink_cmd,
        broker_cmd,
        topics_cmd,
        schema_cmd,
        ledger_cmd,
        erase_cmd,
        records_cmd,
        access_cmd,
        examples_cmd,
        keygen_cmd,
    ]


class _Version(argparse.Action):
    """``--version``: the build description on one line (argparse's own action wraps it)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object, **__: object) -> None:
        print(build_description())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stream-dp",
        description="Differentially private live statistics from event-level Kafka streams.",
        epilog="New here? `stream-dp demo` shows it working in seconds (it needs the "
        "[embedded] extra); `stream-dp examples DIR` writes configurations to adapt to your "
        "topic, and `stream-dp check --config FILE` tests one against your topic before the "
        "first run. `stream-dp COMMAND --help` lists a command's options.",
    )
    parser.add_argument(
        "--version", action=_Version, nargs=0, help="print the build (versions) and exit"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in _command_modules():
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # Warnings and errors of every command through stream-dp's handler (with its raw-id
    # filter); `run` reconfigures it from the configuration. Never a second handler.
    configure_logging("WARNING", "console")
    func: Command = args.func
    try:
        resolve_config(args, os.environ, Path.cwd())
        return func(args)
    except StreamDPError as exc:
        print(f"stream-dp: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
