"""``python -m bench.refactor_parity --before REV --after REV [--events N] [--rounds R]``.

Throughput of the worker before and after a change, in the same run on the same broker: the
two revisions are exported (``git archive``) into temporary folders, one embedded broker and
one preloaded topic serve both, and the worker's keyed and default (repartitioned) paths run
for each tree in turn — before, after, then after, before, ... — so that the machine's load
drifting during the run weighs on both alike. Each worker run is a fresh process started in
its own tree (that tree's ``bench.throughput.run_worker`` and ``bench.contenders``, so each
tree measures its own worker with its own bench code). Prints one JSON object: every run,
and per path the median of the after/before ratios of each round with their range.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

from bench.data import StreamSpec, columns, distinct_windows, encode
from bench.throughput import PARTITIONS, create_topics, delete_topics, produce
from stream_dp.broker import EmbeddedBroker

#: One worker run of the tree in the current directory; prints its result as JSON.
_RUN_ONE = (
    "import sys, orjson\n"
    "from bench.throughput import run_worker\n"
    "a = orjson.loads(sys.argv[1])\n"
    "r = run_worker(a['bootstrap'], a['topic'], a['events'], a['windows'], a['window_size_s'],"
    " a['broker_pid'], keyed_by_user=a['keyed_by_user'])\n"
    "print(orjson.dumps(r).decode())\n"
)
RUN_TIMEOUT_S = 1800.0


def export_tree(repo: Path, rev: str, into: Path) -> str:
    """Write the files of ``rev`` into ``into``; return the full commit id."""
    commit = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", rev], capture_output=True, text=True, check=True
    ).stdout.strip()
    archive = into.with_suffix(".tar")
    subprocess.run(["git", "-C", str(repo), "archive", "-o", str(archive), commit], check=True)
    into.mkdir(parents=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    archive.unlink()
    return commit


def run_in_tree(tree: Path, args: dict[str, Any]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, "-c", _RUN_ONE, orjson.dumps(args).decode()],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"worker run in {tree} failed:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = orjson.loads(lines[-1])
    return result


def _rate(result: dict[str, Any]) -> float:
    return float(result["events"]) / float(result["seconds"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="ab08739")
    parser.add_argument("--after", default="HEAD")
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--users", type=int, default=30_000)
    parser.add_argument("--keys", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    opts = parser.parse_args()
    repo = Path(__file__).resolve().parent.parent
    spec = StreamSpec(events=opts.events, users=opts.users, keys=opts.keys)
    cols = columns(spec)
    values, keys = encode(spec, cols)
    windows = distinct_windows(spec, cols)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="refactor-parity-") as tmp:
        trees = {
            "before": Path(tmp) / "before",
            "after": Path(tmp) / "after",
        }
        commits = {
            "before": export_tree(repo, opts.before, trees["before"]),
            "after": export_tree(repo, opts.after, trees["after"]),
        }
        load_start = os.getloadavg()
        started = time.time()
        with EmbeddedBroker() as broker:
            topic = f"bench-parity-{uuid.uuid4().hex[:8]}"
            asyncio.run(create_topics(broker.bootstrap_servers, [topic], PARTITIONS))
            try:
                produce(broker.bootstrap_servers, topic, values, keys)
                for rnd in range(opts.rounds):
                    for path, keyed in (("keyed", True), ("default", False)):
                        # Alternate which tree goes first, so neither always runs second.
                        order = ("before", "after") if rnd % 2 == 0 else ("after", "before")
                        for side in order:
                            args = {
                                "bootstrap": broker.bootstrap_servers,
                                "topic": topic,
                                "events": spec.events,
                                "windows": windows,
                                "window_size_s": spec.window_size_s,
                                "broker_pid": broker.pid,
                                "keyed_by_user": keyed,
                            }
                            result = run_in_tree(trees[side], args)
                            rate = _rate(result)
                            runs.append(
                                {
                                    "round": rnd,
                                    "path": path,
                                    "side": side,
                                    "events_per_s": rate,
                                    # CPU time is far less sensitive to the shared
                                    # machine's load than wall time.
                                    "events_per_cpu_s": spec.events / result["cpu_seconds"],
                                    "load1": os.getloadavg()[0],
                                }
                            )
                            sys.stderr.write(
                                f"round {rnd + 1} {path} {side}: {rate:,.0f}/s "
                                f"load {os.getloadavg()[0]:.1f}\n"
                            )
            finally:
                asyncio.run(delete_topics(broker.bootstrap_servers, names=[topic]))
    summary: dict[str, Any] = {}
    for path in ("keyed", "default"):
        ratios: list[float] = []
        cpu_ratios: list[float] = []
        for rnd in range(opts.rounds):
            by_side = {
                r["side"]: r["events_per_s"]
                for r in runs
                if r["round"] == rnd and r["path"] == path
            }
            ratios.append(by_side["after"] / by_side["before"])
            cpu = {
                r["side"]: r["events_per_cpu_s"]
                for r in runs
                if r["round"] == rnd and r["path"] == path
            }
            cpu_ratios.append(cpu["after"] / cpu["before"])
        summary[path] = {
            "ratios_after_to_before": ratios,
            "median_ratio": statistics.median(ratios),
            "min_ratio": min(ratios),
            "max_ratio": max(ratios),
            "cpu_ratios_after_to_before": cpu_ratios,
            "median_cpu_ratio": statistics.median(cpu_ratios),
            "median_before_events_per_s": statistics.median(
                r["events_per_s"] for r in runs if r["path"] == path and r["side"] == "before"
            ),
            "median_after_events_per_s": statistics.median(
                r["events_per_s"] for r in runs if r["path"] == path and r["side"] == "after"
            ),
        }
    out = {
        "commits": commits,
        "events": spec.events,
        "users": spec.users,
        "keys": spec.keys,
        "windows": windows,
        "rounds": opts.rounds,
        "cpus": os.cpu_count(),
        "load_at_start": load_start,
        "load_at_end": os.getloadavg(),
        "wall_s": time.time() - started,
        "runs": runs,
        "summary": summary,
    }
    print(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
