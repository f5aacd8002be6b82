"""Helpers for integration tests against the embedded broker: produce, read back, run workers."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from prometheus_client.parser import text_string_to_metric_families

from stream_dp.broker.topics import apply_topics
from stream_dp.config import Config, load_config

Record = tuple[str | None, dict[str, Any]]

#: The least time a wait on a condition (records on a topic, a settled group) gives before
#: it fails: these waits end as soon as the condition holds, so the bound only guards
#: against a hang, and must hold on a loaded 2-core CI machine.
HANG_GUARD_S = 300.0

#: ``privacy`` of a noise-free test run (the workers get STREAM_DP_ALLOW_UNSAFE_TEST_MODE from
#: the fixtures): released values equal the exact bounded ones, so tests compare counts.
NOISE_FREE = {"unsafe_test_mode": True, "epsilon_per_window": 2e6, "max_epsilon_per_horizon": 1e12}


def noise_free(epsilon_per_window: float) -> dict[str, Any]:
    """:data:`NOISE_FREE` with another ``epsilon_per_window`` (the sum of the queries' ε)."""
    return {**NOISE_FREE, "epsilon_per_window": epsilon_per_window}


#: One count query, visits per domain, on the single public key ``a.example``.
ONE_PUBLIC_KEY_QUERY = [
    {"name": "visits", "group_by": ["domain"], "epsilon": 1e6, "keys": {"domain": ["a.example"]}}
]


async def produce(
    bootstrap: str, topic: str, values: Iterable[bytes], key_of: Callable[[bytes], bytes | None]
) -> int:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    n = 0
    try:
        futures = []
        for v in values:
            futures.append(await producer.send(topic, v, key=key_of(v)))
            n += 1
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return n


async def produce_records(
    bootstrap: str, topic: str, records: Iterable[tuple[bytes | None, bytes]]
) -> int:
    """(key, value) records as given (key None: the producer picks a partition)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        futures = [await producer.send(topic, v, key=k) for k, v in records]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return len(futures)


async def produce_events(bootstrap: str, topic: str, events: Iterable[dict[str, Any]]) -> int:
    """Events as JSON, keyed by user id (as producers should)."""
    encoded = [orjson.dumps(e) for e in events]

    def key_of(v: bytes) -> bytes | None:
        uid = orjson.loads(v).get("user_id")
        return None if uid is None else str(uid).encode()

    return await produce(bootstrap, topic, encoded, key_of)


async def read_topic(
    bootstrap: str,
    topic: str,
    *,
    until: Callable[[list[tuple[str | None, bytes]]], bool] | None = None,
    timeout_s: float = 60.0,
    settle_s: float = 0.0,
    since_s: float | None = None,
    headers_out: list[dict[str, bytes]] | None = None,
) -> list[tuple[str | None, bytes]]:
    """All records of a topic from the beginning (manual assignment, no group); with
    ``since_s``, only those stamped at or after that wall-clock time (``time.time()``).
    ``headers_out``, when given, receives each returned record's headers (name → value), in
    the same order. Tombstones (the ledger's, of released windows' records) are skipped.

    Reads until ``until(records)`` holds (then ``settle_s`` more to catch duplicates) or the
    deadline passes; without ``until``, reads until nothing new arrives for 1 s. With
    ``until`` the deadline is a hang guard only (the read returns as soon as the condition
    holds), so it is at least :data:`HANG_GUARD_S`: a loaded 2-core CI machine is slow.
    """
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    out: list[tuple[str | None, bytes]] = []
    try:
        parts = await _partitions(consumer, topic)
        consumer.assign([TopicPartition(topic, p) for p in parts])
        await consumer.seek_to_beginning()
        since_ms = -1 if since_s is None else since_s * 1000
        if until is not None:
            timeout_s = max(timeout_s, HANG_GUARD_S)
        deadline = time.monotonic() + timeout_s
        satisfied_at: float | None = None
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            for msgs in batch.values():
                for m in msgs:
                    if m.timestamp >= since_ms and m.value is not None:
                        out.append((m.key.decode() if m.key else None, m.value))
                        if headers_out is not None:
                            headers_out.append(dict(m.headers))
            now = time.monotonic()
            if batch:
                quiet_since = now
            if until is None:
                if now - quiet_since >= 1.0:
                    return out
                continue
            if satisfied_at is None and until(out):
                satisfied_at = now
            if satisfied_at is not None and now - satisfied_at >= settle_s:
                return out
        if until is not None:
            raise AssertionError(
                f"timed out after {timeout_s} s reading {topic}: {len(out)} records"
            )
        return out
    finally:
        await consumer.stop()


async def _partitions(consumer: AIOKafkaConsumer, topic: str) -> list[int]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        parts = consumer.partitions_for_topic(topic)
        if parts:
            return sorted(parts)
        await consumer._client.force_metadata_update()
        await asyncio.sleep(0.1)
    raise AssertionError(f"topic {topic} has no partitions")


def decode_values(records: Sequence[tuple[str | None, bytes]]) -> list[Record]:
    return [(k, orjson.loads(v)) for k, v in records]


def windows_done(
    queries: Sequence[str], n_windows: int
) -> Callable[[list[tuple[str | None, bytes]]], bool]:
    """``until`` predicate: a window record for every (query, window)."""

    def check(records: list[tuple[str | None, bytes]]) -> bool:
        seen = set()
        for _, v in records:
            d = orjson.loads(v)
            if d.get("kind") == "window":
                seen.add((d["query"], d["window_start"]))
        return len(seen) >= len(queries) * n_windows

    return check


@dataclass
class WorkerProcess:
    proc: subprocess.Popen[bytes]
    log_path: Path

    def terminate(self, timeout_s: float = 60.0) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout_s)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_worker(
    config_path: Path, log_path: Path, env: dict[str, str] | None = None
) -> WorkerProcess:
    """``stream-dp run`` as a real subprocess (so it can be SIGTERMed or SIGKILLed)."""
    full_env = {**os.environ, **(env or {})}
    handle = log_path.open("ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "stream_dp.cli.main", "run", "--config", str(config_path)],
        stdout=handle,
        stderr=subprocess.STDOUT,
        env=full_env,
    )
    handle.close()
    return WorkerProcess(proc, log_path)


def topics_of(config_path: Path) -> dict[str, str]:
    c = load_config(config_path)
    return {
        "input": c.input.topic,
        "output": c.output.topic,
        "dead_letter": c.output.dead_letter_topic,
        "ledger": c.output.ledger_topic,
    }


async def run_worker_until_windows(
    bootstrap: str,
    config_path: Path,
    log_path: Path,
    queries: Sequence[str],
    n_windows: int,
    *,
    env: dict[str, str] | None = None,
    timeout_s: float = 60.0,
    settle_s: float = 0.0,
) -> tuple[list[tuple[str | None, bytes]], WorkerProcess]:
    """Start ``stream-dp run``, read the output topic until every (query, window) has its
    window record, then stop the worker with SIGTERM and require a clean exit (code 0)."""
    worker = start_worker(config_path, log_path, env)
    try:
        out = await read_topic(
            bootstrap,
            topics_of(config_path)["output"],
            until=windows_done(queries, n_windows),
            timeout_s=timeout_s,
            settle_s=settle_s,
        )
        # The windows may all be out before this worker got far (earlier workers released
        # them): SIGTERM before its handlers are installed ends it with -15, not 0. Wait
        # until it is up (its ops endpoint listens: the handlers come first) or has exited.
        await _until_up(worker)
    finally:
        code = worker.terminate()
    assert code == 0, f"exit code {code}:\n{worker.log()}"
    return out, worker


async def _until_up(worker: WorkerProcess, timeout_s: float = HANG_GUARD_S) -> None:
    deadline = time.monotonic() + timeout_s  # a hang guard only
    while worker.proc.poll() is None and "metrics and health on" not in worker.log():
        if time.monotonic() > deadline:
            raise AssertionError(f"the worker did not come up in {timeout_s:g} s")
        await asyncio.sleep(0.05)


def ledger_release_ids(
    records: Sequence[tuple[str | None, bytes]],
) -> dict[tuple[str, str], set[str]]:
    """(query, window start) → release ids of *complete* ledger entries (all parts present)."""
    parts: dict[tuple[str, str, str], set[int]] = {}
    n_parts: dict[tuple[str, str, str], int] = {}
    for _, raw in records:
        v = orjson.loads(raw)
        if v.get("kind") == "ledger":
            ident = (v["query"], v["window_start"], v["release_id"])
            parts.setdefault(ident, set()).add(v["part"])
            n_parts[ident] = v["parts"]
    out: dict[tuple[str, str], set[str]] = {}
    for ident, got in parts.items():
        if len(got) == n_parts[ident]:
            out.setdefault((ident[0], ident[1]), set()).add(ident[2])
    return out


async def topic_partitions(bootstrap: str, topic: str) -> list[int]:
    """The partition numbers of a topic (waits up to 10 s for its metadata)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        return sorted(await asyncio.wait_for(producer.partitions_for(topic), timeout=10))
    finally:
        await producer.stop()


def current_assignment(worker: WorkerProcess) -> set[tuple[str, int]] | None:
    """The worker's partitions per its log's last assign/revoke line (None: revoked, or none
    assigned yet). Reads the JSON log lines the worker writes on every rebalance."""
    current: set[tuple[str, int]] | None = None
    for line in worker.log().splitlines():
        try:
            msg = orjson.loads(line).get("msg", "")
        except (orjson.JSONDecodeError, AttributeError):
            continue
        if not isinstance(msg, str):
            continue
        if msg.startswith("partitions revoked:"):
            current = None
        elif msg.startswith("partitions assigned:"):
            listed = msg.removeprefix("partitions assigned:").strip()
            current = set()
            for item in filter(None, (s.strip() for s in listed.split(","))):
                topic, _, rest = item.rpartition("[")
                current.add((topic, int(rest.rstrip("]"))))
    return current


async def wait_for_group(
    workers: Sequence[WorkerProcess], expected: set[tuple[str, int]], timeout_s: float = 60.0
) -> list[set[tuple[str, int]]]:
    """Wait until the workers' consumer group has settled: every worker holds a non-empty
    share of ``expected`` and the shares are disjoint and cover it. Returns the shares (the
    timeout is a hang guard, at least :data:`HANG_GUARD_S`)."""
    timeout_s = max(timeout_s, HANG_GUARD_S)
    deadline = time.monotonic() + timeout_s
    while True:
        for w in workers:
            assert w.proc.poll() is None, f"worker exited ({w.proc.returncode}):\n{w.log()}"
        shares = [current_assignment(w) for w in workers]
        if all(shares):
            settled = [s for s in shares if s is not None]
            union = set().union(*settled)
            if union == expected and sum(map(len, settled)) == len(expected):
                return settled
        if time.monotonic() > deadline:
            logs = "\n\n".join(w.log()[-3000:] for w in workers)
            raise AssertionError(f"group did not settle in {timeout_s} s: {shares}\n{logs}")
        await asyncio.sleep(0.1)


def _log_entries(log: str) -> list[dict[str, Any]]:
    entries = []
    for line in log.splitlines():
        try:
            entry = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("msg"), str):
            entries.append(entry)
    return entries


def _assigned(entry: dict[str, Any]) -> set[str]:
    return set(entry["msg"].removeprefix("partitions assigned: ").split(", ")) - {""}


def partitions_taken_over(stalled_log: str, other_log: str, marker: str) -> set[str]:
    """Partitions the stalled worker held when it logged ``marker`` (its last assignment
    before it) that the other worker was assigned after that moment: non-empty when the
    group evicted the stalled member and handed its work over (JSON log time stamps of one
    machine's clock)."""
    stalled = _log_entries(stalled_log)
    (at,) = [e["ts"] for e in stalled if e["msg"] == marker][:1] or [None]
    if at is None:
        return set()
    held: set[str] = set()
    for e in stalled:
        if e["ts"] > at:
            break
        if e["msg"].startswith("partitions assigned: "):
            held = _assigned(e)
    later: set[str] = set()
    for e in _log_entries(other_log):
        if e["ts"] >= at and e["msg"].startswith("partitions assigned: "):
            later |= _assigned(e)
    return held & later


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a worker's ops endpoint)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(port: int, path: str, timeout_s: float = 3.0) -> tuple[int, bytes]:
    """(status, body) of ``GET http://127.0.0.1:{port}{path}``; (0, b"") while nothing serves
    there (the worker not up yet, or gone)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout_s) as r:
            return int(r.status), bytes(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, b""


def metric_value(port: int, name: str) -> float | None:
    """The first sample called ``name`` on the worker's /metrics; None while /metrics does
    not answer 200 or has no such sample."""
    code, body = http_get(port, "/metrics")
    if code != 200:
        return None
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    return None


async def wait_while_running(
    condition: Callable[[], bool], what: str, worker: WorkerProcess
) -> None:
    """Until ``condition`` holds (checked in a thread; it may do blocking I/O), failing at
    once if the worker exits first. The bound, :data:`HANG_GUARD_S`, is a hang guard only."""
    deadline = time.monotonic() + HANG_GUARD_S
    while not await asyncio.to_thread(condition):
        assert worker.proc.poll() is None, f"worker exited:\n{worker.log()[-4000:]}"
        assert time.monotonic() < deadline, f"{what} never happened:\n{worker.log()[-4000:]}"
        await asyncio.sleep(0.2)


async def wait_status(port: int, path: str, status: int, timeout_s: float) -> float:
    """Poll ``path`` until it answers ``status``; the monotonic time it did. ``timeout_s`` is
    part of the claim here (the caller's bound on how soon the status must come)."""
    deadline = time.monotonic() + timeout_s
    while True:
        code, _ = await asyncio.to_thread(http_get, port, path)
        if code == status:
            return time.monotonic()
        assert time.monotonic() < deadline, f"{path} never returned {status} (last {code})"
        await asyncio.sleep(0.2)


async def group_partitions(bootstrap: str, topics: Iterable[str]) -> set[tuple[str, int]]:
    """Every (topic, partition) of ``topics``: what the members of a settled consumer group
    on them hold between them (the ``expected`` of :func:`wait_for_group`)."""
    return {(t, p) for t in topics for p in await topic_partitions(bootstrap, t)}


async def wait_in_task(condition: Callable[[], bool], task: asyncio.Task[None], what: str) -> None:
    """Until ``condition`` of an in-process worker running as ``task`` holds, failing at once
    if the task ends first (the bound, :data:`HANG_GUARD_S`, is a hang guard only)."""
    deadline = asyncio.get_running_loop().time() + HANG_GUARD_S
    while not condition():
        assert not task.done(), f"the worker stopped while waiting for {what}: {task!r}"
        assert asyncio.get_running_loop().time() < deadline, f"hang guard: {what}"
        await asyncio.sleep(0.05)


async def stage_partitions(bootstrap: str, config: Config) -> set[tuple[str, int]]:
    """The partitions the group's members share: the input's, partials' and repartition's."""
    return await group_partitions(
        bootstrap,
        (config.input.topic, config.output.partials_topic, config.output.repartition_topic),
    )


def spread_events(t0_s: int, window: int, domains: Sequence[str]) -> list[dict[str, Any]]:
    """30 users' events in 10 s window ``window`` after ``t0_s``: user u visits every 4th
    of ``domains`` from the (u mod 4)-th, at second 1 + (u mod 7) of the window."""
    return [
        {"user_id": f"u{u}", "timestamp": t0_s + window * 10 + 1 + u % 7, "domain": d}
        for u in range(30)
        for d in domains[u % 4 :: 4]
    ]


def spread_windows(t0_s: int, n_windows: int, domains: Sequence[str]) -> list[dict[str, Any]]:
    """:func:`spread_events` of windows 0 to ``n_windows`` - 1, then a last event far ahead
    that moves every partition past them."""
    events = [e for w in range(n_windows) for e in spread_events(t0_s, w, domains)]
    late = {"user_id": "late", "timestamp": t0_s + 10 * n_windows + 5, "domain": domains[0]}
    return [*events, late]


#: The window every :func:`release_one_public_query` event falls in (2020-08-01 00:00 UTC).
ONE_QUERY_T0_S = 1_596_240_000


async def release_one_public_query(
    bootstrap: str,
    config_path: Path,
    log_path: Path,
    query: str,
    events: Iterable[dict[str, Any]],
) -> dict[Any, dict[str, Any]]:
    """Create the topics, produce ``events``, run the worker (test mode, noise-free
    configurations) until the query's one window is out, and return its release records,
    each valid under ``topics/release.schema.json``, by the value of their one group field."""
    await apply_topics(load_config(config_path), bootstrap, include_input=True)
    await produce_events(bootstrap, topics_of(config_path)["input"], events)
    out, _ = await run_worker_until_windows(
        bootstrap,
        config_path,
        log_path,
        [query],
        1,
        env={"STREAM_DP_ALLOW_UNSAFE_TEST_MODE": "1"},
    )
    schema_path = Path(__file__).resolve().parents[2] / "topics" / "release.schema.json"
    validator = jsonschema.Draft202012Validator(orjson.loads(schema_path.read_bytes()))
    released: dict[Any, dict[str, Any]] = {}
    for _, value in decode_values(out):
        if value["kind"] == "release":
            validator.validate(value)
            (group_value,) = value["group"].values()
            released[group_value] = value
    return released


def one_value_per_key(out: list[tuple[str | None, bytes]]) -> dict[str, dict[str, Any]]:
    """Every output key has one value (republished copies are byte-identical)."""
    by_key: dict[str | None, set[bytes]] = defaultdict(set)
    for key, value in out:
        by_key[key].add(value)
    twice = {k: v for k, v in by_key.items() if len(v) > 1}
    assert not twice, f"a (query, window, key) got a second value: {twice}"
    return {str(k): orjson.loads(next(iter(v))) for k, v in by_key.items()}


async def listed_topics(bootstrap: str) -> set[str]:
    """Every topic the broker has (a request for all topics: it creates none)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()
