"""The Kafka Streams peer of the throughput bench (the Java project in ``bench/kstreams``).

:func:`ensure_built` builds it once with Maven (``mvn -q package``; ``make bench`` does too):
``bench/kstreams/target/kstreams-peer.jar`` and its runtime jars in ``target/libs``.
:func:`run_kstreams` runs it as a subprocess (``java -cp ... io.streamdp.bench.KStreamsPeer
SPEC_JSON``) on the bench's topic and checks its output against the stream itself: every
window's users and bounded events (per user and window, at most k) computed here with numpy
from the same columns the topic was written from, so a peer that skipped work could not pass.

The peer times itself like the Python contenders: from just before ``KafkaStreams.start()``
(the JVM's own start-up, like Python's imports, is left out) to the moment its own consumer
of the output topic has read the last window record; CPU is the whole JVM's (all threads:
the stream thread, the clients' network threads, the JIT compiler and the garbage collector).
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from bench.data import START_S, Columns
from stream_dp.broker.apache_kafka_jars import java_executable, java_major_version

PROJECT = Path(__file__).resolve().parent / "kstreams"
TARGET = PROJECT / "target"
JAR = TARGET / "kstreams-peer.jar"
MAIN_CLASS = "io.streamdp.bench.KStreamsPeer"
JAVA_MIN_MAJOR = 17
BUILD_TIMEOUT_S = 900.0
#: The peer's JVM: a heap with room for the windowed store, the default (G1) collector and
#: the full JIT; logs at warn.
JVM_OPTIONS = ("-Xms256m", "-Xmx1g", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn")


class PeerUnavailable(RuntimeError):
    """No Java 17+ or no Maven here: the bench leaves the Kafka Streams rows out, saying why."""


def _sources_newer_than_jar() -> bool:
    if not JAR.is_file() or not (TARGET / "libs").is_dir():
        return True
    built = JAR.stat().st_mtime
    sources = [PROJECT / "pom.xml", *(PROJECT / "src").rglob("*.java")]
    return any(s.stat().st_mtime > built for s in sources)


def java() -> str:
    """The Java runtime that runs the peer; PeerUnavailable (saying what to install) if none."""
    found = java_executable()
    if found is None:
        raise PeerUnavailable(
            "no Java runtime on PATH (nor in JAVA_HOME): install Java 17+ "
            "(Debian: apt-get install openjdk-17-jdk-headless) for the Kafka Streams peer"
        )
    major = java_major_version(found)
    if major < JAVA_MIN_MAJOR:
        raise PeerUnavailable(f"{found} is Java {major}; Kafka Streams 4 needs Java 17+")
    return found


def ensure_built() -> Path:
    """The peer's jar, built first with Maven when missing or older than its sources."""
    java()
    if not _sources_newer_than_jar():
        return JAR
    mvn = shutil.which("mvn")
    if mvn is None:
        raise PeerUnavailable(
            "Maven (mvn) is not on PATH to build bench/kstreams: install it (Debian: apt-get "
            "install maven) or run `make bench` where it is"
        )
    TARGET.mkdir(parents=True, exist_ok=True)
    with open(TARGET / ".build.lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time; the others wait, then reuse
        if _sources_newer_than_jar():
            done = subprocess.run(
                [mvn, "-B", "-q", "-f", str(PROJECT / "pom.xml"), "clean", "package"],
                capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False,
            )  # fmt: skip
            if done.returncode != 0 or not JAR.is_file():
                raise RuntimeError(
                    f"building the Kafka Streams peer failed (mvn exit {done.returncode}):\n"
                    f"{(done.stdout + done.stderr)[-3000:]}"
                )
    return JAR


def expected_windows(cols: Columns, window_size_s: int, k: int) -> dict[int, tuple[int, int]]:
    """Window start (ms) → (users, bounded events: per user at most k), from the columns."""
    window = cols.time_ms // (window_size_s * 1000)
    pairs, counts = np.unique(
        np.stack([window, cols.user.astype(np.int64)]), axis=1, return_counts=True
    )
    bounded = np.minimum(counts, k)
    out: dict[int, tuple[int, int]] = {}
    for w in np.unique(pairs[0]).tolist():
        mine = pairs[0] == w
        out[int(w) * window_size_s * 1000] = (int(mine.sum()), int(bounded[mine].sum()))
    return out


class PeerRecovered(RuntimeError):
    """A peer run in which Kafka Streams recovered a task and re-read records: it measured the
    recovery, not the peer (:func:`run_kstreams` repeats such a run once)."""


#: What Kafka Streams logs (WARN) when it recovers tasks, quoted when a run is repeated.
RECOVERY_LOG_MARKERS = (
    "are corrupted",  # a produce timed out: the task closed dirty and revived
    "being fenced",  # the member missed a rebalance: its tasks closed dirty, made anew
    "cleaned and revived",  # a commit timed out while its tasks were being revoked
)


def recovery_lines(stderr: str, most: int = 3) -> list[str]:
    """The first ``most`` lines of the peer's log that say Kafka Streams recovered tasks."""
    found = [ln for ln in stderr.splitlines() if any(m in ln for m in RECOVERY_LOG_MARKERS)]
    return [ln[-300:] for ln in found[:most]]


def check_run(
    result: dict[str, Any], expected: dict[int, tuple[int, int]], events: int, stderr: str
) -> None:
    """Raise unless the peer's ``result`` aggregated each of the ``events`` once and its window
    records are ``expected``: :class:`PeerRecovered` when it re-read records (its count is
    above the topic's, or Kafka Streams dropped records the bench never sends late), else
    RuntimeError. The window records are popped from ``result``.

    A re-read is Kafka Streams' at-least-once recovery: after a produce or commit that timed
    out on a loaded machine it revives the task from its last commit, and the revived task's
    windowed aggregate keeps the stream time it had reached, so the re-read records fall in
    windows it takes as expired (reproduced by pausing the broker longer than the producer's
    120 s delivery timeout: partition 2 re-read from offset 0, every record "expired")."""
    found = {
        int(r["window_start_ms"]): (int(r["users"]), int(r["bounded_events"]))
        for r in result.pop("window_records")
    }
    if result["events"] == events and found == expected:
        return
    what = (
        f"the Kafka Streams peer aggregated {result['events']} of {events} events; its window "
        f"records {sorted(found.items())} differ from the stream's {sorted(expected.items())}"
    )
    dropped = int(result.get("dropped_records", 0))
    if result["events"] > events or dropped > 0:
        said = "\n".join(recovery_lines(stderr)) or "(no recovery line in its log)"
        raise PeerRecovered(
            f"{what}: it re-read {max(result['events'] - events, 0):,} records and Kafka "
            f"Streams dropped {dropped:,} as late, after recovering a task:\n{said}"
        )
    raise RuntimeError(f"{what}\n{stderr[-4000:]}")


def run_kstreams(
    bootstrap: str,
    topic: str,
    cols: Columns,
    *,
    partitions: int,
    window_size_s: int,
    grace_s: int,
    idle_close_s: float,
    k: int,
    timeout_s: float,
    broker_pid: int | None = None,
) -> dict[str, Any]:
    """One run of the peer on ``topic`` (a fresh application id and state folder); with
    ``broker_pid``, the broker's CPU time over the run too. A run in which Kafka Streams
    recovered a task (:class:`PeerRecovered`) is repeated once, and the kept run says why in
    ``repeated_after``; a second such run, or any other wrong output, raises."""
    if partitions > 64:
        raise ValueError(
            "the Kafka Streams peer keeps its reports in a 64-bit mask: at most 64 partitions"
        )
    expected = expected_windows(cols, window_size_s, k)
    events = int(cols.time_ms.size)
    spec = {
        "bootstrap": bootstrap,
        "topic": topic,
        "partitions": partitions,
        "output_partitions": 1,
        "window_size_s": window_size_s,
        "grace_s": grace_s,
        "idle_close_s": idle_close_s,
        "start_s": START_S,
        "k": k,
        "events": events,
        "windows": len(expected),
        "timeout_s": timeout_s - 60,
    }
    run = functools.partial(_run_once, spec, expected, timeout_s, broker_pid)
    try:
        return run()
    except PeerRecovered as first:
        result = run()
        result["repeated_after"] = str(first)
        return result


def _run_once(
    common: dict[str, Any],
    expected: dict[int, tuple[int, int]],
    timeout_s: float,
    broker_pid: int | None,
) -> dict[str, Any]:
    """One run of the peer with a fresh application id, output topic and state folder."""
    from bench.throughput import cpu_seconds_of, create_topics, delete_topics

    bootstrap = common["bootstrap"]
    app_id = f"bench-kstreams-{uuid.uuid4().hex[:10]}"
    output_topic = f"{app_id}-out"
    asyncio.run(create_topics(bootstrap, [output_topic], 1))
    state_dir = tempfile.TemporaryDirectory(prefix=f"{app_id}-")
    spec = {**common, "app_id": app_id, "state_dir": state_dir.name, "output_topic": output_topic}
    argv = [java(), *JVM_OPTIONS, "-cp", f"{JAR}:{TARGET}/libs/*", MAIN_CLASS,
            orjson.dumps(spec).decode()]  # fmt: skip
    broker_cpu = cpu_seconds_of(broker_pid) if broker_pid is not None else 0.0
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, check=False,
            env={**os.environ, "JAVA_TOOL_OPTIONS": ""},
        )  # fmt: skip
    finally:
        if broker_pid is not None:
            broker_cpu = cpu_seconds_of(broker_pid) - broker_cpu
        asyncio.run(delete_topics(bootstrap, names=[output_topic], prefix=app_id))
        state_dir.cleanup()
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(
            f"the Kafka Streams peer failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
        )
    result: dict[str, Any] = orjson.loads(lines[-1])
    check_run(result, expected, common["events"], proc.stderr)
    result["windows_checked"] = len(expected)
    if broker_pid is not None:
        result["broker_cpu_seconds_whole_process_run"] = broker_cpu
    return result


def main() -> int:
    """``python -m bench.kstreams`` (``make kstreams-peer``): build the peer when out of date."""
    try:
        print(ensure_built())
    except PeerUnavailable as exc:
        print(f"the bench will leave the Kafka Streams peer out: {exc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
