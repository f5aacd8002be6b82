"""Scale-out: events/s with 1, 2 and 3 ``stream-dp run`` processes in one consumer group.

One topic of ``PARTITIONS`` = 6 partitions, keyed by user id, is preloaded once. For each
worker count N and each run, N ``stream-dp run`` subprocesses are started back to back with
the same config (same ``kafka.group_id``; fresh output, ledger, partials and repartition
topics per run, created before the clock starts). The clock runs from the start of the
first process until a reader in the bench process has seen every expected window record on
the output topic. At that moment the CPU seconds (user + system, from ``/proc``) of every
worker process and of the broker are read, so the report can say where the time went on a
machine whose cores the workers share with each other and with the broker. The workers are
then stopped with SIGTERM (they must exit 0) and the output topic is read until it is
quiet, to check that every window was released exactly once.

The span includes what one worker pays once (interpreter start and imports, the ledger
read-back behind fences, the consumer-group join and the rebalances as the other members
join, the idle close of the last window), so small topics understate what more workers buy.

``input.keyed_by_user: true`` is the main figure (stage 1 reads the input partitions
directly). With ``false`` (the default), stage 0 pseudonymizes every event and writes it
to the repartition topic (``topics/repartition.yaml``: 4 partitions), which stage 1 reads.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from bench.data import StreamSpec, columns, distinct_windows, encode
from bench.throughput import (
    WORKER_TOPICS,
    cpu_seconds_of,
    create_topics,
    delete_topics,
    produce,
    worker_config,
)
from bench.worker_phases import POLL_S, SAMPLE_S, Sample, joined, phases
from stream_dp.broker.topics import apply_topics
from stream_dp.config import parse_config

PARTITIONS = 6
WORKER_COUNTS = (1, 2, 3)
#: A run that has not released every window by then is stuck (a full-size run takes ~15 s).
RUN_TIMEOUT_S = 600.0
#: After the workers stopped, the output topic is read until it has been quiet this long.
QUIET_S = 1.0
STOP_TIMEOUT_S = 60.0
#: kafka.session_timeout_ms of the workers: the configuration's default.
SESSION_TIMEOUT_MS = 10_000


def _log_messages(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def _worker_summary(path: Path, roles: dict[str, str]) -> dict[str, Any]:
    """From a worker's JSON log: windows it released, its last assignment (partitions per
    role: input, repartition, partials), warnings."""
    messages = _log_messages(path)
    assigned = [m["msg"] for m in messages if m.get("msg", "").startswith("partitions")]
    last = assigned[-1] if assigned else ""
    held: Counter[str] = Counter()
    if last.startswith("partitions assigned: "):
        for tp in last.removeprefix("partitions assigned: ").split(", "):
            held[roles.get(tp.rsplit("[", 1)[0], "other")] += 1
    warnings = [m for m in messages if m.get("level") in ("WARNING", "ERROR")]
    return {
        "windows_released": sum(1 for m in messages if m.get("msg") == "window released"),
        "last_assignment": last or None,
        "partitions": dict(held),
        "rebalances": sum(1 for a in assigned if a.startswith("partitions assigned")),
        "warnings": len(warnings),
        "warning_kinds": sorted(Counter(f"{m['logger']}: {m['msg']}" for m in warnings).items()),
    }


#: Counters read from each worker's /metrics once every window is out (not in the timed span).
SCRAPED = {
    "events_consumed": "stream_dp_events_consumed_total",
    "late_events": "stream_dp_late_events_total",
    "replayed_events_skipped": "stream_dp_replayed_events_skipped_total",
    "repartition_duplicates_skipped": "stream_dp_repartition_duplicates_skipped_total",
}


def _scrape(path: Path) -> dict[str, float] | None:
    """The worker's counters of :data:`SCRAPED`, from the /metrics address in its log."""
    urls = [
        m["msg"].split(" on ", 1)[1]
        for m in _log_messages(path)
        if m.get("msg", "").startswith("metrics and health on http://")
    ]
    return _scrape_url(urls[-1] if urls else None)


def _scrape_url(url: str | None) -> dict[str, float] | None:
    if url is None:
        return None
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:  # noqa: S310
            text = response.read().decode()
    except OSError:
        return None
    out = dict.fromkeys(SCRAPED, 0.0)
    names = {v: k for k, v in SCRAPED.items()}
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        name = series.split("{", 1)[0]
        if name in names:
            out[names[name]] += float(value)
    return out


@dataclass
class _LogState:
    """What a worker's log says so far: its /metrics address and its assignments."""

    url: str | None = None
    last_assigned: list[str] | None = None  # topic[p] of its last assignment
    taken_after_last: bool = False  # "partitions taken" logged after that assignment
    assignments: int = 0


def _log_state(path: Path) -> _LogState:
    state = _LogState()
    for m in _log_messages(path):
        msg = m.get("msg", "")
        if msg.startswith("metrics and health on http://"):
            state.url = msg.split(" on ", 1)[1]
        elif msg.startswith("partitions assigned: "):
            state.last_assigned = msg.removeprefix("partitions assigned: ").split(", ")
            state.taken_after_last = False
            state.assignments += 1
        elif msg.startswith("partitions revoked"):
            state.last_assigned = None
        elif msg.startswith("partitions taken"):
            state.taken_after_last = True
    return state


class _Sampler:
    """Polled by the run's loop: each worker's start-up CPU (at its first "partitions
    taken"), then, once every worker holds its final partitions, a :class:`Sample` every
    :data:`worker_phases.SAMPLE_S` until the input is drained (:mod:`bench.worker_phases`)."""

    def __init__(
        self, procs: Sequence[subprocess.Popen[bytes]], logs: Sequence[Path], topic: str
    ) -> None:
        self.procs, self.logs = procs, logs
        self.partitions = {f"{topic}[{p}]" for p in range(PARTITIONS)}
        self.startup_cpu_s: list[float | None] = [None] * len(procs)
        self.startup_s: list[float | None] = [None] * len(procs)
        self.samples: list[Sample] = []
        self.drained = False
        self._next_s = 0.0
        self.total_events = 0

    def poll(self, t_s: float, total_events: int) -> None:
        self.total_events = total_events
        if self.drained or t_s < self._next_s:
            return
        states = [_log_state(p) for p in self.logs]
        for i, state in enumerate(states):
            if self.startup_cpu_s[i] is None and state.taken_after_last:
                self.startup_cpu_s[i] = cpu_seconds_of(self.procs[i].pid)
                self.startup_s[i] = t_s
        if not self.samples and not joined(
            [s.last_assigned for s in states],
            [s.taken_after_last for s in states],
            self.partitions,
        ):
            self._next_s = t_s + POLL_S
            return
        sample = self.sample(t_s, states)
        if sample is None:
            self._next_s = t_s + POLL_S
            return
        self.samples.append(sample)
        self.drained = sample.total_events >= total_events
        self._next_s = t_s + SAMPLE_S

    def sample(self, t_s: float, states: Sequence[_LogState] | None = None) -> Sample | None:
        states = states or [_log_state(p) for p in self.logs]
        cpu = tuple(cpu_seconds_of(p.pid) for p in self.procs)
        counters = [_scrape_url(s.url) for s in states]
        if any(c is None for c in counters):
            return None
        return Sample(
            t_s=t_s,
            cpu_s=cpu,
            events=tuple(c["events_consumed"] for c in counters if c is not None),
            assignments=tuple(s.assignments for s in states),
        )

    def phases(self, end: Sample) -> dict[str, Any]:
        startup = [c if c is not None else 0.0 for c in self.startup_cpu_s]
        started = [s if s is not None else 0.0 for s in self.startup_s]
        return phases(self.samples, startup, started, end, self.total_events)


def _tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(encoding="utf-8", errors="replace")[-chars:]


async def _output_reader(bootstrap: str, topic: str) -> AIOKafkaConsumer:
    reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await reader.start()
    deadline = time.monotonic() + 15
    parts = reader.partitions_for_topic(topic)
    while not parts:
        if time.monotonic() > deadline:
            await reader.stop()
            raise RuntimeError(f"output topic {topic} has no partitions")
        await reader._client.force_metadata_update()
        parts = reader.partitions_for_topic(topic)
    reader.assign([TopicPartition(topic, p) for p in sorted(parts)])
    await reader.seek_to_beginning()
    return reader


def _windows_in(batch: dict[TopicPartition, list[Any]], seen: Counter[tuple[str, str]]) -> None:
    for msgs in batch.values():
        for m in msgs:
            value = orjson.loads(m.value)
            if value.get("kind") == "window":
                seen[(value["query"], value["window_start"])] += 1


#: Imported by the warm-up before the first run, so their bytecode is cached (the rest of
#: ``stream_dp`` is compiled with :mod:`compileall`).
WARM_IMPORTS = (
    "stream_dp.cli.main",
    "stream_dp.cli.run_cmd",
    "stream_dp.pipeline.kafka.service",
    "stream_dp.pipeline.kafka.worker",
)


def _bytecode_env(prefix: Path | None) -> dict[str, str]:
    """The workers' environment: with a bytecode cache at ``prefix`` (as an installed
    package has its .pyc files), even where PYTHONDONTWRITEBYTECODE is set."""
    env = dict(os.environ)
    if prefix is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(prefix)
    return env


def warm_bytecode(prefix: Path) -> None:
    """Compile ``stream_dp`` and what a worker imports into ``prefix`` (not timed): without
    it every worker process compiles every module at start-up (PYTHONDONTWRITEBYTECODE in
    this environment), a fixed cost a deployed worker does not pay."""
    env = _bytecode_env(prefix)
    package = Path(__file__).resolve().parents[1] / "stream_dp"
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(package)], env=env, check=True)
    code = "; ".join(f"import {m}" for m in WARM_IMPORTS)
    code += "; stream_dp.cli.main.build_parser()"
    subprocess.run([sys.executable, "-c", code], env=env, check=True)


async def _run_group(
    bootstrap: str,
    broker_pid: int,
    config: dict[str, Any],
    n: int,
    expected_windows: int,
    events: int,
    workdir: Path,
    pycache_prefix: Path | None = None,
) -> dict[str, Any]:
    """Start ``n`` workers, time them until every window record is out (sampling their
    phases meanwhile, :class:`_Sampler`), stop them, check."""
    out_topic = config["output"]["topic"]
    config_path = workdir / "config.json"  # JSON is YAML
    config_path.write_text(json.dumps(config), encoding="utf-8")
    env = {
        **_bytecode_env(pycache_prefix),
        "STREAM_DP_PSEUDONYM_KEY": secrets.token_hex(32),
        "PYTHONWARNINGS": "ignore",
    }
    logs = [workdir / f"worker-{i}.log" for i in range(n)]
    reader = await _output_reader(bootstrap, out_topic)
    procs: list[subprocess.Popen[bytes]] = []
    codes: list[int] = []
    seen: Counter[tuple[str, str]] = Counter()
    try:
        broker_cpu0 = cpu_seconds_of(broker_pid)
        reader_cpu0 = time.process_time()
        t0 = time.perf_counter()
        for path in logs:
            with path.open("wb") as handle:
                procs.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "stream_dp.cli.main",
                            "run",
                            "--config",
                            str(config_path),
                        ],
                        stdout=handle,
                        stderr=subprocess.STDOUT,
                        env=env,
                    )
                )
        arrivals: list[float] = []  # seconds from the start to each window's first record
        sampler = _Sampler(procs, logs, config["input"]["topic"])
        while len(seen) < expected_windows:
            elapsed = time.perf_counter() - t0
            exited = [(i, p.returncode) for i, p in enumerate(procs) if p.poll() is not None]
            if exited or elapsed > RUN_TIMEOUT_S:
                what = (
                    f"worker(s) {exited} exited"
                    if exited
                    else f"no complete output after {RUN_TIMEOUT_S:.0f} s"
                )
                tails = "\n".join(f"--- worker {i} ---\n{_tail(p)}" for i, p in enumerate(logs))
                raise RuntimeError(
                    f"{n} workers ({config['input']}): {what}; {len(seen)} of "
                    f"{expected_windows} windows released; logs in {workdir}:\n{tails}"
                )
            sampler.poll(elapsed, events)
            batch = await reader.getmany(timeout_ms=int(1000 * POLL_S))
            before = len(seen)
            _windows_in(batch, seen)
            if len(seen) > before:
                arrivals.extend([time.perf_counter() - t0] * (len(seen) - before))
        seconds = time.perf_counter() - t0
        cpu = [cpu_seconds_of(p.pid) for p in procs]
        broker_cpu = cpu_seconds_of(broker_pid) - broker_cpu0
        reader_cpu = time.process_time() - reader_cpu0
        counters = [_scrape(path) for path in logs]
        end = Sample(
            t_s=seconds,
            cpu_s=tuple(cpu),
            events=tuple(c["events_consumed"] if c else 0.0 for c in counters),
            assignments=tuple(_log_state(path).assignments for path in logs),
        )
        for p in procs:
            p.send_signal(signal.SIGTERM)
        codes = [p.wait(timeout=STOP_TIMEOUT_S) for p in procs]
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < QUIET_S:
            batch = await reader.getmany(timeout_ms=200)
            if any(batch.values()):
                _windows_in(batch, seen)
                quiet_since = time.monotonic()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        await reader.stop()
    if any(codes):
        tails = "\n".join(f"--- worker {i} ---\n{_tail(p)}" for i, p in enumerate(logs))
        raise RuntimeError(f"workers exited with codes {codes} after SIGTERM:\n{tails}")
    roles = {
        config["input"]["topic"]: "input",
        config["output"]["repartition_topic"]: "repartition",
        config["output"]["partials_topic"]: "partials",
    }
    summaries = [_worker_summary(p, roles) for p in logs]
    return {
        "workers": n,
        "seconds": seconds,
        "first_window_seconds": arrivals[0],
        "window_seconds": arrivals,
        "cpu_seconds_per_worker": cpu,
        "cpu_seconds_workers": sum(cpu),
        "broker_cpu_seconds": broker_cpu,
        "reader_cpu_seconds": reader_cpu,
        "window_records": sum(seen.values()),
        "distinct_windows": len(seen),
        "duplicate_window_records": sum(c - 1 for c in seen.values() if c > 1),
        "exactly_once": len(seen) == expected_windows and all(c == 1 for c in seen.values()),
        "windows_released_per_worker": [s["windows_released"] for s in summaries],
        "last_assignment_per_worker": [s["last_assignment"] for s in summaries],
        "partitions_per_worker": [s["partitions"] for s in summaries],
        "assignments_per_worker": [s["rebalances"] for s in summaries],
        "warnings_per_worker": [s["warnings"] for s in summaries],
        "counters_per_worker": counters,
        **{
            name: sum(c[name] for c in counters if c is not None)
            for name in ("late_events", "events_consumed")
        },
        "warning_kinds_per_worker": [s["warning_kinds"] for s in summaries],
        "phases": sampler.phases(end),
    }


def run_point(
    bootstrap: str,
    broker_pid: int,
    topic: str,
    *,
    n: int,
    keyed_by_user: bool,
    events: int,
    windows: int,
    window_size_s: int,
    pycache_prefix: Path | None = None,
) -> dict[str, Any]:
    suffix = uuid.uuid4().hex[:10]
    config = worker_config(bootstrap, topic, suffix, window_size_s, keyed_by_user=keyed_by_user)
    # The product's session timeout (section 1's 2 s expired mid-run on the loaded 2 cores
    # with 3 workers and the broker: rebalances, re-read records); heartbeats stay frequent
    # so that members still learn of a join quickly.
    config["kafka"]["session_timeout_ms"] = SESSION_TIMEOUT_MS
    # INFO: the log names each worker's assignments, releases and /metrics address.
    config["logging"] = {"level": "INFO", "format": "json"}
    config["metrics"] = {"enabled": True, "host": "127.0.0.1", "port": 0}
    asyncio.run(apply_topics(parse_config(config), bootstrap, include_input=False))
    try:
        with tempfile.TemporaryDirectory(prefix="bench-workers-") as tmp:
            result = asyncio.run(
                _run_group(
                    bootstrap, broker_pid, config, n, windows, events, Path(tmp), pycache_prefix
                )
            )
    finally:
        names = [config["output"][k] for k in WORKER_TOPICS]
        asyncio.run(delete_topics(bootstrap, names=names))
    result["events"] = events
    result["events_per_s"] = events / result["seconds"]
    return result


def _median(runs: Sequence[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in runs))


def summarize(points: dict[int, list[dict[str, Any]]], cores: int) -> list[dict[str, Any]]:
    """Per worker count: medians over the runs, and the ratio to one worker."""
    rows = []
    base = statistics.median(r["events_per_s"] for r in points[min(points)])
    for n, runs in sorted(points.items()):
        rate = _median(runs, "events_per_s")
        seconds = _median(runs, "seconds")
        workers_cpu = _median(runs, "cpu_seconds_workers")
        broker_cpu = _median(runs, "broker_cpu_seconds")
        rows.append(
            {
                "workers": n,
                "runs": list(runs),
                "events_per_s": rate,
                "ratio_to_one_worker": rate / base,
                "seconds": seconds,
                "first_window_seconds": _median(runs, "first_window_seconds"),
                "cpu_seconds_workers": workers_cpu,
                "cpu_seconds_per_worker": [
                    float(statistics.median(col))
                    for col in zip(*(r["cpu_seconds_per_worker"] for r in runs), strict=True)
                ],
                "broker_cpu_seconds": broker_cpu,
                "reader_cpu_seconds": _median(runs, "reader_cpu_seconds"),
                # Share of the machine's CPU (wall × cores) the workers and broker used.
                "cpu_utilisation": (workers_cpu + broker_cpu) / (seconds * cores),
                "exactly_once": all(r["exactly_once"] for r in runs),
                # From each worker's /metrics, summed over the workers, worst run: events
                # dropped as late, and input records read (more than the topic holds when a
                # rebalance made a new owner re-read uncommitted records).
                "late_events_max": max(r["late_events"] for r in runs),
                "events_consumed_max": max(r["events_consumed"] for r in runs),
                "partitions_per_worker": runs[-1]["partitions_per_worker"],
                **_phase_medians(runs),
            }
        )
    return rows


def _phase_medians(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the runs of the steady CPU per event and the fixed costs
    (:mod:`bench.worker_phases`); None where no run had a steady span."""
    measured = [r["phases"] for r in runs if r["phases"].get("steady_us_per_event") is not None]

    def med(key: str) -> float | None:
        return float(statistics.median(p[key] for p in measured)) if measured else None

    return {
        "steady_runs": len(measured),
        "steady_us_per_event": med("steady_us_per_event"),
        "steady_share_of_events": med("steady_share_of_events"),
        "steady_seconds": med("steady_seconds"),
        "steady_cpu_utilisation": med("steady_cpu_utilisation"),
        "startup_cpu_s_mean": med("startup_cpu_s_mean"),
        "fixed_before_cpu_s_per_worker": med("fixed_before_cpu_s_per_worker"),
        "close_excess_cpu_s": med("close_excess_cpu_s"),
        "close_s": med("close_s"),
        "joined_s": med("joined_s"),
        "rebalanced_while_steady": sum(bool(r["phases"]["rebalanced_while_steady"]) for r in runs),
        "whole_us_per_event": float(
            statistics.median(1e6 * r["cpu_seconds_workers"] / r["events"] for r in runs)
        ),
    }


def measure(
    bootstrap: str,
    broker_pid: int,
    spec: StreamSpec,
    *,
    runs: int,
    modes: Sequence[bool] = (True, False),
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Preload the 6-partition topic, run every (mode, N) ``runs`` times, delete the topic."""
    cols = columns(spec)
    values, keys = encode(spec, cols)
    windows = distinct_windows(spec, cols)
    topic = f"bench-workers-{uuid.uuid4().hex[:8]}"
    cores = os.cpu_count() or 1
    asyncio.run(create_topics(bootstrap, [topic], PARTITIONS))
    out: dict[str, Any] = {
        "events": spec.events,
        "users": spec.users,
        "keys": spec.keys,
        "windows": windows,
        "window_size_s": spec.window_size_s,
        "partitions": PARTITIONS,
        "worker_counts": list(WORKER_COUNTS),
        "runs": runs,
        "cores": cores,
        "timeout_s": RUN_TIMEOUT_S,
        "modes": {},
    }
    pycache = tempfile.TemporaryDirectory(prefix="bench-workers-pycache-")
    try:
        warm_bytecode(Path(pycache.name))
        out["produce_seconds"] = produce(bootstrap, topic, values, keys)
        log(f"  preloaded {spec.events:,} events in {PARTITIONS} partitions")
        del values, keys
        for keyed in modes:
            label = "keyed_by_user" if keyed else "repartitioned"
            points: dict[int, list[dict[str, Any]]] = {n: [] for n in WORKER_COUNTS}
            for r in range(runs):
                # Interleaved so that drift on the machine spreads over every worker count.
                for n in WORKER_COUNTS:
                    point = run_point(
                        bootstrap,
                        broker_pid,
                        topic,
                        n=n,
                        keyed_by_user=keyed,
                        events=spec.events,
                        windows=windows,
                        window_size_s=spec.window_size_s,
                        pycache_prefix=Path(pycache.name),
                    )
                    points[n].append(point)
                    cpu = ", ".join(f"{c:.1f}" for c in point["cpu_seconds_per_worker"])
                    ph = point["phases"]
                    steady = ph.get("steady_us_per_event")
                    log(
                        f"  run {r + 1}: {label} {n} worker(s): "
                        f"{point['events_per_s']:,.0f} events/s in {point['seconds']:.1f} s, "
                        f"CPU s workers [{cpu}], broker {point['broker_cpu_seconds']:.1f}, "
                        f"windows per worker {point['windows_released_per_worker']}; steady "
                        + (
                            "not measured"
                            if steady is None
                            else f"{steady:.2f} µs/event over {ph['steady_seconds']:.1f} s "
                            f"({100 * ph['steady_share_of_events']:.0f}% of events), start-up "
                            f"CPU {ph['startup_cpu_s_mean']:.2f} s/process, start-up and "
                            f"join {ph['fixed_before_cpu_s_per_worker']:.2f} s/process, "
                            f"close {ph['close_excess_cpu_s']:.2f} s"
                        )
                    )
            out["modes"][label] = {"keyed_by_user": keyed, "points": summarize(points, cores)}
    finally:
        pycache.cleanup()
        asyncio.run(delete_topics(bootstrap, names=[topic]))
    return out
