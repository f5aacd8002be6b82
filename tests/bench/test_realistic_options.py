"""``bench.realistic``'s options and its round-by-round table.

``--pin-broker``: every thread of the broker and of its children lands on the last core, the
bench's own threads (and so the clients it starts later) on the others, and the bench gets its
cores back after. With three rounds or more, each worker run is set against the raw run of
its own round."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from bench import realistic

# A broker stand-in: a process with a second thread and a child process of its own.
BROKER = """
import subprocess, sys, threading
code = "import sys; sys.stdin.read()"
child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)
threading.Thread(target=sys.stdin.read, daemon=True).start()
print(child.pid, flush=True)
threading.Event().wait()
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning needs two cores")
def test_the_broker_and_its_children_on_the_last_core_the_bench_on_the_others() -> None:
    cores = sorted(os.sched_getaffinity(0))
    with subprocess.Popen(
        [sys.executable, "-c", BROKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as proc:
        try:
            _check_pinning(proc, cores)
        finally:
            proc.kill()


def _check_pinning(proc: subprocess.Popen[str], cores: list[int]) -> None:
    grandchild = -1
    try:
        assert proc.stdout is not None
        grandchild = int(proc.stdout.readline())
        deadline = time.monotonic() + 60  # a hang guard: the second thread starts at once
        while len(os.listdir(f"/proc/{proc.pid}/task")) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        broker_threads = realistic._threads(proc.pid)
        assert grandchild in broker_threads and len(broker_threads) >= 3
        with realistic.pinned(proc.pid) as pins:
            assert pins == {"broker_cores": cores[-1:], "client_cores": cores[:-1]}
            assert {tid: os.sched_getaffinity(tid) for tid in broker_threads} == {
                tid: {cores[-1]} for tid in broker_threads
            }
            own = realistic._own_threads()
            assert {tid: os.sched_getaffinity(tid) for tid in own} == {
                tid: set(cores[:-1]) for tid in own
            }
            # a process the bench starts now inherits the clients' cores
            out = subprocess.run(
                [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                capture_output=True,
                text=True,
                check=True,
            )
            assert out.stdout.strip() == str(cores[:-1])
        assert os.sched_getaffinity(0) == set(cores)
    finally:
        if grandchild > 0:
            os.kill(grandchild, 9)


def _run(events_per_s: float, cpu_us: float) -> dict[str, float]:
    return {"events_per_s": events_per_s, "cpu_us_per_event": cpu_us}


def test_rounds_pair_each_worker_with_the_raw_run_of_its_own_round() -> None:
    raw = [_run(500_000, 1.9), _run(1_000_000, 0.95), _run(400_000, 2.4)]
    default = [_run(300_000, 2.5), _run(700_000, 1.25), _run(200_000, 3.0)]
    keyed = [_run(400_000, 2.0), _run(900_000, 1.0), _run(300_000, 2.5)]
    broker = {
        "runs": {"raw_aiokafka": raw, "worker_default_after": default, "worker_keyed_after": keyed}
    }
    assert realistic._rounds_rows(broker)[2:] == [
        "| default | 0.60, 0.70, 0.50 | 0.60× | 0.76, 0.76, 0.80 | 0.76× | 60%–88%; 95%–96% |",
        "| keyed | 0.80, 0.90, 0.75 | 0.80× | 0.95, 0.95, 0.96 | 0.95× | 75%–90%; 95%–96% |",
    ]
    # two rounds: best of two stays the only figure
    assert realistic._rounds_rows({"runs": {k: v[:2] for k, v in broker["runs"].items()}}) == []


def test_host_speed_rows_set_each_run_s_raw_cpu_beside_the_worker_s_ratio() -> None:
    """Per kept run and broker: raw aiokafka's median CPU per event, then the worker's
    round-by-round median ratio per path; Apache Kafka first, each broker by raw CPU. Left
    out: runs of several workers (no single worker to compare), of two rounds (no round to
    pair with) and of another number of windows (another stream)."""
    raw = [_run(500_000, 1.9), _run(1_000_000, 0.95), _run(400_000, 2.4)]
    default = [_run(300_000, 2.5), _run(700_000, 1.25), _run(200_000, 3.0)]
    keyed = [_run(400_000, 2.0), _run(900_000, 1.0), _run(300_000, 2.5)]
    slow = {
        "raw_aiokafka": [_run(100, 3.0), _run(100, 2.8), _run(100, 2.9)],
        "worker_keyed_after": [_run(90, 3)],
    }
    kept = {
        "a": {
            "brokers": {
                "tansu": {"runs": {"raw_aiokafka": raw, "worker_default_after": default}},
                "kafka": {"runs": slow},
            }
        },
        "b": {
            "brokers": {
                "kafka": {
                    "runs": {
                        "raw_aiokafka": raw,
                        "worker_default_after": default,
                        "worker_keyed_after": keyed,
                    }
                }
            }
        },
        "group": {"workers": [1, 3], "brokers": {"kafka": {"runs": slow}}},
        "one_window": {"windows": 1, "brokers": {"kafka": {"runs": slow}}},
        "two_rounds": {"brokers": {"kafka": {"runs": {k: v[:2] for k, v in slow.items()}}}},
    }
    assert realistic.host_speed_rows(kept)[2:] == [
        "| kafka | 1.90 | `b` | 3 | 0.60× | 0.80× |",
        "| kafka | 2.90 | `a` | 3 | – | 0.90× |",
        "| tansu | 1.90 | `a` | 3 | 0.60× | – |",
    ]


def test_a_single_worker_run_s_notes_are_rendered_under_its_tables() -> None:
    """Notes kept for a run of one worker (not only for runs of several) reach RESULTS.md:
    run `eleventh_quiet`'s were written and never shown."""
    import json

    kept = json.loads(realistic.RESULTS_FILE.read_text(encoding="utf-8"))
    label = "eleventh_quiet"
    assert not kept[label].get("workers") and realistic.NOTES[label]
    lines = realistic.section({label: kept[label]})
    start = lines.index(f"### {label}: {realistic.LABELS[label]}")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("### "))
    assert [line for line in lines[start:end] if line.startswith("- ")] == [
        f"- {note}" for note in realistic.NOTES[label]
    ]


def _wait_running(pid: int) -> None:
    deadline = time.monotonic() + 60  # a hang guard: SIGCONT wakes it at once
    while realistic._state(pid) == "T":
        assert time.monotonic() < deadline, "the worker stayed stopped"
        time.sleep(0.01)


def test_backlog_stops_every_worker_while_the_stream_is_written_and_resumes_them() -> None:
    spin = "while True: pass"
    procs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2)]
    try:
        seen: list[list[str]] = []
        stopped_s = realistic._while_stopped(
            procs, lambda: seen.append([realistic._state(p.pid) for p in procs])
        )
        assert seen == [["T", "T"]] and stopped_s >= 0.0
        for proc in procs:
            _wait_running(proc.pid)

        def fails() -> None:
            raise RuntimeError("the producer failed")

        with pytest.raises(RuntimeError, match=r"^the producer failed$"):
            realistic._while_stopped(procs, fails)
        for proc in procs:  # resumed although the write failed
            _wait_running(proc.pid)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_a_group_s_cpu_per_event_is_set_against_the_same_round_s_single_worker() -> None:
    one = [_run(300_000, 2.0), _run(200_000, 3.0)]
    three = [_run(250_000, 2.2), _run(150_000, 3.6)]
    assert realistic._cpu_round_ratios(three, one) == pytest.approx([1.1, 1.2])


def test_a_poll_of_no_time_is_refused_and_another_poll_is_named_in_the_run_s_heading(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as refused:
        realistic.main(["--workers", "1,3", "--poll-s", "0"])
    assert refused.value.code == 2
    assert "--poll-s: more than 0 seconds" in capsys.readouterr().err
    run = {
        "events": 1_000,
        "written": "2026-12-04 14:00 UTC",
        "cores": 2,
        "windows": 10,
        "workers": [1],
        "brokers": {"kafka": {"runs": {}, "load_1min": [1.0, 1.0]}},
    }
    heading = [line for line in realistic.section({"x": run}) if line.startswith("Run of")]
    assert heading and heading[0].endswith("CPU per event).")
    heading = [
        line
        for line in realistic.section({"x": {**run, "poll_s": 1.0}})
        if line.startswith("Run of")
    ]
    assert heading and heading[0].endswith("; /metrics polled every 1 s instead of 0.05 s.")


def test_a_backlog_s_group_keeps_its_session_over_the_stop_and_the_product_accepts_it() -> None:
    from stream_dp.config.loader import parse_config

    def session_ms(*, backlog: bool) -> int:
        data = realistic.group_config(
            "127.0.0.1:9092", "events", 1_800_000_000, keyed=False, port=9100, backlog=backlog
        )
        config = parse_config(data, environ={"STREAM_DP_PSEUDONYM_KEY": "ab" * 32})
        return int(config.kafka.session_timeout_ms)

    # Writing 3,600,000 events kept a stopped group about 9 s without heartbeats.
    assert session_ms(backlog=True) == realistic.BACKLOG_SESSION_TIMEOUT_MS >= 30_000
    assert session_ms(backlog=False) == 10_000  # the product's default, as an operator runs it
