"""``stream-dp ledger rebuild --config FILE [--bootstrap-servers HOST:PORT] [--dry-run]``:
restore a lost release ledger from the output topic.

A worker that finds the ledger topic emptied, recreated or renamed under a deployment stops
releasing and reports not ready (``stream_dp_ledger_lost``). This command reads the output
topic and writes to the ledger every release found there (same draws, marked published),
the progress past the last window released on each partials partition, and the coverage
record — so that no window already on the output topic is ever drawn again. Run it with the
workers stopped, then start them. It is idempotent: a second run writes nothing.

Before it reads or writes the ledger it checks every window on the output topic against the
configuration's plan (window length and grid, each query's ε, δ, bounds, selection and noise
scale, the query list) and refuses a configuration that did not release them, naming the
fields (:mod:`stream_dp.pipeline.rebuild_check`).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from stream_dp.cli._common import add_config_option, running_broker
from stream_dp.config import load_config
from stream_dp.pipeline.kafka.ledger_rebuild import RebuildPlan, rebuild_ledger
from stream_dp.windows.tumbling import iso_utc


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "ledger",
        help="repair the release ledger of a deployment",
        description="Repair the release ledger (output.ledger_topic) of a deployment.",
    )
    actions = parser.add_subparsers(dest="ledger_action", metavar="ACTION", required=True)
    rebuild = actions.add_parser(
        "rebuild",
        help="restore a lost ledger from the output topic (workers stopped)",
        description="Read output.topic and write to output.ledger_topic every release of the "
        "configured queries found there (the same draws, marked published), the progress past "
        "the last released window and the first covered window, so that the workers start, "
        "become ready and release only later windows: no window already on the output topic "
        "is drawn again. Stop every worker of the group first. Safe to run repeatedly: what "
        "the ledger already holds is left alone. Refused, before anything is written, when "
        "the windows on the output topic were released under other settings (window size, a "
        "query's epsilon, delta, bounds or noise scale, the query list): run it with the "
        "configuration that released them.",
    )
    add_config_option(rebuild)
    rebuild.add_argument(
        "--bootstrap-servers", metavar="HOST:PORT", help="override kafka.bootstrap_servers"
    )
    rebuild.add_argument(
        "--dry-run", action="store_true", help="only show what would be written; write nothing"
    )
    rebuild.set_defaults(func=run_rebuild)


def run_rebuild(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    bootstrap = running_broker(config, args.bootstrap_servers, "ledger rebuild")
    plan = asyncio.run(rebuild_ledger(config, bootstrap_servers=bootstrap, dry_run=args.dry_run))
    for warning in plan.warnings:
        print(f"stream-dp ledger rebuild: warning: {warning}", file=sys.stderr)
    print(_summary(plan, config.output.ledger_topic, dry_run=args.dry_run))
    return 0


def _summary(plan: RebuildPlan, ledger_topic: str, *, dry_run: bool) -> str:
    verb = "would restore" if dry_run else "restored"
    lines = []
    if plan.restored:
        first = min(ws for _, ws in plan.restored)
        last = max(ws for _, ws in plan.restored)
        lines.append(
            f"{verb} {len(plan.restored)} releases to {ledger_topic} "
            f"(windows {iso_utc(first)} to {iso_utc(last)})"
        )
    if plan.already:
        lines.append(f"{len(plan.already)} releases were already in the ledger")
    if plan.coverage_start_s is not None:
        lines.append(f"first covered window: {iso_utc(plan.coverage_start_s)}")
    for r, cursor in sorted(plan.progress.items()):
        lines.append(f"partials partition {r}: next window to release {iso_utc(cursor)}")
    if not plan.writes:
        lines.append("nothing to write: the ledger already holds every release on the output")
    elif not dry_run:
        lines.append("start the workers: they release only windows after these")
    return "\n".join(("dry run: " if dry_run else "") + line for line in lines)
