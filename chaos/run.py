"""``python -m chaos.run [--minutes M] [--smoke] [--out DIR] [--seed N] [--broker B]``: the
chaos run.

Three ``stream-dp run`` workers in one group on the embedded broker (``--broker tansu``, the
default) or on a real single-node Apache Kafka (``--broker apache-kafka``: Java 17+ and the
jars of ``make kafka-jars``), fed by a live producer
(events stamped now, 1,000 users, ten public domains), and every 20–60 s one fault at random:

- ``kill``: SIGKILL a worker, restart it a second later;
- ``pause``: SIGSTOP a worker for three session timeouts, then SIGCONT;
- ``broker_pause``: SIGSTOP the broker for 10–30 s, then SIGCONT;
- ``malformed``: a burst of 300 malformed records (holding a user id, which must not leak);
- ``slow_ledger``: restart a worker with every ledger write delayed by 1 s;
- ``erasure_burst``: 500 users of their own send an event each to a window 30 s ahead,
  then erasure requests for all of them arrive at once, then one more event each: the
  workers (erasure is on) remove them in one batch off the event loop, answer every request
  within a time limit, and the window, released later, holds none of their events (the
  exact counts below leave them out);
- ``slow_database`` and ``changed_database``: the sink (``stream-dp sink`` into a throw-away
  PostgreSQL, :mod:`chaos.sink`) under a lock held past its lock timeout, and under a NOT NULL
  column added to its table (it must halt, not ready, until the column is rolled back and it
  is restarted).
- ``clock``: restart a worker with its wall clock ``CLOCK_SKEW_S`` fast or slow (libfaketime,
  the monotonic clock left true; skipped without it), inside ``input.max_future_s``: it
  takes partitions at a rebalance with that clock, then the producer pauses for a window,
  its grace and the idle close (a quiet input, where a clock drives event time); the next
  fault that restarts the worker fixes its clock. No window may be released early nor any
  event be lost (the checks below);
- ``restart_while_idle``: stop the producer for longer than a window, restart every worker
  (one after another) while it is stopped, and time the due windows (empty ones included)
  from the last restart until they are out:
  the check "restart while idle" wants them within a window (plus grace, idle close and
  the group's start-up) of the restart, not at one second per second since the first window.
  Each restarted worker must take its partitions before the next is stopped, as in a rollout;
  ``--restart-pacing back-to-back`` (an experiment) does not wait.
- ``partition_count``: two partitions added to the input topic while the producer writes:
  the check "partition count" wants every change named in a worker's WARNING (topic, old and
  new count; the workers ask the broker every few seconds), and "nothing lost" still holds.
  The embedded broker has no CreatePartitions: there the fault is reported as refused.
- ``long_outage``: SIGKILL every worker at once (a lost node or zone gives no worker the
  chance to commit or leave its group, as SIGTERM would), keep producing for ``OUTAGE_S``,
  longer than the deployment's ``output.max_hold_s`` (``MAX_HOLD_S``, short for a run of
  minutes; the internal topics keep their records for the default six hours, so nothing is
  deleted), then start them all again. A window held through the outage pins records older
  than the maximum hold: the restarted workers must catch up on the backlog instead of
  stopping on "held too long". The check "long outage" wants every window due at each
  restart on the output topic before the run goes on (the wait is bounded only by a hang
  guard, ``OUTAGE_HANG_GUARD_S``, from the configured timings with a large margin; the time
  it took is reported, not judged: a loaded machine is slower) and no worker's log to say it
  stopped on the maximum hold; "nothing lost" and "released once" still hold.

The queries run in the noise-free test mode (ε = 1e6: discrete Laplace noise of scale
≤ 1e-6 is 0 except with probability below e^-1e5) and k is far above any user's events per
window, so every released value must equal the exact count of what the producer sent.
A partition is idle only as far as a fetch answer found its reader at the partition's end
(never because a stalled reader delivers nothing), and the producer stamps events as it
sends them; so no event may be late and the check "nothing lost" has no exceptions.

At the end the producer stops, the run waits until every window up to the last event's is
released, stops every worker with SIGTERM and checks: each window released once per query (one
release id), one value per (query, window, key) equal to the ledger's winner, values equal to
the exact counts, no raw user id in any topic, log or ``/metrics``, every worker alive and
exiting 0, and every erasure request of a burst answered ``applied`` before its window's
release began, and every record of the output topic stored by the sink once. The report
(``REPORT.md``) and the RSS plot (``rss.png``) go to ``--out``. The report's command names
the seed (one is drawn when ``--seed`` is not given): ``--seed N`` repeats that run's fault
schedule (the waits, kinds, workers hit, durations and clock skews); what each fault meets
still depends on timing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import random
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import yaml
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic

from chaos.sink import ChaosSink, changed_database, slow_database
from chaos.sink import check as sink_check
from chaos.sink import database as sink_database
from stream_dp.broker import EmbeddedBroker
from stream_dp.broker.apache_kafka import ApacheKafkaBroker
from stream_dp.pipeline.formats.erasure_records import encode_request, new_request_id
from stream_dp.pipeline.formats.ledger import LedgerIndex
from stream_dp.windows.tumbling import epoch_of_iso, iso_utc

WINDOW_S = 5
GRACE_S = 5
IDLE_CLOSE_S = 10
SESSION_TIMEOUT_MS = 2000
USERS = 1000
DOMAINS = [f"d{i}.example" for i in range(10)]
INPUT_PARTITIONS = 6
WORKERS = 3
BROKERS = ("tansu", "apache-kafka")
USER_PREFIX = "chaos-user-"
FAULTS: tuple[str, ...] = (
    "kill", "pause", "broker_pause", "malformed", "slow_ledger", "erasure_burst"
)  # fmt: skip
#: Faults of the sink's database (chaos/sink.py), one entry each.
FAULTS += ("slow_database",)
FAULTS += ("changed_database",)
FAULTS += ("restart_while_idle",)
FAULTS += ("partition_count",)
#: partition_count: partitions added to the input topic per fault.
PARTITIONS_ADDED = 2
FAULTS += ("clock",)
FAULTS += ("long_outage",)
#: The clock error the deployment tolerates (input.max_future_s), and the clock fault's skew
#: inside it: a worker this far fast or slow must lose no event and close no window early.
MAX_FUTURE_S = 30
CLOCK_SKEW_S = 20
#: long_outage: the deployment's output.max_hold_s (its default is half the internal topics'
#: retention, hours), and how long every worker is down: past it, with the producer on. The
#: hold a running group may legitimately reach is a window's life plus three clock skews (a
#: worker slow by the skew holds every window that much longer, its records carry stamps
#: that much older, and a worker fast by it reads every age that much older) plus 30 s for
#: a rebalance after a partition change (the metadata refresh, 10 s, and the rejoin): at
#: 60 s a clock fault and a partition change together stopped a worker at 61 s.
MAX_HOLD_S = WINDOW_S + GRACE_S + IDLE_CLOSE_S + 3 * CLOCK_SKEW_S + 30
OUTAGE_S = MAX_HOLD_S + 15
#: Debian's libfaketime (package faketime), under the architecture's library directory.
LIBFAKETIME = next(iter(sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))), None)
QUERIES = ("visits", "total")
#: erasure_burst: users erased at once; how far ahead of the clock their window starts (the
#: window is still open when the burst is applied); how long every request may take to be
#: answered (generous: a rebalance after a kill may be under way).
ERASURE_BURST_USERS = 500
ERASURE_BURST_AHEAD_S = 30
ERASURE_RESPONSE_TIMEOUT_S = 240


@dataclass(frozen=True)
class Settings:
    minutes: float
    fault_every_s: tuple[float, float]
    broker_pause_s: tuple[float, float]
    rate_per_s: int


FULL = Settings(minutes=20, fault_every_s=(20, 60), broker_pause_s=(10, 30), rate_per_s=100)
SMOKE = Settings(minutes=2, fault_every_s=(8, 14), broker_pause_s=(4, 8), rate_per_s=50)


@dataclass
class Slot:
    """One of the three worker positions; restarts replace its process."""

    index: int
    proc: subprocess.Popen[bytes] | None = None
    logs: list[Path] = field(default_factory=list)
    paused_at: list[float] = field(default_factory=list)


@dataclass
class Fault:
    at_s: float
    kind: str
    detail: str
    #: Wall-clock time, to line faults up with the windows a failed check names.
    wall_s: float = field(default_factory=time.time)


@dataclass(frozen=True)
class ErasureBurst:
    """One erasure_burst fault: its window, requests sent, answered ``applied``, and those
    whose answer says the window's release had begun before the erasure (then it may hold
    the user's events: the check fails, the burst came too late to tell)."""

    window_s: int
    requests: int
    applied: int
    window_already_released: int


@dataclass
class Run:
    settings: Settings
    out: Path
    workdir: Path
    #: The faults' draws (the waits between them, their kinds, the workers they hit, their
    #: durations and clock skews): a run's schedule, the same for a seed (``for_seed``)
    #: whatever its producer did meanwhile.
    rng: random.Random
    #: The produced events' users and domains: the producer draws as often as its pace lets
    #: it, so these draws have a generator of their own and leave the schedule alone.
    events_rng: random.Random = field(default_factory=random.Random)
    started: float = field(default_factory=time.monotonic)
    faults: list[Fault] = field(default_factory=list)
    rss: dict[int, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    #: Per worker, the largest stream_dp_held_record_age_seconds its /metrics showed: how
    #: near output.max_hold_s the run came.
    held_age_max: dict[int, float] = field(default_factory=dict)
    produced: Counter[tuple[int, str]] = field(default_factory=Counter)
    users_seen: set[str] = field(default_factory=set)
    last_event_s: float = 0.0
    erasure_bursts: list[ErasureBurst] = field(default_factory=list)
    #: The sink and its database (chaos/sink.py), once started.
    sink: ChaosSink | None = None
    #: Set while the producer holds off (restart_while_idle).
    producer_held: asyncio.Event = field(default_factory=asyncio.Event)
    #: restart_while_idle: (windows due at the restart, seconds until all were out or None).
    idle_restarts: list[tuple[int, float | None]] = field(default_factory=list)
    #: partition_count faults: (count before, count after); the after is None if refused.
    partition_changes: list[tuple[int, int | None]] = field(default_factory=list)
    #: long_outage: (seconds down, windows due at the restart, seconds until all were out
    #: or None).
    outages: list[tuple[float, int, float | None]] = field(default_factory=list)
    #: restart_while_idle: wait for each restarted worker's "partitions assigned" before
    #: stopping the next (a rollout), or not (``--restart-pacing back-to-back``, an experiment).
    wait_for_rejoin: bool = True

    @classmethod
    def for_seed(
        cls, settings: Settings, out: Path, workdir: Path, seed: int, *, wait_for_rejoin: bool
    ) -> Run:
        """A run whose fault schedule is ``seed``'s (``--seed N`` repeats it; what each fault
        meets still depends on timing), its events drawn apart from it."""
        return cls(
            settings,
            out,
            workdir,
            random.Random(seed),
            random.Random(f"events-{seed}"),
            wait_for_rejoin=wait_for_rejoin,
        )

    def elapsed(self) -> float:
        return time.monotonic() - self.started


def _config(bootstrap: str, first_window_s: int, suffix: str) -> dict[str, Any]:
    return {
        "kafka": {
            "bootstrap_servers": bootstrap,
            "group_id": f"chaos-{suffix}",
            "session_timeout_ms": SESSION_TIMEOUT_MS,
            "heartbeat_interval_ms": 500,
        },
        "input": {"topic": f"chaos-events-{suffix}", "max_future_s": MAX_FUTURE_S},
        "output": {"topic": f"chaos-releases-{suffix}", "max_hold_s": MAX_HOLD_S},
        "window": {
            "size_s": WINDOW_S,
            "grace_s": GRACE_S,
            "idle_close_s": IDLE_CLOSE_S,
            "start_at": iso_utc(first_window_s),
        },
        "privacy": {
            "unsafe_test_mode": True,
            "epsilon_per_window": 2e6,
            "max_epsilon_per_horizon": 1e12,
            "horizon_windows": 24,
        },
        "bounds": {"max_contributions_per_window": 5000},
        "queries": [
            {"name": "visits", "group_by": ["domain"], "epsilon": 1e6, "keys": {"domain": DOMAINS}},
            {"name": "total", "epsilon": 1e6, "keys": {}},
        ],
        "metrics": {"port": 0},
        "logging": {"level": "INFO", "format": "json"},
        "erasure": {
            "enabled": True,
            "requests_topic": f"chaos-erasure-requests-{suffix}",
            "log_topic": f"chaos-erasures-{suffix}",
            "responses_topic": f"chaos-erasure-responses-{suffix}",
        },
    }


def _worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, "STREAM_DP_ALLOW_UNSAFE_TEST_MODE": "1", **(extra or {})}


def _start(slot: Slot, config: Path, run: Run, extra: dict[str, str] | None = None) -> None:
    log = run.workdir / f"worker{slot.index}-{len(slot.logs)}.log"
    slot.logs.append(log)
    with log.open("wb") as handle:
        slot.proc = subprocess.Popen(
            [sys.executable, "-m", "stream_dp.cli.main", "run", "--config", str(config)],
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=_worker_env(extra),
        )


def _rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


HELD_AGE = re.compile(rb"^stream_dp_held_record_age_seconds (\S+)$", re.MULTILINE)


def _held_age(slot: Slot, ports: dict[Path, int]) -> float | None:
    """The worker's stream_dp_held_record_age_seconds now; None if it does not answer (a
    paused or starting worker). ``ports``: each log's metrics port, once read from it."""
    try:
        log = slot.logs[-1] if slot.logs else None
        if log is not None and log not in ports and (found_port := _metrics_port(log)):
            ports[log] = found_port
        port = ports.get(log) if log is not None else None
        if port is None:
            return None
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as response:
            found = HELD_AGE.search(response.read())
    except OSError:
        return None
    return float(found.group(1)) if found else None


async def _sample_workers(run: Run, slots: list[Slot], stop: asyncio.Event) -> None:
    """Every 2 s, each running worker's RSS and held record age."""
    ports: dict[Path, int] = {}
    while not stop.is_set():
        for slot in slots:
            if slot.proc is not None and slot.proc.poll() is None:
                rss = _rss_mib(slot.proc.pid)
                if rss is not None:
                    run.rss[slot.index].append((run.elapsed(), rss))
                age = await asyncio.to_thread(_held_age, slot, ports)
                if age is not None and age > run.held_age_max.get(slot.index, 0.0):
                    run.held_age_max[slot.index] = age
        await asyncio.sleep(2)


async def _produce(run: Run, bootstrap: str, topic: str, stop: asyncio.Event) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20)
    await producer.start()
    pending: list[asyncio.Future[Any]] = []
    try:
        interval = 1.0 / run.settings.rate_per_s
        next_at = time.monotonic()
        while not stop.is_set():
            if run.producer_held.is_set():
                await asyncio.sleep(0.05)
                next_at = time.monotonic()
                continue
            now = time.time()
            user = f"{USER_PREFIX}{run.events_rng.randrange(USERS):06d}"
            domain = DOMAINS[run.events_rng.randrange(len(DOMAINS))]
            event = {"user_id": user, "timestamp": now, "domain": domain}
            pending.append(await producer.send(topic, orjson.dumps(event), key=user.encode()))
            run.produced[(int(now // WINDOW_S) * WINDOW_S, domain)] += 1
            run.users_seen.add(user)
            run.last_event_s = now
            if len(pending) >= 500:
                await asyncio.gather(*pending)
                pending.clear()
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                next_at = time.monotonic()  # behind (a broker pause): do not burst to catch up
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


async def _malformed(bootstrap: str, topic: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        records = [
            b"{not json",
            orjson.dumps({"user_id": f"{USER_PREFIX}leak-check", "timestamp": "soon"}),
            orjson.dumps([f"{USER_PREFIX}leak-check-2", 1]),
            b"\xff\xfe" * 10,
        ]
        futures = [await producer.send(topic, records[i % len(records)]) for i in range(300)]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def _erasure_responses(
    bootstrap: str, topic: str, request_ids: set[str], timeout_s: float
) -> dict[str, dict[str, Any]]:
    """The responses to ``request_ids`` (by request id), read until all are in or the time
    is up."""
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None
    )
    await consumer.start()
    found: dict[str, dict[str, Any]] = {}
    try:
        deadline = time.monotonic() + timeout_s
        while request_ids - found.keys() and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500, max_records=5_000)
            for msgs in batch.values():
                for m in msgs:
                    value = orjson.loads(m.value or b"{}")
                    if value.get("request_id") in request_ids:
                        found[value["request_id"]] = value
    finally:
        await consumer.stop()
    return found


async def _erasure_burst(
    run: Run, bootstrap: str, input_topic: str, erasure: dict[str, Any]
) -> str:
    """``erasure_burst``: events of users of their own in a window 30 s ahead, erasure
    requests for all of them at once, then one more event each once every request is
    answered. None of these events is in ``run.produced``: the window's released counts
    must leave every one of them out (removed from the open window, or dropped on arrival)."""
    n = sum(f.kind == "erasure_burst" for f in run.faults)
    users = [f"{USER_PREFIX}burst{n}-{i:04d}" for i in range(ERASURE_BURST_USERS)]
    window_s = int((time.time() + ERASURE_BURST_AHEAD_S) // WINDOW_S) * WINDOW_S
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20)
    await producer.start()

    async def events() -> None:
        futures = []
        for user in users:
            domain = DOMAINS[run.events_rng.randrange(len(DOMAINS))]
            event = {"user_id": user, "timestamp": window_s + 1.0, "domain": domain}
            futures.append(await producer.send(input_topic, orjson.dumps(event), key=user.encode()))
        await asyncio.gather(*futures)

    try:
        await events()
        ids = {new_request_id() for _ in users}
        now = time.time()
        sent = [
            await producer.send(
                erasure["requests_topic"], encode_request(u, request_id=r, requested_at_s=now)
            )
            for u, r in zip(users, sorted(ids), strict=True)
        ]
        await asyncio.gather(*sent)
        responses = await _erasure_responses(
            bootstrap, erasure["responses_topic"], ids, ERASURE_RESPONSE_TIMEOUT_S
        )
        await events()  # after the burst was applied: dropped on arrival
    finally:
        await producer.stop()
    applied = [r for r in responses.values() if r.get("status") == "applied"]
    late = [r for r in applied if epoch_of_iso(r["open_windows_affected"]["from"]) > window_s]
    burst = ErasureBurst(window_s, len(users), len(applied), len(late))
    run.erasure_bursts.append(burst)
    return (
        f"{len(users)} erasure requests at once for users with events in the window "
        f"{iso_utc(window_s)}: {len(applied)} answered applied in "
        f"{time.time() - now:.0f} s"
    )


async def _until_burst_windows_end(run: Run) -> None:
    """The producer runs on until every burst's window has ended, so the final checks cover
    it (the window's exact count leaves the burst's events out)."""
    ends = [b.window_s + WINDOW_S for b in run.erasure_bursts]
    if ends and (wait_s := max(ends) - time.time()) > 0:
        await asyncio.sleep(wait_s)


async def _fault(
    run: Run,
    kind: str,
    slots: list[Slot],
    broker_pid: int,
    config: Path,
    bootstrap: str,
    input_topic: str,
) -> None:
    slot = slots[run.rng.randrange(len(slots))]
    if kind == "kill":
        assert slot.proc is not None
        slot.proc.kill()
        slot.proc.wait()
        run.faults.append(Fault(run.elapsed(), kind, f"SIGKILL worker {slot.index}"))
        await asyncio.sleep(1)
        _start(slot, config, run)
    elif kind == "pause":
        assert slot.proc is not None
        pause_s = 3 * SESSION_TIMEOUT_MS / 1000
        run.faults.append(Fault(run.elapsed(), kind, f"SIGSTOP worker {slot.index} {pause_s:g} s"))
        slot.proc.send_signal(signal.SIGSTOP)
        slot.paused_at.append(run.elapsed())
        await asyncio.sleep(pause_s)
        slot.proc.send_signal(signal.SIGCONT)
    elif kind == "broker_pause":
        pause_s = run.rng.uniform(*run.settings.broker_pause_s)
        run.faults.append(Fault(run.elapsed(), kind, f"SIGSTOP broker {pause_s:.0f} s"))
        os.kill(broker_pid, signal.SIGSTOP)
        await asyncio.sleep(pause_s)
        os.kill(broker_pid, signal.SIGCONT)
    elif kind == "malformed":
        run.faults.append(Fault(run.elapsed(), kind, "300 malformed records"))
        await _malformed(bootstrap, input_topic)
    elif kind == "slow_ledger":
        assert slot.proc is not None
        run.faults.append(Fault(run.elapsed(), kind, f"worker {slot.index}: ledger writes +1 s"))
        slot.proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(slot.proc.wait, 60)
        _start(slot, config, run, {"STREAM_DP_TEST_LEDGER_DELAY_S": "1.0"})
    elif kind == "erasure_burst":
        erasure = yaml.safe_load(config.read_text(encoding="utf-8"))["erasure"]
        run.faults.append(Fault(run.elapsed(), kind, "erasure burst"))
        run.faults[-1].detail = await _erasure_burst(run, bootstrap, input_topic, erasure)
    elif kind == "slow_database":
        assert run.sink is not None
        run.faults.append(Fault(run.elapsed(), kind, await slow_database(run.sink, run.rng)))
    elif kind == "changed_database":
        assert run.sink is not None
        run.faults.append(Fault(run.elapsed(), kind, await changed_database(run.sink, run.rng)))
    elif kind == "clock":
        await _skewed_clock(run, slot, config)
    elif kind == "restart_while_idle":
        await _restart_while_idle(run, slots, config, bootstrap)
    elif kind == "long_outage":
        await _long_outage(run, slots, config, bootstrap)
    elif kind == "partition_count":
        # A change before a worker took its partitions is no change to it: it starts on it.
        for slot in slots:
            await _rejoined(slot, "partitions taken")
        run.faults.append(
            Fault(run.elapsed(), kind, await _add_partitions(run, bootstrap, input_topic))
        )


async def _add_partitions(run: Run, bootstrap: str, topic: str) -> str:
    """The partition_count fault: PARTITIONS_ADDED more partitions of the input topic."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (described,) = await admin.describe_topics([topic])
        before = len(described["partitions"])
        try:
            await admin.create_partitions({topic: NewPartitions(before + PARTITIONS_ADDED)})
        except Exception as exc:  # noqa: BLE001 - a broker without CreatePartitions: reported
            run.partition_changes.append((before, None))
            return f"input {before} → {before + PARTITIONS_ADDED} partitions refused: {exc!r}"
    finally:
        await admin.close()
    run.partition_changes.append((before, before + PARTITIONS_ADDED))
    return f"input {before} → {before + PARTITIONS_ADDED} partitions"


def _partition_count_check(run: Run, scanned: dict[str, bytes], topic: str) -> Check:
    """Every applied partition_count fault named in some worker's WARNING line."""
    logs = b"\n".join(blob for name, blob in scanned.items() if name.startswith("log "))
    warned = {
        (int(m[0]), int(m[1]))
        for line in logs.splitlines()
        if line.startswith(b"{") and b'"WARNING"' in line
        for m in re.findall(
            rf"topic {re.escape(topic)} changed from (\d+) to (\d+) partitions".encode(), line
        )
    }
    applied = [(a, b) for a, b in run.partition_changes if b is not None]
    unsaid = [change for change in applied if change not in warned]
    refused = len(run.partition_changes) - len(applied)
    return Check(
        "partition count: every change of the input topic named in a WARNING",
        not unsaid,
        f"changes {applied} (refused by the broker: {refused}); not named: {unsaid}",
    )


async def _skewed_clock(run: Run, slot: Slot, config: Path) -> None:
    """Restart the slot's worker with its wall clock CLOCK_SKEW_S fast or slow (libfaketime;
    the monotonic clock stays true, as after an NTP step). It rejoins the group and takes
    partitions with that clock; the next fault that restarts it fixes it."""
    if LIBFAKETIME is None:
        run.faults.append(Fault(run.elapsed(), "clock", "skipped: no libfaketime (faketime)"))
        return
    assert slot.proc is not None
    skew_s = run.rng.choice((CLOCK_SKEW_S, -CLOCK_SKEW_S))
    way = "fast" if skew_s > 0 else "slow"
    run.faults.append(Fault(run.elapsed(), "clock", f"worker {slot.index}: {abs(skew_s)} s {way}"))
    slot.proc.send_signal(signal.SIGTERM)
    await asyncio.to_thread(slot.proc.wait, 60)
    _start(slot, config, run, faked_clock(skew_s))
    await _rejoined(slot)
    # Quiet input, as between sparse events: only then does a clock carry event time (with
    # events, their own times do). A fast clock that moved it would close windows early,
    # and the events after the pause would be late: the check "nothing lost" says so.
    run.producer_held.set()
    try:
        await asyncio.sleep(WINDOW_S + GRACE_S + IDLE_CLOSE_S)
    finally:
        run.producer_held.clear()


def faked_clock(skew_s: float) -> dict[str, str]:
    """A worker's environment for a wall clock ``skew_s`` off (libfaketime, monotonic true)."""
    assert LIBFAKETIME is not None
    return {
        "LD_PRELOAD": str(LIBFAKETIME),
        "FAKETIME": f"{skew_s:+.0f}s",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_NO_CACHE": "1",
    }


#: restart_while_idle: the due windows must be out this long after the restart at most — a
#: window, its grace and the idle close, plus the group's start-up on a loaded machine — and
#: input.max_future_s: a restart trusts its own clock only that far back (beyond, as far as
#: the last release's stamp), the last of it at one second per second.
IDLE_RESTART_BOUND_S = WINDOW_S + GRACE_S + IDLE_CLOSE_S + MAX_FUTURE_S + 30


async def _restart_while_idle(run: Run, slots: list[Slot], config: Path, bootstrap: str) -> None:
    """Hold the producer for longer than a window, restart every worker meanwhile, and time
    the windows due at the last restart until each has its window record.

    One worker after another, as a rolling update does (``--restart-pacing back-to-back``,
    an experiment, skips the wait for each one's rejoin). Stopping all three at once, or back
    to back, left the embedded broker's group coordinator in state "Unknown" with three
    members and no assignment, for minutes, in smoke runs on a loaded machine. That is the
    embedded broker's, as far as it was traced: on Apache Kafka back-to-back rounds had their
    due windows out as fast as a rollout's, the group "Stable" and every stopped member gone
    at once, and no run has reproduced the stuck group since (docs: Architecture, the
    embedded broker's quirks). The embedded broker numbers generations from 0, and aiokafka
    sends no LeaveGroup from generation 0: a worker stopped in the group's first generation
    stays a member until its session has run out and another member joins
    (tests/broker/test_group_leave.py). Each
    round's group, as DescribeGroups sees it, goes to ``group-states.log``."""
    run.faults.append(
        Fault(run.elapsed(), "restart_while_idle", "producer held, every worker restarted in turn")
    )
    run.producer_held.set()
    try:
        held_from = time.time()
        while time.time() < held_from + WINDOW_S + GRACE_S:
            await asyncio.sleep(0.2)  # a window and its grace without events, then restart
        for slot in slots:
            assert slot.proc is not None
            slot.proc.send_signal(signal.SIGTERM)
            await asyncio.to_thread(slot.proc.wait, 60)
            _start(slot, config, run)
            if run.wait_for_rejoin:
                await _rejoined(slot)
        due, taken = await _due_windows_out(run, config, bootstrap, 3 * IDLE_RESTART_BOUND_S)
        run.idle_restarts.append((due, taken))
        run.faults[-1].detail += f"; due windows out after {taken} s"
    finally:
        run.producer_held.clear()


async def _due_windows_out(
    run: Run, config: Path, bootstrap: str, guard_s: float
) -> tuple[int, float | None]:
    """(windows due now, seconds until each had its window record on the output topic, or
    None when ``guard_s`` passed first: a hang guard, the checks judge). The group's state
    goes to ``group-states.log`` every 5 s meanwhile."""
    restarted = time.time()
    data = yaml.safe_load(config.read_text())
    first_s = epoch_of_iso(data["window"]["start_at"])
    last_due = int((restarted - GRACE_S) // WINDOW_S) * WINDOW_S - WINDOW_S
    wanted = {(q, w) for q in QUERIES for w in range(first_s, last_due + 1, WINDOW_S)}
    taken: float | None = None
    probed = 0.0
    while time.time() < restarted + guard_s:
        if wanted <= _window_records(await _read_all(bootstrap, data["output"]["topic"])):
            taken = time.time() - restarted
            break
        if time.time() >= probed + 5:
            probed = time.time()
            await _log_group_state(run, bootstrap, data["kafka"]["group_id"])
        await asyncio.sleep(0.5)
    return len(wanted) // len(QUERIES), taken


#: long_outage: a hang guard only (the check wants every due window out, not a time): the
#: outage's backlog, a window, its grace and the idle close, four times over, for the group's
#: start-up from nothing and the backlog's read on a loaded machine. A catch-up that stops
#: (a worker held on the maximum hold) never ends; this keeps the run from waiting forever.
OUTAGE_HANG_GUARD_S = 4 * (OUTAGE_S + WINDOW_S + GRACE_S + IDLE_CLOSE_S)


async def _long_outage(run: Run, slots: list[Slot], config: Path, bootstrap: str) -> None:
    """SIGKILL every worker, keep producing for OUTAGE_S (past output.max_hold_s), start them
    all again and wait until every window due at the restart is out (module docstring)."""
    for slot in slots:
        assert slot.proc is not None
        slot.proc.kill()
    for slot in slots:
        assert slot.proc is not None
        await asyncio.to_thread(slot.proc.wait, 60)
    run.faults.append(
        Fault(
            run.elapsed(),
            "long_outage",
            f"every worker SIGKILLed for {OUTAGE_S} s (output.max_hold_s = {MAX_HOLD_S} s), "
            "the producer on",
        )
    )
    await asyncio.sleep(OUTAGE_S)
    for slot in slots:
        _start(slot, config, run)
    due, taken = await _due_windows_out(run, config, bootstrap, OUTAGE_HANG_GUARD_S)
    run.outages.append((OUTAGE_S, due, taken))
    out = "never" if taken is None else f"{taken:.0f} s"
    run.faults[-1].detail += f"; the {due} windows due at the restart out after {out}"


#: A worker's ERROR when it stops on the maximum hold (stream_dp.pipeline.stages.hold).
HELD_TOO_LONG = b"more than output.max_hold_s"


def _long_outage_check(run: Run, scanned: dict[str, bytes]) -> Check:
    """The check of the long_outage faults: every window due at each restart out (whatever
    it took: the wait's hang guard is no claim), and no worker stopped on the maximum hold
    (at any time of the run: a running worker held past it is as much a failure)."""
    never = [o for o in run.outages if o[2] is None]
    stopped = sorted(
        name
        for name, blob in scanned.items()
        if name.startswith("log worker")
        and any(
            b'"ERROR"' in line and HELD_TOO_LONG in line
            for line in blob.splitlines()
            if line.startswith(b"{")
        )
    )
    return Check(
        "long outage: every window due at each restart out, no worker stopped on "
        f"output.max_hold_s = {MAX_HOLD_S} s",
        not never and not stopped,
        f"(seconds down, windows due, seconds until out) per outage: {run.outages}; never all "
        f"out: {never} (hang guard {OUTAGE_HANG_GUARD_S} s); logs with a stop on the maximum "
        f"hold: {stopped}",
    )


async def _log_group_state(run: Run, bootstrap: str, group: str) -> None:
    """Append the group's state, as ``kafka-consumer-groups.sh --describe`` shows it (state,
    protocol, members and the size of each one's assignment), to ``group-states.log``. The
    embedded broker answers neither protocol nor assignments (0 B): there the members and the
    state are what tell."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        await admin.start()
        described = [g for r in await admin.describe_consumer_groups([group]) for g in r.groups]
        states = [
            # (error code, group, state, protocol type, protocol, members): per member its id's
            # tail and the size of its assignment (a few bytes: none)
            f"state {g[2]!r} protocol {g[4]!r} error {g[0]} members "
            + ", ".join(f"{m[0][-8:]}:{len(m[4] or b'')}B" for m in g[5])
            for g in described
        ]
        line = f"{run.elapsed():7.1f} s {datetime.now(tz=UTC):%H:%M:%S} {'; '.join(states)}"
    except Exception as exc:  # noqa: BLE001 - a probe for the report, never a reason to stop
        line = f"{run.elapsed():7.1f} s describe failed: {exc!r}"
    finally:
        with contextlib.suppress(Exception):  # a failed start: nothing to close
            await admin.close()
    with (run.workdir / "group-states.log").open("a", encoding="utf-8") as handle:
        handle.write(line + "\n")


#: A restarted worker must be back in its group within this (a hang guard: the run goes on and
#: the idle-restart check judges the windows).
REJOIN_GUARD_S = 120.0


async def _rejoined(slot: Slot, said: str = "partitions assigned") -> None:
    """Wait until the restarted worker has been assigned partitions, as a rolling update waits
    for each replica to be ready before it stops the next. Restarting the three back to back,
    a second time within a minute, left the embedded broker's group without an assignment for
    minutes in smoke runs on a loaded machine (no worker logged a partition); Apache Kafka
    rebalanced back-to-back restarts at once (see :func:`_restart_while_idle`). ``said``: the
    log line that tells (partition_count waits for "partitions taken")."""
    deadline = time.monotonic() + REJOIN_GUARD_S
    while time.monotonic() < deadline:
        if said in slot.logs[-1].read_text(errors="replace"):
            return
        if slot.proc is not None and slot.proc.poll() is not None:
            return  # exited: the checks at the end report it
        await asyncio.sleep(0.2)


def _idle_restart_check(run: Run) -> Check:
    """The check of the restart_while_idle faults (none run: nothing to check)."""
    slow = [(n, t) for n, t in run.idle_restarts if t is None or t > IDLE_RESTART_BOUND_S]
    return Check(
        f"restart while idle: due windows out within {IDLE_RESTART_BOUND_S} s of the restart",
        not slow,
        f"(windows due, seconds until out) per restart: {run.idle_restarts}; too slow: {slow}",
    )


async def _read_all(bootstrap: str, topic: str) -> list[tuple[int, str, bytes]]:
    """Every record of a topic: (partition, key, value), in partition order."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    out: list[tuple[int, str, bytes]] = []
    try:
        parts = consumer.partitions_for_topic(topic)
        deadline = time.monotonic() + 30
        while not parts and time.monotonic() < deadline:
            await consumer._client.force_metadata_update()
            parts = consumer.partitions_for_topic(topic)
        if not parts:
            return []
        consumer.assign([TopicPartition(topic, p) for p in sorted(parts)])
        await consumer.seek_to_beginning()
        quiet = 0
        hang_guard = time.monotonic() + 300
        while quiet < 6 and time.monotonic() < hang_guard:
            batch = await consumer.getmany(timeout_ms=300, max_records=20_000)
            quiet = 0 if batch else quiet + 1
            for tp, msgs in batch.items():
                out += [
                    (tp.partition, (m.key or b"").decode(errors="replace"), m.value or b"")
                    for m in msgs
                ]
    finally:
        await consumer.stop()
    return out


def _window_records(records: list[tuple[int, str, bytes]]) -> set[tuple[str, int]]:
    done = set()
    for _, _, raw in records:
        value = orjson.loads(raw)
        if value.get("kind") == "window":
            done.add((value["query"], epoch_of_iso(value["window_start"])))
    return done


async def _wait_released(
    bootstrap: str, topic: str, last_window_s: int, first_s: int, timeout_s: float
) -> list[tuple[int, str, bytes]]:
    wanted = {(q, w) for q in QUERIES for w in range(first_s, last_window_s + 1, WINDOW_S)}
    deadline = time.monotonic() + timeout_s
    while True:
        records = await _read_all(bootstrap, topic)
        if wanted <= _window_records(records) or time.monotonic() > deadline:
            return records
        await asyncio.sleep(3)


def _metrics_port(log: Path) -> int | None:
    found = re.findall(rb"metrics and health on http://127\.0\.0\.1:(\d+)", log.read_bytes())
    return int(found[-1]) if found else None


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


def _checks(
    run: Run,
    first_s: int,
    last_window_s: int,
    output: list[tuple[int, str, bytes]],
    ledger: list[tuple[int, str, bytes]],
    scanned: dict[str, bytes],
    exits: dict[str, int | None],
) -> list[Check]:
    checks: list[Check] = []
    releases: dict[tuple[str, int], set[str]] = defaultdict(set)
    values: dict[tuple[str, int, str], set[Any]] = defaultdict(set)
    for _, _, raw in output:
        v = orjson.loads(raw)
        ident = (v["query"], epoch_of_iso(v["window_start"]))
        releases[ident].add(v["release_id"])
        if v["kind"] == "release":
            values[(*ident, orjson.dumps(v["group"]).decode())].add(v["value"])
    windows = list(range(first_s, last_window_s + 1, WINDOW_S))
    missing = [(q, iso_utc(w)) for q in QUERIES for w in windows if (q, w) not in releases]
    twice = {k: ids for k, ids in releases.items() if len(ids) > 1}
    checks.append(
        Check(
            "every window released exactly once per query",
            not missing and not twice,
            f"{len(windows)} windows × {len(QUERIES)} queries; missing {missing[:5]}; "
            f"with two release ids {list(twice)[:5]}",
        )
    )
    index = LedgerIndex()
    for _, key, raw in ledger:
        index.feed(key, raw or None)  # b"": a tombstone (of a released window's record)
    split = {k: vs for k, vs in values.items() if len(vs) > 1}
    disagree = []
    for (q, w, group), vs in values.items():
        rel = index.get(q, w)
        ledgered = (
            None
            if rel is None
            else {
                orjson.dumps(r.value["group"]).decode(): r.value["value"]
                for r in rel.records
                if r.value["kind"] == "release"
            }.get(group)
        )
        if ledgered not in vs:
            disagree.append((q, iso_utc(w), group))
    checks.append(
        Check(
            "one value per (query, window, key), the ledger's first complete draw",
            not split and not disagree,
            f"{len(values)} (query, window, key) values; two values: {list(split)[:5]}; "
            f"not the ledger's: {disagree[:5]}; losing draws in the ledger: {index.losing_draws}",
        )
    )
    wrong = []
    for w in windows:
        exact = {d: run.produced[(w, d)] for d in DOMAINS}
        for d in DOMAINS:
            got = values.get(("visits", w, orjson.dumps({"domain": d}).decode()))
            if got != {exact[d]}:
                wrong.append((iso_utc(w), d, exact[d], got))
        got_total = values.get(("total", w, "{}"))
        if got_total != {sum(exact.values())}:
            wrong.append((iso_utc(w), "total", sum(exact.values()), got_total))
    late = {
        name: sum(map(float, re.findall(rb"^stream_dp_late_events_total (\S+)$", blob, re.M)))
        for name, blob in scanned.items()
        if name.startswith("/metrics")
    }
    checks.append(
        Check(
            "nothing lost: released values equal the exact counts produced",
            not wrong,
            f"{sum(run.produced.values()):,} events in {len(windows)} windows; "
            f"mismatches {len(wrong)}: {wrong[:5]}; late events per running worker: {late}",
        )
    )
    leaks = sorted(name for name, blob in scanned.items() if USER_PREFIX.encode() in blob)
    checks.append(
        Check(
            "no raw user id in any topic, log or /metrics",
            not leaks,
            f"scanned {len(scanned)} sources ({', '.join(sorted(scanned))}); leaking: {leaks}",
        )
    )
    bad_exits = {name: code for name, code in exits.items() if code != 0}
    checks.append(
        Check(
            "every worker alive at the end (paused ones included) and exiting 0 on SIGTERM",
            not bad_exits,
            f"exit codes {exits}",
        )
    )
    checks.append(_erasure_burst_check(run))
    return checks


def _erasure_burst_check(run: Run) -> Check:
    """Every request of every burst answered ``applied``, each before its window's release
    began (the window's exact count, checked above, then leaves every burst event out)."""
    bursts = run.erasure_bursts
    unanswered = [
        (iso_utc(b.window_s), b.requests - b.applied) for b in bursts if b.applied < b.requests
    ]
    late = [
        (iso_utc(b.window_s), b.window_already_released)
        for b in bursts
        if b.window_already_released
    ]
    return Check(
        "every erasure of a burst applied in time, its users' events in no released window",
        not unanswered and not late,
        f"{len(bursts)} bursts of {ERASURE_BURST_USERS} requests"
        + (
            f"; not answered 'applied' within {ERASURE_RESPONSE_TIMEOUT_S} s: {unanswered}"
            if unanswered
            else ""
        )
        + (f"; answered after the window's release began: {late}" if late else ""),
    )


def _plot(run: Run, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4))
    for index, samples in sorted(run.rss.items()):
        if samples:
            ax.plot(
                [t / 60 for t, _ in samples],
                [r for _, r in samples],
                label=f"worker {index}",
                linewidth=1,
            )
    palette = ["red", "orange", "purple", "gray", "green", "blue", "brown", "olive", "cyan"]
    colors = dict(zip(FAULTS, itertools.cycle(palette), strict=False))
    for kind in FAULTS:
        times = [f.at_s / 60 for f in run.faults if f.kind == kind]
        for i, t in enumerate(times):
            ax.axvline(
                t, color=colors[kind], alpha=0.5, linewidth=0.8, label=kind if i == 0 else None
            )
    ax.set_xlabel("minutes")
    ax.set_ylabel("RSS (MiB)")
    ax.set_title("stream-dp chaos run: resident memory per worker, faults marked")
    ax.legend(loc="upper left", fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _report(run: Run, checks: list[Check], path: Path, command: str) -> None:
    rss_end = {i: s[-1][1] for i, s in run.rss.items() if s}
    rss_max = {i: max(r for _, r in s) for i, s in run.rss.items() if s}
    lines = [
        "# Chaos run",
        "",
        f"- Date: {datetime.now(tz=UTC).strftime('%Y-%m-%d %H:%M UTC')}; command: `{command}`",
        f"- Duration: {run.settings.minutes:g} min of faults; {WORKERS} workers, "
        f"{INPUT_PARTITIONS} input partitions, windows of {WINDOW_S} s (grace {GRACE_S} s, "
        f"idle close {IDLE_CLOSE_S} s), unkeyed input (the default path), "
        f"{run.settings.rate_per_s} events/s from {USERS} users, noise-free test mode; "
        f"output.max_hold_s {MAX_HOLD_S} s, internal topics' retention the default.",
        f"- Faults every {run.settings.fault_every_s[0]:g}–{run.settings.fault_every_s[1]:g} s: "
        f"{dict(Counter(f.kind for f in run.faults))}",
        f"- RSS per worker at the end (MiB): {rss_end}; maximum: {rss_max}",
        "- Largest held record age per worker (s, by its own clock; output.max_hold_s "
        f"{MAX_HOLD_S} s): { {i: round(a, 1) for i, a in sorted(run.held_age_max.items())} }",
        "",
        "## Checks",
        "",
        "| check | result | detail |",
        "|---|---|---|",
        *[f"| {c.name} | {'PASS' if c.ok else 'FAIL'} | {c.detail} |" for c in checks],
        "",
        "![RSS per worker](rss.png)",
        "",
        "## Faults",
        "",
        "| at (s) | UTC | fault | detail |",
        "|---|---|---|---|",
        *[
            f"| {f.at_s:.0f} | {datetime.fromtimestamp(f.wall_s, tz=UTC):%H:%M:%S} | {f.kind} "
            f"| {f.detail} |"
            for f in run.faults
        ],
        "",
    ]
    path.write_text("\n".join(lines), encoding="utf-8")


async def _start_broker(kind: str) -> EmbeddedBroker | ApacheKafkaBroker:
    if kind == "apache-kafka":
        # Started from this (the main) thread: the JVM dies with it (PR_SET_PDEATHSIG).
        return ApacheKafkaBroker().start()
    return await EmbeddedBroker().astart()


async def chaos(
    settings: Settings,
    out: Path,
    seed: int,
    command: str,
    broker_kind: str = "tansu",
    faults: tuple[str, ...] = FAULTS,
    wait_for_rejoin: bool = True,
) -> bool:
    out.mkdir(parents=True, exist_ok=True)
    workdir = out / "run"
    workdir.mkdir(exist_ok=True)
    run = Run.for_seed(settings, out, workdir, seed, wait_for_rejoin=wait_for_rejoin)
    suffix = secrets.token_hex(4)
    broker = await _start_broker(broker_kind)
    bootstrap = broker.bootstrap_servers
    os.environ["STREAM_DP_PSEUDONYM_KEY"] = secrets.token_hex(32)
    first_s = int(time.time() // WINDOW_S) * WINDOW_S
    data = _config(bootstrap, first_s, suffix)
    config = workdir / "config.yaml"
    config.write_text(yaml.safe_dump(data), encoding="utf-8")
    input_topic = data["input"]["topic"]
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(input_topic, INPUT_PARTITIONS, 1)])
    await admin.close()
    slots = [Slot(i) for i in range(WORKERS)]
    for slot in slots:
        _start(slot, config, run)
    postgres = contextlib.ExitStack()
    run.sink = ChaosSink(postgres.enter_context(sink_database()), config, workdir)
    run.sink.start()
    stop_producing, stop_sampling = asyncio.Event(), asyncio.Event()
    producer = asyncio.create_task(_produce(run, bootstrap, input_topic, stop_producing))
    sampler = asyncio.create_task(_sample_workers(run, slots, stop_sampling))
    try:
        end = run.elapsed() + settings.minutes * 60
        while run.elapsed() < end:
            await asyncio.sleep(run.rng.uniform(*settings.fault_every_s))
            if run.elapsed() >= end:
                break
            kind = run.rng.choice(faults)
            await _fault(run, kind, slots, broker.pid, config, bootstrap, input_topic)
            print(f"[chaos] {run.elapsed():6.0f} s  {run.faults[-1].detail}", flush=True)
        await _until_burst_windows_end(run)
        stop_producing.set()
        await producer
        last_window_s = int(run.last_event_s // WINDOW_S) * WINDOW_S
        await _wait_released(
            bootstrap, data["output"]["topic"], last_window_s, first_s, timeout_s=300
        )
        scanned: dict[str, bytes] = {}
        for slot in slots:
            if slot.proc is not None and slot.proc.poll() is None:
                port = _metrics_port(slot.logs[-1])
                if port is not None:
                    with urllib.request.urlopen(
                        f"http://127.0.0.1:{port}/metrics", timeout=10
                    ) as response:
                        scanned[f"/metrics worker {slot.index}"] = response.read()
        # Stop the workers before reading the internal topics: they write watermarks and
        # progress marks every second, so a reader would never see them go quiet.
        exits: dict[str, int | None] = {}
        for slot in slots:
            assert slot.proc is not None
            alive = slot.proc.poll() is None
            slot.proc.send_signal(signal.SIGTERM)
            try:
                code = await asyncio.to_thread(slot.proc.wait, 60)
            except subprocess.TimeoutExpired:
                slot.proc.kill()
                code = None
            exits[f"worker {slot.index}"] = code if alive else None
        group = data["kafka"]["group_id"]
        topics = {
            "output": data["output"]["topic"],
            "ledger": f"{group}.ledger",
            "partials": f"{group}.partials",
            "repartition": f"{group}.repartition",
            "dead-letter": f"{group}.dead-letter",
            "erasure log": data["erasure"]["log_topic"],
            "erasure responses": data["erasure"]["responses_topic"],
        }
        records: dict[str, list[tuple[int, str, bytes]]] = {}
        for name, topic in topics.items():
            records[name] = await _read_all(bootstrap, topic)
            scanned[f"topic {name}"] = b"\n".join(k.encode() + v for _, k, v in records[name])
        output = records["output"]
        for slot in slots:
            for log in slot.logs:
                scanned[f"log {log.name}"] = log.read_bytes()
        sink_ok, sink_detail = await sink_check(run.sink, output)
        for log in run.sink.logs:
            scanned[f"log {log.name}"] = log.read_bytes()
        checks = _checks(run, first_s, last_window_s, output, records["ledger"], scanned, exits)
        checks.append(
            Check(
                "the sink stored every released record once, through a slow and a changed "
                "database (halted, not ready, until fixed and restarted)",
                sink_ok,
                sink_detail,
            )
        )
        checks.append(_idle_restart_check(run))
        checks.append(_partition_count_check(run, scanned, input_topic))
        checks.append(_long_outage_check(run, scanned))
    finally:
        stop_sampling.set()
        await sampler
        for slot in slots:
            if slot.proc is not None and slot.proc.poll() is None:
                slot.proc.kill()
        if run.sink.proc is not None and run.sink.proc.poll() is None:
            run.sink.proc.kill()
        postgres.close()
        broker.stop()
    _plot(run, out / "rss.png")
    _report(run, checks, out / "REPORT.md", command)
    for check in checks:
        print(f"[chaos] {'PASS' if check.ok else 'FAIL'}  {check.name}: {check.detail}")
    return all(check.ok for check in checks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos.run", description=__doc__)
    parser.add_argument("--minutes", type=float, help="how long faults go on")
    parser.add_argument("--smoke", action="store_true", help="short faults, for make test")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--broker", choices=BROKERS, default="tansu", help="which broker")
    parser.add_argument(
        "--restart-pacing",
        choices=("rollout", "back-to-back"),
        default="rollout",
        help="restart_while_idle: wait for each restarted worker's 'partitions assigned' before "
        "stopping the next (rollout, the default), or not (back-to-back: an experiment that "
        "restarts faster than a rollout may; its restart-while-idle check may fail)",
    )
    parser.add_argument(
        "--faults",
        type=lambda text: tuple(text.split(",")),
        default=FAULTS,
        help=f"the faults to draw from, comma-separated (default: all of {','.join(FAULTS)})",
    )
    args = parser.parse_args(argv)
    if unknown := set(args.faults) - set(FAULTS):
        parser.error(f"--faults: unknown {sorted(unknown)}; known: {', '.join(FAULTS)}")
    base = SMOKE if args.smoke else FULL
    settings = Settings(
        minutes=args.minutes if args.minutes is not None else base.minutes,
        fault_every_s=base.fault_every_s,
        broker_pause_s=base.broker_pause_s,
        rate_per_s=base.rate_per_s,
    )
    seed = args.seed if args.seed is not None else secrets.randbits(32)
    given = list(argv if argv is not None else sys.argv[1:])
    # The report's command repeats the run's fault schedule: the seed drawn is named in it.
    command = " ".join(
        ["python -m chaos.run", *given, *([] if args.seed is not None else ["--seed", str(seed)])]
    )
    print(f"[chaos] seed {seed}; broker {args.broker}; {settings}", flush=True)
    ok = asyncio.run(
        chaos(
            settings,
            args.out,
            seed,
            command,
            args.broker,
            args.faults,
            wait_for_rejoin=args.restart_pacing == "rollout",
        )
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
