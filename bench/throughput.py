"""Throughput on one broker: raw fetch+decode, the stream-dp worker, Faust, Kafka Streams.

All read the same preloaded topic in the same bench run, each in a fresh process, in turn
(raw, worker on keyed input, worker in the default configuration — input not keyed by
user, repartitioned by pseudonym — Faust and the Kafka Streams peer of bench/kstreams.py)
for every run; the figures are medians over the runs. bench/run.py measures on the embedded
Tansu broker and on an Apache Kafka broker, in the same run.

A last, profiled run of the default configuration gives the profile section. Faust is
~100× slower than the others, so when the main topic is larger than ``faust_events`` it
reads a second topic holding the first ``faust_events`` records of the same stream (same
keys, same partitions), and the worker is timed on that topic too, so that the b/c ratio
compares the two on identical input in the same run.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from bench.data import START_S, StreamSpec, columns, distinct_windows, encode
from stream_dp.broker.topics import apply_topics
from stream_dp.config import parse_config
from stream_dp.windows.tumbling import iso_utc

PARTITIONS = 4
K = 40
GRACE_S = 0
IDLE_CLOSE_S = 0.5
#: Faust's event delivery stalls for more than 0.5 s now and then in mid-stream (seen here:
#: windows closed by idleness before the input was read), so its idle close is longer.
FAUST_IDLE_CLOSE_S = 2.0
#: The Kafka Streams peer's too: at 1M events on a loaded machine its stream thread has been
#: seen to take no event for more than 0.5 s in mid-stream (commits, collections, the machine's
#: other work), which closed a window before its last events were read (the check of its
#: window records caught it).
KSTREAMS_IDLE_CLOSE_S = 2.0
CONTENDER_TIMEOUT_S = 1800.0


@dataclass
class Contender:
    """One contender's runs on one topic."""

    name: str
    events: int
    runs: list[dict[str, Any]] = field(default_factory=list)

    def median(self, key: str) -> float:
        return float(statistics.median(r[key] for r in self.runs))

    @property
    def events_per_s(self) -> float:
        return float(statistics.median(r["events"] / r["seconds"] for r in self.runs))

    @property
    def steady_events_per_s(self) -> float:
        """Events over the processing phase only (first → last event), when measured."""
        rates = [
            r["events"] / r["processing_seconds"] for r in self.runs if r.get("processing_seconds")
        ]
        return float(statistics.median(rates)) if rates else float("nan")

    def describe(self) -> dict[str, Any]:
        keys = sorted({k for r in self.runs for k in r if isinstance(r[k], int | float)})
        return {
            "name": self.name,
            "events": self.events,
            "runs": self.runs,
            "events_per_s": self.events_per_s,
            "steady_events_per_s": self.steady_events_per_s,
            "median": {k: self.median(k) for k in keys if all(k in r for r in self.runs)},
        }


def cpu_seconds_of(pid: int) -> float:
    """User + system CPU time of another process (Linux /proc), e.g. the broker."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


# -- topics ---------------------------------------------------------------------------------
async def create_topics(bootstrap: str, names: Sequence[str], partitions: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        topics = [NewTopic(n, partitions, 1, None, {"retention.ms": "-1"}) for n in names]
        response = await admin.create_topics(topics)
        errors = [e for e in response.to_object()["topic_errors"] if e["error_code"] != 0]
        if errors:
            raise RuntimeError(f"creating bench topics failed: {errors}")
    finally:
        await admin.close()


async def delete_topics(bootstrap: str, *, names: Sequence[str] = (), prefix: str = "") -> None:
    """Delete the named topics and every topic starting with ``prefix`` (if given)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        doomed = [n for n in existing if n in names or (prefix and n.startswith(prefix))]
        if doomed:
            await admin.delete_topics(doomed)
    finally:
        await admin.close()


def produce(bootstrap: str, topic: str, values: Sequence[bytes], keys: Sequence[bytes]) -> float:
    """Preload a topic with confluent-kafka (acks=all, every record acknowledged); seconds."""
    from confluent_kafka import Producer

    errors: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            # One request in flight per broker connection: a retried batch (a timeout under
            # load) must not land after a later one, or a partition's events leave event-time
            # order and the Kafka Streams peer drops them as late ("expired window").
            "max.in.flight.requests.per.connection": 1,
            "linger.ms": 20,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
            "partitioner": "murmur2_random",  # Java-compatible: same key, same partition
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
    seconds = time.perf_counter() - started
    if remaining or errors:
        raise RuntimeError(f"producing to {topic}: {remaining} unsent, errors: {errors[:3]}")
    return seconds


async def count_window_records(bootstrap: str, topic: str, expected: int) -> int:
    """Window records on an output topic (read from the start; stops at ``expected``)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    found = 0
    try:
        parts = consumer.partitions_for_topic(topic)
        if not parts:
            await consumer._client.force_metadata_update()
            parts = consumer.partitions_for_topic(topic) or {0}
        consumer.assign([TopicPartition(topic, p) for p in parts])
        await consumer.seek_to_beginning()
        deadline = time.monotonic() + 15
        while found < expected and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            for msgs in batch.values():
                found += sum(1 for m in msgs if orjson.loads(m.value).get("kind") == "window")
    finally:
        await consumer.stop()
    return found


# -- contenders -----------------------------------------------------------------------------
def _run_process(module: str, args: Sequence[str], broker_pid: int) -> dict[str, Any]:
    broker_cpu = cpu_seconds_of(broker_pid)
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=CONTENDER_TIMEOUT_S,
        check=False,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    broker_cpu = cpu_seconds_of(broker_pid) - broker_cpu
    # Faust's terminal handling may prefix the line with cursor escape codes.
    lines = [ln[ln.index("{") :] for ln in proc.stdout.splitlines() if "{" in ln]
    if proc.returncode != 0 and not lines:
        raise RuntimeError(
            f"{module} {args[:1]} failed with exit code {proc.returncode}:\n{proc.stderr[-3000:]}"
        )
    if not lines:
        raise RuntimeError(f"{module} printed no result:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = orjson.loads(lines[-1])
    result["broker_cpu_seconds_whole_process_run"] = broker_cpu
    return result


#: Topics of a worker config (``output.*``) the bench creates per run and deletes after.
WORKER_TOPICS = (
    "topic",
    "dead_letter_topic",
    "ledger_topic",
    "partials_topic",
    "repartition_topic",
    "continual_topic",
)


def worker_config(
    bootstrap: str, topic: str, suffix: str, window_size_s: int, *, keyed_by_user: bool = True
) -> dict[str, Any]:
    """The bench's worker: input keyed by user id unless ``keyed_by_user`` is false (then
    stage 0 repartitions it by pseudonym through the repartition topic)."""
    return {
        "kafka": {
            "bootstrap_servers": bootstrap,
            "group_id": f"bench-{suffix}",
            "session_timeout_ms": 2000,
            "heartbeat_interval_ms": 500,
        },
        "input": {"topic": topic, "keyed_by_user": keyed_by_user},
        "output": {
            "topic": f"bench-out-{suffix}",
            "dead_letter_topic": f"bench-dead-{suffix}",
            "ledger_topic": f"bench-ledger-{suffix}",
            "partials_topic": f"bench-partials-{suffix}",
            "repartition_topic": f"bench-repartition-{suffix}",
            "continual_topic": f"bench-continual-{suffix}",
        },
        "window": {
            "size_s": window_size_s,
            "grace_s": GRACE_S,
            "idle_close_s": IDLE_CLOSE_S,
            "start_at": iso_utc(START_S),
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
        "metrics": {"enabled": False},
        "logging": {"level": "WARNING"},
    }


def run_raw(bootstrap: str, topic: str, events: int, broker_pid: int) -> dict[str, Any]:
    spec = {"bootstrap": bootstrap, "topic": topic, "events": events, "partitions": PARTITIONS}
    return _run_process("bench.contenders", ["raw", orjson.dumps(spec).decode()], broker_pid)


def run_worker(
    bootstrap: str,
    topic: str,
    events: int,
    windows: int,
    window_size_s: int,
    broker_pid: int,
    *,
    keyed_by_user: bool = True,
) -> dict[str, Any]:
    suffix = uuid.uuid4().hex[:10]
    config = worker_config(bootstrap, topic, suffix, window_size_s, keyed_by_user=keyed_by_user)
    asyncio.run(apply_topics(parse_config(config), bootstrap, include_input=False))
    spec = {
        "bootstrap": bootstrap,
        "events": events,
        "windows": windows,
        "config": config,
        "timeout_s": CONTENDER_TIMEOUT_S - 60,
    }
    try:
        result = _run_process(
            "bench.contenders", ["worker", orjson.dumps(spec).decode()], broker_pid
        )
        result["window_records_on_output"] = asyncio.run(
            count_window_records(bootstrap, config["output"]["topic"], windows)
        )
        if result["window_records_on_output"] != windows:
            raise RuntimeError(
                f"the worker's output topic holds {result['window_records_on_output']} window "
                f"records, expected {windows}"
            )
    finally:
        outputs = [config["output"][k] for k in WORKER_TOPICS]
        asyncio.run(delete_topics(bootstrap, names=outputs))
    return result


def run_faust(
    bootstrap: str, topic: str, events: int, windows: int, window_size_s: int, broker_pid: int
) -> dict[str, Any]:
    app_id = f"bench-faust-{uuid.uuid4().hex[:10]}"
    # Faust keeps table metadata in a data directory (cwd by default): a temporary one.
    datadir = tempfile.TemporaryDirectory(prefix=f"{app_id}-")
    spec = {
        "app_id": app_id,
        "datadir": datadir.name,
        "bootstrap": bootstrap,
        "topic": topic,
        "output_topic": f"{app_id}-out",
        "partitions": PARTITIONS,
        "window_size_s": window_size_s,
        "grace_s": GRACE_S,
        "idle_close_s": FAUST_IDLE_CLOSE_S,
        "windows": windows,
        "k": K,
    }
    try:
        result = _run_process("bench.faust_app", [orjson.dumps(spec).decode()], broker_pid)
        if result["events"] != events:
            raise RuntimeError(f"faust processed {result['events']} of {events} events")
    finally:
        asyncio.run(delete_topics(bootstrap, prefix=app_id))
        datadir.cleanup()
    return result


def measure(
    bootstrap: str,
    broker_pid: int,
    spec: StreamSpec,
    *,
    runs: int,
    faust_events: int,
    log: Any = print,
    profile_dir: Path | None = None,
    kstreams_peer: bool = True,
    kstreams_idle_close_s: float = KSTREAMS_IDLE_CLOSE_S,
) -> dict[str, Any]:
    """Preload the topic(s), run every contender ``runs`` times, delete the topics.

    ``kstreams_peer``: run the Kafka Streams peer too (when Java and its build are there;
    otherwise ``kstreams_unavailable`` says why and its rows are left out)."""
    cols = columns(spec)
    values, keys = encode(spec, cols)
    windows = distinct_windows(spec, cols)
    run_id = uuid.uuid4().hex[:8]
    main_topic = f"bench-events-{run_id}"
    # Faust's input ends at a window boundary (whole windows of the same stream, at most
    # faust_events), so that its last window is complete and closes on idleness at once.
    window_of = cols.time_ms // 1000 // spec.window_size_s
    prefix_events = spec.events
    if faust_events < spec.events:
        ends = np.flatnonzero(np.diff(window_of)) + 1  # first index of each later window
        fitting = ends[ends <= faust_events]
        prefix_events = int(fitting[-1]) if fitting.size else int(ends[0])
    separate = prefix_events < spec.events
    prefix_topic = f"bench-events-prefix-{run_id}" if separate else main_topic
    prefix_windows = int(np.unique(window_of[:prefix_events]).size)
    topics = [main_topic, *([prefix_topic] if separate else [])]
    asyncio.run(create_topics(bootstrap, topics, PARTITIONS))
    out: dict[str, Any] = {
        "events": spec.events,
        "users": spec.users,
        "keys": spec.keys,
        "windows": windows,
        "window_size_s": spec.window_size_s,
        "partitions": PARTITIONS,
        "k": K,
        "grace_s": GRACE_S,
        "idle_close_s": IDLE_CLOSE_S,
        "faust_idle_close_s": FAUST_IDLE_CLOSE_S,
        "kstreams_idle_close_s": kstreams_idle_close_s,
        "runs": runs,
        "mean_value_bytes": sum(map(len, values)) / len(values),
        "faust_events": prefix_events,
        "faust_windows": prefix_windows,
        "faust_topic_is_main_topic": not separate,
    }
    try:
        out["produce_seconds"] = produce(bootstrap, main_topic, values, keys)
        out["produce_events_per_s"] = spec.events / out["produce_seconds"]
        log(f"  preloaded {spec.events:,} events in {out['produce_seconds']:.1f} s")
        if separate:
            produce(bootstrap, prefix_topic, values[:prefix_events], keys[:prefix_events])
        del values, keys
        raw = Contender("raw", spec.events)
        worker = Contender("worker", spec.events)
        default = Contender("worker_default", spec.events)
        worker_prefix = Contender("worker_on_faust_input", prefix_events)
        faust = Contender("faust", prefix_events)
        peer = _kstreams_contender(spec.events, kstreams_peer, out, log)
        for r in range(runs):
            raw.runs.append(run_raw(bootstrap, main_topic, spec.events, broker_pid))
            log(f"  run {r + 1}: raw {raw.runs[-1]['events'] / raw.runs[-1]['seconds']:,.0f}/s")
            worker.runs.append(
                run_worker(
                    bootstrap, main_topic, spec.events, windows, spec.window_size_s, broker_pid
                )
            )
            w = worker.runs[-1]
            log(f"  run {r + 1}: worker (keyed input) {w['events'] / w['seconds']:,.0f}/s")
            default.runs.append(
                run_worker(
                    bootstrap,
                    main_topic,
                    spec.events,
                    windows,
                    spec.window_size_s,
                    broker_pid,
                    keyed_by_user=False,
                )
            )
            d = default.runs[-1]
            rate = d["events"] / d["seconds"]
            log(f"  run {r + 1}: worker (default, repartitioned) {rate:,.0f}/s")
            if separate:
                worker_prefix.runs.append(
                    run_worker(
                        bootstrap,
                        prefix_topic,
                        prefix_events,
                        prefix_windows,
                        spec.window_size_s,
                        broker_pid,
                    )
                )
            faust.runs.append(
                run_faust(
                    bootstrap,
                    prefix_topic,
                    prefix_events,
                    prefix_windows,
                    spec.window_size_s,
                    broker_pid,
                )
            )
            f = faust.runs[-1]
            log(f"  run {r + 1}: faust {f['events'] / f['seconds']:,.0f}/s")
            if peer is not None:
                _run_kstreams(
                    peer,
                    bootstrap,
                    main_topic,
                    cols,
                    spec.window_size_s,
                    broker_pid,
                    idle_close_s=kstreams_idle_close_s,
                )
                ks = peer.runs[-1]
                log(f"  run {r + 1}: kafka streams {ks['events'] / ks['seconds']:,.0f}/s")
                if "repeated_after" in ks:
                    first = ks["repeated_after"].splitlines()[0][-200:]
                    log(f"  (kafka streams: a run that recovered a task was repeated: {first})")
        if not separate:
            worker_prefix = Contender("worker_on_faust_input", prefix_events, worker.runs)
        if profile_dir is not None:
            from bench import profile  # (it uses this module's helpers)

            log("  profile of the default path (py-spy)")
            out["profile"] = profile.profile_default_path(
                bootstrap,
                main_topic,
                spec.events,
                windows,
                spec.window_size_s,
                broker_pid,
                profile_dir,
            )
    finally:
        asyncio.run(delete_topics(bootstrap, names=topics))
    out["contenders"] = {c.name: c.describe() for c in (raw, worker, default, worker_prefix, faust)}
    if peer is not None:
        out["contenders"]["kstreams"] = peer.describe()
        out.update(kstreams_ratios(raw, worker, default, peer))
    out["ratio_worker_to_raw"] = worker.events_per_s / raw.events_per_s
    out["ratio_default_to_raw"] = default.events_per_s / raw.events_per_s
    out["ratio_default_to_raw_steady"] = default.steady_events_per_s / raw.events_per_s
    out["ratio_worker_to_raw_steady"] = worker.steady_events_per_s / raw.events_per_s
    out.update(cpu_ratios(raw, worker, default))
    out["ratio_worker_to_faust"] = worker_prefix.events_per_s / faust.events_per_s
    out["ratio_worker_to_faust_steady"] = (
        worker_prefix.steady_events_per_s / faust.steady_events_per_s
    )
    out["ratio_worker_full_to_faust"] = worker.events_per_s / faust.events_per_s
    return out


def _kstreams_contender(
    events: int, wanted: bool, out: dict[str, Any], log: Any
) -> Contender | None:
    """The Kafka Streams contender, its jar built first; None (the reason in ``out``) if not."""
    from bench import kstreams

    if not wanted:
        out["kstreams_unavailable"] = "not asked for"
        return None
    try:
        kstreams.ensure_built()
    except kstreams.PeerUnavailable as exc:
        out["kstreams_unavailable"] = str(exc)
        log(f"  Kafka Streams peer left out: {exc}")
        return None
    return Contender("kstreams", events)


def _run_kstreams(
    peer: Contender,
    bootstrap: str,
    topic: str,
    cols: Any,
    window_size_s: int,
    broker_pid: int,
    *,
    idle_close_s: float,
) -> None:
    from bench import kstreams

    peer.runs.append(
        kstreams.run_kstreams(
            bootstrap,
            topic,
            cols,
            partitions=PARTITIONS,
            window_size_s=window_size_s,
            grace_s=GRACE_S,
            idle_close_s=idle_close_s,
            k=K,
            broker_pid=broker_pid,
            timeout_s=CONTENDER_TIMEOUT_S,
        )
    )


def cpu_ratios(raw: Contender, worker: Contender, default: Contender) -> dict[str, float]:
    """The workers against the raw consumer by CPU per event: the raw consumer's CPU per event
    over the worker's, for the worker's whole timed span and (``_steady``) for its processing
    phase alone (first batch taken to last event ingested: start-up and close left out, as
    the wall-clock ``_steady`` ratios leave them out). On two cores shared with the broker
    the wall clock measures the broker's work too; CPU is the client's own cost."""
    raw_us = raw.median("cpu_seconds") / raw.events
    out: dict[str, float] = {}
    for name, contender in (("worker", worker), ("default", default)):
        out[f"ratio_{name}_to_raw_cpu"] = raw_us / (
            contender.median("cpu_seconds") / contender.events
        )
        if all("processing_cpu_seconds" in r for r in contender.runs):
            steady = contender.median("processing_cpu_seconds") / contender.events
            out[f"ratio_{name}_to_raw_cpu_steady"] = raw_us / steady
    return out


def kstreams_ratios(
    raw: Contender, worker: Contender, default: Contender, peer: Contender
) -> dict[str, float]:
    """stream-dp against the Kafka Streams peer (end to end and over the processing phases),
    and the peer against the raw consumer."""
    return {
        "ratio_worker_to_kstreams": worker.events_per_s / peer.events_per_s,
        "ratio_default_to_kstreams": default.events_per_s / peer.events_per_s,
        "ratio_worker_to_kstreams_steady": worker.steady_events_per_s / peer.steady_events_per_s,
        "ratio_default_to_kstreams_steady": (
            default.steady_events_per_s / peer.steady_events_per_s
        ),
        "ratio_kstreams_to_raw": peer.events_per_s / raw.events_per_s,
    }
