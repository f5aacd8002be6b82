"""The demo end to end, in one process: embedded broker, topics, synthetic events, the
worker (ephemeral key, exact-totals observer), and the output topic read back.

Everything the demo starts is stopped on the way out — on success, on an error, and when
``stop`` is set (Ctrl-C / SIGTERM): the worker stops gracefully (open windows are not
released early), then the broker process is terminated. The broker also dies with this
process if it is killed outright (PR_SET_PDEATHSIG, see :mod:`stream_dp.broker.embedded`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import orjson

from stream_dp.broker.embedded import EmbeddedBroker
from stream_dp.broker.topics import apply_topics
from stream_dp.clients.output import OutputAssembler, OutputReader, WindowGroup
from stream_dp.clients.producer import ProduceReport, produce_records
from stream_dp.config import Config
from stream_dp.demo.results import (
    ExactTotals,
    Summary,
    WindowResult,
    compare_query,
    summarize,
)
from stream_dp.demo.scenario import DemoOptions, data_spec, demo_config
from stream_dp.errors import StreamDPError
from stream_dp.pipeline.kafka.worker import Worker
from stream_dp.pipeline.stages.keys import ephemeral_keyring
from stream_dp.privacy.planner import ConfigPlan, plan_config
from stream_dp.privacy.pseudonymize import KeyRing
from stream_dp.synthetic.browser_logs import BrowserLogSpec, browser_log_events
from stream_dp.windows.tumbling import iso_utc

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Give up when no window closes for this long (something is wrong; say so, do not hang).
NO_PROGRESS_TIMEOUT_S = 60.0
WORKER_STOP_TIMEOUT_S = 30.0
POLL_S = 0.2


class DemoError(StreamDPError):
    """The demo could not finish (exit code 1)."""


class DemoInterrupted(Exception):
    """``stop`` was set (a signal) before the demo finished; carries what was seen."""

    def __init__(self, summary: Summary | None) -> None:
        super().__init__("interrupted")
        self.summary = summary


@dataclass(frozen=True)
class StartInfo:
    broker_pid: int
    bootstrap_servers: str
    options: DemoOptions
    spec: BrowserLogSpec
    events: int
    rare_domains: int
    config: Config
    plan: ConfigPlan


class Reporter(Protocol):
    """Where the demo tells what happens (console or JSON lines)."""

    def started(self, info: StartInfo) -> None: ...
    def produced(self, report: ProduceReport) -> None: ...
    def producing(self, sent: int, total: int, elapsed_s: float) -> None: ...
    def worker_started(self) -> None: ...
    def waiting(self, window_index: int, total: int, elapsed_s: float) -> None: ...
    def window(self, result: WindowResult) -> None: ...
    def finished(self, summary: Summary) -> None: ...
    def interrupted(self, summary: Summary | None) -> None: ...


@dataclass
class _Run:
    options: DemoOptions
    started_at: float = field(default_factory=time.monotonic)
    config: Config | None = None
    results: list[WindowResult] = field(default_factory=list)

    def summary(self) -> Summary | None:
        if self.config is None:
            return None
        return summarize(
            self.results,
            self.config,
            windows_expected=self.options.windows,
            elapsed_s=time.monotonic() - self.started_at,
        )


async def _unless_stopped(awaitable: Awaitable[T], stop: asyncio.Event, run: _Run) -> T:
    """Await ``awaitable``; if ``stop`` is set first, cancel it and raise DemoInterrupted."""
    task = asyncio.ensure_future(awaitable)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    raise DemoInterrupted(run.summary())


def _encode(events: list[dict[str, Any]]) -> list[tuple[bytes | None, bytes]]:
    """Events as JSON values, keyed by user id (as producers should)."""
    return [(str(e["user_id"]).encode(), orjson.dumps(e)) for e in events]


async def run_demo(options: DemoOptions, reporter: Reporter, *, stop: asyncio.Event) -> Summary:
    """Run the whole demo; returns the summary, or raises DemoInterrupted / DemoError."""
    run = _Run(options)
    spec = data_spec(options)
    events = await _unless_stopped(
        asyncio.to_thread(lambda: _encode(list(browser_log_events(spec)))), stop, run
    )
    broker = EmbeddedBroker()
    await _unless_stopped(broker.astart(), stop, run)
    try:
        config = demo_config(options, broker.bootstrap_servers)
        run.config = config
        keyring = ephemeral_keyring()
        reporter.started(
            StartInfo(
                broker_pid=broker.pid,
                bootstrap_servers=broker.bootstrap_servers,
                options=options,
                spec=spec,
                events=len(events),
                rare_domains=spec.rare_domains,
                config=config,
                plan=plan_config(config.spec()),
            )
        )
        await _unless_stopped(
            apply_topics(config, broker.bootstrap_servers, include_input=True), stop, run
        )
        # Not cancelled on a signal: it stops itself after the chunk in flight, so the
        # report says what was sent.
        total = len(events)
        report = await produce_records(
            config.kafka,
            config.input.topic,
            events,
            bootstrap_servers=broker.bootstrap_servers,
            progress=lambda n, _b, t: reporter.producing(n, total, t),
            stop=stop,
        )
        reporter.produced(report)
        if stop.is_set():
            raise DemoInterrupted(run.summary())
        events.clear()  # the broker has them; free the memory
        await _run_worker(config, keyring, broker.bootstrap_servers, reporter, stop, run)
    finally:
        await asyncio.to_thread(broker.stop)
    summary = run.summary()
    assert summary is not None
    reporter.finished(summary)
    return summary


async def _run_worker(
    config: Config,
    keyring: KeyRing,
    bootstrap: str,
    reporter: Reporter,
    stop: asyncio.Event,
    run: _Run,
) -> None:
    totals = ExactTotals()
    worker = Worker(config, keyring, bootstrap_servers=bootstrap, exact_totals_observer=totals)
    task = asyncio.create_task(worker.run(), name="stream-dp-worker")
    reporter.worker_started()
    try:
        await _collect(config, bootstrap, totals, task, reporter, stop, run)
    finally:
        worker.request_stop()
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout=WORKER_STOP_TIMEOUT_S)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        except Exception:  # the failure was already raised by _collect
            log.debug("worker ended with an error", exc_info=True)


async def _collect(
    config: Config,
    bootstrap: str,
    totals: ExactTotals,
    worker_task: asyncio.Task[None],
    reporter: Reporter,
    stop: asyncio.Event,
    run: _Run,
) -> None:
    """Read the output topic until every window of every query is in; report each window."""
    starts = [iso_utc(s) for s in data_spec(run.options).window_starts()]
    queries = {q.name: q for q in config.queries}
    assembler = OutputAssembler()
    done: dict[str, dict[str, WindowGroup]] = {}
    last_progress = time.monotonic()
    async with OutputReader(config.kafka, config.output.topic, bootstrap_servers=bootstrap) as r:
        while len(run.results) < len(starts):
            if stop.is_set():
                raise DemoInterrupted(run.summary())
            if worker_task.done():
                _worker_ended(worker_task)
            if time.monotonic() - last_progress > NO_PROGRESS_TIMEOUT_S:
                raise DemoError(
                    f"no window closed within {NO_PROGRESS_TIMEOUT_S:g} s; the worker seems "
                    "stuck (run with STREAM_DP_LOGGING__LEVEL=INFO to see its log)"
                )
            reporter.waiting(len(run.results) + 1, len(starts), time.monotonic() - run.started_at)
            await r.try_assign()
            for key, value in await r.poll(POLL_S):
                group = assembler.add(key, value, now=time.monotonic())
                if group is not None:
                    done.setdefault(group.window_start, {})[group.query] = group
            for start in starts[len(run.results) :]:
                groups = done.get(start, {})
                if set(groups) != set(queries):
                    break  # report windows in order
                run.results.append(_compare(start, starts, groups, queries, totals))
                reporter.window(run.results[-1])
                last_progress = time.monotonic()


def _compare(
    start: str,
    starts: list[str],
    groups: dict[str, WindowGroup],
    queries: dict[str, Any],
    totals: ExactTotals,
) -> WindowResult:
    compared = []
    for name, query in queries.items():
        group = groups[name]
        assert group.window is not None
        exact = totals.get(name, start)
        if exact is None:
            raise DemoError(f"no exact totals were observed for {name} at {start}")
        compared.append(compare_query(query, group.release_values(), group.window, exact))
    any_group = next(iter(groups.values()))
    return WindowResult(
        index=starts.index(start) + 1,
        total=len(starts),
        window_start=start,
        window_end=any_group.window_end or start,
        queries=compared,
    )


def _worker_ended(task: asyncio.Task[None]) -> None:
    exc = None if task.cancelled() else task.exception()
    if exc is None:
        raise DemoError("the worker stopped before every window was released")
    raise DemoError(f"the worker failed: {type(exc).__name__}: {exc}") from exc
