"""``stream-dp run --config FILE``: the streaming worker."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from typing import Any

from stream_dp.cli._common import add_config_option
from stream_dp.config import load_config
from stream_dp.ops.build_info import build_description
from stream_dp.ops.logging import configure_logging
from stream_dp.pipeline.kafka.service import run_worker
from stream_dp.pipeline.stages.keys import load_keyring

log = logging.getLogger(__name__)

# --bootstrap-servers is applied as this variable, so it is validated like any override.
BOOTSTRAP_VARIABLE = "STREAM_DP_KAFKA__BOOTSTRAP_SERVERS"


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "run",
        help="run the streaming worker",
        description="Consume the input topic, release private statistics per window to the "
        "output topic. Creates its missing output, dead-letter, ledger and internal topics at "
        "start. SIGTERM/Ctrl-C stops it gracefully (open windows are not released early).",
    )
    add_config_option(p)
    p.add_argument(
        "--bootstrap-servers",
        metavar="HOST:PORT",
        help="override kafka.bootstrap_servers (as STREAM_DP_KAFKA__BOOTSTRAP_SERVERS does)",
    )
    p.add_argument(
        "--log-format", choices=["json", "console"], help="override logging.format from config"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    environ = dict(os.environ)
    if args.bootstrap_servers:
        environ[BOOTSTRAP_VARIABLE] = args.bootstrap_servers
    config = load_config(args.config, environ)
    configure_logging(config.logging.level, args.log_format or config.logging.format)
    log.info("%s: worker of deployment %s", build_description(), config.kafka.group_id)
    keyring = load_keyring(config.pseudonymization)
    asyncio.run(run_worker(config, keyring))
    return 0
