"""``python -m bench.run [--size {smoke,small,full}] [--out DIR] [--only SECTION]``.

The whole benchmark. Starts its own embedded broker, measures throughput (raw consumer,
worker, Faust, the Kafka Streams peer), then the same throughput section on an Apache Kafka
broker (stream_dp.broker.apache_kafka; left out, saying why, without Java), scale-out
over 1, 2 and 3 worker processes, in-process scaling of the pipeline stages, state size and
utility against PipelineDP, automatic bounds against fixed bounds and PipelineDP (section 6),
continual release (running totals, simulated without Kafka), a burst of erasures on a
large window (:mod:`bench.erasure_burst`) and the ledger's start-up read against its size
(:mod:`bench.ledger_startup`),
deletes its topics, stops the broker and writes ``RESULTS.md``, ``results.json``,
``throughput.png``, ``scaling_workers.png`` and ``continual_rmse.png`` into ``--out``
(default: the ``bench`` folder). ``smoke`` takes a few minutes and exists for the test.

``--only throughput`` runs the throughput sections alone (both brokers) and merges them into
the ``results.json`` already in ``--out``: the other sections keep the figures of the run that
wrote them, and RESULTS.md says which run wrote which section. ``--only workers`` (section 2)
and ``--only scaling`` (section 3: the stages in-process, the releases of 100,000 and
1,000,000 keys, the state per retained event; no broker) do the same for their sections.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from bench import (
    continual,
    erasure_burst,
    ledger_startup,
    report,
    scaling,
    throughput,
    utility,
    workers,
)
from bench.data import StreamSpec
from stream_dp.broker import EmbeddedBroker
from stream_dp.broker.apache_kafka import ApacheKafkaBroker
from stream_dp.errors import BrokerError

SIZES: dict[str, dict[str, Any]] = {
    "smoke": {
        "events": 20_000,
        "users": 2_000,
        "keys": 50,
        "windows": 4,
        "window_size_s": 10,
        "faust_events": 10_000,
        "workers_events": 20_000,
        # The smoke's Kafka Streams peer runs on a machine busy with the test suite: a 2 s
        # pause of its one stream thread closed windows early there, and once 6 s (the suite
        # beside a chaos run). 15 s of whole-stream silence before the wall clock closes
        # them (its window records are still checked against the stream's).
        "kstreams_idle_close_s": 15.0,
        "runs": 1,
        "scaling_events": 20_000,
        "users_sweep": [1_000, 5_000, 20_000],
        "keys_sweep": [20, 500, 5_000],
        "keys_sweep_users": 2_000,
        "release_events": 40_000,
        "release_keys": 4_000,
        "release_users": 5_000,
        "large_release_events": 60_000,
        "large_release_keys": 40_000,
        "large_release_users": 40_000,
        "memory_users": 10_000,
        "memory_events_per_user": 48,
        "heavy_events": 20_000,
        "heavy_users": 2_000,
        "utility_users": 1_500,
        "utility_runs": 2,
    },
    "small": {
        "events": 200_000,
        "users": 20_000,
        "keys": 500,
        "windows": 10,
        "window_size_s": 60,
        "faust_events": 20_000,
        "workers_events": 400_000,
        "runs": 3,
        "scaling_events": 200_000,
        "users_sweep": [10_000, 100_000, 300_000],
        "keys_sweep": [20, 1_000, 10_000, 100_000],
        "keys_sweep_users": 50_000,
        "release_events": 500_000,
        "release_keys": 100_000,
        "release_users": 100_000,
        "large_release_events": 1_000_000,
        "large_release_keys": 400_000,
        "large_release_users": 400_000,
        "memory_users": 100_000,
        "memory_events_per_user": 48,
        "heavy_events": 200_000,
        "heavy_users": 20_000,
        "utility_users": 9_000,
        "utility_runs": 5,
    },
    "full": {
        "events": 1_000_000,
        "users": 50_000,
        "keys": 1_000,
        "windows": 10,
        "window_size_s": 60,
        "faust_events": 120_000,
        # Section 2: long enough that its steady state (every worker joined, input not yet
        # drained) holds most of the run (bench/worker_phases.py).
        "workers_events": 2_000_000,
        "runs": 3,
        "scaling_events": 1_000_000,
        "users_sweep": [10_000, 100_000, 1_000_000],
        "keys_sweep": [20, 1_000, 10_000, 100_000],
        "keys_sweep_users": 50_000,
        "release_events": 1_000_000,
        "release_keys": 100_000,
        "release_users": 100_000,
        "large_release_events": 2_000_000,
        "large_release_keys": 1_000_000,
        "large_release_users": 1_000_000,
        "memory_users": 1_000_000,
        "memory_events_per_user": 48,
        "heavy_events": 1_000_000,
        "heavy_users": 50_000,
        "utility_users": 9_000,
        "utility_runs": 20,
    },
}

NOTES = [
    "The Kafka client's work per record. aiokafka parses every fetched record into a Python "
    "object (its C extension, about 0.8 µs a record here) and then builds a `ConsumerRecord` "
    "from it (about 0.5 µs more); the raw consumer pays both, the worker only the first "
    "(stream_dp/clients/fetched.py hands it the parsed records). Its producer takes "
    "tens of microseconds of Python per `send`: the worker never sends one record per event, "
    "stage 0 writes packed records and record batches (`send_batch`) carry the output.",
    "Python work per event that cannot be batched away: one decode per record (msgspec's of "
    "the needed fields where its guards allow, else orjson's, as the raw consumer), and per "
    "distinct user and batch a normalisation and an HMAC-SHA256 "
    "pseudonym (raw ids live only in a batch-local cache, never in state, so each fetched "
    "batch pseudonymizes its users again). Everything else — validation of the decoded "
    "columns, the key and placement checks, windows, signatures, the samples' bottom-k "
    "compaction, bounding and totals — is per batch and column (numpy).",
    "Two cores shared with the broker and with other work on the machine (the load average "
    "is in the header): the broker serves every fetch and stores every produced record (the "
    "default path writes every event once more), so client and broker compete.",
    "Fixed costs that do not shrink with the topic: the consumer-group join (the broker "
    "holds JoinGroup for about 1 s), the ledger read-back behind fences, and the close of the "
    "last window (idle_close_s; with repartitioned input stage 0's progress marks must first "
    "say that the input partitions are idle; then its partials' round trip through the "
    "partials topic, the release and its acknowledged writes). The raw consumer uses manual "
    "assignment and has none of them; on a topic that the raw consumer reads in 3 s they "
    "are a large share of the worker's end-to-end time (the processing-phase ratios leave "
    "them out).",
    "A worker process runs its stages in one thread (the release's CPU-heavy steps run in a "
    "second one, off the event loop): one process cannot use the second core. Several "
    "`stream-dp run` processes in one consumer group share the partitions (section 2).",
    "Faust: about 200 µs per event in its stream machinery, table bookkeeping (a heap entry "
    "and a changelog record per update) and producer, so its rate is bound by its own "
    "per-event overhead, not by Kafka. On a topic small enough for Faust to read in a few "
    "runs, the worker's fixed startup and close costs weigh in the end-to-end ratio.",
]


#: The Apache Kafka broker's JVM in the bench: the heap and collector flags Kafka's own start
#: scripts use (KAFKA_HEAP_OPTS, KAFKA_JVM_PERFORMANCE_OPTS) and the full JIT, not the test
#: tier's small-heap, quick-start-JIT flags.
BENCH_BROKER_JVM_OPTIONS = (
    "-Xms1g",
    "-Xmx1g",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-Djava.awt.headless=true",
)


def _log(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


def _spec(cfg: dict[str, Any]) -> StreamSpec:
    return StreamSpec(
        events=cfg["events"],
        users=cfg["users"],
        keys=cfg["keys"],
        windows=cfg["windows"],
        window_size_s=cfg["window_size_s"],
    )


def _workers_spec(cfg: dict[str, Any]) -> StreamSpec:
    """Section 2's stream: section 1's with ``workers_events`` events."""
    return dataclasses.replace(_spec(cfg), events=cfg.get("workers_events", cfg["events"]))


def throughput_on_apache_kafka(cfg: dict[str, Any]) -> dict[str, Any]:
    """The throughput section on a fresh single-node Apache Kafka broker (KRaft), or
    ``{"unavailable": reason}`` where it cannot start here (no Java, no jars)."""
    spec = _spec(cfg)
    _log(f"[bench] throughput on Apache Kafka: {spec.events:,} events, {cfg['runs']} run(s)")
    broker = ApacheKafkaBroker(jvm_options=BENCH_BROKER_JVM_OPTIONS)
    try:
        broker.start()
    except BrokerError as exc:
        _log(f"[bench] Apache Kafka throughput left out: {exc}")
        return {"unavailable": str(exc)}
    try:
        section = throughput.measure(
            broker.bootstrap_servers,
            broker.pid,
            spec,
            runs=cfg["runs"],
            faust_events=cfg["faust_events"],
            kstreams_idle_close_s=_kstreams_idle_close_s(cfg),
            log=_log,
        )
    finally:
        broker.stop()
    section["broker"] = f"Apache Kafka {broker.version} (single-node KRaft)"
    section["broker_jvm_options"] = list(BENCH_BROKER_JVM_OPTIONS)
    return section


def _kstreams_idle_close_s(cfg: dict[str, Any]) -> float:
    return float(cfg.get("kstreams_idle_close_s", throughput.KSTREAMS_IDLE_CLOSE_S))


def run(size: str, out: Path, command: str) -> dict[str, Any]:
    cfg = SIZES[size]
    logging.getLogger("stream_dp").setLevel(logging.ERROR)
    started = time.perf_counter()
    results: dict[str, Any] = {
        "size": size,
        "command": command,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": report.machine(),
        "sizes": cfg,
        "notes": NOTES,
    }
    spec = _spec(cfg)
    _log(f"[bench] throughput: {spec.events:,} events, {cfg['runs']} run(s)")
    with EmbeddedBroker() as broker:
        results["throughput"] = throughput.measure(
            broker.bootstrap_servers,
            broker.pid,
            spec,
            runs=cfg["runs"],
            faust_events=cfg["faust_events"],
            kstreams_idle_close_s=_kstreams_idle_close_s(cfg),
            log=_log,
            profile_dir=out,
        )
        results["throughput"]["broker"] = "Tansu (embedded, memory storage)"
        _log(
            f"[bench] scale-out: 1, 2, 3 worker processes, {workers.PARTITIONS} partitions, "
            f"{cfg['runs']} run(s)"
        )
        results["workers"] = workers.measure(
            broker.bootstrap_servers, broker.pid, _workers_spec(cfg), runs=cfg["runs"], log=_log
        )
    results["throughput_apache_kafka"] = throughput_on_apache_kafka(cfg)
    _log("[bench] scaling (stages in-process)")
    results["scaling"] = scaling.measure(cfg, log=_log)
    _log(f"[bench] utility: {cfg['utility_users']:,} users, {cfg['utility_runs']} runs")
    results["utility"] = utility.measure(cfg["utility_users"], cfg["utility_runs"], log=_log)
    sizes = continual.SIZES[size]
    _log(f"[bench] continual release: horizons {sizes['windows']}")
    results["continual"] = continual.measure(
        sizes["windows"], sizes["keys"], sizes["keys_long"], log=_log
    )
    results["continual"]["size"] = size
    results["auto_bounds"] = utility.measure_auto_bounds(size, log=_log)
    results["erasure_burst"] = {
        **erasure_burst.measure(size, log=_log),
        "command": command,
        "date": results["date"],
        "loadavg": f"{report.loadavg()[0]:.2f}",
    }
    _log("[bench] ledger start-up against its size")
    results["ledger_startup"] = ledger_startup.measure(ledger_startup.SIZES[size], log=_log)
    results["total_seconds"] = time.perf_counter() - started
    results["machine"]["loadavg_at_end"] = report.loadavg()
    _finish(results, out)
    return results


def _previous_results(out: Path, section: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The results a ``--only SECTION`` run merges into (refused when ``out`` has none), and
    the default path's profile kept from them, with its folded stacks read back."""
    previous = out / "results.json"
    if not previous.exists():
        raise SystemExit(
            f"--only {section} merges into {previous}, which does not exist: run the whole "
            "bench (without --only) into that folder first"
        )
    from bench import profile

    results: dict[str, Any] = orjson.loads(previous.read_bytes())
    logging.getLogger("stream_dp").setLevel(logging.ERROR)
    kept_profile = results["throughput"].get("profile") or {}
    folded = out / "profiles" / "default_path_after.folded"
    if folded.exists():
        kept_profile = {**kept_profile, "stacks": profile.read_folded(folded)}
    return results, kept_profile


def run_throughput_only(size: str, out: Path, command: str) -> dict[str, Any]:
    """The throughput sections alone (Tansu, then Apache Kafka), merged into the results
    already in ``out`` (their other sections, profile included, are kept as they were)."""
    results, kept_profile = _previous_results(out, "throughput")
    cfg = SIZES[size]
    started = time.perf_counter()
    # A second --only run keeps pointing at the whole run the other sections come from.
    sources = results.get("sections_from") or {
        "whole_run": {k: results[k] for k in ("size", "command", "date", "total_seconds")}
    }
    results["sections_from"] = {k: v for k, v in sources.items() if k in ("whole_run", "workers")}
    whole_machine = results["machine"].get("whole_run", results["machine"])
    results["machine"] = {**report.machine(), "whole_run": whole_machine}
    spec = _spec(cfg)
    _log(f"[bench] throughput: {spec.events:,} events, {cfg['runs']} run(s)")
    with EmbeddedBroker() as broker:
        results["throughput"] = throughput.measure(
            broker.bootstrap_servers,
            broker.pid,
            spec,
            runs=cfg["runs"],
            faust_events=cfg["faust_events"],
            kstreams_idle_close_s=_kstreams_idle_close_s(cfg),
            log=_log,
        )
    results["throughput"]["broker"] = "Tansu (embedded, memory storage)"
    results["throughput"]["profile"] = kept_profile
    results["notes"] = NOTES  # what limits throughput: this code's, not the whole run's
    results["throughput_apache_kafka"] = throughput_on_apache_kafka(cfg)
    results["sections_from"]["throughput"] = {
        "size": size,
        "command": command,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "sizes": cfg,
        "seconds": time.perf_counter() - started,
    }
    results["machine"]["loadavg_at_end"] = report.loadavg()
    _finish(results, out)
    return results


def _section_source(
    results: dict[str, Any],
    section: str,
    size: str,
    command: str,
    started: float,
    loadavg_at_start: Any,
) -> None:
    """Record which run wrote ``section`` (a ``--only`` run), beside the whole run's."""
    sources = results.setdefault("sections_from", {})
    if "whole_run" not in sources:
        sources["whole_run"] = {k: results[k] for k in ("size", "command", "date", "total_seconds")}
    sources[section] = {
        "size": size,
        "command": command,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "sizes": SIZES[size],
        "seconds": time.perf_counter() - started,
        "loadavg_at_start": loadavg_at_start,
        "loadavg_at_end": report.loadavg(),
    }


def run_workers_only(size: str, out: Path, command: str) -> dict[str, Any]:
    """Section 2 alone (scale-out over worker processes, on Tansu), merged into the results
    already in ``out`` (the other sections, profile included, are kept as they were)."""
    results, kept_profile = _previous_results(out, "workers")
    results["throughput"]["profile"] = kept_profile
    cfg = SIZES[size]
    started = time.perf_counter()
    loadavg_at_start = report.loadavg()
    spec = _workers_spec(cfg)
    _log(
        f"[bench] scale-out: 1, 2, 3 worker processes, {workers.PARTITIONS} partitions, "
        f"{spec.events:,} events, {cfg['runs']} run(s)"
    )
    with EmbeddedBroker() as broker:
        results["workers"] = workers.measure(
            broker.bootstrap_servers, broker.pid, spec, runs=cfg["runs"], log=_log
        )
    _section_source(results, "workers", size, command, started, loadavg_at_start)
    _finish(results, out)
    return results


def run_scaling_only(size: str, out: Path, command: str) -> dict[str, Any]:
    """Section 3 alone (the stages in-process, the releases of 100,000 and 1,000,000 keys and
    the state per retained event, no broker), merged into the results already in ``out``
    (the other sections, profile included, are kept as they were)."""
    results, kept_profile = _previous_results(out, "scaling")
    results["throughput"]["profile"] = kept_profile
    cfg = SIZES[size]
    started = time.perf_counter()
    loadavg_at_start = report.loadavg()
    _log("[bench] scaling (stages in-process)")
    results["scaling"] = scaling.measure(cfg, log=_log)
    _section_source(results, "scaling", size, command, started, loadavg_at_start)
    _finish(results, out)
    return results


def _finish(results: dict[str, Any], out: Path) -> None:
    report.write(results, out)
    for t in results["targets"]:
        verdict = "PASS" if t["passed"] else "FAIL"
        _log(f"[bench] {verdict}  {t['target']} ({t['goal']}): {t['measured']}")
    _log(f"[bench] wrote {out / 'RESULTS.md'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument(
        "--only",
        choices=["throughput", "workers", "scaling"],
        help="run only this section (throughput: sections 1 and 1b, on both brokers; "
        "workers: section 2; scaling: section 3 with the releases of 100,000 and 1,000,000 "
        "keys and the state per event) and merge it into --out's results.json",
    )
    args = parser.parse_args(argv)
    shown = ["python -m bench.run", *(sys.argv[1:] if argv is None else argv)]
    if args.only == "throughput":
        run_throughput_only(args.size, args.out, " ".join(shown))
    elif args.only == "workers":
        run_workers_only(args.size, args.out, " ".join(shown))
    elif args.only == "scaling":
        run_scaling_only(args.size, args.out, " ".join(shown))
    else:
        run(args.size, args.out, " ".join(shown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
