"""bench/perf_probe.py: perf's outputs read back, and the table of a kept ``--perf`` run.

The outputs are cut from real ones (``perf trace -s`` and ``perf report -n --sort sym`` of a
worker), the kept run is hand-made so each cell can be worked out from it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import perf_probe

TRACE_SUMMARY = """
 Summary of events:

 python (16055), 26376 events, 99.9%

   syscall            calls  errors  total       min       avg       max       stddev
                                     (msec)    (msec)    (msec)    (msec)        (%)
   --------------- --------  ------ -------- --------- --------- ---------     ------
   epoll_wait          3633      1  5379.622     0.011     1.481    52.342      8.89%
   recvfrom            1069     16    37.335     0.012     0.035     0.169      1.53%
   munmap               106      0    20.877     0.015     0.197     3.018     19.57%

 python (16061), 12 events, 0.1%

   syscall            calls  errors  total       min       avg       max       stddev
                                     (msec)    (msec)    (msec)    (msec)        (%)
   --------------- --------  ------ -------- --------- --------- ---------     ------
   futex                  5      0     0.100     0.011     0.020     0.040      5.00%
   munmap                 1      0     0.015     0.015     0.015     0.015      0.00%
"""

REPORT = """# To display the perf.data header info, please use --header/--header-only options.
#
# Samples: 140K of event 'page-faults'
# Event count (approx.): 140885
#
# Overhead       Samples  Symbol
# ........  ............  ..............................
#
    68.25%         96157  [.] __memmove_avx512_unaligned_erms
    12.66%         17839  [.] _PyObject_Malloc
     0.01%            14  [k] clear_user_erms
"""


def test_syscalls_are_summed_over_the_threads_by_name() -> None:
    assert perf_probe.syscall_counts(TRACE_SUMMARY) == {
        "epoll_wait": 3633,
        "recvfrom": 1069,
        "munmap": 107,
        "futex": 5,
    }


def test_faults_are_counted_by_symbol_user_and_kernel() -> None:
    assert perf_probe.symbol_counts(REPORT) == {
        "__memmove_avx512_unaligned_erms": 96157,
        "_PyObject_Malloc": 17839,
        "clear_user_erms": 14,
    }


def test_an_unknown_kind_is_refused_with_the_kinds() -> None:
    with pytest.raises(ValueError, match="one of syscalls, faults, not 'cycles'"):
        perf_probe.Probe("cycles", Path("."))


def _round(events: int, counts: dict[str, int]) -> dict[str, Any]:
    return {"events": events, "perf_counts": counts}


def test_rows_give_each_path_the_median_per_1k_events_of_the_rounds() -> None:
    runs = {
        "raw_aiokafka": [{"events": 1000}],  # not a worker: left out
        "workers_1_default": [
            _round(1000, {"mmap": 1, "getpid": 2}),
            _round(2000, {"mmap": 4, "getpid": 2}),
            _round(1000, {"mmap": 3}),
        ],
        "workers_3_default": [_round(1000, {"mmap": 6, "getpid": 1})],
    }
    kept = {
        "probe": {"perf": "syscalls", "brokers": {"kafka": {"runs": runs}}},
        "other": {"perf": None, "brokers": {"kafka": {"runs": runs}}},  # not a --perf run
    }
    # per 1k events: 1 worker mmap 1, 2, 3 (median 2), getpid 2, 1, 0 (median 1), all 3, 3, 3;
    # 3 workers mmap 6, getpid 1, all 7. mmap is the more frequent name over the run.
    assert perf_probe.rows(kept) == [
        "`probe`: system calls per 1,000 events (median of the rounds)",
        "",
        "| workers, path | rounds | all | `mmap` | `getpid` |",
        "|---|---:|---:|---:|---:|",
        "| 1, default | 3 | 3.00 | 2.00 | 1.00 |",
        "| 3, default | 1 | 7.00 | 6.00 | 1.00 |",
    ]
    assert perf_probe.rows(kept, "tansu") == []


# Waits for a line, then makes exactly 500 getppid system calls and exits: 250 in its main
# thread and 250 in a thread started after perf attached (a worker starts threads too).
CHILD = (
    "import os, sys, threading; sys.stdin.readline(); "
    "t = threading.Thread(target=lambda: [os.getppid() for _ in range(250)]); t.start(); "
    "[os.getppid() for _ in range(250)]; t.join()"
)


@pytest.mark.skipif(perf_probe.available() is not None, reason=str(perf_probe.available()))
@pytest.mark.timeout(300)
def test_perf_attaches_while_the_worker_is_stopped_and_counts_all_it_does_after(
    tmp_path: Path,
) -> None:
    from bench import realistic

    for kind in perf_probe.KINDS:
        with subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE) as child:
            probe = perf_probe.Probe(kind, tmp_path)
            assert child.stdin is not None
            stdin = child.stdin

            def release(pipe: Any = stdin) -> None:
                pipe.write(b"go\n")
                pipe.flush()

            realistic._while_stopped([child], realistic._attached_first(probe, [child], release))
            assert child.wait(timeout=120) == 0
            counts = probe.counts()
        if kind == "syscalls":
            assert counts["getppid"] == 500, counts  # every one, none before the attach
        else:
            assert sum(counts.values()) > 0 and all(n > 0 for n in counts.values()), counts


def test_without_a_probe_the_work_is_run_as_it_is() -> None:
    from bench import realistic

    def work() -> None:
        return None

    assert realistic._attached_first(None, [], work) is work
