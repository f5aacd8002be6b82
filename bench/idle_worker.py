"""What a ready worker with nothing to read costs per second, with and without a /metrics poll.

``python -m bench.idle_worker [--seconds S] [--keyed]``: the embedded broker, an empty topic
of 4 partitions, one ``stream-dp run`` of bench/realistic.py's configuration; once it is
ready (``stream_dp_ready``), its process CPU over ``S`` seconds without scraping /metrics,
then over ``S`` seconds scraped every 50 ms (bench/realistic.py's poll), then again without.
Prints the CPU milliseconds per second of each phase (one JSON line): the fixed cost each
extra worker adds to the group, whatever its share of the input.
"""

from __future__ import annotations

import argparse
import asyncio
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

from bench import realistic


def main(argv: list[str] | None = None) -> None:
    from bench.throughput import create_topics
    from stream_dp.broker import EmbeddedBroker
    from stream_dp.broker.process import free_port

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--keyed", action="store_true")
    opts = parser.parse_args(argv)
    start_s = realistic.first_window_s(time.time())
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory(prefix="idle-") as tmp:
        topic = f"idle-{uuid.uuid4().hex[:8]}"
        asyncio.run(create_topics(broker.bootstrap_servers, [topic], realistic.PARTITIONS))
        port = free_port("127.0.0.1")
        config = realistic.worker_config(
            broker.bootstrap_servers, topic, start_s, keyed=opts.keyed, port=port
        )
        path = Path(tmp) / "config.json"
        path.write_text(json.dumps(config), encoding="utf-8")
        env = {
            **os.environ,
            "STREAM_DP_PSEUDONYM_KEY": secrets.token_hex(32),
            "PYTHONWARNINGS": "ignore",
        }
        command = [sys.executable, "-m", "stream_dp.cli.main", "run", "--config", str(path)]
        url = f"http://127.0.0.1:{port}/metrics"
        with (Path(tmp) / "worker.log").open("wb") as log:
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.perf_counter() + 120
            while realistic._scrape(url)["stream_dp_ready"] < 1:
                if proc.poll() is not None or time.perf_counter() > deadline:
                    raise SystemExit("the worker never got ready")
                time.sleep(0.5)
            out = {}
            for phase, scraping in (("quiet", False), ("scraped", True), ("quiet again", False)):
                t0, c0 = time.perf_counter(), realistic._cpu_s(proc.pid)
                while time.perf_counter() - t0 < opts.seconds:
                    if scraping:
                        realistic._scrape(url)
                    time.sleep(realistic.POLL_S if scraping else 0.5)
                seconds = time.perf_counter() - t0
                out[phase] = (realistic._cpu_s(proc.pid) - c0) / seconds * 1e3
            print(json.dumps({"keyed": opts.keyed, "cpu_ms_per_s": out}))
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


if __name__ == "__main__":
    main()
