"""``stream-dp sink --config FILE --postgres DSN``: the output topic into PostgreSQL."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from typing import Any

from stream_dp.cli._common import add_config_option, running_broker
from stream_dp.config import Config, load_config
from stream_dp.errors import ConfigError
from stream_dp.ops.build_info import build_description
from stream_dp.ops.logging import configure_logging
from stream_dp.sink import LOCK_TIMEOUT_S, STATEMENT_TIMEOUT_S

log = logging.getLogger(__name__)

#: Where the DSN comes from when --postgres is not given (keeps a password out of `ps`).
DSN_ENV = "STREAM_DP_POSTGRES_DSN"
DEFAULT_METRICS_PORT = 9109


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "sink",
        help="store the output topic in PostgreSQL tables (for dashboards)",
        description="Consume output.topic in its own consumer group and upsert every release "
        "and window record into PostgreSQL (schema stream_dp, created and migrated at start). "
        "Offsets are committed after the database transaction: after a crash nothing is lost "
        "and nothing doubles. SIGTERM/Ctrl-C stops it after the batch in hand.",
    )
    add_config_option(p)
    p.add_argument(
        "--postgres",
        metavar="DSN",
        help="libpq connection string or URI, e.g. postgresql://user@host:5432/db "
        f"(default: ${DSN_ENV}; a password is better in PGPASSWORD or ~/.pgpass)",
    )
    p.add_argument(
        "--group-id",
        metavar="ID",
        help="the sink's consumer group (default: <kafka.group_id>.sink)",
    )
    p.add_argument(
        "--bootstrap-servers", metavar="HOST:PORT", help="override kafka.bootstrap_servers"
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=DEFAULT_METRICS_PORT,
        metavar="PORT",
        help=f"/metrics and /health/* on metrics.host (default {DEFAULT_METRICS_PORT}; "
        "0 picks a free port)",
    )
    p.add_argument(
        "--lock-timeout-s",
        type=float,
        default=LOCK_TIMEOUT_S,
        metavar="S",
        help="PostgreSQL lock_timeout of the sink's session: a lock held longer by another "
        f"session fails the try, which is retried with back-off (default {LOCK_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--statement-timeout-s",
        type=float,
        default=STATEMENT_TIMEOUT_S,
        metavar="S",
        help="PostgreSQL statement_timeout of the sink's session "
        f"(default {STATEMENT_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--log-format", choices=["json", "console"], help="override logging.format from config"
    )
    p.set_defaults(func=run)


def _dsn(args: argparse.Namespace) -> str:
    dsn = args.postgres or os.environ.get(DSN_ENV, "")
    if not dsn.strip():
        raise ConfigError(
            f"no database given: pass --postgres DSN (e.g. postgresql://user@host/db) or set "
            f"{DSN_ENV}"
        )
    try:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:
        raise ConfigError(
            'the sink needs psycopg: pip install "psycopg[binary]>=3.1" (the sink extra)'
        ) from None
    try:
        conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise ConfigError(
            f"--postgres is not a valid libpq connection string or URI ({type(exc).__name__}); "
            "use e.g. postgresql://user@host:5432/dbname or 'host=… dbname=… user=…'"
        ) from None
    return dsn


def run(args: argparse.Namespace) -> int:
    config: Config = load_config(args.config)
    configure_logging(config.logging.level, args.log_format or config.logging.format)
    log.info("%s: sink of deployment %s", build_description(), config.kafka.group_id)
    dsn = _dsn(args)
    if not 0 <= args.metrics_port <= 65535:
        raise ConfigError(f"--metrics-port {args.metrics_port}: use 0 to 65535")
    for flag, seconds in (
        ("--lock-timeout-s", args.lock_timeout_s),
        ("--statement-timeout-s", args.statement_timeout_s),
    ):
        if not seconds > 0:
            raise ConfigError(f"{flag} {seconds}: use a positive number of seconds")
    bootstrap = running_broker(config, args.bootstrap_servers, "sink")
    from stream_dp.sink.run import run_sink

    asyncio.run(
        run_sink(
            config,
            dsn,
            group_id=args.group_id,
            bootstrap_servers=bootstrap,
            metrics_port=args.metrics_port,
            lock_timeout_s=args.lock_timeout_s,
            statement_timeout_s=args.statement_timeout_s,
        )
    )
    return 0
