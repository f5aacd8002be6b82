"""Issue 43's realistic stream, measured the way an operator sees it, on both brokers.

``python -m bench.realistic [--events N] [--before REV] [--after REV] [--profile] > RUN.json``,
then ``--keep LABEL RUN.json`` keeps it in ``bench/realistic.json`` and writes its section of
RESULTS.md (``--render``: the section from what is kept; ``bench.report`` renders it too);
``--smoke`` runs a small topic on the embedded broker only (the bench's smoke test).

The stream (one topic of 4 partitions, produced by librdkafka — confluent-kafka with
``linger.ms`` 5 and its default partitioner, keyed by user id): ``N`` JSON events
``{"user_id": "user123", "timestamp": "<ISO-8601 with offset>", "domain": "d17.com"}``;
users ``int(paretovariate(1.2)) % 50,000`` (a long tail: most events from a few users),
41 domains uniform, event times spread evenly over 10 one-minute windows that end before
the run starts (``window.start_at`` is the first), so every window closes during the run.

Per broker, in one run, each contender in a fresh process, in turn:

* ``raw aiokafka``: ``getmany`` (10,000 records at most, 4 MB per partition) and
  ``orjson.loads`` of every value; ``raw librdkafka``: confluent-kafka ``consume(10,000)``
  and ``orjson.loads``. Rate and CPU (the process's user + system time, every thread) from
  the end of the first batch to the last event; best of two runs each.
* ``worker``: ``stream-dp run`` (one query: count by domain, private keys, ε 1, δ 1e-6;
  k = 10, grace 2 s, idle close 3 s), default path (``input.keyed_by_user: false``: stage 0
  repartitions by pseudonym) and keyed input (``keyed_by_user: true`` with
  ``input.partitioner: crc32``, librdkafka's default placement). Its rate is
  ``stream_dp_events_consumed_total`` on ``/metrics``, polled every 50 ms, from the first
  non-zero reading to the reading that reaches ``N``; its CPU per event is its process CPU
  (``/proc``) between those two readings over the events between them. It then runs until
  every window is released (``stream_dp_windows_released_total``), and is stopped.
* ``--before REV``: the worker of commit ``REV`` (exported with ``git archive``) runs too,
  alternating with this checkout's, on the same topic: a lever's before/after in one run.
* ``--profile``: one more run of each worker mode under ``py-spy record`` (the top
  functions go in the report; the samples in ``bench/profiles/realistic_*.folded``).
* Each contender's measured span is also split (``bench.cpu_split``): its user and system
  CPU, the broker process's CPU and its JIT compiler's share, the machine's idle and steal.
* ``--pin-broker``: the broker's every thread on the last core, this bench and every process
  it starts after the broker (producer, raw consumers, workers) on the others, as a broker on
  its own machine would be: the broker's work no longer takes the CPU the client under test
  waits for. Both sides of every ratio get the same one core fewer.
* ``--workers 1,3 --turns SLICE_S``: as ``--backlog``, then a group's workers take turns on
  the backlog, one running at a time for ``SLICE_S`` seconds (``bench.group_turns``): the
  group's own work per event without the preemption of more processes than cores.
* ``--workers 1,3 --backlog``: as ``--settle``, but the settled group is stopped (SIGSTOP)
  while the stream is produced and resumed after: every worker finds its share waiting, as a
  group does after a pause or an outage, and no producer shares the cores with it. With
  ``--settle`` the stream is produced while the group reads it, so a worker whose partitions
  are small reads a trickle in small batches, and the producer takes CPU from the workers.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import math
import os
import random
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from bench import perf_probe
from bench.cpu_split import process_tree, snapshot, split, split_rows, stat_cpu, stat_fields
from bench.group_turns import Turns, stop_and_wait
from bench.realistic_notes import (
    ANALYSIS,
    CONTENTION_NOTES,
    CONTENTION_TITLE,
    GROUP_EXCESS_NOTES,
    GROUP_EXCESS_TITLE,
    HOST_SPEED_NOTES,
    LABELS,
    LEVERS,
    MACHINE_NOTES,
    MACHINE_TITLE,
    NOTES,
    PERF_NOTES,
    PROBE_RUN_NOTES,
    RUN_NOTES,
)
from bench.sections import splice_section

T = TypeVar("T")
PARTITIONS = 4
USERS = 50_000
DOMAINS = 41
WINDOWS = 10
WINDOW_S = 60
PARETO_SHAPE = 1.2
K = 10
GRACE_S = 2
IDLE_CLOSE_S = 3.0
FETCH_MAX_RECORDS = 10_000
FETCH_PARTITION_BYTES = 4 * 1_048_576
POLL_S = 0.05
#: ``--backlog``'s workers' ``kafka.session_timeout_ms``. They are stopped while the stream is
#: written (about 9 s for 3,600,000 events on Apache Kafka, 12 s at most) and then, with
#: ``--turns``, for (workers - 1) x the slice at a time; under the default 10 s a member's
#: session expired and its partitions' records were read twice (runs ``fifteenth_turns_long``,
#: ``_tunables``). Runs up to ``sixteenth_memory`` had 60 s with the default request timeout,
#: which the product now refuses: the embedded broker holds a new group's first join for half
#: the session timeout, and 30 s is the request timeout (its workers never joined).
BACKLOG_SESSION_TIMEOUT_MS = 30_000
#: ``--backlog``'s workers' ``kafka.request_timeout_ms``: above the session timeout.
BACKLOG_REQUEST_TIMEOUT_MS = 40_000
#: ``--settle``: how long every worker must have been ready before the stream is produced.
SETTLE_S = 3.0
#: ``--settle``: then this long without polling /metrics (an idle worker's own cost).
QUIET_S = 2.0
RUN_TIMEOUT_S = 600.0
RAW_RUNS = 2
REPO = Path(__file__).resolve().parent.parent
RESULTS_FILE = Path(__file__).resolve().parent / "realistic.json"
PROFILES = Path(__file__).resolve().parent / "profiles"
TITLE = "## 12. The realistic stream (issue 43), as an operator measures it"
MODES = {"default": False, "keyed": True}
#: The raw consumers: aiokafka as a plain consumer builds a ConsumerRecord per record; with
#: the worker's fetch adapter (stream_dp/kafka_client/fetched.py) it hands out its parsed records.
RAW_KINDS = ("raw_aiokafka", "raw_aiokafka_adapter", "raw_librdkafka")


# -- the stream -------------------------------------------------------------------------------
def first_window_s(now_s: float) -> int:
    """The first of the 10 windows: they all end at least a minute before ``now_s``."""
    return (int(now_s) // WINDOW_S - WINDOWS - 1) * WINDOW_S


def stream(
    events: int, start_s: int, seed: int = 43, *, even_users: bool = False
) -> tuple[list[bytes], list[bytes]]:
    """(values, keys) of the issue's stream; event ``i`` at ``start_s + (i + ½)·span/N``.
    Its users are few and lopsided (``int(paretovariate(1.2))`` is 1 more than half the
    time: on 400,000 events 645 distinct users, the first with 56.5% of the events, the
    first three with 81%); with ``even_users`` (a diagnostic) each event's user is drawn
    uniformly from :data:`USERS` instead."""
    rng = random.Random(seed)
    span_s = WINDOWS * WINDOW_S
    utc = dt.UTC
    values: list[bytes] = []
    keys: list[bytes] = []
    for i in range(events):
        user = rng.randrange(USERS) if even_users else int(rng.paretovariate(PARETO_SHAPE)) % USERS
        t = dt.datetime.fromtimestamp(start_s + (i + 0.5) * span_s / events, tz=utc)
        value = {
            "user_id": f"user{user}",
            "timestamp": t.isoformat(timespec="milliseconds"),
            "domain": f"d{rng.randrange(DOMAINS)}.com",
        }
        values.append(json.dumps(value).encode())
        keys.append(b"user%d" % user)
    return values, keys


def produce(bootstrap: str, topic: str, values: Sequence[bytes], keys: Sequence[bytes]) -> float:
    """librdkafka as a service's producer would: linger.ms 5, its default partitioner."""
    from confluent_kafka import Producer

    errors: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 5,
            "acks": "all",
            "max.in.flight.requests.per.connection": 1,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
        }
    )
    started = time.perf_counter()
    for i, (value, key) in enumerate(zip(values, keys, strict=True)):
        while True:
            try:
                producer.produce(topic, value, key, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    remaining = producer.flush(120)
    if remaining or errors:
        raise RuntimeError(f"producing to {topic}: {remaining} unsent, errors: {errors[:3]}")
    return time.perf_counter() - started


# -- raw consumers (each in a child process) ------------------------------------------------
class _RawSpan:
    """A raw consumer's measured span: from the end of its first batch that held records
    (``begin_at``, called after every batch) to its last event (``end_at``)."""

    def __init__(self, broker_pid: int | None) -> None:
        self._broker_pid = broker_pid
        self.n0 = 0
        self._t0 = self._c0 = 0.0
        self._s0: dict[str, Any] = {}

    def begin_at(self, n: int) -> None:
        if not self.n0 and n:
            self.n0, self._t0, self._c0 = n, time.perf_counter(), time.process_time()
            self._s0 = snapshot([os.getpid()], self._broker_pid)

    def end_at(self, n: int) -> dict[str, Any]:
        t1, c1 = time.perf_counter(), time.process_time()
        s1 = snapshot([os.getpid()], self._broker_pid)
        return {
            "events": n,
            "span_events": n - self.n0,
            "seconds": t1 - self._t0,
            "cpu_seconds": c1 - self._c0,
            "split": split(self._s0, s1, n - self.n0),
        }


async def _raw_aiokafka(spec: dict[str, Any]) -> dict[str, Any]:
    import orjson
    from aiokafka import AIOKafkaConsumer, TopicPartition

    options: dict[str, Any] = {}
    if spec["kind"] == "raw_aiokafka_adapter":  # the worker's fetch: no ConsumerRecord
        from stream_dp.kafka_client.fetched import fetch_options

        options = fetch_options()
    consumer = AIOKafkaConsumer(
        bootstrap_servers=spec["bootstrap"],
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=FETCH_PARTITION_BYTES,
        **options,
    )
    await consumer.start()
    loads = orjson.loads
    expected = int(spec["events"])
    n = 0
    span = _RawSpan(spec.get("broker_pid"))
    try:
        consumer.assign(
            [TopicPartition(spec["topic"], p) for p in range(spec.get("partitions", PARTITIONS))]
        )
        await consumer.seek_to_beginning()
        while n < expected:
            batch = await consumer.getmany(timeout_ms=200, max_records=FETCH_MAX_RECORDS)
            for msgs in batch.values():
                for m in msgs:
                    loads(m.value)
                n += len(msgs)
            span.begin_at(n)
        return span.end_at(n)
    finally:
        await consumer.stop()


def _raw_librdkafka(spec: dict[str, Any]) -> dict[str, Any]:
    import orjson
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": spec["bootstrap"],
            "group.id": f"raw-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "max.partition.fetch.bytes": FETCH_PARTITION_BYTES,
            # librdkafka pauses a partition's fetches for fetch.queue.backoff.ms (1 s) once
            # its prefetch queue is full; with 0 it refills as consume() drains it.
            "fetch.queue.backoff.ms": 0,
            **spec.get("extra", {}),
        }
    )
    loads = orjson.loads
    expected = int(spec["events"])
    n = 0
    span = _RawSpan(spec.get("broker_pid"))
    try:
        consumer.assign(
            [
                TopicPartition(spec["topic"], p, OFFSET_BEGINNING)
                for p in range(spec.get("partitions", PARTITIONS))
            ]
        )
        while n < expected:
            msgs = consumer.consume(num_messages=FETCH_MAX_RECORDS, timeout=0.2)
            for m in msgs:
                if m.error() is None:
                    loads(m.value())  # type: ignore[arg-type]  # no tombstones here
                    n += 1
            span.begin_at(n)
        return span.end_at(n)
    finally:
        consumer.close()


def _run_raw(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "bench.realistic", "--child", json.dumps({**spec, "kind": kind})],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    result = dict(json.loads(out.stdout.strip().splitlines()[-1]))
    result["events_per_s"] = result["span_events"] / result["seconds"]
    result["cpu_us_per_event"] = result["cpu_seconds"] / result["span_events"] * 1e6
    return result


# -- the worker, as an operator runs it ------------------------------------------------------
def group_config(
    bootstrap: str, topic: str, start_s: int, *, keyed: bool, port: int, backlog: bool
) -> dict[str, Any]:
    """A ``--workers`` group's configuration: :func:`worker_config`, and with ``backlog`` a
    session timeout of :data:`BACKLOG_SESSION_TIMEOUT_MS` (its workers are stopped while the
    stream is written: no heartbeat for that long) and the request timeout above it."""
    config = worker_config(bootstrap, topic, start_s, keyed=keyed, port=port)
    if backlog:
        config["kafka"]["session_timeout_ms"] = BACKLOG_SESSION_TIMEOUT_MS
        config["kafka"]["request_timeout_ms"] = BACKLOG_REQUEST_TIMEOUT_MS
    return config


def worker_config(
    bootstrap: str, topic: str, start_s: int, *, keyed: bool, port: int
) -> dict[str, Any]:
    suffix = uuid.uuid4().hex[:10]
    return {
        "kafka": {"bootstrap_servers": bootstrap, "group_id": f"realistic-{suffix}"},
        "input": {
            "topic": topic,
            "keyed_by_user": keyed,
            # librdkafka's default partitioner (consistent_random) places keys by CRC32.
            **({"partitioner": "crc32"} if keyed else {}),
        },
        "output": {
            "topic": f"realistic-out-{suffix}",
            "dead_letter_topic": f"realistic-dead-{suffix}",
            "ledger_topic": f"realistic-ledger-{suffix}",
            "partials_topic": f"realistic-partials-{suffix}",
            "repartition_topic": f"realistic-repartition-{suffix}",
            "continual_topic": f"realistic-continual-{suffix}",
        },
        "window": {
            "size_s": WINDOW_S,
            "grace_s": GRACE_S,
            "idle_close_s": IDLE_CLOSE_S,
            "start_at": dt.datetime.fromtimestamp(start_s, tz=dt.UTC).isoformat(),
        },
        "privacy": {"epsilon_per_window": 1.0, "delta_per_window": 1e-6},
        "bounds": {"max_contributions_per_window": K},
        "queries": [
            {
                "name": "visits_by_domain",
                "statistic": "count",
                "group_by": ["domain"],
                "epsilon": 1.0,
                "delta": 1e-6,
            }
        ],
        "metrics": {"enabled": True, "host": "127.0.0.1", "port": port},
        "logging": {"level": "WARNING"},
    }


def _scrape(url: str) -> dict[str, float]:
    return scrape_sums(url, SCRAPED, timeout_s=2)


def scrape_sums(url: str, names: tuple[str, ...], *, timeout_s: float) -> dict[str, float]:
    """Each of ``names`` on the exposition at ``url``, summed over its labels (0 when the
    scrape fails or the series is absent)."""
    out = dict.fromkeys(names, 0.0)
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - loopback
            text = response.read().decode()
    except OSError:
        return out
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        name = series.split("{", 1)[0]
        if name in out:
            out[name] += float(value)
    return out


SCRAPED = (
    "stream_dp_events_consumed_total",
    "stream_dp_windows_released_total",
    "stream_dp_late_events_total",
    "stream_dp_bad_records_total",
    "stream_dp_repartition_duplicates_skipped_total",
    "stream_dp_partials_published_total",
    "stream_dp_ready",
    # per worker (--workers): its iterations that fetched something, and its rejoins
    "stream_dp_batch_processing_seconds_count",
    "stream_dp_membership_lost_total",
)


def _cpu_s(pid: int) -> float:
    _, user, system = stat_cpu(f"/proc/{pid}/stat")
    return user + system


def _start_profiler(pid: int, to: Path) -> subprocess.Popen[bytes]:
    """py-spy sampling ``pid`` from now on (only while a thread holds the GIL: the Python
    work, not the waits), until it gets SIGINT."""
    py_spy = str(Path(sys.executable).parent / "py-spy")
    command = [
        py_spy,
        "record",
        "--pid",
        str(pid),
        "--rate",
        "200",
        "--gil",
        "--nonblocking",
        "--format",
        "raw",
        "--output",
        str(to),
    ]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def run_worker(
    bootstrap: str,
    topic: str,
    events: int,
    start_s: int,
    *,
    keyed: bool,
    tree: Path,
    workdir: Path,
    profile_to: Path | None = None,
    workers: int = 1,
    produce_when_ready: Callable[[], object] | None = None,
    broker_pid: int | None = None,
    backlog: bool = False,
    turns_s: float | None = None,
    perf: str | None = None,
) -> dict[str, Any]:
    """``workers`` processes of ``stream-dp run`` of the checkout at ``tree``, in one consumer
    group on ``topic``, timed from their ``/metrics``: the rate from the sum of their
    ``stream_dp_events_consumed_total``, the CPU the sum of their process CPU times.
    ``profile_to``: py-spy samples each worker over the measured span (``<name>.<i>``).
    ``produce_when_ready``: ``topic`` is empty; this writes the stream to it (in a thread)
    once every worker has been ready (``stream_dp_ready``) for :data:`SETTLE_S` in a row —
    the group settled before the first event, as in a deployment that is already running.
    ``backlog``: the workers are stopped while it writes (:func:`_while_stopped`);
    ``turns_s`` too: then they take turns on the backlog, one running at a time for
    ``turns_s`` seconds (:class:`bench.group_turns.Turns`), until every event is consumed.
    ``perf`` (with ``backlog``): :mod:`bench.perf_probe` of that kind on every worker, attached
    while they are stopped; its counts in ``perf_counts``."""
    from stream_dp.broker.process import free_port

    ports = [free_port("127.0.0.1") for _ in range(workers)]
    base = group_config(bootstrap, topic, start_s, keyed=keyed, port=ports[0], backlog=backlog)
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),
        "STREAM_DP_PSEUDONYM_KEY": secrets.token_hex(32),
        "PYTHONWARNINGS": "ignore",
    }
    logs: list[Path] = []
    procs: list[subprocess.Popen[bytes]] = []
    turns: Turns | None = None
    probe = perf_probe.Probe(perf, workdir) if perf else None
    t_start = time.perf_counter()
    try:
        for port in ports:  # one group, one set of topics, one key: only the port differs
            config = {**base, "metrics": {**base["metrics"], "port": port}}
            path = workdir / f"config-{uuid.uuid4().hex[:8]}.json"
            path.write_text(json.dumps(config), encoding="utf-8")
            command = [sys.executable, "-m", "stream_dp.cli.main", "run", "--config", str(path)]
            logs.append(workdir / f"worker-{uuid.uuid4().hex[:8]}.log")
            with logs[-1].open("wb") as handle:
                procs.append(
                    subprocess.Popen(
                        command, stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=tree
                    )
                )
        settled: dict[str, Any] = {}
        stopped_s = 0.0
        if produce_when_ready is not None:
            settled = _settle(procs, ports, logs, t_start)
            if backlog:
                stopped_s = _while_stopped(procs, _attached_first(probe, procs, produce_when_ready))
            else:
                threading.Thread(target=produce_when_ready, daemon=True).start()
        if turns_s is not None and workers > 1:
            urls = [f"http://127.0.0.1:{port}/metrics" for port in ports]
            turns = Turns(
                [p.pid for p in procs],
                turns_s,
                scrape=lambda i: _scrape(urls[i]),
                cpu_s=_cpu_s,
                state=_state,
            )
            turns.start()
        result = _watch(
            procs,
            ports,
            logs,
            events,
            t_start,
            profile_to,
            broker_pid,
            read=turns.read if turns is not None else None,
            on_last=turns.stop if turns is not None else None,
        )
        if backlog:
            result["stopped_s"] = stopped_s
        if turns is not None:
            result["turns"] = {"slice_s": turns_s, "switches": turns.switches}
        for i, idle in enumerate(settled.get("per_worker", [])):
            result["per_worker"][i].update(idle)
    finally:
        if turns is not None:
            turns.stop()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if probe is not None:
        result["perf_counts"] = probe.counts()
    return result


def _attached_first(
    probe: perf_probe.Probe | None,
    procs: Sequence[subprocess.Popen[bytes]],
    work: Callable[[], object],
) -> Callable[[], object]:
    """``work``, preceded by attaching ``probe`` to the (stopped) workers when there is one."""
    if probe is None:
        return work

    def attached_then_work() -> object:
        probe.attach([proc.pid for proc in procs])
        return work()

    return attached_then_work


def _settle(
    procs: list[subprocess.Popen[bytes]], ports: list[int], logs: list[Path], t_start: float
) -> dict[str, Any]:
    """Returns once every worker has reported ``stream_dp_ready`` 1 for SETTLE_S in a row,
    with each worker's start-up (from its start to its first ready reading, rejoins
    included) and its idle CPU per second over those SETTLE_S (ready, nothing to read,
    its /metrics polled every POLL_S as in the measured span)."""
    urls = [f"http://127.0.0.1:{port}/metrics" for port in ports]
    since: float | None = None
    since_cpu: list[float] = []
    ready_at: dict[int, float] = {}
    polls = 0  # since ``since``: each polls every worker's /metrics once
    while True:
        if any(p.poll() is not None for p in procs) or time.perf_counter() - t_start > 120:
            tails = "\n".join(log.read_text()[-3000:] for log in logs)
            raise RuntimeError(f"the workers never all got ready:\n{tails}")
        states = [_scrape(url)["stream_dp_ready"] for url in urls]
        now = time.perf_counter()
        for i, state in enumerate(states):
            if state >= 1:
                ready_at.setdefault(i, now - t_start)
        if sum(states) < len(urls):
            since = None
        elif since is None:
            since, since_cpu, polls = now, [_cpu_s(p.pid) for p in procs], 0
        elif now - since >= SETTLE_S:
            cpus = [_cpu_s(p.pid) for p in procs]
            time.sleep(QUIET_S)  # then no poll: the same workers' CPU without the scrapes
            quiet_s = time.perf_counter() - now
            quiet = [(_cpu_s(p.pid) - cpus[i]) / quiet_s * 1e3 for i, p in enumerate(procs)]
            return {
                "per_worker": [
                    {
                        "ready_after_start_s": ready_at[i],
                        "cpu_at_ready_s": since_cpu[i],
                        "idle_cpu_ms_per_s": (cpus[i] - since_cpu[i]) / (now - since) * 1e3,
                        "quiet_cpu_ms_per_s": quiet[i],
                        "scrapes_per_s": polls / (now - since),
                    }
                    for i in range(len(procs))
                ]
            }
        polls += 1
        time.sleep(POLL_S)


def _while_stopped(procs: Sequence[subprocess.Popen[bytes]], work: Callable[[], object]) -> float:
    """Runs ``work`` with every worker stopped (SIGSTOP), then resumes them (SIGCONT, also
    when ``work`` raises); returns the seconds they were stopped. A stopped process spends no
    CPU, and it misses heartbeats for that long: the backlog's workers run with a session
    timeout of :data:`BACKLOG_SESSION_TIMEOUT_MS` to keep them in the group."""
    started = time.perf_counter()
    try:
        stop_and_wait([proc.pid for proc in procs], _state)
        work()
    finally:
        for proc in procs:
            os.kill(proc.pid, signal.SIGCONT)
    return time.perf_counter() - started


def _state(pid: int) -> str:
    """A process's state letter in /proc (``T``: stopped by a signal)."""
    return stat_fields(f"/proc/{pid}/stat")[1][0]


def _read_with_snapshots(
    pids: list[int], urls: list[str]
) -> tuple[list[dict[str, float]], list[float], list[dict[str, Any]]]:
    """Each worker's /metrics and, right after its answer, its own counters
    (:func:`snapshot`: CPU, faults, switches, memory) and CPU seconds from them: a set that
    describes one moment. A busy worker answers once its iteration ends (up to ~100 ms
    later), so a CPU time read before the request missed that iteration's CPU while its
    count held its events. With three workers scraped in turn, readings taken before and
    after the round differed by 0.06–0.61 µs per event over 1.2M events (run
    ``thirteenth_unpaired``), and by 0.03 for one worker. The counters were taken after the
    round until the seventeenth pass: by a bench sharing two cores with three busy workers,
    a group's splits then summed to 2–6% less than its CPU (median; up to 26%)."""
    scraped, cpus, owns = [], [], []
    for pid, url in zip(pids, urls, strict=True):
        scraped.append(_scrape(url))
        own = snapshot([pid], None)
        owns.append(own)
        cpus.append(own["user"] + own["system"])
    return scraped, cpus, owns


def _watch(
    procs: list[subprocess.Popen[bytes]],
    ports: list[int],
    logs: list[Path],
    events: int,
    t_start: float,
    profile_to: Path | None,
    broker_pid: int | None = None,
    *,
    read: Callable[[], tuple[list[dict[str, float]], list[float]]] | None = None,
    on_last: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Polls every worker's /metrics until all ``events`` are consumed and every window is
    released, then stops them (SIGTERM) and returns the figures. ``read``: the workers'
    readings (default :func:`_read_with_snapshots`); ``on_last``: called once every event
    is consumed."""
    pids = [proc.pid for proc in procs]
    urls = [f"http://127.0.0.1:{port}/metrics" for port in ports]
    #: Each worker's own counters taken with the last reading (the default reader's).
    owns: list[dict[str, Any]] = []
    if read is None:

        def read() -> tuple[list[dict[str, float]], list[float]]:
            scraped, cpus, owns[:] = _read_with_snapshots(pids, urls)
            return scraped, cpus

    profilers: list[subprocess.Popen[bytes]] = []
    first: tuple[float, float, float] | None = None
    last: tuple[float, float, float] | None = None
    last_scraped: list[dict[str, float]] = []
    own_first: dict[int, tuple[float, float, float]] = {}
    own_last: dict[int, tuple[float, float, float]] = {}
    #: Per worker, the reading at which its consumed count last grew (within the span).
    own_change: dict[int, tuple[float, float, float]] = {}
    first_scraped: list[dict[str, float]] = []
    polls_in_span = 0
    first_cpus: list[float] = []
    split_first: dict[str, Any] = {}
    split_last: dict[str, Any] = {}
    #: Each worker's own counters at the span's two ends (its faults and kernel time apart).
    own_split_first: list[dict[str, Any]] = []
    own_split_last: list[dict[str, Any]] = []

    def tail() -> str:
        return "\n".join(log.read_text()[-3000:] for log in logs)

    while True:
        stalled = time.perf_counter() - t_start > RUN_TIMEOUT_S
        if stalled or any(p.poll() is not None for p in procs):
            raise RuntimeError(f"a worker exited or stalled:\n{tail()}")
        scraped, cpus = read()
        t, cpu = time.perf_counter(), sum(cpus)
        m = {name: sum(s[name] for s in scraped) for name in scraped[0]}
        n = m["stream_dp_events_consumed_total"]
        for i, s in enumerate(scraped):  # each worker from its own first consumed event
            n_i = s["stream_dp_events_consumed_total"]
            if n_i > 0 and i not in own_first:
                own_first[i] = (t, cpus[i], n_i)
            if last is None:
                if n_i > own_last.get(i, (0.0, 0.0, 0.0))[2]:
                    own_change[i] = (t, cpus[i], n_i)
                own_last[i] = (t, cpus[i], n_i)
        if first is not None and last is None:
            polls_in_span += 1
        if n > 0 and first is None:
            first, first_cpus, first_scraped = (t, cpu, n), cpus, scraped
            split_first = snapshot(pids, broker_pid)
            own_split_first = list(owns) or [snapshot([pid], None) for pid in pids]
            if profile_to is not None:  # the span the rate is measured over, only
                profilers = [
                    _start_profiler(pid, profile_to.with_suffix(f".{i}"))
                    for i, pid in enumerate(pids)
                ]
        if n >= events and last is None:
            last, last_scraped = (t, cpu, n), scraped
            split_last = snapshot(pids, broker_pid)
            own_split_last = list(owns) or [snapshot([pid], None) for pid in pids]
            if on_last is not None:
                on_last()
            for profiler in profilers:
                profiler.send_signal(signal.SIGINT)
            for profiler in profilers:
                profiler.wait(timeout=60)
        if last is not None and m["stream_dp_windows_released_total"] >= WINDOWS:
            break
        time.sleep(POLL_S)
    t_done, cpu_done = time.perf_counter(), sum(_cpu_s(pid) for pid in pids)
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    codes = [proc.wait(timeout=60) for proc in procs]
    assert first is not None and last is not None
    if last[0] == first[0]:  # a small topic, taken in one poll: from the workers' start
        first, first_cpus = (t_start, 0.0, 0.0), [0.0] * len(procs)
        split_first = split_last  # no span to split
        own_split_first = own_split_last
    iterations = "stream_dp_batch_processing_seconds_count"
    if any(codes):
        raise RuntimeError(f"a worker exited {codes} after SIGTERM:\n{tail()}")
    span_events = last[2] - first[2]
    return {
        "workers": len(procs),
        "events": int(last[2]),
        "span_events": span_events,
        "seconds": last[0] - first[0],
        "cpu_seconds": last[1] - first[1],
        "events_per_s": span_events / (last[0] - first[0]),
        "cpu_us_per_event": (last[1] - first[1]) / span_events * 1e6,
        "split": split(split_first, split_last, span_events),
        "startup_seconds": first[0] - t_start,
        "release_after_last_event_seconds": t_done - last[0],
        "whole_cpu_seconds": cpu_done,
        "late_events": m["stream_dp_late_events_total"],
        "windows_released": m["stream_dp_windows_released_total"],
        "bad_records": m["stream_dp_bad_records_total"],
        # Input records counted more than once (re-read after a rebalance moved a partition
        # before its offsets were committed), and what the repartition hop dropped as seen.
        "events_consumed_final": m["stream_dp_events_consumed_total"],
        "repartition_duplicates_skipped": m["stream_dp_repartition_duplicates_skipped_total"],
        "partials_published": m["stream_dp_partials_published_total"],
        # Per worker: when it first consumed (after the first worker did, in seconds), and
        # its CPU and events from then to the reading that reached every event (so its
        # start-up, when it falls inside the measured span, is left out).
        "per_worker": [
            {
                "first_consumed_after_s": own_first[i][0] - first[0] if i in own_first else None,
                "cpu_seconds": own_last[i][1] - own_first[i][1] if i in own_first else 0.0,
                "events": own_last[i][2] - own_first[i][2] if i in own_first else 0.0,
                "cpu_seconds_in_span": own_last[i][1] - first_cpus[i],
                # Its own consuming stretch: from its first consumed reading to the reading
                # at which its count last grew; the rest of the span it had nothing to read.
                "last_consumed_after_s": own_change[i][0] - first[0] if i in own_change else None,
                "cpu_seconds_consuming": (
                    own_change[i][1] - own_first[i][1] if i in own_change else 0.0
                ),
                "events_in_span": own_last[i][2]
                - (first_scraped[i] if first_scraped else {}).get(
                    "stream_dp_events_consumed_total", 0.0
                ),
                "iterations_in_span": last_scraped[i][iterations]
                - (first_scraped[i][iterations] if first_scraped else 0.0),
                "rejoins": last_scraped[i]["stream_dp_membership_lost_total"],
                # Its own user and kernel time, faults and switches per event over the span.
                "split": split(
                    own_split_first[i],
                    own_split_last[i],
                    own_last[i][2]
                    - (first_scraped[i] if first_scraped else {}).get(
                        "stream_dp_events_consumed_total", 0.0
                    ),
                ),
            }
            for i in range(len(procs))
        ],
        "polls_in_span": polls_in_span,
    }


# -- one broker ------------------------------------------------------------------------------
def _threads(pid: int) -> list[int]:
    """Every thread of ``pid`` and of its descendants (a thread gone meanwhile is left out)."""
    tids: list[int] = []
    for member in process_tree(pid):
        with suppress(FileNotFoundError):
            tids += [int(tid) for tid in os.listdir(f"/proc/{member}/task")]
    return tids


def _own_threads() -> list[int]:
    """This process's threads (its children, the broker among them, left out)."""
    return [int(tid) for tid in os.listdir("/proc/self/task")]


@contextmanager
def pinned(broker_pid: int) -> Iterator[dict[str, list[int]]]:
    """The broker (every thread, its children's too) on the last core this bench may use, the
    bench's own threads (and so everything it starts from now on) on the others; the bench's
    cores given back after. Threads the broker starts later inherit its core."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("--pin-broker needs at least 2 cores")
    broker, clients = {cores[-1]}, set(cores[:-1])
    for tid in _threads(broker_pid):
        with suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, broker)
    for tid in _own_threads():
        os.sched_setaffinity(tid, clients)
    try:
        yield {"broker_cores": sorted(broker), "client_cores": sorted(clients)}
    finally:
        for tid in _own_threads():
            with suppress(ProcessLookupError):
                os.sched_setaffinity(tid, set(cores))


@contextmanager
def spinning(processes: int, load: str = "spin") -> Iterator[None]:
    """``processes`` Python processes busy while the block runs: the sharing of the cores a
    group brings, without a group (``--contend``). ``load``: ``spin``, a busy loop (no
    system calls, next to no memory); ``decode``, this stream's JSON events decoded and
    their ISO-8601 times parsed, 10,000 at a time (memory allocated and freed as a worker's
    batch is, no system calls)."""
    spinners = [
        subprocess.Popen([sys.executable, "-c", CONTEND_LOADS[load]]) for _ in range(processes)
    ]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait(timeout=60)


#: How the tables name the ``--contend`` processes, by their load.
_LOAD_NAMES = {"spin": "spinning processes", "decode": "processes decoding events"}
#: What ``--contend-load`` runs in each of the ``--contend`` processes.
CONTEND_LOADS = {
    "spin": "while True: pass",
    "decode": (
        "import datetime, orjson\n"
        "batch = [orjson.dumps({'user_id': f'user{i}', 'timestamp': "
        "f'2026-12-04T00:{i % 60:02d}:00.000+00:00', 'domain': f'd{i % 41}.com'}) "
        "for i in range(10_000)]\n"
        "while True:\n"
        "    rows = [orjson.loads(b) for b in batch]\n"
        "    times = [datetime.datetime.fromisoformat(r['timestamp']).timestamp() for r in rows]\n"
    ),
}


@contextmanager
def _broker(name: str) -> Iterator[Any]:
    if name == "tansu":
        from stream_dp.broker import EmbeddedBroker

        with EmbeddedBroker() as broker:
            yield broker
        return
    from bench.run import BENCH_BROKER_JVM_OPTIONS
    from stream_dp.broker.apache_kafka import ApacheKafkaBroker

    with ApacheKafkaBroker(jvm_options=BENCH_BROKER_JVM_OPTIONS) as broker:
        yield broker


def measure_broker(
    name: str,
    events: int,
    trees: dict[str, Path],
    *,
    raw_runs: int,
    profile: bool,
    log: Callable[[str], None],
    workers: Sequence[int] = (),
    settle: bool = False,
    pin_broker: bool = False,
    backlog: bool = False,
    turns_s: float | None = None,
    partitions: int = PARTITIONS,
    even_users: bool = False,
    contend: int = 0,
    contend_load: str = "spin",
    perf: str | None = None,
) -> dict[str, Any]:
    """The raw consumers and the workers on one topic of ``partitions`` on a fresh broker;
    with ``workers`` (counts of worker processes), each count in one group instead of the
    single workers; with ``settle`` too, each group on a fresh topic, produced once the
    group is ready (with ``backlog``, while the group is stopped; with ``turns_s`` too, its
    workers then take turns); with ``pin_broker``, the broker on a core of its own
    (``pinned``)."""
    from bench.throughput import create_topics

    start_s = first_window_s(time.time())
    values, keys = stream(events, start_s, even_users=even_users)
    out: dict[str, Any] = {"runs": {}, "load_1min": [os.getloadavg()[0]]}
    with ExitStack() as stack:
        broker = stack.enter_context(_broker(name))
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="realistic-"))
        if pin_broker:
            out["pinned"] = stack.enter_context(pinned(broker.pid))
        bootstrap = broker.bootstrap_servers
        topic = f"realistic-{uuid.uuid4().hex[:8]}"
        asyncio.run(create_topics(bootstrap, [topic], partitions))
        out["produce_seconds"] = produce(bootstrap, topic, values, keys)

        def worker(keyed: bool, tree: Path, n: int = 1, to: Path | None = None) -> dict[str, Any]:
            on, fill = topic, None
            if settle or backlog:  # a fresh, empty topic, filled once the group is ready
                on = f"realistic-{uuid.uuid4().hex[:8]}"
                asyncio.run(create_topics(bootstrap, [on], partitions))

                def fill() -> float:
                    return produce(bootstrap, on, values, keys)

            return run_worker(
                bootstrap,
                on,
                events,
                start_s,
                keyed=keyed,
                tree=tree,
                workdir=Path(tmp),
                profile_to=to,
                workers=n,
                produce_when_ready=fill,
                broker_pid=broker.pid,
                backlog=backlog,
                turns_s=turns_s,
                perf=perf,
            )

        spec = {
            "bootstrap": bootstrap,
            "topic": topic,
            "events": events,
            "broker_pid": broker.pid,
            "partitions": partitions,
        }
        runs: dict[str, list[dict[str, Any]]] = out["runs"]
        for i in range(raw_runs):
            for kind in RAW_KINDS:
                runs.setdefault(kind, []).append(_run_raw(kind, spec))
                log(f"[realistic] {name} {kind} run {i + 1}: {_brief(runs[kind][-1])}")
            if workers:
                for n in workers:
                    for mode, keyed in MODES.items():
                        for label, tree in trees.items():  # --before: alternating
                            r = worker(keyed, tree, n)
                            key = f"workers_{n}_{mode}" + ("_before" if label == "before" else "")
                            runs.setdefault(key, []).append(r)
                            log(
                                f"[realistic] {name} {n} workers {mode} {label} run {i + 1}: "
                                f"{_brief(r)}"
                            )
                            if n == 1 and contend:  # the same worker beside spinners
                                with spinning(contend, contend_load):
                                    r = worker(keyed, tree, n)
                                runs.setdefault(f"{key}_contended", []).append(r)
                                log(
                                    f"[realistic] {name} 1 worker beside {contend} {contend_load} "
                                    f"{mode} {label} run {i + 1}: {_brief(r)}"
                                )
                continue
            for label, tree in trees.items():
                for mode, keyed in MODES.items():
                    r = worker(keyed, tree)
                    runs.setdefault(f"worker_{mode}_{label}", []).append(r)
                    log(f"[realistic] {name} worker {mode} {label} run {i + 1}: {_brief(r)}")
        if profile:
            PROFILES.mkdir(exist_ok=True)
            from bench.profile import fold_functions, top_functions, write_folded

            out["profiles"] = {}
            # With worker counts: the fewest and the most, every worker of the group sampled.
            counts = sorted({min(workers), max(workers)}) if workers else [1]
            for n in counts:
                for mode, keyed in MODES.items():
                    key = f"{n}w_{mode}" if workers else mode
                    raw = Path(tmp) / f"profile-{key}.raw"
                    r = worker(keyed, trees["after"], n, raw)
                    stacks: Counter[str] = Counter()
                    for i in range(n):
                        stacks += fold_functions(raw.with_suffix(f".{i}").read_text("utf-8"))
                    write_folded(stacks, PROFILES / f"realistic_{name}_{key}.folded")
                    out["profiles"][key] = {
                        "events_per_s_under_profiler": r["events_per_s"],
                        "cpu_us_per_event_under_profiler": r["cpu_us_per_event"],
                        "samples": sum(stacks.values()),
                        "top": top_functions(stacks, 20),
                        "spend": spend(stacks),
                    }
                    log(f"[realistic] {name} profile {key}: {sum(stacks.values())} samples")
    out["load_1min"].append(os.getloadavg()[0])
    out["best"] = best_of(out["runs"])
    return out


def best_of(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per contender, the run of the highest rate, with the lowest CPU per event of its runs
    (each figure's best: the machine's load slows a run's wall time far more than its CPU)."""
    out = {}
    for kind, rs in runs.items():
        fastest = max(rs, key=lambda r: r["events_per_s"])
        out[kind] = {**fastest, "cpu_us_per_event": min(r["cpu_us_per_event"] for r in rs)}
    return out


#: Where a worker's GIL samples go, by the first of these (in order) its stack passes through.
SPEND: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("worker start-up: imports", ("_find_and_load",)),
    ("/metrics scrapes (the bench's 50 ms poll)", ("prometheus_client", "ops/http")),
    ("window closes: seal, partials, release", ("seal", "release", "partials", "offload")),
    ("JSON decode, validation, ISO-8601 times", ("decode_columns", "formats/decode.py")),
    ("repartition: stage 1 reading packed records", ("_decode_routed", "formats/packed.py")),
    ("repartition: producing packed records", ("aiokafka/producer", "output_assembler")),
    ("fetch: aiokafka's protocol, batches, records", ("aiokafka", "clients/", "asyncio/streams")),
    ("stage 1: windows, pseudonyms, samples", ("stages/", "privacy/", "windows/")),
)
OTHER = "event loop and the rest"


def spend(stacks: dict[str, int]) -> dict[str, float]:
    """Each :data:`SPEND` category's share of the samples (and :data:`OTHER`)."""
    out = dict.fromkeys([*(name for name, _ in SPEND), OTHER], 0.0)
    total = sum(stacks.values()) or 1
    for stack, count in stacks.items():
        name = next((n for n, marks in SPEND if any(m in stack for m in marks)), OTHER)
        out[name] += count / total
    return out


def _brief(r: dict[str, Any]) -> str:
    return f"{r['events_per_s']:,.0f} events/s, {r['cpu_us_per_event']:.2f} µs CPU/event"


def _export(rev: str, into: Path) -> Path:
    from bench.refactor_parity import export_tree

    export_tree(REPO, rev, into)
    return into


def measure(opts: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="realistic-trees-") as tmp:
        after = _export(opts.after, Path(tmp) / "after") if opts.after else REPO
        trees = {"after": after}
        if opts.before:
            trees = {"before": _export(opts.before, Path(tmp) / "before"), "after": after}
        result: dict[str, Any] = {
            "events": opts.events,
            "before": opts.before,
            "after": opts.after,
            "written": dt.datetime.now(tz=dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "cores": os.cpu_count(),
            "windows": WINDOWS,
            "poll_s": POLL_S,
            "partitions": opts.partitions,
            "even_users": opts.even_users,
            "contend": opts.contend,
            "contend_load": opts.contend_load,
            "perf": opts.perf,
            **(
                {
                    "workers": opts.workers,
                    "settle": opts.settle,
                    "backlog": opts.backlog,
                    "turns_s": opts.turns,
                }
                if opts.workers
                else {}
            ),
            "brokers": {},
        }
        for name in opts.brokers:
            result["brokers"][name] = measure_broker(
                name,
                opts.events,
                trees,
                raw_runs=opts.runs,
                profile=opts.profile,
                log=log,
                workers=opts.workers,
                settle=opts.settle,
                pin_broker=opts.pin_broker,
                backlog=opts.backlog,
                turns_s=opts.turns,
                partitions=opts.partitions,
                even_users=opts.even_users,
                contend=opts.contend,
                contend_load=opts.contend_load,
                perf=opts.perf,
            )
    return result


def ratios(best: dict[str, dict[str, Any]], label: str = "after") -> dict[str, float]:
    """worker / raw by events/s, and raw / worker by CPU per event (higher is better)."""
    out: dict[str, float] = {}
    for mode in MODES:
        w = best.get(f"worker_{mode}_{label}")
        if w is None:
            continue
        for raw in ("raw_aiokafka", "raw_librdkafka"):
            out[f"{mode}/{raw}"] = w["events_per_s"] / best[raw]["events_per_s"]
            out[f"{mode}/{raw} cpu"] = best[raw]["cpu_us_per_event"] / w["cpu_us_per_event"]
    return out


_KINDS = {
    "raw_aiokafka": "raw aiokafka getmany + orjson.loads",
    "raw_librdkafka": "raw librdkafka consume + orjson.loads",
}
_ROWS = {
    **_KINDS,
    "raw_aiokafka_adapter": "raw aiokafka with the worker's fetch adapter + orjson.loads",
}

SPLIT_INTRO = (
    "Where each contender's CPU goes over its measured span (`bench.cpu_split`, medians over "
    "the rounds): its user and kernel (system) time per event, the broker process's CPU per "
    "event meanwhile and how much of it its JIT compiler threads took (a JVM's C1/C2 "
    "compiler: work a broker that has run for days did long ago), and the machine's CPU "
    "time by state (idle, steal: taken by the hypervisor for other guests, softirq: the "
    "kernel's network processing); with runs that recorded them, its minor page faults (a "
    "page the kernel maps on first touch) and its threads' context switches per 1,000 "
    "events (involuntary: the scheduler took the core from it). A group's figures are its "
    "workers' summed:"
)
#: The contenders ``split_rows`` reports, in its order.
_SPLIT_ROWS = {
    **_ROWS,
    **{f"worker_{mode}_after": f"worker, {mode}" for mode in MODES},
    **{f"worker_{mode}_before": f"worker, {mode}, before" for mode in MODES},
}


def _rows(broker: dict[str, Any]) -> list[str]:
    best = best_of(broker["runs"])
    lines = [
        "| contender | events/s | CPU µs/event | ÷ raw aiokafka (events/s) | ÷ raw aiokafka "
        "(CPU per event) | ÷ raw librdkafka (events/s) | ÷ raw librdkafka (CPU per event) |",
        "|---|---|---|---|---|---|---|",
    ]
    names = list(_ROWS) + sorted(k for k in best if k.startswith("worker_"))
    for name in names:
        r = best.get(name)
        if r is None:
            continue
        label = _ROWS.get(name) or name.removeprefix("worker_").replace("_", " path, ")
        if name.startswith("worker_"):
            label = "worker, " + label.replace("keyed path", "keyed input").replace(
                "default path", "default path (repartitioned)"
            )
        cells = [f"{r['events_per_s']:,.0f}", f"{r['cpu_us_per_event']:.2f}"]
        for raw in _KINDS:
            cells += [
                f"{r['events_per_s'] / best[raw]['events_per_s']:.2f}×",
                f"{best[raw]['cpu_us_per_event'] / r['cpu_us_per_event']:.2f}×",
            ]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def busy_share(r: dict[str, Any]) -> float:
    """A contender's CPU time over its measured span: the share of a core it kept busy."""
    return float(r["cpu_us_per_event"] * r["events_per_s"] / 1e6)


def _round_ratios(worker: list[dict[str, Any]], raw: list[dict[str, Any]]) -> list[float]:
    """Each worker run's events/s over raw aiokafka's run of the same round."""
    return [w["events_per_s"] / r["events_per_s"] for w, r in zip(worker, raw, strict=False)]


def _cpu_round_ratios(group: list[dict[str, Any]], base: list[dict[str, Any]]) -> list[float]:
    """Each group run's CPU per event over the same round's run of the fewest workers."""
    pairs = zip(group, base, strict=False)
    return [g["cpu_us_per_event"] / b["cpu_us_per_event"] for g, b in pairs]


def _rounds_rows(broker: dict[str, Any]) -> list[str]:
    """With three rounds or more: each worker against raw aiokafka's run of the same round
    (minutes apart on a shared machine, a round's two runs are seconds apart), the median of
    those ratios, and the share of a core each kept busy."""
    runs = broker["runs"]
    raw = runs.get("raw_aiokafka", [])
    if len(raw) < 3:
        return []
    lines = [
        "| worker ÷ raw aiokafka, round by round | events/s | median | CPU per event | median "
        "| busy share of a core (worker; raw aiokafka) |",
        "|---|---|---|---|---|---|",
    ]
    for mode in MODES:
        worker = runs.get(f"worker_{mode}_after", [])
        pairs = list(zip(worker, raw, strict=False))
        rate = _round_ratios(worker, raw)
        cpu = [r["cpu_us_per_event"] / w["cpu_us_per_event"] for w, r in pairs]
        busy = (
            f"{min(map(busy_share, worker)):.0%}–{max(map(busy_share, worker)):.0%}; "
            f"{min(map(busy_share, raw)):.0%}–{max(map(busy_share, raw)):.0%}"
        )
        lines.append(
            f"| {mode} | {', '.join(f'{v:.2f}' for v in rate)} | {statistics.median(rate):.2f}× "
            f"| {', '.join(f'{v:.2f}' for v in cpu)} | {statistics.median(cpu):.2f}× | {busy} |"
        )
    return lines


def host_speed_rows(kept: dict[str, Any]) -> list[str]:
    """Across the kept single-worker runs of the issue's stream in three rounds or more, per
    broker: raw aiokafka's CPU per event (the median of its runs: how fast the machine was)
    beside the worker's ratio to it by events/s (each worker run against raw aiokafka's run
    of the same round, the median), sorted by the first: whether the ratio moves with the
    machine's speed."""
    rows: list[tuple[str, float, str, list[str]]] = []
    for label, run in kept.items():
        if run.get("workers") or run.get("windows", WINDOWS) != WINDOWS:
            continue
        for name, broker in run["brokers"].items():
            raw = broker["runs"].get("raw_aiokafka", [])
            if len(raw) < 3:  # best of two runs: no round to pair a worker run with
                continue
            cells = []
            for mode in MODES:
                ratio = _round_ratios(broker["runs"].get(f"worker_{mode}_after", []), raw)
                cells.append(f"{statistics.median(ratio):.2f}×" if ratio else "–")
            speed = statistics.median(r["cpu_us_per_event"] for r in raw)
            rows.append((name, speed, label, cells))
    lines = [
        "| broker | raw aiokafka, CPU µs/event (median) | run | rounds | worker default ÷ raw "
        "(events/s, median by round) | worker keyed ÷ raw |",
        "|---|---|---|---|---|---|",
    ]
    for name, speed, label, cells in sorted(rows, key=lambda row: (row[0] != "kafka", row[1])):
        rounds = len(kept[label]["brokers"][name]["runs"]["raw_aiokafka"])
        lines.append(f"| {name} | {speed:.2f} | `{label}` | {rounds} | {' | '.join(cells)} |")
    return lines


def _group_excess(r1: dict[str, Any], r3: dict[str, Any]) -> tuple[float, float] | None:
    """One round's 3 workers less 1 worker (run one after the other on one topic): the
    group's user and kernel CPU per event less the single worker's (µs), each from the
    workers' own splits; None for a round kept before the splits were recorded."""
    if not all("split" in w for w in r1["per_worker"] + r3["per_worker"]):
        return None

    def per_event(r: dict[str, Any], part: str) -> float:
        events = sum(w["events_in_span"] for w in r["per_worker"])
        return float(sum(w["split"][part] * w["events_in_span"] for w in r["per_worker"]) / events)

    return (
        per_event(r3, "user_us_per_event") - per_event(r1, "user_us_per_event"),
        per_event(r3, "system_us_per_event") - per_event(r1, "system_us_per_event"),
    )


def _sign_p(above: int, n: int) -> float:
    """Two-sided sign test: the chance of a split at least this uneven between rounds above
    and below zero if each round were as likely to fall either way."""
    tail = min(above, n - above)
    return float(min(1.0, 2 * sum(math.comb(n, k) for k in range(tail + 1)) / 2**n))


def _paired_rounds(
    kept: dict[str, Any],
    broker: str,
    pair: Callable[[dict[str, Any], dict[str, Any]], T | None],
) -> Iterator[tuple[str, dict[str, Any], list[T]]]:
    """Each kept run on ``broker`` with its rounds of 1 and of 3 workers, both paths, made
    into ``pair``'s values (a round it returns None for is left out); a run with none, or a
    ``--perf`` run (perf's hooks are in its CPU figures: only its counts are read), is
    skipped."""
    for label, run in kept.items():
        if run.get("perf"):
            continue
        runs = run["brokers"].get(broker, {}).get("runs", {})
        values = [
            v
            for mode in MODES
            for r1, r3 in zip(
                runs.get(f"workers_1_{mode}", []), runs.get(f"workers_3_{mode}", []), strict=False
            )
            if (v := pair(r1, r3)) is not None
        ]
        if values:
            yield label, run, values


def group_excess_rows(kept: dict[str, Any], broker: str = "kafka") -> list[str]:
    """Per kept ``--workers 1,3`` run with the workers' own splits on ``broker``, and over
    all of them: 3 workers less 1, round by round, in user and in kernel time per event (the
    median, the rounds above zero, the sign test's p); empty when no run has them. Runs whose
    workers took turns (``--turns``) and runs whose workers ran at once are pooled apart when
    both are kept: the two methods cost the group differently."""
    rows: list[str] = []
    pooled: dict[str, list[tuple[float, float]]] = {}
    for label, run, diffs in _paired_rounds(kept, broker, _group_excess):
        rows.append(_excess_row(f"`{label}`", diffs))
        method = "taking turns" if run.get("turns_s") else "running at once"
        pooled.setdefault(method, []).extend(diffs)
    if not rows:
        return []
    if len(pooled) == 1:
        totals = [_excess_row("**all of them**", next(iter(pooled.values())))]
    else:
        totals = [_excess_row(f"**all of them, {m}**", d) for m, d in sorted(pooled.items())]
    return [
        "| runs | rounds | user µs/event, 3 workers less 1 (median) | rounds above 0 | sign "
        "test p | kernel µs/event, 3 workers less 1 (median) | rounds above 0 | sign test p |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        *totals,
    ]


class MachineRound(NamedTuple):
    """One round's group against the single worker (:func:`_machine_round`)."""

    workers: float  # the workers' CPU per event, 3 ÷ 1
    with_broker: float  # the workers' and the broker's CPU per event, 3 ÷ 1
    workers_kernel_us: float  # the workers' kernel µs per event, 3 less 1
    broker_kernel_us: float  # the broker's kernel µs per event, 3 less 1
    busy_cores: float  # every busy core's time per event, 3 ÷ 1


def _machine_round(r1: dict[str, Any], r3: dict[str, Any]) -> MachineRound | None:
    """One round's group against the single worker, with the broker counted in: workers' CPU
    per event ÷ alone, workers' and broker's ÷ alone, and the workers' and the broker's kernel
    µs per event less alone, and every busy core's time per event ÷ alone; None for a round
    kept without the broker's split or the machine's."""
    needed = ("broker_system_us_per_event", "machine_share")
    if not all(k in r.get("split", {}) for r in (r1, r3) for k in needed):
        return None

    def workers_kernel_us(r: dict[str, Any]) -> float:
        if all("split" in w for w in r["per_worker"]):  # each worker's own, read at its answer
            return _summed(r, "system_us_per_event")
        return float(r["split"]["system_us_per_event"])  # the group's, read after the round

    def broker_us(r: dict[str, Any], part: str = "") -> float:
        split = r["split"]
        if part:
            return float(split[f"broker_{part}_us_per_event"])
        return float(split["broker_user_us_per_event"] + split["broker_system_us_per_event"])

    def machine_us(r: dict[str, Any]) -> float:
        """Every busy core of the machine over the span (/proc/stat: workers, broker, this
        bench, the kernel's threads), per event; the cores cancel in the ratio."""
        share = r["split"]["machine_share"]
        busy = 1.0 - sum(share.get(k, 0.0) for k in ("idle", "iowait", "steal"))
        return float(busy * r["seconds"] / r["span_events"] * 1e6)

    return MachineRound(
        workers=r3["cpu_us_per_event"] / r1["cpu_us_per_event"],
        with_broker=(r3["cpu_us_per_event"] + broker_us(r3))
        / (r1["cpu_us_per_event"] + broker_us(r1)),
        workers_kernel_us=workers_kernel_us(r3) - workers_kernel_us(r1),
        broker_kernel_us=broker_us(r3, "system") - broker_us(r1, "system"),
        busy_cores=machine_us(r3) / machine_us(r1),
    )


def _machine_row(title: str, rounds: list[MachineRound]) -> str:
    def median(part: str) -> float:
        return float(statistics.median(getattr(r, part) for r in rounds))

    above = sum(r.with_broker > 1 for r in rounds)
    cells = [
        f"{median('workers'):.2f}×",
        f"{median('with_broker'):.2f}×",
        f"{above} of {len(rounds)}",
        f"{_sign_p(above, len(rounds)):.2g}",
        f"{median('workers_kernel_us'):+.2f}",
        f"{median('broker_kernel_us'):+.2f}",
        f"{median('busy_cores'):.2f}×",
    ]
    return f"| {title} | {len(rounds)} | {' | '.join(cells)} |"


def machine_rows(kept: dict[str, Any], broker: str = "kafka") -> list[str]:
    """Per kept ``--workers 1,3`` run with the splits on ``broker`` (and pooled over the runs
    whose workers ran at once): 3 workers against 1, round by round, by the workers' CPU per
    event alone and with the broker's, and where the kernel time went (workers, broker)."""
    rows: list[str] = []
    pooled: list[MachineRound] = []
    for label, run, rounds in _paired_rounds(kept, broker, _machine_round):
        turns = run.get("turns_s")
        rows.append(_machine_row(f"`{label}`" + (" (taking turns)" if turns else ""), rounds))
        if not turns:
            pooled += rounds
    if not rows:
        return []
    return [
        "| runs | rounds | workers' CPU/event, 3 ÷ 1 (median) | workers' and broker's CPU/event, "
        "3 ÷ 1 (median) | rounds above 1 | sign test p | workers' kernel µs/event, 3 less 1 "
        "(median) | broker's kernel µs/event, 3 less 1 (median) | the whole machine's busy "
        "CPU/event, 3 ÷ 1 (median) |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        *([_machine_row("**all of them, running at once**", pooled)] if pooled else []),
    ]


def contention_rows(kept: dict[str, Any], broker: str = "kafka") -> list[str]:
    """Per kept ``--contend`` run on ``broker``: the single worker beside spinning processes
    less the single worker alone, and the group less the single worker alone, round by round,
    in user and kernel time per event (as :func:`group_excess_rows`), with the medians of
    their page faults and involuntary context switches per 1,000 events; empty when none."""
    rows: list[str] = []
    for label, run in kept.items():
        if not run.get("contend"):
            continue
        runs = run["brokers"].get(broker, {}).get("runs", {})
        largest = max(run["workers"])
        for title, key in (
            (_contenders(run), "workers_1_{}_contended"),
            (f"{largest} workers", f"workers_{largest}_{{}}"),
        ):
            pairs = [
                (r1, other)
                for mode in MODES
                for r1, other in zip(
                    runs.get(f"workers_1_{mode}", []), runs.get(key.format(mode), []), strict=False
                )
            ]
            diffs = [d for r1, other in pairs if (d := _group_excess(r1, other)) is not None]
            if not diffs:
                continue
            counts = [
                f"{statistics.median(_summed(o, part) - _summed(r1, part) for r1, o in pairs):+.1f}"
                for part in ("faults_per_1k_events", "involuntary_switches_per_1k_events")
            ]
            ratio = statistics.median(
                o["cpu_us_per_event"] / r1["cpu_us_per_event"] for r1, o in pairs
            )
            counts.insert(0, f"{ratio:.2f}×")
            rows.append(_excess_row(f"`{label}`: {title}", diffs, counts))
    if not rows:
        return []
    return [
        "| run: compared with 1 worker alone | rounds | user µs/event, less alone (median) | "
        "rounds above 0 | sign test p | kernel µs/event, less alone (median) | rounds above 0 "
        "| sign test p | CPU µs/event ÷ alone (median) | page faults / 1k events, less alone | "
        "involuntary context switches / 1k events, less alone |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
    ]


def _contenders(run: dict[str, Any]) -> str:
    """How the tables name a ``--contend`` run's single worker and its busy neighbours."""
    return f"1 worker beside {run['contend']} {_LOAD_NAMES[run.get('contend_load', 'spin')]}"


def _summed(r: dict[str, Any], part: str) -> float:
    """A round's ``part`` of its workers' splits, per event over the group (weighted by each
    worker's events)."""
    events = sum(w["events_in_span"] for w in r["per_worker"])
    return float(
        sum(w["split"].get(part, 0.0) * w["events_in_span"] for w in r["per_worker"]) / events
    )


def _excess_row(title: str, diffs: list[tuple[float, float]], extra: Sequence[str] = ()) -> str:
    """A table row: the rounds, then per part (user, kernel) the median difference, the
    rounds above zero and the sign test's p; then ``extra`` cells."""
    cells = []
    for part in (0, 1):
        values = [d[part] for d in diffs]
        above = sum(v > 0 for v in values)
        cells.append(
            f"{statistics.median(values):+.2f} | {above} of {len(values)} | "
            f"{_sign_p(above, len(values)):.2g}"
        )
    return f"| {title} | {len(diffs)} | {' | '.join([*cells, *extra])} |"


def _profile_rows(profile: dict[str, Any], n: int = 15) -> list[str]:
    lines = ["| function | self | inclusive |", "|---|---|---|"]
    for row in profile["top"][:n]:
        lines.append(f"| `{row['function']}` | {row['self']:.1%} | {row['inclusive']:.1%} |")
    return lines


def _spend_rows(
    broker: str, profiles: dict[str, Any], best: dict[str, dict[str, Any]]
) -> list[str]:
    """Where the worker's CPU per event goes: each category's share of the GIL samples
    times the worker's CPU per event (the run's best, after)."""
    modes = [m for m in profiles if "spend" in profiles[m]]
    head = " | ".join(f"{m}: share | {m}: µs/event" for m in modes)
    lines = [
        f"Where the worker's CPU per event goes, {broker} (share of the GIL samples × the "
        "worker's CPU per event; samples leave out work done without the GIL):",
        "",
        f"| spent on | {head} |",
        "|---|" + "---|" * (2 * len(modes)),
    ]
    for category in [*(name for name, _ in SPEND), OTHER]:
        if all(category not in profiles[m]["spend"] for m in modes):
            continue  # a category added after this run was kept
        cells = []
        for m in modes:
            share = profiles[m]["spend"].get(category, 0.0)
            cpu = best[f"worker_{m}_after"]["cpu_us_per_event"]
            cells += [f"{share:.0%}", f"{share * cpu:.2f}"]
        lines.append(f"| {category} | " + " | ".join(cells) + " |")
    return lines


def _busiest(r: dict[str, Any]) -> tuple[float, float, float]:
    """The worker that consumed the most input from its first event on: (its share of those
    events, its CPU per event over them in µs, the other workers' CPU in the measured span
    in seconds)."""
    per = r["per_worker"]
    top = max(range(len(per)), key=lambda i: per[i]["events"])
    events = sum(w["events"] for w in per) or 1.0
    others = sum(w["cpu_seconds_in_span"] for i, w in enumerate(per) if i != top)
    w = per[top]
    return w["events"] / events, w["cpu_seconds"] / max(w["events"], 1.0) * 1e6, others


def _workers_lines(run: dict[str, Any]) -> list[str]:
    """A ``--workers`` run: per broker, CPU per event by the number of workers."""
    lines: list[str] = []
    for name, broker in run["brokers"].items():
        title = {"tansu": "Embedded broker (Tansu)", "kafka": "Apache Kafka 4.1.1"}[name]
        runs = broker["runs"]
        raw = ", ".join(
            f"{_KINDS.get(k, k).split(' +')[0]} {min(r['cpu_us_per_event'] for r in runs[k]):.2f}"
            for k in ("raw_aiokafka", "raw_librdkafka")
            if k in runs
        )
        lines += [
            "",
            f"**{title}** (the raw consumers on the same topic, CPU µs/event: {raw}; load "
            f"average {broker['load_1min'][0]:.1f} at its start, {broker['load_1min'][-1]:.1f} "
            "at its end)",
            "",
            "| path | workers | events/s | CPU µs/event | ÷ 1 worker | each run's CPU µs/event | "
            "÷ 1 worker round by round (median) | "
            "busiest worker: its share of the input, its own CPU µs/event | the other "
            "workers' CPU in the span | input records read twice (rebalances) | the last "
            "worker's first record after the first's |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for mode in MODES:
            base: dict[str, float] = {}
            for n in run["workers"]:
                rs = runs.get(f"workers_{n}_{mode}")
                if not rs:
                    continue
                cpu = min(r["cpu_us_per_event"] for r in rs)
                base = base or {"cpu": cpu}
                rounds = _cpu_round_ratios(rs, runs[f"workers_{run['workers'][0]}_{mode}"])
                busiest = [_busiest(r) for r in rs]
                lags = [
                    max(w["first_consumed_after_s"] or 0.0 for w in r["per_worker"]) for r in rs
                ]
                twice = [r["events_consumed_final"] - run["events"] for r in rs]
                cells = [
                    mode,
                    str(n),
                    f"{max(r['events_per_s'] for r in rs):,.0f}",
                    f"{cpu:.2f}",
                    f"{cpu / base['cpu']:.2f}×",
                    ", ".join(f"{r['cpu_us_per_event']:.2f}" for r in rs),
                    ", ".join(f"{x:.2f}" for x in rounds) + f" ({statistics.median(rounds):.2f}×)",
                    ", ".join(f"{share:.0%} at {own:.2f}" for share, own, _ in busiest),
                    ", ".join(f"{others:.2f} s" for _, _, others in busiest),
                    ", ".join(f"{x:,.0f}" for x in twice),
                    ", ".join(f"{x:.1f} s" for x in lags),
                ]
                lines.append("| " + " | ".join(cells) + " |")
        names = {
            f"workers_{n}_{mode}": f"{n} worker{'s' if n > 1 else ''}, {mode}"
            for mode in MODES
            for n in run["workers"]
        }
        if run.get("contend"):
            names.update(
                {f"workers_1_{mode}_contended": f"{_contenders(run)}, {mode}" for mode in MODES}
            )
        split = split_rows(runs, names)
        if split:
            lines += ["", SPLIT_INTRO, "", *split]
    for name, broker in run["brokers"].items():
        profiles = broker.get("profiles") or {}
        if not profiles:
            continue
        keys = list(profiles)
        best = best_of(broker["runs"])
        lines += [
            "",
            f"Where the workers' CPU per event goes, {name} (every worker of the group sampled by "
            "py-spy at 200 Hz while it holds the GIL, over the measured span; share of the "
            "samples × the CPU per event of that profiled run):",
            "",
            "| spent on | " + " | ".join(f"{k}: share | {k}: µs/event" for k in keys) + " |",
            "|---|" + "---|" * (2 * len(keys)),
        ]
        for category in [*(c for c, _ in SPEND), OTHER]:
            cells = []
            for k in keys:
                share = profiles[k]["spend"].get(category, 0.0)
                cpu = (
                    profiles[k].get("cpu_us_per_event_under_profiler")
                    or best["workers_" + k.replace("w_", "_", 1)]["cpu_us_per_event"]
                )
                cells += [f"{share:.0%}", f"{share * cpu:.2f}"]
            lines.append(f"| {category} | " + " | ".join(cells) + " |")
        lines.append(
            "| py-spy samples | " + " | ".join(f"| {profiles[k]['samples']:,}" for k in keys) + " |"
        )
        under = [profiles[k].get("cpu_us_per_event_under_profiler", float("nan")) for k in keys]
        lines.append(
            "| CPU µs/event of the profiled run | "
            + " | ".join(f"| {cpu:.2f}" for cpu in under)
            + " |"
        )
    return lines


def _process_row(r: dict[str, Any], i: int) -> list[str]:
    """One worker process of a ``--workers --settle`` run: its share, its stretches and CPU."""
    w, span = r["per_worker"][i], r["seconds"]
    events = max(sum(x["events_in_span"] for x in r["per_worker"]), 1.0)
    busy_s = (w["last_consumed_after_s"] or 0.0) - (w["first_consumed_after_s"] or 0.0)
    idle_cpu = w["cpu_seconds_in_span"] - w["cpu_seconds_consuming"]
    own = w["cpu_seconds_consuming"] / max(w["events_in_span"], 1.0) * 1e6
    return [
        f"{w['events_in_span'] / events:.0%}",
        f"{busy_s:.1f} of {span:.1f} s",
        f"{w['cpu_seconds_consuming']:.2f} s ({own:.2f} µs/event)",
        f"{idle_cpu:.2f} s",
        f"{w['iterations_in_span']:,.0f}",
        f"{w['ready_after_start_s']:.1f} s",
        f"{w['idle_cpu_ms_per_s']:.0f} / {w['quiet_cpu_ms_per_s']:.0f}",
        f"{_scrape_cpu_s(r, i):.2f} s",
    ]


def _scrape_cpu_s(r: dict[str, Any], i: int) -> float:
    """The CPU worker ``i`` spent answering the bench's polls of /metrics in the span: the
    polls in the span × its CPU per scrape (its idle CPU polled less quiet, over its scrapes
    per second, measured while the group was settled)."""
    w = r["per_worker"][i]
    per_scrape_s = (w["idle_cpu_ms_per_s"] - w["quiet_cpu_ms_per_s"]) / 1e3 / w["scrapes_per_s"]
    return float(r["polls_in_span"] * max(per_scrape_s, 0.0))


def _without_scrapes(r: dict[str, Any]) -> float:
    """CPU µs per event of a group less the CPU its workers spent answering the bench's polls."""
    scrapes = sum(_scrape_cpu_s(r, i) for i in range(len(r["per_worker"])))
    return float((r["cpu_seconds"] - scrapes) / r["span_events"] * 1e6)


def _per_process_lines(run: dict[str, Any]) -> list[str]:
    """A ``--workers --settle --before`` run: CPU per event before and after, and per
    process where the span's CPU went."""
    lines: list[str] = []
    for name, broker in run["brokers"].items():
        title = {"tansu": "Embedded broker (Tansu)", "kafka": "Apache Kafka 4.1.1"}[name]
        runs = broker["runs"]
        lines += [
            "",
            f"**{title}, per process** (the span: the group's first consumed reading to the "
            "one that reaches every event; a process consumes from its first reading to the "
            "one at which its count last grew, and is idle in the rest of the span; idle CPU "
            "per second measured in the same run over the 3 s the settled group waited, "
            f"its /metrics polled every {POLL_S * 1e3:.0f} ms as in the span; load average "
            f"{broker['load_1min'][0]:.1f} at its start, {broker['load_1min'][-1]:.1f} at its "
            "end)",
            "",
            "| path | workers | tree | CPU µs/event | ÷ 1 worker | less the bench's polls: CPU "
            "µs/event, ÷ 1 worker | process | its share of the events | consuming | CPU "
            "consuming | CPU idle in the span | iterations with records | ready after start | "
            "idle CPU ms/s, polled / quiet | its CPU answering the polls in the span |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for mode in MODES:
            for suffix, tree in (("_before", "before"), ("", "after")):
                base: tuple[float, float] | None = None
                for n in run["workers"]:
                    rs = runs.get(f"workers_{n}_{mode}{suffix}")
                    if not rs:
                        continue
                    r = min(rs, key=lambda x: x["cpu_us_per_event"])
                    base = base or (r["cpu_us_per_event"], _without_scrapes(r))
                    order = sorted(range(n), key=lambda i: -r["per_worker"][i]["events_in_span"])
                    for k, i in enumerate(order):
                        head = [mode, str(n), tree] if k == 0 else ["", "", ""]
                        cpu, net = r["cpu_us_per_event"], _without_scrapes(r)
                        head += (
                            [
                                f"{cpu:.2f}",
                                f"{cpu / base[0]:.2f}×",
                                f"{net:.2f}, {net / base[1]:.2f}×",
                            ]
                            if k == 0
                            else ["", "", ""]
                        )
                        cells = [*head, str(k + 1), *_process_row(r, i)]
                        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _rank_split_lines(run: dict[str, Any]) -> list[str]:
    """A ``--workers`` run whose workers' own CPU splits were recorded: per path, group size
    and rank by share (busiest first), the medians over the rounds of each worker's share of
    the span's events, its user and kernel time per event of its own and its page faults per
    1,000 of them; empty for runs kept before the splits were."""
    lines: list[str] = []
    for name, broker in run["brokers"].items():
        runs = broker["runs"]
        rows: list[str] = []
        for mode in MODES:
            for n in run["workers"]:
                rs = [
                    r
                    for r in runs.get(f"workers_{n}_{mode}", [])
                    if all("split" in w for w in r["per_worker"])
                ]
                for k in range(n if rs else 0):

                    def ranked(r: dict[str, Any], k: int = k) -> dict[str, Any]:
                        per = sorted(r["per_worker"], key=lambda w: -w["events_in_span"])
                        total = max(sum(w["events_in_span"] for w in per), 1.0)
                        return {"share": per[k]["events_in_span"] / total, **per[k]["split"]}

                    at = [ranked(r) for r in rs]

                    def med(part: str, at: list[dict[str, Any]] = at) -> float:
                        return float(statistics.median([x[part] for x in at]))

                    own = med("user_us_per_event") + med("system_us_per_event")
                    new_pages = (
                        f"{med('new_pages_per_1k_events'):,.0f}"
                        if all("new_pages_per_1k_events" in x for x in at)
                        else "–"
                    )
                    rows.append(
                        f"| {mode} | {n} | {k + 1} | {len(at)} | {med('share'):.0%} | "
                        f"{med('user_us_per_event'):.2f} | {med('system_us_per_event'):.2f} | "
                        f"{own:.2f} | {med('faults_per_1k_events'):,.0f} | {new_pages} |"
                    )
        if rows:
            lines += [
                "",
                f"**{name}, each worker on its own** (ranked by its share of the span's input "
                "events; medians over the rounds; its own user and kernel CPU time over the "
                "span per input event it read, so a small share carries its fixed costs, and "
                "on the default path its part of the repartitioned events, over few events)",
                "",
                "| path | workers | rank | rounds | share of the events | user µs/event | "
                "system µs/event | user + system | page faults / 1k events | its peak resident "
                "memory's growth in the span, pages / 1k events |",
                "|---|---|---|---|---|---|---|---|---|---|",
                *rows,
            ]
    return lines


def _cores(run: dict[str, Any]) -> str:
    pins = [b["pinned"] for b in run["brokers"].values() if b.get("pinned")]
    if not pins:
        return f"{run['cores']} cores shared with other engineers' work"
    broker, clients = pins[0]["broker_cores"], pins[0]["client_cores"]
    return (
        f"{run['cores']} cores, the broker pinned to core {', '.join(map(str, broker))} and "
        f"the clients under test to core {', '.join(map(str, clients))} (`--pin-broker`)"
    )


def section(kept: dict[str, Any]) -> list[str]:
    """The RESULTS.md section (markdown lines, title first) from the kept runs."""
    lines = [
        TITLE,
        "",
        "From `python -m bench.realistic` (its own runs, kept in bench/realistic.json by "
        "`--keep`; `bench.run` does not rerun it). Issue 43's stream: "
        f"{next(iter(kept.values()))['events']:,} JSON events "
        '`{"user_id": "user123", "timestamp": "<ISO-8601 with offset>", "domain": "d17.com"}`, '
        f"users `int(paretovariate({PARETO_SHAPE})) % {USERS:,}`, {DOMAINS} domains uniform, "
        f"event times spread evenly over {WINDOWS} one-minute windows that end before the run "
        "(`window.start_at` the first, so every window closes during the run), one topic of "
        f"{PARTITIONS} partitions produced by librdkafka (`linger.ms` 5, keyed by user id, its "
        "default partitioner). One query (count by domain, private keys, ε 1, δ 1e-6), "
        f"k = {K}, grace {GRACE_S} s, idle close {IDLE_CLOSE_S:g} s. The worker is `stream-dp "
        "run` (default path: `input.keyed_by_user: false`, stage 0 repartitions by pseudonym; "
        "keyed input: `keyed_by_user: true`, `partitioner: crc32`, librdkafka's placement); its "
        "rate is `stream_dp_events_consumed_total` on `/metrics` polled every 50 ms, from the "
        "first non-zero reading to the reading that reaches every event — as an operator sees "
        "it — and its CPU per event is its process's CPU time (`/proc`) between those two "
        "readings over the events between them. The raw consumers (aiokafka `getmany`, at most "
        "10,000 records and 4 MB per partition; librdkafka `consume(num_messages=10000)` with "
        "`fetch.queue.backoff.ms` 0) decode every value with `orjson.loads`; rate and CPU from "
        "the end of their first batch to the last event. Best of two runs each, every "
        "contender in a fresh process, all on one topic per broker in one run.",
    ]
    order = list(LABELS)
    for label in sorted(kept, key=lambda name: (order.index(name) if name in order else 99, name)):
        run = kept[label]
        loads = [x for b in run["brokers"].values() for x in b["load_1min"]]
        lines += [
            "",
            f"### {label}: {LABELS.get(label, label)}",
            "",
            f"Run of {run['written']}: before `{run.get('before') or '-'}`, after "
            f"`{run.get('after') or 'the working tree'}`; {_cores(run)}, load average (1 min) "
            f"{min(loads):.1f} to {max(loads):.1f} "
            "(both sides of every ratio equally slowed; events/s vary with it far more than "
            "CPU per event)"
            + (
                f"; /metrics polled every {run['poll_s']:g} s instead of 0.05 s."
                if run.get("poll_s", 0.05) != 0.05
                else "."
            ),
        ]
        if run.get("workers"):
            lines += _workers_lines(run)
            if (run.get("before") and run.get("settle")) or run.get("backlog"):
                lines += _per_process_lines(run)
            lines += _rank_split_lines(run)
            if NOTES.get(label):
                lines += ["", *(f"- {note}" for note in NOTES[label])]
            continue
        for name, broker in run["brokers"].items():
            title = {"tansu": "Embedded broker (Tansu)", "kafka": "Apache Kafka 4.1.1"}[name]
            lines += ["", f"**{title}**", "", *_rows(broker)]
            rounds = _rounds_rows(broker)
            if rounds:
                lines += ["", *rounds]
            split = split_rows(broker["runs"], _SPLIT_ROWS)
            if split:
                lines += ["", SPLIT_INTRO, "", *split]
        if run.get("idle_probe"):
            from bench.idle_probe import NOTES as PROBE_NOTES
            from bench.idle_probe import rows

            # The probe's own notes describe the run kept under "idle"; a later run's probe
            # is described by that run's notes.
            notes = PROBE_NOTES if label == "idle" else PROBE_RUN_NOTES.get(label, [])
            lines += ["", "Where the measured span's wall time goes (`bench.idle_probe`):", ""]
            lines += rows(run["idle_probe"])
            if notes:
                lines += ["", *(f"- {note}" for note in notes)]
        for name, broker in run["brokers"].items():
            profiles = broker.get("profiles") or {}
            if any("spend" in p for p in profiles.values()):
                lines += ["", *_spend_rows(name, profiles, best_of(broker["runs"]))]
            for mode, profile in profiles.items():
                lines += [
                    "",
                    f"Profile, {name}, worker {mode} ({profile['samples']:,} py-spy samples at "
                    "200 Hz, only while a thread holds the GIL, over the measured span; "
                    f"{profile['events_per_s_under_profiler']:,.0f} events/s under the "
                    "profiler):",
                    "",
                    *_profile_rows(profile),
                ]
        notes = RUN_NOTES.get(label, []) + NOTES.get(label, [])
        if notes:
            lines += ["", *[f"- {note}" for note in notes]]
    if ANALYSIS:
        lines += ["", "### What the worker spends per event, and what is left", ""]
        lines += [f"- {note}" for note in ANALYSIS]
    if HOST_SPEED_NOTES:
        lines += ["", "### The ratio and the machine's speed", "", *host_speed_rows(kept)]
        lines += ["", *(f"- {note}" for note in HOST_SPEED_NOTES)]
    for broker, title in (("kafka", "Apache Kafka"), ("tansu", "the embedded broker (Tansu)")):
        pooled_tables = (
            (group_excess_rows, GROUP_EXCESS_TITLE, GROUP_EXCESS_NOTES),
            (contention_rows, CONTENTION_TITLE, CONTENTION_NOTES),
            (machine_rows, MACHINE_TITLE, MACHINE_NOTES),
            (perf_probe.rows, perf_probe.TITLE, PERF_NOTES),
        )
        for rows_of, heading, notes_of in pooled_tables:
            table = rows_of(kept, broker)
            if table:
                lines += ["", heading.format(broker=title), "", *table]
                lines += ["", *(f"- {n}" for n in notes_of.get(broker, []))]
    if LEVERS:
        lines += ["", "### Per lever: what it gains, what it costs, what is left of the gap", ""]
        lines += [f"- {note}" for note in LEVERS]
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=400_000)
    parser.add_argument("--runs", type=int, default=RAW_RUNS)
    parser.add_argument("--brokers", default="tansu,kafka")
    parser.add_argument("--before", help="a commit whose worker runs too (before/after)")
    parser.add_argument("--after", help="the commit whose worker is 'after' (default: this tree)")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument(
        "--workers",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[],
        help="worker processes in one group, e.g. 3 or 1,2,3 (each count in turn, both "
        "paths, instead of the single worker)",
    )
    parser.add_argument("--smoke", action="store_true", help="50,000 events, Tansu, one run")
    parser.add_argument(
        "--keep",
        nargs=2,
        metavar=("LABEL", "RUN_JSON"),
        help="keep a run's output in bench/realistic.json under LABEL, write the section",
    )
    parser.add_argument(
        "--settle",
        action="store_true",
        help="with --workers: each group on a fresh topic, produced once every worker is ready",
    )
    parser.add_argument(
        "--backlog",
        action="store_true",
        help="with --workers: as --settle, the group stopped while the stream is produced",
    )
    parser.add_argument(
        "--turns",
        type=float,
        default=None,
        metavar="SLICE_S",
        help="with --workers: as --backlog, then a group's workers take turns on it, one "
        "running at a time for SLICE_S seconds (a group without preemption on fewer cores)",
    )
    parser.add_argument(
        "--windows",
        type=int,
        default=WINDOWS,
        help="the stream's one-minute windows (a diagnostic: fewer closes in the same events)",
    )
    parser.add_argument(
        "--pin-broker",
        action="store_true",
        help="the broker on the last core, this bench and what it starts on the others",
    )
    parser.add_argument(
        "--poll-s",
        type=float,
        default=POLL_S,
        help="how often /metrics is polled, in seconds (a diagnostic: each answer costs a "
        "worker CPU, so a group of three pays for three per poll)",
    )
    parser.add_argument(
        "--partitions",
        type=int,
        default=PARTITIONS,
        help="the input topic's partitions (a diagnostic: with more partitions than workers, "
        "each worker's share of a skewed stream evens out)",
    )
    parser.add_argument(
        "--even-users",
        action="store_true",
        help="each event's user drawn uniformly from 50,000 (a diagnostic: the issue's users "
        "are few and lopsided, one of them with more than half the events, so one worker of "
        "a group always holds most of the stream)",
    )
    parser.add_argument(
        "--contend",
        type=int,
        default=0,
        metavar="N",
        help="with --workers including 1: each single worker's run repeated beside N "
        "processes spinning on the cores (a control: the sharing of cores a group of N + 1 "
        "brings, without the group)",
    )
    parser.add_argument(
        "--contend-load",
        choices=sorted(CONTEND_LOADS),
        default="spin",
        help="what each --contend process runs: spin (a busy loop) or decode (this stream's "
        "events decoded, memory allocated and freed as a worker's batch is)",
    )
    parser.add_argument(
        "--perf",
        choices=perf_probe.KINDS,
        help="with --backlog: Linux perf on every worker, counting its system calls or its "
        "page faults by the function that took them (bench/perf_probe.py; the run's CPU "
        "figures are then perf's too)",
    )
    parser.add_argument("--render", action="store_true", help="the section from the kept runs")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.child:
        spec = json.loads(opts.child)
        if spec["kind"] in ("raw_aiokafka", "raw_aiokafka_adapter"):
            result = asyncio.run(_raw_aiokafka(spec))
        else:
            result = _raw_librdkafka(spec)
        print(json.dumps(result))
        return
    if (opts.backlog or opts.turns) and not opts.workers:
        parser.error("--backlog and --turns need --workers (a group of worker processes)")
    if opts.contend and 1 not in opts.workers:
        parser.error(
            "--contend needs --workers with 1 among the counts (it repeats the single worker)"
        )
    if opts.perf and not (opts.backlog or opts.turns):
        parser.error("--perf needs --backlog (perf attaches while the group is stopped)")
    if opts.perf and (missing := perf_probe.available()):
        parser.error(f"--perf: {missing}")
    if opts.turns is not None:
        if opts.turns <= 0:
            parser.error("--turns: a slice of more than 0 seconds")
        opts.backlog = True
    if opts.smoke:
        opts.events, opts.runs, opts.brokers = 50_000, 1, "tansu"
    if opts.windows != WINDOWS:  # the stream's, the first window's and the watch's count
        globals()["WINDOWS"] = opts.windows
    if opts.poll_s <= 0:
        parser.error("--poll-s: more than 0 seconds")
    globals()["POLL_S"] = opts.poll_s  # the settled group's and the measured span's polls
    opts.brokers = [b for b in opts.brokers.split(",") if b]

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    if opts.keep:  # a finished run's JSON (its stdout) kept under a label, then rendered
        label, source = opts.keep
        kept = json.loads(RESULTS_FILE.read_text()) if RESULTS_FILE.exists() else {}
        # several run files (one per broker, run side by side): their brokers in one run
        parts = [json.loads(Path(one).read_text()) for one in source.split(",")]
        for part in parts[1:]:
            parts[0]["brokers"].update(part["brokers"])
        kept[label] = parts[0]
        RESULTS_FILE.write_text(json.dumps(kept, indent=1) + "\n", encoding="utf-8")
    if opts.keep or opts.render:
        md = REPO / "bench" / "RESULTS.md"
        kept = json.loads(RESULTS_FILE.read_text())
        md.write_text(splice_section(md.read_text(), TITLE, section(kept)), encoding="utf-8")
        return
    result = measure(opts, log)
    for name, b in result["brokers"].items():
        for key, value in ratios(b["best"]).items():
            log(f"[realistic] {name} {key}: {value:.2f}×")
    print(json.dumps(result))


if __name__ == "__main__":
    if sys.path and sys.path[0] == str(Path(__file__).resolve().parent):
        sys.path.pop(0)
    main()
