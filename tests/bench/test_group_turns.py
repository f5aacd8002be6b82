"""bench.group_turns: a group's workers take turns, one running at a time, and each stopped
worker's figures are those read just before it was stopped."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from bench.group_turns import Turns
from bench.realistic import _cpu_s, _state
from tests.helpers import wait_until

SPIN = "while True: pass"


@pytest.fixture
def spinners() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(3)]
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()


def test_one_worker_runs_at_a_time_each_in_turn_and_all_run_after_the_stop(
    spinners: list[subprocess.Popen[bytes]],
) -> None:
    scrapes: Counter[int] = Counter()

    def scrape(i: int) -> dict[str, float]:
        scrapes[i] += 1
        return {"scrape": float(scrapes[i])}

    pids = [p.pid for p in spinners]
    turns = Turns(pids, 0.05, scrape=scrape, cpu_s=_cpu_s, state=_state)
    turns.start()
    seen_running: Counter[int] = Counter()
    deadline = time.monotonic() + 120  # a hang guard: 30 switches take about 1.5 s
    try:
        while turns.switches < 30:
            assert time.monotonic() < deadline, f"{turns.switches} switches in 120 s"
            with turns._lock:  # no switch while the states are read
                running = [i for i, pid in enumerate(pids) if _state(pid) != "T"]
                stopped_scrapes = {i: scrapes[i] for i in range(3) if i != turns.running}
                figures, cpus = turns.read()
            # At most one runs (a resumed one may still read T for a moment).
            assert len(running) <= 1, running
            seen_running.update(running)
            for i, count in stopped_scrapes.items():  # a stopped one is not scraped ...
                assert scrapes[i] == count
                assert figures[i] == {"scrape": float(count)}  # ... its last figures stand
            assert len(cpus) == 3 and all(c >= 0 for c in cpus)
            time.sleep(0.01)
    finally:
        turns.stop()
    assert set(seen_running) == {0, 1, 2}, seen_running
    for pid in pids:  # every worker resumed by the stop
        wait_until(lambda pid=pid: _state(pid) != "T", timeout_s=30, what=f"{pid} resumed")
    turns.stop()  # a second stop does no harm


def test_a_stopped_worker_s_cpu_time_does_not_move(
    spinners: list[subprocess.Popen[bytes]],
) -> None:
    pids = [p.pid for p in spinners]
    turns = Turns(pids, 60.0, scrape=lambda i: {}, cpu_s=_cpu_s, state=_state)
    turns.start()  # worker 0 runs for the whole slice; 1 and 2 are stopped
    try:
        before = [_cpu_s(pid) for pid in pids]
        wait_until(lambda: _cpu_s(pids[0]) > before[0] + 0.2, timeout_s=60, what="worker 0 runs")
        after = [_cpu_s(pid) for pid in pids]
        assert after[1:] == before[1:]
    finally:
        turns.stop()
