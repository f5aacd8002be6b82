"""Whether this machine's two vCPUs slow each other: a CPU-bound loop's CPU time alone on the
first core, then with the same loop spinning on the second (five rounds, alternating).

``python -m bench.vcpu_pairing`` prints both and the ratio of the medians. SMT siblings (two
hardware threads of one core) show 1.2–1.6×; separate cores little. The loop is the worker's
kind of work: a JSON decode and a SHA-256 per event. Not a test, and never timed in one.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import subprocess
import sys
import time

RECORD = (
    b'{"user_id": "user123", "timestamp": "2026-12-03T10:00:00.000+00:00", "domain": "d17.com"}'
)
ROUNDS = 5
EVENTS = 300_000


def work(events: int = EVENTS) -> float:
    """CPU seconds of ``events`` decodes and hashes in this process."""
    t0 = time.process_time()
    for _ in range(events):
        hashlib.sha256(json.loads(RECORD)["user_id"].encode()).digest()
    return time.process_time() - t0


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--spin":  # the loop on the core given
        os.sched_setaffinity(0, {int(sys.argv[2])})
        while True:
            work(10_000)
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("needs two cores")
    os.sched_setaffinity(0, {cores[0]})
    alone, paired = [], []
    for _ in range(ROUNDS):
        alone.append(work())
        with subprocess.Popen(
            [sys.executable, "-m", "bench.vcpu_pairing", "--spin", str(cores[1])]
        ) as spin:
            time.sleep(0.3)  # the spinner's start-up done; it spins until killed
            paired.append(work())
            spin.kill()
    ratio = statistics.median(paired) / statistics.median(alone)
    print(json.dumps({"alone_cpu_s": alone, "paired_cpu_s": paired, "ratio": ratio}))


if __name__ == "__main__":
    main()
