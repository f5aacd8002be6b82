"""What a ready worker with nothing to read costs per second, with and without a /metrics poll.

``python -m bench.idle_worker [--seconds S] [--keyed] [--brokers tansu,kafka] [--before REV]
[--rounds R] [--profile]``: per broker, an empty topic of 4 partitions and one ``stream-dp
run`` of bench/realistic.py's configuration; once it is ready (``stream_dp_ready``) and 3 s
more, its process CPU over ``S`` seconds without scraping /metrics, then over ``S`` seconds
scraped every 50 ms (bench/realistic.py's poll), then again without. Prints one JSON line:
per broker, per tree (``--before REV``: the worker of commit ``REV`` too, alternating with
this checkout's, ``R`` rounds), the CPU milliseconds per second of each phase and the CPU
of one scrape (the scraped phase's extra CPU over its scrapes): the fixed cost each extra
worker adds to a group, whatever its share of the input. ``--profile``: py-spy samples the
last quiet phase of this checkout's worker (every thread, 250 Hz, idle samples left out),
folded into ``bench/profiles/idle_worker_<broker>.folded``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench import realistic
from bench.cpu_split import faults_and_switches, process_cpu

#: How long a ready worker runs before the first phase (its group settled).
SETTLE_S = 3.0


def _idle_worker(
    bootstrap: str, tree: Path, tmp: Path, seconds: float, *, keyed: bool, profile: Path | None
) -> dict[str, Any]:
    """One worker of ``tree`` on a fresh empty topic: its CPU per second in each phase."""
    from bench.throughput import create_topics
    from stream_dp.broker.process import free_port

    start_s = realistic.first_window_s(time.time())
    topic = f"idle-{uuid.uuid4().hex[:8]}"
    asyncio.run(create_topics(bootstrap, [topic], realistic.PARTITIONS))
    port = free_port("127.0.0.1")
    config = realistic.worker_config(bootstrap, topic, start_s, keyed=keyed, port=port)
    path = tmp / f"config-{uuid.uuid4().hex[:8]}.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),
        "STREAM_DP_PSEUDONYM_KEY": secrets.token_hex(32),
        "PYTHONWARNINGS": "ignore",
    }
    command = [sys.executable, "-m", "stream_dp.cli.main", "run", "--config", str(path)]
    url = f"http://127.0.0.1:{port}/metrics"
    log_path = tmp / f"worker-{uuid.uuid4().hex[:8]}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tree)
    try:
        deadline = time.perf_counter() + 120
        while realistic._scrape(url)["stream_dp_ready"] < 1:
            if proc.poll() is not None or time.perf_counter() > deadline:
                raise SystemExit(f"the worker never got ready:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        time.sleep(SETTLE_S)
        out: dict[str, Any] = {}
        scrapes = 0
        phases = (("quiet", False), ("scraped", True), ("quiet again", False))
        for phase, scraping in phases:
            spy = None
            if profile is not None and phase == "quiet again":
                spy = _py_spy(proc.pid, profile, seconds)
            t0, c0 = time.perf_counter(), realistic._cpu_s(proc.pid)
            f0, s0 = faults_and_switches(proc.pid)[0], process_cpu(proc.pid)[1]
            while time.perf_counter() - t0 < seconds:
                if scraping:
                    realistic._scrape(url)
                    scrapes += 1
                time.sleep(realistic.POLL_S if scraping else 0.5)
            elapsed = time.perf_counter() - t0
            out[phase] = (realistic._cpu_s(proc.pid) - c0) / elapsed * 1e3
            # Its kernel time and page faults per second: a scrape's text is built and freed.
            out[f"{phase}: system"] = (process_cpu(proc.pid)[1] - s0) / elapsed * 1e3
            out[f"{phase}: faults_per_s"] = (faults_and_switches(proc.pid)[0] - f0) / elapsed
            if phase == "scraped":
                quiet = out["quiet"]
                out["scrapes_per_s"] = scrapes / elapsed
                out["ms_per_scrape"] = (out[phase] - quiet) / (scrapes / elapsed)
                out["faults_per_scrape"] = (
                    out["scraped: faults_per_s"] - out["quiet: faults_per_s"]
                ) / (scrapes / elapsed)
            if spy is not None:
                spy.wait(timeout=seconds + 60)
        return out
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _py_spy(pid: int, to: Path, seconds: float) -> subprocess.Popen[bytes]:
    py_spy = str(Path(sys.executable).parent / "py-spy")
    command = [py_spy, "record", "--pid", str(pid), "--rate", "250", "--format", "raw"]
    command += ["--nonblocking", "--duration", str(int(seconds)), "--output", str(to)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--keyed", action="store_true")
    parser.add_argument("--brokers", default="tansu")
    parser.add_argument("--before", help="a commit whose worker runs too, alternating")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--profile", action="store_true")
    opts = parser.parse_args(argv)
    result: dict[str, Any] = {
        "written": dt.datetime.now(tz=dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "seconds_per_phase": opts.seconds,
        "keyed": opts.keyed,
        "before": opts.before,
        "brokers": {},
    }
    with tempfile.TemporaryDirectory(prefix="idle-") as tmp_name:
        tmp = Path(tmp_name)
        trees = {"after": realistic.REPO}
        if opts.before:
            trees = {"before": realistic._export(opts.before, tmp / "before"), **trees}
        for name in [b for b in opts.brokers.split(",") if b]:
            runs: dict[str, list[dict[str, Any]]] = {label: [] for label in trees}
            load = [os.getloadavg()[0]]
            with realistic._broker(name) as broker:
                for i in range(opts.rounds):
                    for label, tree in trees.items():
                        last = i == opts.rounds - 1 and label == "after"
                        raw = tmp / f"idle-{name}.raw" if opts.profile and last else None
                        r = _idle_worker(
                            broker.bootstrap_servers,
                            tree,
                            tmp,
                            opts.seconds,
                            keyed=opts.keyed,
                            profile=raw,
                        )
                        runs[label].append(r)
                        print(f"[idle] {name} {label} {r}", file=sys.stderr, flush=True)
            load.append(os.getloadavg()[0])
            result["brokers"][name] = {"runs": runs, "load_1min": load}
            raw = tmp / f"idle-{name}.raw"
            if opts.profile and raw.exists():
                from bench.profile import fold_functions, write_folded

                stacks = fold_functions(raw.read_text("utf-8"))
                write_folded(stacks, realistic.PROFILES / f"idle_worker_{name}.folded")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
