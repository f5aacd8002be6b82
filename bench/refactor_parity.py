"""``python -m bench.refactor_parity --before REV --after REV [--events N] [--rounds R]``.

Throughput of the worker before and after a change, in the same run on the same broker: the
two revisions are exported (``git archive``) into temporary folders, one embedded broker and
one preloaded topic serve both, and the worker's keyed and default (repartitioned) paths run
for each tree in turn — before, after, then after, before, ... — so that the machine's load
drifting during the run weighs on both alike. Each worker run is a fresh process started in
its own tree (that tree's ``bench.throughput.run_worker`` and ``bench.contenders``, so each
tree measures its own worker with its own bench code). Prints one JSON object: every run,
and per path the median of the after/before ratios of each round with their range.
``--write`` keeps it in ``bench/refactor_parity.json`` and writes its section into
``bench/RESULTS.md`` (``bench.report`` renders the kept result too); ``--render-only``
rewrites the section from the kept result without measuring.
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
from bench.sections import splice_section
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
#: Where ``--write`` keeps the last measurement; ``bench.report`` renders it into RESULTS.md.
RESULTS_FILE = Path(__file__).resolve().parent / "refactor_parity.json"
SECTION_TITLE = "## 9. Before and after the redesign (same run, alternating)"


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
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--users", type=int, default=50_000)
    parser.add_argument("--keys", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--write", action="store_true", help=f"keep it in {RESULTS_FILE.name}")
    parser.add_argument("--render-only", action="store_true", help="section from the kept run")
    parser.add_argument(
        "--note", help="what the difference was (a paragraph under the figures, kept with them)"
    )
    opts = parser.parse_args()
    out = orjson.loads(RESULTS_FILE.read_bytes()) if opts.render_only else measure(opts)
    if opts.note is not None:
        out["note"] = opts.note
    if not opts.render_only:
        print(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())
    if opts.write or opts.render_only:
        RESULTS_FILE.write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2) + b"\n")
        md_path = RESULTS_FILE.parent / "RESULTS.md"
        text = md_path.read_text(encoding="utf-8")
        md_path.write_text(splice(text, section(out)), encoding="utf-8")


def measure(opts: argparse.Namespace) -> dict[str, Any]:
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
    return {
        "command": (
            f"python -m bench.refactor_parity --before {opts.before} --after {opts.after} "
            f"--events {opts.events} --users {opts.users} --keys {opts.keys} "
            f"--rounds {opts.rounds} --write"
        ),
        "finished_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
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


def section(r: dict[str, Any]) -> list[str]:
    """The RESULTS.md section (markdown lines, title first)."""
    before, after = r["commits"]["before"][:7], r["commits"]["after"][:7]
    start, end = r["load_at_start"][0], r["load_at_end"][0]
    loads = [run["load1"] for run in r["runs"]]
    lines = [
        SECTION_TITLE,
        "",
        f"From `{r.get('command', 'python -m bench.refactor_parity')}` "
        f"({r.get('finished_utc', 'date not kept')}, {r['wall_s']:.0f} s; its own run, kept "
        "in bench/refactor_parity.json). The worker before the redesign of issue 26 "
        f"(`{before}`) and after it (`{after}`), each from its own exported tree with its own "
        f"bench code, on one embedded broker and one preloaded topic: {r['events']:,} events, "
        f"{r['users']:,} users, {r['keys']:,} keys, {r['windows']} windows. Each round runs "
        "the keyed path (input keyed by user) and the default path (repartitioned) for both "
        "trees, alternating which goes first, so that the shared machine's load drift weighs "
        f"on both. {r['cpus']} cores shared with other work: load average (1 min) "
        f"{start:.1f} at the start, {end:.1f} at the end, {min(loads):.1f} to "
        f"{max(loads):.1f} across the runs.",
        "",
        "Wall time is end to end (group join to the last window acknowledged); CPU time is the "
        "worker process's own, which the machine's load disturbs far less.",
        "",
        "| path | round | before events/s | after events/s | after/before (wall) "
        "| after/before (CPU per event) |",
        "|---|---|---|---|---|---|",
    ]
    for path in ("keyed", "default"):
        for rnd in range(r["rounds"]):
            side = {x["side"]: x for x in r["runs"] if x["round"] == rnd and x["path"] == path}
            b, a = side["before"], side["after"]
            lines.append(
                f"| {path} | {rnd + 1} | {b['events_per_s']:,.0f} | {a['events_per_s']:,.0f} | "
                f"{a['events_per_s'] / b['events_per_s']:.3f} | "
                f"{a['events_per_cpu_s'] / b['events_per_cpu_s']:.3f} |"
            )
    lines.append("")
    for path in ("keyed", "default"):
        s = r["summary"][path]
        cpu = s["cpu_ratios_after_to_before"]
        lines.append(
            f"- {path}: after/before median {s['median_ratio']:.3f} (range "
            f"{s['min_ratio']:.3f} to {s['max_ratio']:.3f}) in wall time, "
            f"{s['median_cpu_ratio']:.3f} ({min(cpu):.3f} to {max(cpu):.3f}) in events per "
            "CPU second."
        )
    if r.get("note"):
        lines += ["", str(r["note"])]
    return lines


def splice(markdown: str, lines: list[str]) -> str:
    """``markdown`` with this section replaced (or inserted before the closing notes)."""
    return splice_section(markdown, SECTION_TITLE, lines)


if __name__ == "__main__":
    main()
