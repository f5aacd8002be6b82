"""``bench.cpu_split``: a measured span's CPU split into the client's user and system time,
the broker's (its JIT compiler's share), and the machine's states; and the table of it."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from bench import cpu_split, realistic

# Pure arithmetic: a loop reading a CPU clock would spend most of it in the kernel on a VM
# whose clock reads are system calls. Seconds of CPU on any machine; the test waits for less.
SPIN = "sum(i * i for i in range(200_000_000))"


def _snap(user: float, system: float, broker: float, jit: float, idle: float) -> dict:
    machine = dict.fromkeys(cpu_split.MACHINE_FIELDS, 0.0)
    machine.update(user=user + broker, system=system, idle=idle)
    return {
        "user": user,
        "system": system,
        "broker_user": broker,
        "broker_system": 0.0,
        "broker_jit": jit,
        "machine": machine,
    }


def test_split_is_the_difference_per_event_and_the_machine_shares() -> None:
    start = _snap(1.0, 0.5, 2.0, 0.5, 10.0)
    end = _snap(3.0, 0.7, 3.0, 0.9, 12.0)  # 2 s user, 0.2 s system, 1 s broker, 2 s idle
    out = cpu_split.split(start, end, 1_000_000)
    assert round(out["user_us_per_event"], 9) == 2.0
    assert round(out["system_us_per_event"], 9) == 0.2
    assert round(out["broker_user_us_per_event"], 9) == 1.0
    assert round(out["broker_jit_us_per_event"], 9) == 0.4
    shares = {k: round(v, 9) for k, v in out["machine_share"].items() if v}
    assert shares == {"user": round(3 / 5.2, 9), "system": round(0.2 / 5.2, 9),
                      "idle": round(2 / 5.2, 9)}  # fmt: skip


def test_a_snapshot_reads_a_busy_process_and_a_broker_without_a_jit() -> None:
    """A child computing shows as user time; as the broker, its CPU counts and no thread of
    it is a JIT compiler."""
    child = subprocess.Popen([sys.executable, "-c", SPIN])
    try:
        before = cpu_split.snapshot([child.pid], child.pid)
        deadline = time.monotonic() + 60  # hang guard only
        while cpu_split.process_cpu(child.pid)[0] - before["user"] < 0.3:
            assert time.monotonic() < deadline and child.poll() is None
            time.sleep(0.01)
        after = cpu_split.snapshot([child.pid], child.pid)
    finally:
        child.kill()
        child.wait(timeout=60)
    out = cpu_split.split(before, after, 1)
    assert out["user_us_per_event"] >= 0.3e6
    assert out["broker_user_us_per_event"] == out["user_us_per_event"]
    assert out["broker_jit_us_per_event"] == 0.0
    assert cpu_split.process_cpu(2**22 + 7) == (0.0, 0.0)  # a pid that is not there
    assert sum(cpu_split.machine_cpu().values()) > 0
    assert os.getpid() not in cpu_split.process_tree(child.pid)


def _run(user: float, system: float, broker: float, jit: float, idle: float) -> dict:
    return {
        "split": {
            "user_us_per_event": user,
            "system_us_per_event": system,
            "broker_user_us_per_event": broker,
            "broker_system_us_per_event": 0.1,
            "broker_jit_us_per_event": jit,
            "machine_share": {"idle": idle, "steal": 0.0, "softirq": 0.01},
        }
    }


def test_the_table_gives_medians_over_rounds_and_leaves_out_runs_without_a_split() -> None:
    runs = {
        "raw_aiokafka": [
            _run(2.0, 0.1, 0.1, 0.0, 0.5),
            _run(1.0, 0.3, 0.2, 0.0, 0.4),
            _run(3.0, 0.2, 0.3, 0.0, 0.6),
        ],
        "worker_keyed_after": [_run(2.5, 0.2, 0.5, 0.2, 0.4), {"events_per_s": 1.0}],
        "worker_default_after": [{"events_per_s": 1.0}],
    }
    counted = {"faults_per_1k_events": 12.0, "voluntary_switches_per_1k_events": 3.0}
    runs["worker_keyed_after"][0]["split"] |= counted | {"involuntary_switches_per_1k_events": 0.5}
    assert cpu_split.split_rows(runs, realistic._SPLIT_ROWS)[2:] == [
        "| raw aiokafka getmany + orjson.loads | 3 | 2.00 | 0.20 | 0.30 | 0.00 | 50% | 0% | 1% "
        "| – | –, – |",  # kept before faults and switches were counted
        "| worker, keyed | 1 | 2.50 | 0.20 | 0.60 | 0.20 | 40% | 0% | 1% | 12.0 | 3.0, 0.5 |",
    ]
    without = {"raw_aiokafka": [{"events_per_s": 1.0}]}  # a run kept before the split
    assert cpu_split.split_rows(without, {"raw_aiokafka": "x"}) == []


# Waits for a line, touches 64 MiB of fresh memory, sleeps 50 times, says so, waits again.
TOUCH_AND_SLEEP = """
import sys, time
sys.stdin.readline()
b = b"x" * (64 << 20)
for _ in range(50):
    time.sleep(0.001)
print("done", flush=True)
sys.stdin.readline()
"""


def test_faults_and_switches_count_memory_touched_and_sleeps() -> None:
    """64 MiB written is at least 32 faults (2 MiB pages; 16,384 with 4 KiB ones), and 50
    sleeps are at least 50 voluntary switches; per 1,000 events in the split, beside the
    pages the peak resident memory grew by."""
    with subprocess.Popen(
        [sys.executable, "-c", TOUCH_AND_SLEEP],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as child:
        assert child.stdin is not None and child.stdout is not None
        try:
            before = cpu_split.snapshot([child.pid], None)
            child.stdin.write("go\n")
            child.stdin.flush()
            assert child.stdout.readline() == "done\n"
            after = cpu_split.snapshot([child.pid], None)
        finally:
            child.kill()
    assert after["faults"] - before["faults"] >= 32
    assert after["voluntary_switches"] - before["voluntary_switches"] >= 50
    out = cpu_split.split(before, after, 1_000)
    assert out["faults_per_1k_events"] == after["faults"] - before["faults"]
    # the 64 MiB stay resident: the peak grew by at least as many pages
    assert out["new_pages_per_1k_events"] >= (64 << 10) / cpu_split.PAGE_KIB
    assert out["voluntary_switches_per_1k_events"] >= 50
    assert cpu_split.faults_and_switches(2**22 + 7) == (0, 0, 0)  # a pid that is not there
