"""A real worker's memory and liveness while it holds and releases one window of N keys
(issue 39, item 3: "the shipped limits hold a window of at least 1M keys").

    python -m bench.worker_memory [--keys 1000000] [--broker tansu|apache-kafka] [--before REV]
                                  [--public]

One ``stream-dp run`` process — the shipped Kubernetes configuration
(``ops/kubernetes/stream-dp.yaml``: 5-minute windows, grace 30 s, idle close 30 s, k = 40,
L0 = 3, Linf = 10, ``visits_by_domain`` count by ``domain`` with private keys and
``users_by_country`` on four public countries), with only the broker address, the group,
the topics, ``window.start_at`` and the ops port changed — reads a topic of four partitions
that a librdkafka producer (:func:`bench.realistic.produce`: ``linger.ms`` 5, its default
partitioner, keyed by user id) fills once the worker is ready.

The stream: one 5-minute window (ended before the run starts: ``window.start_at`` is it)
with ``N`` distinct domains. A 1M-key window is a long tail, as URLs or search terms are:
:data:`HEAD_KEYS` popular domains take a tenth of the events (thousands of users each: they
are released), and each of the other ``N − 100`` domains is visited once or twice (half of
them each) by different users (they are not: partition selection drops them, as it should).
Each user makes three events on three domains (within L0 = 3, Linf and k: nothing is cut),
in one of the four public countries; event times spread evenly over the window. About
``1.67·N`` events and ``0.56·N`` users. Then one event per input partition, stamped past the
window's end plus grace, moves every partition's watermark past it (as a live stream's next
events do), so the window is due as soon as everything before is read.

Sampled while the worker runs: its RSS (``/proc/PID/status`` ``VmRSS`` every 0.1 s; its
``VmHWM`` before it is stopped) and the endpoint the Deployment's liveness probe asks
(``deployment.yaml``: ``/health/live``, timeout 5 s) every 0.2 s, with the probe's timeout;
its ``/metrics`` every 0.2 s for the phases: ready, every event read, the window due
(``stream_dp_windows_due``), released (``stream_dp_windows_released_total`` of both
queries). Reported as one JSON line per worker run: the baseline RSS (ready, before any
event), RSS holding the window when it became due, the peak (sampled and ``VmHWM``), the
growth per key, the release's seconds (due → released), the longest liveness answer and
every failed probe. ``--before REV`` runs the worker of commit ``REV`` too, in the same
session, on the same stream (a fresh topic each), after → before → after. ``--public``
lists the ``N`` domains as ``visits_by_domain``'s public keys: every one is released, so
the release's records (ledger parts and output) are all made and written.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import math
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from bench.realistic import _broker, _export, produce, scrape_sums

REPO = Path(__file__).resolve().parent.parent
SHIPPED_CONFIG = REPO / "ops" / "kubernetes" / "stream-dp.yaml"
SHIPPED_DEPLOYMENT = REPO / "ops" / "kubernetes" / "deployment.yaml"
PARTITIONS = 4
#: Popular domains: a tenth of the events, thousands of users each at 1M keys.
HEAD_KEYS = 100
HEAD_SHARE = 0.1
EVENTS_PER_USER = 3
RSS_EVERY_S = 0.1
LIVE_EVERY_S = 0.2
METRICS_EVERY_S = 0.2
RUN_TIMEOUT_S = 1800.0


# -- the shipped deployment -------------------------------------------------------------------
def shipped_config() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(SHIPPED_CONFIG.read_text(encoding="utf-8"))
    return loaded


def liveness_probe() -> tuple[str, float]:
    """(path, timeout s) of the shipped Deployment's liveness probe."""
    deployment = yaml.safe_load(SHIPPED_DEPLOYMENT.read_text(encoding="utf-8"))
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    probe = container["livenessProbe"]
    return str(probe["httpGet"]["path"]), float(probe["timeoutSeconds"])


def worker_config(
    bootstrap: str,
    topic: str,
    window_start_s: int,
    port: int,
    *,
    public_keys: int = 0,
    log_level: str = "INFO",
) -> dict[str, Any]:
    """The shipped configuration, on ``topic`` of ``bootstrap``, with its own group and
    topics, covering windows from ``window_start_s``, its ops endpoint on ``port``; with
    ``public_keys``, ``visits_by_domain`` lists that many domains (:func:`key_name`) as
    public keys: every one is released."""
    config = shipped_config()
    if public_keys:
        (query,) = [q for q in config["queries"] if q["name"] == "visits_by_domain"]
        query.pop("selection", None)
        query["keys"] = {"domain": [key_name(i) for i in range(public_keys)]}
    suffix = uuid.uuid4().hex[:10]
    config["kafka"] = {
        **config["kafka"],
        "bootstrap_servers": bootstrap,
        "group_id": f"worker-memory-{suffix}",
    }
    config["input"] = {**config["input"], "topic": topic}
    config["output"] = {
        **config["output"],
        **{
            name: f"worker-memory-{name.removesuffix('_topic')}-{suffix}"
            for name in (
                "topic",
                "dead_letter_topic",
                "ledger_topic",
                "partials_topic",
                "repartition_topic",
                "continual_topic",
                "access_log_topic",
            )
        },
    }
    config["window"] = {
        **config["window"],
        "start_at": dt.datetime.fromtimestamp(window_start_s, tz=dt.UTC).isoformat(),
    }
    config["metrics"] = {**config["metrics"], "host": "127.0.0.1", "port": port}
    config["logging"] = {**config["logging"], "level": log_level}
    return config


def window_s(config: dict[str, Any]) -> tuple[int, int]:
    """(size_s, grace_s) of a configuration."""
    return int(config["window"]["size_s"]), int(config["window"]["grace_s"])


def past_window_start(now_s: float, size_s: int, grace_s: int) -> int:
    """The latest window whose end plus grace plus a second is 10 s or more before now."""
    return (int(now_s) - size_s - grace_s - 11) // size_s * size_s


# -- the stream -------------------------------------------------------------------------------
@dataclass(frozen=True)
class WindowStream:
    """One window's events (JSON values, the producer's keys: the user ids) and the
    closing events (one per input partition, past the window's end plus grace)."""

    keys: int
    users: int
    values: list[bytes]
    user_ids: list[bytes]
    closing: list[bytes]


def key_name(i: int) -> str:
    return f"site{i:07d}.example"


def window_stream(
    keys: int, window_start_s: int, size_s: int, grace_s: int, countries: Sequence[str]
) -> WindowStream:
    """The long-tail window of the module docstring, ``keys`` distinct domains."""
    if keys <= HEAD_KEYS:
        raise ValueError(f"keys must exceed the {HEAD_KEYS} popular domains")
    rng = np.random.default_rng(39)
    tail = np.arange(HEAD_KEYS, keys, dtype=np.int64)
    tail_events = np.repeat(tail, 1 + tail % 2)  # once or twice each
    head_n = round(len(tail_events) * HEAD_SHARE / (1 - HEAD_SHARE))
    head_events = rng.integers(0, HEAD_KEYS, head_n)
    visits = np.concatenate([tail_events, head_events])
    rng.shuffle(visits)
    # Three consecutive visits per user; a tail domain visited twice gets two users, unless
    # a shuffle puts both visits in one user's three (rare, and then Linf holds them).
    users = math.ceil(len(visits) / EVENTS_PER_USER)
    offsets_ms = rng.integers(0, size_s * 1000, len(visits))
    stamps: dict[int, str] = {}

    def stamp(ms: int) -> str:
        s = window_start_s + ms // 1000
        if s not in stamps:
            stamps[s] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(s))
        return f"{stamps[s]}.{ms % 1000:03d}Z"

    values: list[bytes] = []
    user_ids: list[bytes] = []
    template = '{"user_id":"u%d","timestamp":"%s","domain":"%s","country":"%s"}'
    for i, (key, ms) in enumerate(zip(visits.tolist(), offsets_ms.tolist(), strict=True)):
        user = i // EVENTS_PER_USER
        country = countries[user % len(countries)]
        values.append((template % (user, stamp(ms), key_name(key), country)).encode())
        user_ids.append(b"u%d" % user)
    after = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(window_start_s + size_s + grace_s + 1))
    closing = [
        (template % (users + p, after, key_name(0), countries[0])).encode()
        for p in range(PARTITIONS)
    ]
    return WindowStream(keys, users, values, user_ids, closing)


def produce_closing(bootstrap: str, topic: str, closing: Sequence[bytes]) -> None:
    """One closing event on each input partition (after the window's, in each partition)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for partition, value in enumerate(closing):
        producer.produce(topic, value, b"closing%d" % partition, partition=partition)
    if producer.flush(60):
        raise RuntimeError(f"the closing events to {topic} were not all sent")


# -- watching a worker ------------------------------------------------------------------------
def rss_bytes(pid: int, field_name: str = "VmRSS") -> int:
    """``VmRSS`` (or ``VmHWM``, the peak) of ``pid`` from /proc; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1]) * 1024
    except FileNotFoundError:
        return 0
    return 0


def probe(url: str, timeout_s: float) -> tuple[int, float]:
    """(status, seconds) of one GET as a kubelet's HTTP probe makes it: 0 when it got no
    answer within ``timeout_s`` (or none at all)."""
    started = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - loopback
            response.read()
            status = int(response.status)
    except urllib.error.HTTPError as e:
        status = e.code
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        status = 0
    return status, time.monotonic() - started


@dataclass
class WorkerWatch:
    """RSS samples of a worker process and answers of its liveness endpoint, taken by two
    threads from :meth:`start` to :meth:`stop`: ``rss`` holds (monotonic s, bytes),
    ``live`` (monotonic s at the request, status, answer s)."""

    pid: int
    live_url: str
    live_timeout_s: float
    rss: list[tuple[float, int]] = field(default_factory=list)
    live: list[tuple[float, int, float]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> WorkerWatch:
        self._threads = [
            threading.Thread(target=self._sample_rss, daemon=True),
            threading.Thread(target=self._poll_live, daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=self.live_timeout_s + 5)

    def _sample_rss(self) -> None:
        while not self._stop.is_set():
            value = rss_bytes(self.pid)
            if value:
                self.rss.append((time.monotonic(), value))
            self._stop.wait(RSS_EVERY_S)

    def _poll_live(self) -> None:
        while not self._stop.is_set():
            t = time.monotonic()
            status, seconds = probe(self.live_url, self.live_timeout_s)
            self.live.append((t, status, seconds))
            self._stop.wait(max(0.0, LIVE_EVERY_S - seconds))

    def peak_rss(self, since: float = 0.0, until: float = math.inf) -> int:
        return max((b for t, b in self.rss if since <= t <= until), default=0)

    def rss_at(self, t: float) -> int:
        """The last sample at or before ``t``."""
        before = [b for s, b in self.rss if s <= t]
        return before[-1] if before else 0

    def probes(self, since: float = 0.0, until: float = math.inf) -> list[tuple[float, int, float]]:
        return [p for p in self.live if since <= p[0] <= until]


def live_summary(probes: Sequence[tuple[float, int, float]]) -> dict[str, Any]:
    return {
        "probes": len(probes),
        "longest_answer_s": round(max((s for _, _, s in probes), default=0.0), 3),
        "failed": [
            {"status": status, "answer_s": round(seconds, 3)}
            for _, status, seconds in probes
            if status != 200
        ],
    }


# -- one run ----------------------------------------------------------------------------------
@contextmanager
def running_worker(
    config: dict[str, Any], tree: Path, workdir: Path
) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """``stream-dp run`` of the checkout at ``tree`` with ``config``; killed on the way out
    if still running. Yields the process and its log."""
    path = workdir / f"config-{uuid.uuid4().hex[:8]}.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    log = workdir / f"worker-{uuid.uuid4().hex[:8]}.log"
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),
        "STREAM_DP_PSEUDONYM_KEY": secrets.token_hex(32),
        "PYTHONWARNINGS": "ignore",
    }
    command = [sys.executable, "-m", "stream_dp.cli.main", "run", "--config", str(path)]
    with log.open("wb") as handle:
        proc = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=tree)
    try:
        yield proc, log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _metrics(port: int) -> dict[str, float]:
    names = (
        "stream_dp_ready",
        "stream_dp_events_consumed_total",
        "stream_dp_windows_due",
        "stream_dp_partials_published_total",
        "stream_dp_windows_released_total",
        "stream_dp_keys_released_total",
    )
    return scrape_sums(f"http://127.0.0.1:{port}/metrics", names, timeout_s=5)


def run_once(
    bootstrap: str,
    data: WindowStream,
    window_start_s: int,
    tree: Path,
    workdir: Path,
    *,
    public: bool = False,
) -> dict[str, Any]:
    """One worker of ``tree`` on a fresh topic: started, ready, the window produced, read,
    released; watched throughout (see the module docstring)."""
    from bench.throughput import create_topics
    from stream_dp.broker.process import free_port

    topic = f"worker-memory-{uuid.uuid4().hex[:8]}"
    asyncio.run(create_topics(bootstrap, [topic], PARTITIONS))
    port = free_port("127.0.0.1")
    config = worker_config(
        bootstrap, topic, window_start_s, port, public_keys=data.keys if public else 0
    )
    queries = len(config["queries"])
    path, timeout_s = liveness_probe()
    events = len(data.values) + len(data.closing)
    marks: dict[str, float] = {}
    with running_worker(config, tree, workdir) as (proc, log):
        watch = WorkerWatch(proc.pid, f"http://127.0.0.1:{port}{path}", timeout_s).start()
        t0 = time.monotonic()
        try:
            while True:  # the phases, from /metrics
                if proc.poll() is not None or time.monotonic() - t0 > RUN_TIMEOUT_S:
                    raise RuntimeError(f"the worker exited or stalled:\n{log.read_text()[-4000:]}")
                m = _metrics(port)
                now = time.monotonic()
                if "ready" not in marks and m["stream_dp_ready"] >= 1:
                    marks["ready"] = now
                    time.sleep(1.0)  # the baseline: ready, nothing read yet
                    marks["baseline"] = time.monotonic()
                    produced = produce(bootstrap, topic, data.values, data.user_ids)
                    produce_closing(bootstrap, topic, data.closing)
                    marks["produced"] = time.monotonic()
                    continue
                if "consumed" not in marks and m["stream_dp_events_consumed_total"] >= events:
                    marks["consumed"] = now
                if "sealed" not in marks and m["stream_dp_partials_published_total"] >= 1:
                    marks["sealed"] = now  # the first partial of the window written
                if "due" not in marks and m["stream_dp_windows_due"] >= 1:
                    marks["due"] = now
                if m["stream_dp_windows_released_total"] >= queries:
                    marks["released"] = now
                    keys_released = m["stream_dp_keys_released_total"]
                    break
                time.sleep(METRICS_EVERY_S)
            time.sleep(1.0)  # a second after the release, for the samples
            hwm = rss_bytes(proc.pid, "VmHWM")
        finally:
            watch.stop()
        proc.terminate()
        code = proc.wait(timeout=60)
    if code != 0:
        raise RuntimeError(f"the worker exited {code} on SIGTERM:\n{log.read_text()[-4000:]}")
    baseline = watch.rss_at(marks["baseline"])
    # Every event read: the window is sealed (stage 1), its partials read back and it is
    # released (stage 2) from here on, while the worker idles otherwise.
    read = marks.get("consumed", marks["released"])
    peak = max(watch.peak_rss(), hwm)
    return {
        "tree": str(tree),
        "keys": data.keys,
        "keys_public": public,
        "events": events,
        "users": data.users,
        "produce_seconds": round(produced, 2),
        "baseline_rss_bytes": baseline,
        "rss_holding_window_bytes": watch.rss_at(read),
        "peak_rss_reading_bytes": watch.peak_rss(until=read),
        "peak_rss_seal_and_release_bytes": watch.peak_rss(since=read),
        "vm_hwm_bytes": hwm,
        "peak_rss_bytes": peak,
        "peak_growth_bytes_per_key": round((peak - baseline) / data.keys, 1),
        "read_seconds": round(read - marks["baseline"], 2),
        "first_partial_after_read_seconds": round(marks.get("sealed", read) - read, 2),
        "due_after_read_seconds": round(marks["due"] - read, 2) if "due" in marks else None,
        "seal_and_release_seconds": round(marks["released"] - read, 2),
        "keys_released": keys_released,
        "liveness_from_ready": live_summary(watch.probes(since=marks["ready"])),
        "liveness_seal_and_release": live_summary(
            watch.probes(since=read, until=marks["released"])
        ),
        "rss_mb_every_s": _every_second(watch, t0),
    }


def _every_second(watch: WorkerWatch, t0: float) -> list[list[float]]:
    out: list[list[float]] = []
    next_s = 0.0
    for t, b in watch.rss:
        if t - t0 >= next_s:
            out.append([round(t - t0, 1), round(b / 1e6)])
            next_s = math.floor(t - t0) + 1.0
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--broker", choices=("tansu", "apache-kafka"), default="tansu")
    parser.add_argument("--before", help="also run the worker of this commit, alternating")
    parser.add_argument(
        "--public", action="store_true", help="the domains as a public key list: all released"
    )
    args = parser.parse_args(argv)
    config = shipped_config()
    size_s, grace_s = window_s(config)
    start_s = past_window_start(time.time(), size_s, grace_s)
    countries = config["queries"][1]["keys"]["country"]
    data = window_stream(args.keys, start_s, size_s, grace_s, countries)
    with tempfile.TemporaryDirectory(prefix="worker-memory-") as tmp, _broker(args.broker) as b:
        runs: list[tuple[str, Path]] = [("after", REPO)]
        if args.before:
            before = _export(args.before, Path(tmp) / "before")
            runs = [("after", REPO), ("before", before), ("after", REPO)]
        for label, tree in runs:
            load = os.getloadavg()[0]
            result = run_once(
                b.bootstrap_servers, data, start_s, tree, Path(tmp), public=args.public
            )
            result = {"label": label, "broker": args.broker, "load_1min": [load], **result}
            result["load_1min"].append(os.getloadavg()[0])
            sys.stdout.write(json.dumps(result) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
