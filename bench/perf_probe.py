"""Linux ``perf`` on each worker of a ``bench.realistic --backlog`` run (its ``--perf KIND``).

Where a group's extra kernel time per event goes, counted rather than timed:

* ``syscalls``: every system call of each worker (``perf record -e raw_syscalls:*``), summed
  by name over its threads (``perf trace -i FILE -s``);
* ``faults``: every page fault of each worker (``perf record -e page-faults -c 1``) by the
  function whose access took it (``perf report --sort sym``): a fresh pymalloc arena's first
  touch (``_PyObject_Malloc``, ``allocate_from_new_pool``) apart from a large buffer's copy
  (``__memmove_*``).

Each worker is attached while the backlog stops it (SIGSTOP), before the stream is produced,
and counted until it exits: the measured span, the release after it and the idle tail (the
bench kills the workers once they released). The counts are divided by the events of the
whole run. ``perf`` slows every system call it traces, so a ``--perf`` run's CPU figures are
not comparable with other runs: only its counts are read.
"""

from __future__ import annotations

import errno
import os
import re
import select
import shutil
import statistics
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

KINDS = ("syscalls", "faults")
#: How long perf may take to start counting on a stopped worker (a hang guard; ~0.1 s).
ATTACH_TIMEOUT_S = 30.0
#: How long perf may take to finish once its worker is gone (writing, then reading back).
FINISH_TIMEOUT_S = 120.0

# `perf trace -s`: "   recvfrom   1234   0   5.678   0.001   0.004   0.100   3.21%"
_SYSCALL_ROW = re.compile(r"^\s+(?P<name>\w+)\s+(?P<count>\d+)\s+\d+\s+[\d.]+\s")
# `perf report -n --sort sym`: "    46.92%   12345  [.] __memmove_avx512_unaligned_erms"
_SYMBOL_ROW = re.compile(r"^\s+[\d.]+%\s+(?P<count>\d+)\s+\[[.k]\]\s+(?P<name>\S+)")


def available() -> str | None:
    """None when ``perf`` can run here, else why not (what to install)."""
    if shutil.which("perf") is None:
        return "perf is not on PATH (Debian: apt-get install linux-perf)"
    return None


def syscall_counts(summary: str) -> Counter[str]:
    """System calls by name from ``perf trace -s`` output, summed over the threads."""
    return _counted(_SYSCALL_ROW, summary)


def symbol_counts(report: str) -> Counter[str]:
    """Samples (here: page faults) by symbol from ``perf report -n --sort sym``."""
    return _counted(_SYMBOL_ROW, report)


def _counted(row: re.Pattern[str], text: str) -> Counter[str]:
    """Each matching line's ``count`` summed by its ``name``."""
    counts: Counter[str] = Counter()
    for line in text.splitlines():
        if m := row.match(line):
            counts[m["name"]] += int(m["count"])
    return counts


#: What ``perf record`` samples, every occurrence (``-c 1``), per kind.
EVENTS = {
    "syscalls": "raw_syscalls:sys_enter,raw_syscalls:sys_exit",
    "faults": "page-faults",
}


class Probe:
    """``perf record`` attached to each of ``pids`` (stopped), its files in ``folder``.

    perf starts with its events disabled and is enabled through its control FIFO, which
    acknowledges once they are on: an output file that exists says perf started, not that
    it is counting (a worker resumed then would do its first work unseen)."""

    def __init__(self, kind: str, folder: Path) -> None:
        if kind not in KINDS:
            raise ValueError(f"--perf: one of {', '.join(KINDS)}, not {kind!r}")
        self.kind = kind
        self.folder = folder
        self._procs: list[tuple[subprocess.Popen[bytes], Path]] = []

    def attach(self, pids: list[int]) -> None:
        """Starts perf on every pid and returns once each has acknowledged counting."""
        for pid in pids:
            base = self.folder / f"perf-{self.kind}-{pid}-{time.monotonic_ns()}"
            ctl, ack = base.with_suffix(".ctl"), base.with_suffix(".ack")
            os.mkfifo(ctl)
            os.mkfifo(ack)
            argv = ["perf", "record", "-q", "-e", EVENTS[self.kind], "-c", "1", "-D", "-1",
                    "--control", f"fifo:{ctl},{ack}", "-p", str(pid), "-o", str(base)]  # fmt: skip
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            self._procs.append((proc, base))
            _enable(proc, ctl, ack)

    def counts(self) -> dict[str, int]:
        """Once the workers are gone: the counts summed over them (by name, most first)."""
        total: Counter[str] = Counter()
        for proc, data in self._procs:
            proc.communicate(timeout=FINISH_TIMEOUT_S)  # its stderr read and closed
            parse: Callable[[str], Counter[str]]
            if self.kind == "syscalls":
                argv = ["perf", "trace", "-i", str(data), "-s"]
                parse = syscall_counts
            else:
                argv = ["perf", "report", "-i", str(data), "--stdio", "-n", "--no-children",
                        "--sort", "sym", "-g", "none"]  # fmt: skip
                parse = symbol_counts
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=FINISH_TIMEOUT_S, check=True
            )
            # perf trace -s writes its summary to stderr, perf report to stdout
            total += parse(done.stdout + done.stderr)
        return dict(total.most_common())


def _enable(proc: subprocess.Popen[bytes], ctl: Path, ack: Path) -> None:
    """Tells ``proc`` (perf) to enable its events and waits for its "ack"."""
    deadline = time.monotonic() + ATTACH_TIMEOUT_S
    ack_fd = os.open(ack, os.O_RDONLY | os.O_NONBLOCK)
    try:
        while True:  # a FIFO opens for writing only once perf has it open for reading
            try:
                ctl_fd = os.open(ctl, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError as exc:
                if exc.errno != errno.ENXIO:
                    raise
                _still_starting(proc, deadline)
                time.sleep(0.01)
        try:
            os.write(ctl_fd, b"enable\n")
            answer = b""
            while b"\n" not in answer:  # perf sends "ack\n" and a NUL
                _still_starting(proc, deadline)
                ready, _, _ = select.select([ack_fd], [], [], 0.05)
                if ready:
                    answer += os.read(ack_fd, 64)
        finally:
            os.close(ctl_fd)
    finally:
        os.close(ack_fd)
    if answer.split(b"\n")[0] != b"ack":
        raise RuntimeError(f"perf answered {answer!r} to enable, not ack")


def _still_starting(proc: subprocess.Popen[bytes], deadline: float) -> None:
    if proc.poll() is not None or time.monotonic() > deadline:
        err = proc.stderr.read().decode(errors="replace") if proc.stderr and proc.poll() else ""
        raise RuntimeError(f"perf did not start counting (exit {proc.returncode}): {err[-500:]}")


TITLE = (
    "### Where a group's kernel time goes, counted on {broker} (`--perf`: `perf` on each worker)"
)
#: Names shown in the table beside the total: the most frequent over the kept runs.
SHOWN = 6


def rows(kept: dict[str, Any], broker: str = "kafka") -> list[str]:
    """Per kept ``--perf`` run on ``broker``: per path and worker count, the median over the
    rounds of the counts per 1,000 events, in total and for the most frequent names."""
    out: list[str] = []
    for label, run in kept.items():
        kind = run.get("perf")
        runs = run["brokers"].get(broker, {}).get("runs", {}) if kind else {}
        table: dict[str, list[dict[str, float]]] = {}
        for key, rounds in runs.items():
            if not key.startswith("workers_"):
                continue
            per_1k = [
                {n: c * 1000 / r["events"] for n, c in r["perf_counts"].items()}
                for r in rounds
                if "perf_counts" in r
            ]
            if per_1k:
                table[key] = per_1k
        if not table:
            continue
        overall: Counter[str] = Counter()
        for rounds_1k in table.values():
            for one in rounds_1k:
                overall.update(one)
        names = [n for n, _ in overall.most_common(SHOWN)]
        what = "system calls" if kind == "syscalls" else "page faults"
        out += [
            f"`{label}`: {what} per 1,000 events (median of the rounds)",
            "",
            "| workers, path | rounds | all | " + " | ".join(f"`{n}`" for n in names) + " |",
            "|---|---:|---:|" + "---:|" * len(names),
        ]
        for key, rounds_1k in table.items():
            cells = [statistics.median(sum(one.values()) for one in rounds_1k)]
            cells += [statistics.median(one.get(n, 0.0) for one in rounds_1k) for n in names]
            path = key.removeprefix("workers_").replace("_", ", ", 1)
            out.append(
                f"| {path} | {len(rounds_1k)} | " + " | ".join(f"{c:.2f}" for c in cells) + " |"
            )
        out.append("")
    return out[:-1] if out else []
