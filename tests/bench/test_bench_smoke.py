"""The benchmark's smallest size end to end: every figure is produced and is a finite number.

Runs ``python -m bench.run --size smoke`` in a subprocess (its own embedded broker, worker,
1, 2 and 3 ``stream-dp run`` processes, Faust and Kafka Streams peers, the throughput section
again on an Apache Kafka broker, and the PipelineDP comparison), writing into a temporary
folder. Where Java cannot run (no JVM, no Maven to build the peer or fetch the broker's jars)
the bench leaves the Kafka Streams and Apache Kafka rows out and says why; then only those
checks skip, with that reason.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from bench.brokers_report import CONTENDERS, RATIOS

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


def _finite(value: Any, what: str) -> None:
    assert isinstance(value, int | float) and not isinstance(value, bool), (what, value)
    assert math.isfinite(value), (what, value)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("bench")
    proc = subprocess.run(
        [sys.executable, "-m", "bench.run", "--size", "smoke", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,  # a hang guard only: a loaded 2-core machine is slower
        check=False,
    )
    # The Java peers log a WARN per skipped record; the bench's own lines and any traceback
    # are what says why it failed, with the peers' last WARN lines after them (a skipped or
    # re-read record, a rebalance: what the peer saw when its counts came out wrong).
    lines = proc.stderr.splitlines()
    ours = "\n".join(line for line in lines if " WARN " not in line)[-6000:]
    warned = "\n".join([line for line in lines if " WARN " in line][-12:])[-3000:]
    assert proc.returncode == 0, f"{ours}\n--- the peers' last WARN lines:\n{warned}"
    return out, orjson.loads((out / "results.json").read_bytes())


def test_throughput_lines_and_ratios(smoke: tuple[Path, dict[str, Any]]) -> None:
    tp = smoke[1]["throughput"]
    for name in ("raw", "worker", "worker_default", "worker_on_faust_input", "faust"):
        c = tp["contenders"][name]
        assert c["runs"], name
        _finite(c["events_per_s"], f"{name} events/s")
        assert c["events_per_s"] > 0
        _finite(c["median"]["cpu_seconds"], f"{name} cpu")
        _finite(c["median"]["seconds"], f"{name} seconds")
    for name in ("worker", "worker_default", "worker_on_faust_input", "faust"):
        c = tp["contenders"][name]
        for phase in ("startup_seconds", "processing_seconds", "close_seconds"):
            _finite(c["median"][phase], f"{name} {phase}")
        _finite(c["steady_events_per_s"], f"{name} steady")
        for run in c["runs"] if name != "faust" else ():  # the processing phase: a part
            assert 0 < run["processing_cpu_seconds"] <= run["cpu_seconds"], (name, run)
    for ratio in (
        "ratio_default_to_raw",
        "ratio_default_to_raw_steady",
        "ratio_worker_to_raw",
        "ratio_worker_to_raw_steady",
        "ratio_worker_to_faust",
        "ratio_worker_to_faust_steady",
        "ratio_default_to_raw_cpu",
        "ratio_default_to_raw_cpu_steady",
        "ratio_worker_to_raw_cpu",
        "ratio_worker_to_raw_cpu_steady",
    ):
        _finite(tp[ratio], ratio)
        assert tp[ratio] > 0


def test_kafka_streams_and_apache_kafka_rows(smoke: tuple[Path, dict[str, Any]]) -> None:
    out, results = smoke
    sections = {"tansu": results["throughput"], "apache_kafka": results["throughput_apache_kafka"]}
    missing = {
        name: sec.get("unavailable") or sec.get("kstreams_unavailable")
        for name, sec in sections.items()
        if "unavailable" in sec or "kstreams_unavailable" in sec
    }
    if missing:
        pytest.skip(f"no Java here for the Kafka Streams / Apache Kafka rows: {missing}")
    for name, sec in sections.items():
        for key, _label in CONTENDERS:
            c = sec["contenders"][key]
            _finite(c["events_per_s"], f"{name} {key} events/s")
            assert c["events_per_s"] > 0 and c["runs"], (name, key)
        ks = sec["contenders"]["kstreams"]
        assert ks["events"] == sec["events"], name  # the peer reads the whole topic
        for run in ks["runs"]:
            # bench/kstreams.py compared every window record with the stream itself.
            assert run["windows_checked"] == sec["windows"], (name, run)
        for phase in ("startup_seconds", "processing_seconds", "close_seconds"):
            _finite(ks["median"][phase], f"{name} kstreams {phase}")
        for key, _label in RATIOS:
            _finite(sec[key], f"{name} {key}")
            assert sec[key] > 0
    text = (out / "RESULTS.md").read_text(encoding="utf-8")
    assert "## 1b. Throughput on Apache Kafka and on Tansu, with the Kafka Streams peer" in text
    assert "(d) Kafka Streams windowed count" in text


def test_worker_processes_release_every_window_exactly_once(
    smoke: tuple[Path, dict[str, Any]],
) -> None:
    wk = smoke[1]["workers"]
    assert wk["worker_counts"] == [1, 2, 3]
    assert set(wk["modes"]) == {"keyed_by_user", "repartitioned"}
    for label, mode in wk["modes"].items():
        assert [p["workers"] for p in mode["points"]] == [1, 2, 3], label
        for point in mode["points"]:
            n = point["workers"]
            _finite(point["events_per_s"], f"{label} {n} events/s")
            assert point["events_per_s"] > 0
            _finite(point["ratio_to_one_worker"], f"{label} {n} ratio")
            _finite(point["broker_cpu_seconds"], f"{label} {n} broker cpu")
            assert len(point["runs"]) == wk["runs"]
            for run in point["runs"]:
                # One window record per (query, window), read back after every worker stopped.
                assert run["exactly_once"], (label, n, run)
                assert run["distinct_windows"] == run["window_records"] == wk["windows"]
                # Every input record was read (from each worker's /metrics).
                assert run["events_consumed"] >= wk["events"], (label, n, run)
                assert len(run["cpu_seconds_per_worker"]) == n
                assert all(c > 0 for c in run["cpu_seconds_per_worker"]), (label, n, run)
                # The phases (bench/worker_phases.py): the smoke's topic is too short for a
                # steady span, but every process's start-up is read.
                phases = run["phases"]
                assert len(phases["startup_cpu_s_per_worker"]) == n, (label, n, phases)
                assert all(c > 0 for c in phases["startup_cpu_s_per_worker"]), (label, n, phases)


def test_scaling_release_and_memory(smoke: tuple[Path, dict[str, Any]]) -> None:
    sc = smoke[1]["scaling"]
    assert len(sc["users_sweep"]) >= 2 and len(sc["keys_sweep"]) >= 2
    for row in [*sc["users_sweep"], *sc["keys_sweep"]]:
        _finite(row["events_per_s"], "scaling events/s")
        _finite(row["release_seconds_per_window"], "scaling release")
    _finite(sc["release"]["seconds"], "release seconds")
    _finite(sc["release_large"]["seconds"], "large release seconds")
    assert sc["release_large"]["public"]["released_keys"] == sc["release_large"]["keys"]
    _finite(sc["release"]["public"]["seconds"], "public release seconds")
    assert sc["release"]["public"]["released_keys"] == sc["release"]["keys"]
    for step in ("seal_seconds", "transport_seconds", "release_seconds"):
        _finite(sc["release"]["public"][step], f"public release {step}")
    for rate in ("route_events_per_s", "routed_ingest_events_per_s", "routed_bytes_per_event"):
        _finite(sc["repartition"][rate], f"repartition {rate}")
    for memory in (sc["memory"], sc["memory_traced"], sc["memory_heavy_tailed"]):
        _finite(memory["bytes_per_retained_event"], "bytes per event")
        assert memory["bytes_per_retained_event"] > 0


def test_utility_rows(smoke: tuple[Path, dict[str, Any]]) -> None:
    rows = smoke[1]["utility"]["rows"]
    methods = {r["method"] for r in rows}
    assert methods == {
        "pipeline_dp",
        "stream-dp truncated_geometric",
        "stream-dp laplace_threshold",
        "stream-dp gaussian_threshold",
        "stream-dp count_threshold",
    }
    assert len({r["bounds"] for r in rows}) == 2
    for row in rows:
        _finite(row["keys_kept"], f"{row['method']} keys kept")
        if row["keys_kept"] > 0:
            _finite(row["mae"], f"{row['method']} MAE")


def test_continual_rows(smoke: tuple[Path, dict[str, Any]]) -> None:
    c = smoke[1]["continual"]
    assert c["windows"] == [64, 256]
    options = {"discrete_laplace": 3, "discrete_gaussian": 4}
    for n in c["windows"]:
        rows = [r for r in c["rows"] if r["windows"] == n]
        expected = options["discrete_laplace"] + 2 * options["discrete_gaussian"]
        assert len(rows) == expected, n
        for row in rows:
            for field in ("rmse_last", "rmse_all_windows", "predicted_worst_sd"):
                _finite(row[field], f"continual {n} {row['option']} {field}")
                assert row[field] > 0
            _finite(row["ratio_all_to_per_window_sum"], "continual ratio")


def test_report_and_plot(smoke: tuple[Path, dict[str, Any]]) -> None:
    out, results = smoke
    text = (out / "RESULTS.md").read_text(encoding="utf-8")
    assert "## Targets" in text and "--size smoke" in text
    assert len(results["targets"]) == 11
    assert all(isinstance(t["passed"], bool) for t in results["targets"])
    assert "## 2. Scale-out: 1, 2 and 3 worker processes" in text
    assert "(scaling_workers.png)" in text
    assert "## 5. Continual release: running totals (simulated, no Kafka)" in text
    assert "## 6. Automatic bounds (bounds: auto)" in text
    assert "## 10. Ledger start-up against the ledger's size (no broker)" in text
    plots = ("throughput.png", "scaling_workers.png", "continual_rmse.png", "auto_bounds_drift.png")
    for name in plots:
        png = (out / name).read_bytes()
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000, name
    assert "## 7. Profiles of the default path, before and after" in text
    # The profile of the old code ships with the bench; this run's is drawn beside it
    # (unless py-spy may not attach here, which the report then says).
    before = (out / "profiles" / "default_path_before.svg").read_text(encoding="utf-8")
    assert before.startswith("<svg") and "samples" in before
    if "error" not in results["throughput"]["profile"]:
        after = (out / "profiles" / "default_path_after.svg").read_text(encoding="utf-8")
        assert after.startswith("<svg") and results["profiles"]["after"]["top"]
