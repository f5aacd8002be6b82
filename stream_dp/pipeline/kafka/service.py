"""The worker as a service: broker (embedded if asked), topics, HTTP endpoints, signals.

SIGTERM/SIGINT once: stop fetching, flush, commit what is safe, exit 0 (open windows are
not released early — invariant 7). A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import os
import signal
from collections.abc import AsyncIterator
from typing import Protocol

from stream_dp.broker.durability import verify_durable_topics
from stream_dp.broker.embedded import EmbeddedBroker
from stream_dp.broker.probe import wait_at_start
from stream_dp.broker.topics import apply_topics
from stream_dp.config.model import Config
from stream_dp.ops.health import Health
from stream_dp.ops.http import ops_endpoints
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.formats.decode import REASONS
from stream_dp.pipeline.kafka.worker import Worker
from stream_dp.privacy.pseudonymize import KeyRing

log = logging.getLogger(__name__)

#: Upper bound on a graceful shutdown before the process gives up waiting.
SHUTDOWN_TIMEOUT_S = 30.0


@contextlib.asynccontextmanager
async def bootstrap_for(config: Config) -> AsyncIterator[str]:
    """The broker address: the configured one, or an embedded broker started for this run."""
    if not config.kafka.embedded:
        yield config.kafka.bootstrap_servers
        return
    broker = EmbeddedBroker()
    await broker.astart()
    log.info("embedded broker started on %s", broker.bootstrap_servers)
    try:
        yield broker.bootstrap_servers
    finally:
        broker.stop()


def install_signal_handlers(on_first: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()

    def handler(signum: int) -> None:
        if on_first.is_set():
            log.warning("second signal: exiting at once")
            os._exit(128 + signum)
        log.info("signal %d: shutting down gracefully", signum)
        on_first.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, handler, sig)


def freeze_startup_heap() -> None:
    """Exempt the objects of start-up (imported modules, classes, the config) from every later
    garbage collection: a full collection walks every tracked object, and the worker's
    fetches (tens of thousands of records a batch) trigger several a minute; the start-up
    heap was most of what each walked (about 20% of a keyed worker's CPU before this, 7% after,
    bench/RESULTS.md section 9). Garbage at this point is collected first; a start-up object
    dropped later is not reclaimed (start-up is done once per process)."""
    gc.collect()
    gc.freeze()


async def run_worker(
    config: Config, keyring: KeyRing, *, stop: asyncio.Event | None = None
) -> None:
    """Run one worker until ``stop`` is set (or a signal arrives)."""
    stop = stop if stop is not None else asyncio.Event()
    freeze_startup_heap()
    install_signal_handlers(stop)
    metrics = Metrics(reasons=REASONS)
    health = Health(metrics=metrics, live_timeout_s=config.metrics.live_timeout_s)
    m = config.metrics
    async with (
        bootstrap_for(config) as bootstrap,
        ops_endpoints(m.enabled, m.host, m.port, metrics, health, setting="metrics.port"),
    ):
        # The endpoints first: while it waits for its broker the worker is live, not ready.
        if not config.kafka.embedded:
            beat = functools.partial(health.progress, "waiting for the broker")
            await wait_at_start(config.kafka, bootstrap, who="worker", waiting=beat)
        created = await apply_topics(config, bootstrap, include_input=config.kafka.embedded)
        if created:
            log.info("created topics: %s", ", ".join(created))
        # Refuse a ledger (or erasure log, cumulative state) the broker would delete from.
        await verify_durable_topics(config, bootstrap)
        worker = Worker(
            config, keyring, bootstrap_servers=bootstrap, metrics=metrics, health=health
        )
        await run_until_stopped(worker, stop, SHUTDOWN_TIMEOUT_S)


class Service(Protocol):
    """A long-running part (the worker, the sink): ``run()`` until ``request_stop()``."""

    async def run(self) -> None: ...

    def request_stop(self) -> None: ...


async def run_until_stopped(service: Service, stop: asyncio.Event, timeout_s: float) -> None:
    """Run ``service`` until it ends or ``stop`` is set; then ask it to stop and wait for it
    at most ``timeout_s`` (TimeoutError beyond)."""
    task = asyncio.create_task(service.run())
    stopper = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        service.request_stop()
        await asyncio.wait_for(task, timeout=timeout_s)
    finally:
        stopper.cancel()
