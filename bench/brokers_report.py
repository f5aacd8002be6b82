"""RESULTS.md's section 1b: throughput on Apache Kafka and on Tansu, with the Kafka Streams peer.

Rendered from ``results["throughput"]`` (Tansu) and ``results["throughput_apache_kafka"]``
(bench/run.py measures both in the same run), and the provenance lines of a run that merged
only its throughput sections into an earlier whole run (``--only throughput``).
"""

from __future__ import annotations

import math
from typing import Any

#: (results key, label) of every contender row, in table order.
CONTENDERS: tuple[tuple[str, str], ...] = (
    ("raw", "(a) raw aiokafka fetch + orjson decode"),
    ("worker", "(b) stream-dp worker, input keyed by user"),
    ("worker_default", "(b2) stream-dp worker, default configuration (repartitioned)"),
    ("faust", "(c) faust-streaming windowed table"),
    ("kstreams", "(d) Kafka Streams windowed count (bench/kstreams)"),
)
#: (results key, label) of every ratio row; ``_steady`` variants are the processing phases.
RATIOS: tuple[tuple[str, str], ...] = (
    ("ratio_default_to_kstreams", "b2/d: default configuration vs Kafka Streams"),
    ("ratio_worker_to_kstreams", "b/d: keyed input vs Kafka Streams"),
    ("ratio_default_to_raw", "b2/a: default configuration vs raw consumer"),
    ("ratio_worker_to_raw", "b/a: keyed input vs raw consumer"),
    ("ratio_kstreams_to_raw", "d/a: Kafka Streams vs raw consumer"),
    ("ratio_default_to_raw_cpu", "b2/a by CPU per event: default configuration vs raw consumer"),
    ("ratio_worker_to_raw_cpu", "b/a by CPU per event: keyed input vs raw consumer"),
)


def _fmt(x: float | None, digits: int = 0) -> str:
    if x is None or not math.isfinite(x):
        return "–"
    return f"{x:,.{digits}f}"


def provenance(r: dict[str, Any]) -> list[str]:
    """Which run wrote which sections, when some were rerun alone (``--only``)."""
    sources = r.get("sections_from")
    if not sources:
        return []
    whole = sources["whole_run"]
    tp = sources.get("throughput")
    lines = [
        "",
        f"**Sections rerun alone.** The sections not named below are from "
        f"`{whole['command']}` on {whole['date']} (size `{whole['size']}`, "
        f"{whole['total_seconds']:.0f} s), kept as that run wrote them."
        + (" The load average above is the throughput run's." if tp else ""),
    ]
    if tp:
        lines += [
            "",
            f"Sections 1 and 1b (and the throughput targets) are from `{tp['command']}` on "
            f"{tp['date']} (size `{tp['size']}`: {tp['sizes']['events']:,} events, "
            f"{tp['sizes']['runs']} run(s), {tp['seconds']:.0f} s).",
        ]
    for key, what in (
        ("workers", "Section 2 (and the scale-out targets)"),
        ("scaling", "Section 3 (and the targets of the releases and the state per event)"),
    ):
        source = sources.get(key)
        if source:
            shown = " and ".join(
                f"{v[0]:.2f}" if v else "unknown"
                for v in (source.get("loadavg_at_start"), source.get("loadavg_at_end"))
            )
            lines += [
                "",
                f"{what} is from `{source['command']}` on {source['date']} "
                f"({source['seconds']:.0f} s; load average at its start and end {shown}).",
            ]
    return lines


def _contender(section: dict[str, Any], key: str) -> dict[str, Any] | None:
    if "unavailable" in section:
        return None
    found: dict[str, Any] | None = section["contenders"].get(key)
    return found


def section(r: dict[str, Any]) -> list[str]:
    tansu = r["throughput"]
    kafka = r.get("throughput_apache_kafka") or {"unavailable": "not measured in this run"}
    lines = [
        "",
        "## 1b. Throughput on Apache Kafka and on Tansu, with the Kafka Streams peer "
        f"(same run, median of {tansu['runs']} run{'s' if tansu['runs'] > 1 else ''})",
        "",
        "The contenders of section 1 on the same stream, written to a fresh single-node "
        f"{kafka.get('broker', 'Apache Kafka')} broker started by the bench "
        "(stream_dp/broker/apache_kafka.py; JVM flags as Kafka's start scripts: "
        f"`{' '.join(kafka.get('broker_jvm_options', []))}`), and to the embedded Tansu "
        "broker, plus (d) the Kafka Streams peer. Each broker runs on the same 2 cores as the "
        "contender under test.",
        "",
        "| contender | Tansu events/s (end to end) | Tansu events/s (processing) | Tansu CPU s "
        "| Apache Kafka events/s (end to end) | Apache Kafka events/s (processing) "
        "| Apache Kafka CPU s |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, label in CONTENDERS:
        cells = []
        for sec in (tansu, kafka):
            c = _contender(sec, key)
            if c is None:
                cells += ["–", "–", "–"]
                continue
            cells += [
                f"{_fmt(c['events_per_s'])} ({c['events']:,} ev.)",
                _fmt(c["steady_events_per_s"]),
                _fmt(c["median"].get("cpu_seconds"), 2),
            ]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| ratio | Tansu, end to end | Tansu, processing | Apache Kafka, end to end "
        "| Apache Kafka, processing |",
        "|---|---|---|---|---|",
    ]
    for key, label in RATIOS:
        cells = []
        for sec in (tansu, kafka):
            cells += [_fmt(sec.get(key), 2) + "×", _fmt(sec.get(f"{key}_steady"), 2) + "×"]
        lines.append(f"| {label} | " + " | ".join(c.replace("–×", "–") for c in cells) + " |")
    lines.append("")
    if "unavailable" in kafka:
        lines.append(f"- Apache Kafka: not measured here ({kafka['unavailable']}).")
    for name, sec in (("Tansu", tansu), ("Apache Kafka", kafka)):
        if sec.get("kstreams_unavailable"):
            reason = sec["kstreams_unavailable"]
            lines.append(f"- Kafka Streams peer on {name}: left out ({reason}).")
    ks = _contender(tansu, "kstreams") or _contender(kafka, "kstreams")
    if ks is not None:
        med = ks["median"]
        lines.append(
            f"- Kafka Streams time split on Tansu (median): startup "
            f"{_fmt(med.get('startup_seconds'), 2)} s (group join, internal topics: the "
            f"changelog and the partials' repartition topic), processing "
            f"{_fmt(med.get('processing_seconds'), 2)} s, close "
            f"{_fmt(med.get('close_seconds'), 2)} s."
        )
    for name, sec in (("Tansu", tansu), ("Apache Kafka", kafka)):
        peer = _contender(sec, "kstreams")
        repeated = [r for r in (peer or {}).get("runs", []) if "repeated_after" in r]
        if repeated:
            lines.append(
                f"- Kafka Streams on {name}: {len(repeated)} run(s) repeated because Kafka Streams "
                "recovered a task in the first try and re-read records (at-least-once: a revived "
                "task's windowed aggregate keeps its stream time and drops the re-read records as "
                "expired); results.json keeps what the first try saw."
            )
    lines += [
        "- The Kafka Streams peer (bench/kstreams, Java 17, kafka-streams at the broker's version)"
        " reads the same topic as the raw consumer and the worker: every value decoded by Jackson "
        "into an event, its record time the event's `timestamp` field (a TimestampExtractor); "
        "`groupByKey` (the topic is keyed by user id, so no repartition, as the worker's keyed "
        "input) into tumbling event-time windows of the bench's size and grace, aggregated into "
        "each user's count bounded at k in an in-memory window store with its changelog topic (as "
        "Faust's memory store) and Kafka Streams' default record cache (10 MiB, flushed at each 1 "
        "s commit: the changelog gets the latest count per user and window, not one record per "
        "event). Windows close by event time; once the whole stream has been idle for "
        f"{tansu.get('kstreams_idle_close_s', 0):g} s (as the Faust peer's: its stream thread "
        "pauses for more than 0.5 s in mid-stream at times under load), and only once it has "
        "taken every event of the topic (its reader at the end of every partition, as stream-dp "
        "counts silence only at the log's end), its watermark follows "
        "the wall clock (stream-dp's rule: `suppress(untilWindowCloses)` alone "
        "never closes the last window of a stream that falls silent). On close, each partition's "
        "task reads the window's bounded counts from the store and writes one partial through a "
        "repartition topic to a table of window totals, which writes one record per window to the "
        "output topic once every input partition has reported it. One stream thread, "
        "at-least-once, no idempotent producer (the embedded broker has none), the worker's fetch "
        "sizes. The bench checks every window's users and bounded events against the stream "
        "itself. Like Faust it does not pseudonymize, group by domain, add noise or keep a ledger:"
        " less work than the worker. Timed from just before `KafkaStreams.start()` (JVM start-up "
        "left out, as Python's imports are) to its own consumer reading the last window record; "
        "CPU is the whole JVM's (stream and client threads, JIT compiler, garbage collector).",
    ]
    return lines
