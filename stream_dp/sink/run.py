"""The sink as a service: HTTP endpoints, signals, a clean stop.

SIGTERM/SIGINT once: finish the batch in hand (stored and committed, or neither), leave the
consumer group, exit 0. A second signal exits at once — harmless too: an uncommitted batch
is read again by the next sink and changes nothing.
"""

from __future__ import annotations

import asyncio
import logging

from psycopg.conninfo import conninfo_to_dict

from stream_dp.config import Config
from stream_dp.ops.health import Health
from stream_dp.ops.http import ops_endpoints
from stream_dp.pipeline.kafka.service import install_signal_handlers, run_until_stopped
from stream_dp.sink import LOCK_TIMEOUT_S, STATEMENT_TIMEOUT_S
from stream_dp.sink.metrics import SinkMetrics
from stream_dp.sink.service import SINK_COMPONENTS, Sink

log = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT_S = 30.0


def describe_dsn(dsn: str) -> str:
    """host:port/dbname as user — for logs; never the password."""
    info = conninfo_to_dict(dsn)
    host = info.get("host") or "localhost"
    port = info.get("port") or "5432"
    return f"{host}:{port}/{info.get('dbname') or '(default)'} as {info.get('user') or '(default)'}"


async def run_sink(
    config: Config,
    dsn: str,
    *,
    group_id: str | None = None,
    bootstrap_servers: str | None = None,
    metrics_port: int = 0,
    stop: asyncio.Event | None = None,
    lock_timeout_s: float = LOCK_TIMEOUT_S,
    statement_timeout_s: float = STATEMENT_TIMEOUT_S,
) -> None:
    """Run one sink until ``stop`` is set (or a signal arrives)."""
    stop = stop if stop is not None else asyncio.Event()
    install_signal_handlers(stop)
    metrics = SinkMetrics()
    health = Health(metrics=metrics, components=SINK_COMPONENTS)
    sink = Sink(
        config,
        dsn,
        group_id=group_id,
        bootstrap_servers=bootstrap_servers,
        metrics=metrics,
        health=health,
        lock_timeout_s=lock_timeout_s,
        statement_timeout_s=statement_timeout_s,
    )
    m = config.metrics
    async with ops_endpoints(
        m.enabled, m.host, metrics_port, metrics, health, setting="--metrics-port"
    ):
        log.info("sink writing to PostgreSQL at %s", describe_dsn(dsn))
        await run_until_stopped(sink, stop, SHUTDOWN_TIMEOUT_S)
