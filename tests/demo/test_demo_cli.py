"""``stream-dp demo`` as a real process: JSON lines end to end, and Ctrl-C / SIGTERM.

The accuracy check is statistical, on the two queries that release a count of every kept
key (visits_by_domain, users_by_country; the summary checks the same). Each released value
carries its own 95% half-width t (the smallest t with P(|Z| > t) ≤ 0.05 for its discrete
Laplace noise). At the demo's ε = 4 the exact miss probabilities are 0.0488 (visits, ε 1.6,
scale 25, t = 75) and 0.0462 (users, ε 0.8, scale 3.75, t = 11); noise draws are
independent, also of partition selection. So the number of misses among n ≥ 500 large
values is at most Binomial(n, 0.0488), and the test's "≥ 90% inside" fails by chance with
probability ≤ 8.2·10⁻⁷ (scipy: binom.sf(50, 500, 0.0488); larger n only lowers it), below
the project's 1e-6 bound for statistical tests.
A half-width that is too narrow (say the scale instead of 3 × the scale: ~63% coverage)
fails it every time.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.cli.support import LineReader, cli_argv, run_cli
from tests.helpers import process_gone, tansu_pids, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

EPSILON = 4.0
WINDOWS = 50
DEMO_ARGS = ["--users", "500", "--windows", str(WINDOWS), "--epsilon", str(EPSILON)]
QUERIES = {
    "visits_by_domain",
    "users_by_country",
    "top_domains",
    "latency_variance",
    "latency_quantiles",
}
#: The queries of the statistical check (above).
CI_CHECKED = {"visits_by_domain", "users_by_country"}
QUANTILES = [0.5, 0.9, 0.99]
MIN_LARGE_VALUES = 500


def _broker_gone(start: dict[str, Any]) -> None:
    pid = start["broker"]["pid"]
    port = int(start["broker"]["bootstrap_servers"].rsplit(":", 1)[1])
    wait_until(lambda: process_gone(pid), 10, f"the demo's broker (pid {pid}) to exit")
    assert tansu_pids(port) == [], "a broker process still serves the demo's port"


def test_demo_json_end_to_end() -> None:
    # Environment overrides meant for a real deployment must not reach the demo.
    env = {
        **os.environ,
        "STREAM_DP_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:1",
        "STREAM_DP_PRIVACY__EPSILON_PER_WINDOW": "0.01",
    }
    done = run_cli("demo", "--json", *DEMO_ARGS, env=env)
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert all(r["schema_version"] == 1 for r in records)
    start, *windows, summary = records
    assert start["kind"] == "start" and summary["kind"] == "summary"
    assert start["ephemeral_key"] is True
    assert start["broker"]["bootstrap_servers"] != "127.0.0.1:1"
    assert start["privacy"]["epsilon_per_window"] == EPSILON
    _broker_gone(start)

    # A result for every window, in order, with releases for both queries.
    assert [w["kind"] for w in windows] == ["window"] * WINDOWS
    assert [w["index"] for w in windows] == list(range(1, WINDOWS + 1))
    for w in windows:
        per_query = {q["query"]: q for q in w["queries"]}
        assert set(per_query) == QUERIES
        for name, q in per_query.items():
            rows = [r for r in w["rows"] if r["query"] == name]
            per_key = len(QUANTILES) if name == "latency_quantiles" else 1
            assert len(rows) == q["released_keys"] * per_key
        assert per_query["visits_by_domain"]["released_keys"] >= 1
        for name in ("users_by_country", "latency_variance", "latency_quantiles"):
            assert per_query[name]["released_keys"] == 4  # public keys
        assert per_query["top_domains"]["released_keys"] <= 3  # top_k
        quantile_rows = [r for r in w["rows"] if r["query"] == "latency_quantiles"]
        assert [r["group"]["quantile"] for r in quantile_rows] == QUANTILES * 4
        for r in quantile_rows:  # the exact quantiles of a log-normal with median 120 ms
            assert 0 < r["true_value"] <= 600 and r["within_ci95"] is False
        assert math.isclose(w["epsilon_spent"], EPSILON)
        assert math.isclose(w["horizon_epsilon_spent"], EPSILON * w["index"])
        for r in w["rows"]:
            assert r["error"] == r["released_value"] - r["true_value"]

    # Keys held by a single user are never released (and there were some to suppress).
    all_rows = [r for w in windows for r in w["rows"]]
    released_domains = {r["group"]["domain"] for r in all_rows if "domain" in r["group"]}
    assert not any(d.startswith("rare-") for d in released_domains), released_domains
    assert summary["rare_keys_released"] == 0
    assert summary["rare_keys_in_data"] > 0
    for w in windows:
        visits = next(q for q in w["queries"] if q["query"] == "visits_by_domain")
        assert visits["suppressed_keys"] >= visits["rare_keys_in_data"]

    # Large keys: released values inside their stated 95% CI of the true bounded value.
    checked = [r for r in all_rows if r["query"] in CI_CHECKED]
    large = [r for r in checked if r["true_value"] >= summary["large_key_min_true"]]
    assert len(large) >= MIN_LARGE_VALUES, "too few large keys for the statistical check"
    inside = sum(abs(r["released_value"] - r["true_value"]) <= r["ci95"] for r in large)
    assert inside >= 0.9 * len(large), f"{inside} of {len(large)} inside their 95% CI"
    assert summary["large_values"] == len(large)
    assert summary["large_within_ci95"] == inside

    assert summary["complete"] is True
    assert summary["windows_seen"] == WINDOWS
    assert math.isclose(summary["epsilon_spent_total"], EPSILON * WINDOWS)
    assert summary["events_produced"] == start["data"]["events"]


def _start_demo(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[str], LineReader, Path]:
    stderr_path = tmp_path / "demo.stderr"
    with stderr_path.open("w") as stderr:
        proc = subprocess.Popen(
            cli_argv("demo", "--json", *args), stdout=subprocess.PIPE, stderr=stderr, text=True
        )
    assert proc.stdout is not None
    return proc, LineReader(proc.stdout), stderr_path


def _json(line: str | None) -> dict[str, Any]:
    assert line is not None, "the demo ended early"
    record: dict[str, Any] = json.loads(line)
    return record


def test_ctrl_c_mid_demo_stops_worker_and_broker(tmp_path: Path) -> None:
    # Windows 1-2 close as soon as the worker reads past them; window 3 only after 1 s of
    # silence: Ctrl-C right after the first window record lands while the worker runs.
    proc, lines, stderr_path = _start_demo(tmp_path, "--users", "500", "--windows", "3")
    try:
        start = _json(lines.next(120))
        assert start["kind"] == "start"
        first = _json(lines.next(120))
        assert first["kind"] == "window" and first["index"] == 1
        proc.send_signal(signal.SIGINT)
        rest = [_json(line) for line in lines.rest(120)]
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        lines.close()
    assert code == 128 + signal.SIGINT, stderr_path.read_text()
    summary = rest[-1]
    assert summary["kind"] == "summary" and summary["complete"] is False
    assert 1 <= summary["windows_seen"] < 3
    assert "Traceback" not in stderr_path.read_text()
    _broker_gone(start)


def test_sigterm_during_setup_stops_the_broker(tmp_path: Path) -> None:
    proc, lines, stderr_path = _start_demo(tmp_path, "--fast")
    try:
        start = _json(lines.next(120))  # the broker is up; topics and events come next
        proc.send_signal(signal.SIGTERM)
        rest = [_json(line) for line in lines.rest(120)]
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        lines.close()
    assert code == 128 + signal.SIGTERM, stderr_path.read_text()
    assert [r["kind"] for r in rest] == ["summary"]
    assert rest[0]["complete"] is False and rest[0]["windows_seen"] == 0
    assert "Traceback" not in stderr_path.read_text()
    _broker_gone(start)


def test_console_output_shows_private_beside_true_values() -> None:
    done = run_cli("demo", "--users", "300", "--windows", "2")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "ephemeral pseudonym key" in out
    assert "window 1/2" in out and "window 2/2" in out
    assert "true  released    error   95% CI" in out
    assert "rare keys released: 0" in out
    assert "not released (partition selection)" in out
    assert "summary" in out
    assert "rare-" not in out.replace("rare-NNN", "")  # never a rare key by name
