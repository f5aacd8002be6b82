"""Where the default path's time goes: py-spy samples of a worker, top functions, a flame graph.

The default configuration (``input.keyed_by_user: false``: stage 0 repartitions by
pseudonym) runs as the throughput contender does (``bench.contenders worker``), under
``py-spy record`` (sampling the process from outside; its work is not slowed by the
profiler beyond the sampling). The samples are folded stacks, one per line
(``frame;frame;frame count``); this module reduces them to function level (file and
function, no line numbers), lists the functions with the largest self and inclusive share,
and draws an icicle flame graph as a self-contained SVG (drawn here, no external tool).

``bench/profiles/default_path_before.folded`` holds the samples of the same measurement on
the code before issue 15 (one ``send`` per repartitioned event), recorded once; the bench
writes ``default_path_after.folded`` and both SVGs on every full run.
"""

from __future__ import annotations

import asyncio
import html
import re
import shutil
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from bench.throughput import WORKER_TOPICS, cpu_seconds_of, delete_topics, worker_config
from stream_dp.broker.topics import apply_topics
from stream_dp.config import parse_config

PROFILES = Path(__file__).resolve().parent / "profiles"
BEFORE = PROFILES / "default_path_before.folded"
SAMPLE_RATE_HZ = 200
_LINE = re.compile(r":\d+\)")
#: Frames above the worker's own code (the interpreter, asyncio's machinery) are cut from the
#: top of every stack so that the graph starts where the work is.
_ROOTS = ("Handle._run (asyncio/events.py)",)


def fold_functions(text: str) -> Counter[str]:
    """py-spy's raw output at function level: line numbers dropped, stacks merged."""
    out: Counter[str] = Counter()
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [_LINE.sub(")", f) for f in stack.split(";")]
        for root in _ROOTS:
            if root in frames:
                frames = frames[frames.index(root) + 1 :]
                break
        if frames:
            out[";".join(frames)] += int(count)
    return out


def read_folded(path: Path) -> Counter[str]:
    out: Counter[str] = Counter()
    for line in path.read_text(encoding="utf-8").splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            out[stack] += int(count)
    return out


def write_folded(stacks: Counter[str], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"{s} {n}" for s, n in sorted(stacks.items())]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def top_functions(stacks: Counter[str], n: int = 15) -> list[dict[str, Any]]:
    """The n functions with the most samples of their own (self), with inclusive shares."""
    total = sum(stacks.values()) or 1
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    for stack, count in stacks.items():
        frames = stack.split(";")
        own[frames[-1]] += count
        for f in set(frames):
            incl[f] += count
    return [
        {"function": f, "self": c / total, "inclusive": incl[f] / total}
        for f, c in own.most_common(n)
    ]


def flame_svg(stacks: Counter[str], title: str, *, width: int = 1200, row: int = 16) -> str:
    """An icicle graph (callers on top): a frame's width is its share of the samples."""
    total = sum(stacks.values()) or 1
    tree: dict[str, Any] = {"n": 0, "kids": {}}
    for stack, count in stacks.items():
        node = tree
        node["n"] += count
        for frame in stack.split(";"):
            node = node["kids"].setdefault(frame, {"n": 0, "kids": {}})
            node["n"] += count
    rects: list[str] = []
    depth_max = 0

    def walk(node: dict[str, Any], x: float, depth: int) -> None:
        nonlocal depth_max
        for name, kid in sorted(node["kids"].items(), key=lambda kv: -kv[1]["n"]):
            w = width * kid["n"] / total
            if w >= 0.5:
                depth_max = max(depth_max, depth)
                y = 24 + depth * row
                share = 100 * kid["n"] / total
                hue = 20 + (hash(name.split(" (")[-1]) % 40)
                label = html.escape(name if w > 7 * len(name) else name[: max(0, int(w / 7))])
                tip = html.escape(f"{name}: {share:.1f}%")
                rects.append(
                    f'<g><title>{tip}</title><rect x="{x:.1f}" y="{y}" width="{w:.1f}" '
                    f'height="{row - 1}" fill="hsl({hue},80%,62%)"/>'
                    f'<text x="{x + 2:.1f}" y="{y + row - 4}" font-size="11">{label}</text></g>'
                )
                walk(kid, x, depth + 1)
            x += w

    walk(tree, 0.0, 0)
    height = 24 + (depth_max + 1) * row + 8
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="monospace"><text x="4" y="16" font-size="13">{html.escape(title)} '
        f"({total:,} samples; hover for names)</text>{''.join(rects)}</svg>\n"
    )


def profile_default_path(
    bootstrap: str,
    topic: str,
    events: int,
    windows: int,
    window_size_s: int,
    broker_pid: int,
    out: Path,
) -> dict[str, Any]:
    """Run the default-path worker under py-spy; write the folded samples, return a summary
    (or the reason there is none: py-spy may not be allowed to attach here)."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(py_spy).exists():
        return {"error": "py-spy is not installed (bench extra)"}
    suffix = uuid.uuid4().hex[:10]
    config = worker_config(bootstrap, topic, suffix, window_size_s, keyed_by_user=False)
    asyncio.run(apply_topics(parse_config(config), bootstrap, include_input=False))
    spec = {
        "bootstrap": bootstrap,
        "events": events,
        "windows": windows,
        "config": config,
        "timeout_s": 900,
    }
    out.mkdir(parents=True, exist_ok=True)
    raw = out / f"profile-{suffix}.raw"
    broker_cpu = cpu_seconds_of(broker_pid)
    try:
        proc = subprocess.run(
            [
                py_spy,
                "record",
                "--rate",
                str(SAMPLE_RATE_HZ),
                "--format",
                "raw",
                "--output",
                str(raw),
                "--",
                sys.executable,
                "-m",
                "bench.contenders",
                "worker",
                orjson.dumps(spec).decode(),
            ],
            capture_output=True,
            text=True,
            timeout=1200,
            check=False,
        )
    finally:
        asyncio.run(delete_topics(bootstrap, names=[config["output"][k] for k in WORKER_TOPICS]))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not raw.exists() or not lines:
        return {"error": f"py-spy record failed ({proc.returncode}): {proc.stderr[-500:]}"}
    result = orjson.loads(lines[-1])
    stacks = fold_functions(raw.read_text(encoding="utf-8"))
    raw.unlink()
    return {
        "events": events,
        "events_per_s_under_profiler": result["events"] / result["seconds"],
        "broker_cpu_seconds": cpu_seconds_of(broker_pid) - broker_cpu,
        "stacks": stacks,
    }


def write_profiles(after: dict[str, Any], out: Path) -> dict[str, Any]:
    """Folded samples, top functions and SVGs of the default path before and after."""
    summary: dict[str, Any] = {}
    for label, stacks in (
        ("before", read_folded(BEFORE) if BEFORE.exists() else None),
        ("after", after.get("stacks")),
    ):
        if not stacks:
            continue
        if label == "after":
            write_folded(stacks, out / "profiles" / "default_path_after.folded")
        svg = out / "profiles" / f"default_path_{label}.svg"
        svg.parent.mkdir(parents=True, exist_ok=True)
        title = f"stream-dp worker, default path (keyed_by_user: false), {label} issue 15"
        svg.write_text(flame_svg(stacks, title), encoding="utf-8")
        summary[label] = {
            "samples": sum(stacks.values()),
            "top": top_functions(stacks),
            "svg": f"profiles/default_path_{label}.svg",
        }
    return summary


def main(argv: list[str] | None = None) -> None:
    """``python -m bench.profile [--size full] [--out bench]``: the profile section alone.

    Starts the embedded broker, preloads the size's stream, records the default-path worker
    under py-spy and writes ``profiles/default_path_after.folded`` (and both SVGs) into
    ``--out``; the next ``python -m bench.run --only throughput`` report shows its top
    functions in section 7."""
    import argparse

    from bench.data import columns as stream_columns
    from bench.data import distinct_windows, encode
    from bench.run import SIZES, _spec
    from bench.throughput import PARTITIONS, create_topics, produce
    from stream_dp.broker.embedded import EmbeddedBroker

    parser = argparse.ArgumentParser(prog="python -m bench.profile")
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--out", type=Path, default=PROFILES.parent)
    args = parser.parse_args(argv)
    spec = _spec(SIZES[args.size])
    cols = stream_columns(spec)
    values, keys = encode(spec, cols)
    topic = f"bench-profile-{uuid.uuid4().hex[:8]}"
    with EmbeddedBroker() as broker:
        asyncio.run(create_topics(broker.bootstrap_servers, [topic], PARTITIONS))
        produce(broker.bootstrap_servers, topic, values, keys)
        after = profile_default_path(
            broker.bootstrap_servers,
            topic,
            spec.events,
            distinct_windows(spec, cols),
            spec.window_size_s,
            broker.pid,
            args.out,
        )
    if "error" in after:
        raise SystemExit(after["error"])
    summary = write_profiles(after, args.out)["after"]
    print(f"{summary['samples']} samples, {after['events_per_s_under_profiler']:,.0f} events/s")
    for row in summary["top"]:
        print(f"{row['self']:6.1%} {row['inclusive']:6.1%}  {row['function']}")


if __name__ == "__main__":
    main()
