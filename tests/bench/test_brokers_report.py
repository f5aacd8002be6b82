"""RESULTS.md's section 1b and the provenance of a throughput-only rerun (bench/brokers_report.py).

Rendered from hand-made results, so each line can be checked against the figures that made it.
"""

from __future__ import annotations

from typing import Any

from bench import brokers_report


def _section(scale: float, *, kstreams: bool = True) -> dict[str, Any]:
    keys = [key for key, _label in brokers_report.CONTENDERS if kstreams or key != "kstreams"]
    contenders = {
        key: {
            "events": 1000,
            "events_per_s": scale * (i + 1) * 1000,
            "steady_events_per_s": scale * (i + 1) * 2000,
            "median": {
                "cpu_seconds": 1.5,
                "startup_seconds": 0.5,
                "processing_seconds": 1.0,
                "close_seconds": 0.25,
            },
        }
        for i, key in enumerate(keys)
    }
    section: dict[str, Any] = {"runs": 3, "contenders": contenders}
    section.update({key: 2.0 for key, _label in brokers_report.RATIOS})
    if not kstreams:
        section["kstreams_unavailable"] = "no Java runtime on PATH"
    return section


def test_rows_of_both_brokers_and_the_ratios() -> None:
    results = {"throughput": _section(1.0), "throughput_apache_kafka": _section(3.0)}
    results["throughput_apache_kafka"]["ratio_default_to_kstreams"] = 0.5
    lines = brokers_report.section(results)
    row = next(line for line in lines if line.startswith("| (d) Kafka Streams"))
    # Tansu's fifth contender at 5,000 events/s, Apache Kafka's at 15,000.
    assert "| 5,000 (1,000 ev.) | 10,000 | 1.50 | 15,000 (1,000 ev.) | 30,000 | 1.50 |" in row
    ratio = next(line for line in lines if line.startswith("| b2/d"))
    assert ratio.endswith("| 2.00× | – | 0.50× | – |")


def test_missing_broker_and_missing_peer_are_said_with_their_reason() -> None:
    results = {
        "throughput": _section(1.0, kstreams=False),
        "throughput_apache_kafka": {"unavailable": "no Java on PATH"},
    }
    text = "\n".join(brokers_report.section(results))
    assert "- Apache Kafka: not measured here (no Java on PATH)." in text
    assert "- Kafka Streams peer on Tansu: left out (no Java runtime on PATH)." in text
    row = next(line for line in text.splitlines() if line.startswith("| (d) Kafka Streams"))
    assert row.count("| –") == 6


def test_provenance_names_both_runs_only_when_merged() -> None:
    assert brokers_report.provenance({}) == []
    merged = {
        "sections_from": {
            "throughput": {
                "command": "python -m bench.run --only throughput",
                "date": "D2",
                "size": "small",
                "sizes": {"events": 200_000, "runs": 3},
                "seconds": 480.0,
            },
            "whole_run": {
                "command": "python -m bench.run",
                "date": "D1",
                "size": "full",
                "total_seconds": 1187.0,
            },
        }
    }
    text = "\n".join(brokers_report.provenance(merged))
    assert "`python -m bench.run --only throughput` on D2 (size `small`: 200,000 events" in text
    assert "`python -m bench.run` on D1 (size `full`, 1187 s)" in text


def test_provenance_names_a_scaling_only_rerun_without_a_throughput_one() -> None:
    merged = {
        "sections_from": {
            "scaling": {
                "command": "python -m bench.run --only scaling",
                "date": "D3",
                "size": "full",
                "sizes": {},
                "seconds": 200.0,
                "loadavg_at_start": [0.5, 0.4, 0.3],
                "loadavg_at_end": [1.25, 0.9, 0.5],
            },
            "whole_run": {
                "command": "python -m bench.run",
                "date": "D1",
                "size": "full",
                "total_seconds": 1187.0,
            },
        }
    }
    text = "\n".join(brokers_report.provenance(merged))
    assert "`python -m bench.run` on D1 (size `full`, 1187 s)" in text
    assert (
        "Section 3 (and the targets of the releases and the state per event) is from "
        "`python -m bench.run --only scaling` on D3 (200 s; load average at its start and "
        "end 0.50 and 1.25)." in text
    )
    assert "throughput run" not in text and "Sections 1 and 1b" not in text


def test_a_repeated_peer_run_is_said_per_broker_and_a_clean_one_is_not() -> None:
    results = {"throughput": _section(1.0), "throughput_apache_kafka": _section(3.0)}
    runs = [{"seconds": 2.0}, {"seconds": 2.1, "repeated_after": "re-read 5,565 records"}]
    results["throughput_apache_kafka"]["contenders"]["kstreams"]["runs"] = runs
    results["throughput"]["contenders"]["kstreams"]["runs"] = [{"seconds": 2.0}]
    said = [ln for ln in brokers_report.section(results) if "repeated because" in ln]
    assert said == [
        "- Kafka Streams on Apache Kafka: 1 run(s) repeated because Kafka Streams recovered a "
        "task in the first try and re-read records (at-least-once: a revived task's windowed "
        "aggregate keeps its stream time and drops the re-read records as expired); "
        "results.json keeps what the first try saw."
    ]
