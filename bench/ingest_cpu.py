"""CPU per event of the worker's per-batch work on issue 43's stream, without Kafka: before, after.

``python -m bench.ingest_cpu [--before DIR] [--events N] [--batch B] [--repeats R]``: the
events of issue 43's stream (bench/realistic.py: ISO-8601 times, a Pareto tail of users, 41
domains) placed on 4 partitions as librdkafka places them (CRC32 of the key), read back as
aiokafka's own parsed records (uncompressed v2 record batches of ``B`` records, parsed by its
C extension: the objects the worker's fetch hands out), then, per partition batch, what the
worker does with them once fetched:

* ``keyed``: stage 1 on keyed input (``input.keyed_by_user: true``, ``partitioner: crc32``):
  :meth:`IngestStage.ingest` — decode, validation, event times, the key and placement checks,
  pseudonyms, windows and samples;
* ``default``: stage 0 on unkeyed input, :meth:`IngestStage.route_packed` — decode,
  validation, event times, pseudonyms and the packed repartition records;
* ``repartitioned``: stage 1 on those packed records (made by the same tree's stage 0,
  untimed), :meth:`IngestStage.ingest` with ``routed=True`` — decoding the packed records,
  placement, re-sent events, key checks, windows and samples — per repartition partition
  in fetches of ``--fetch`` records. ``default + repartitioned`` is the default path's
  per-event CPU without Kafka.

Each side runs in fresh processes (``--before DIR``: a checkout of the code before, e.g. from
``git worktree add`` or ``git archive``; the bench itself always from this tree), alternating
before and after ``R`` times; each process measures ``time.process_time`` over every batch
(``--passes`` times, each into a fresh stage, keeping the best), the heap frozen first as the
worker freezes its start-up heap. Prints the best (and median) over processes of µs of CPU per
event of each side and path, and the load average.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PARTITIONS = 4
PATHS = ("keyed", "default", "repartitioned")


def _records(events: int, per_batch: int, start_s: int) -> dict[int, list[list[Any]]]:
    """Per partition, its batches of aiokafka's parsed records."""
    from aiokafka.record.memory_records import MemoryRecords

    from bench.realistic import stream
    from bench.record_batch_columns import build_batches

    values, keys = stream(events, start_s)
    by_partition: dict[int, tuple[list[bytes], list[bytes]]] = {
        p: ([], []) for p in range(PARTITIONS)
    }
    for value, key in zip(values, keys, strict=True):
        vs, ks = by_partition[zlib.crc32(key) % PARTITIONS]
        vs.append(value)
        ks.append(key)
    out: dict[int, list[list[Any]]] = {}
    for p, (vs, ks) in by_partition.items():
        out[p] = [list(MemoryRecords(raw).next_batch()) for raw in build_batches(vs, ks, per_batch)]
    return out


def _config(path: str, start_s: int) -> Any:
    from bench.realistic import GRACE_S, IDLE_CLOSE_S, WINDOW_S, K
    from stream_dp.config import parse_config
    from stream_dp.windows.tumbling import iso_utc

    keyed = path == "keyed"
    return parse_config(
        {
            "input": {"keyed_by_user": keyed, **({"partitioner": "crc32"} if keyed else {})},
            "window": {
                "size_s": WINDOW_S,
                "grace_s": GRACE_S,
                "idle_close_s": IDLE_CLOSE_S,
                "start_at": iso_utc(start_s),
            },
            "privacy": {"epsilon_per_window": 1.0, "delta_per_window": 1e-6},
            "bounds": {"max_contributions_per_window": K},
            "queries": [
                {"name": "visits_by_domain", "group_by": ["domain"], "epsilon": 1.0, "delta": 1e-6}
            ],
            "metrics": {"enabled": False},
        }
    )


def child(spec: dict[str, Any]) -> dict[str, float]:
    """One side's CPU per event for each path (``stream_dp`` from ``spec["tree"]``)."""
    if "stream_dp" in sys.modules:
        raise SystemExit("stream_dp was imported before its tree was chosen")
    sys.path.insert(0, str(spec["tree"]))  # before the checkout bench.ingest_cpu runs from
    import stream_dp

    if not Path(stream_dp.__file__).resolve().is_relative_to(Path(spec["tree"]).resolve()):
        raise SystemExit(f"stream_dp from {stream_dp.__file__}, not from {spec['tree']}")
    from stream_dp.pipeline.stages.ingest import IngestSettings, IngestStage
    from stream_dp.pipeline.stages.ingest_columns import FetchedRecords
    from stream_dp.privacy.pseudonymize import KeyRing, Pseudonymizer

    start_s = int(spec["start_s"])
    batches = _records(int(spec["events"]), int(spec["batch"]), start_s)
    now_s = start_s + 3600.0
    settings = IngestSettings(
        source_partitions=PARTITIONS,
        input_partitions=PARTITIONS,
        routed_partitions=PARTITIONS,
    )
    keyring = KeyRing(Pseudonymizer(b"k" * 32, "bench"))

    def stage_for(path: str) -> IngestStage:
        stage = IngestStage(_config(path, start_s), keyring, settings=settings)
        stage.assign(list(range(PARTITIONS)), 0.0, routed=path == "repartitioned")
        return stage

    # Stage 1's input: the packed records this tree's stage 0 writes, per repartition
    # partition, in fetches of ``fetch`` records.
    router = stage_for("default")
    routed: dict[int, list[tuple[int, bytes | None, bytes]]] = {p: [] for p in range(PARTITIONS)}
    for p, bs in batches.items():
        for b in bs:
            for key, value, target in router.route_packed(
                p, FetchedRecords(b), now_s=now_s, now_mono_s=0.0
            )[0]:
                routed[target].append((len(routed[target]), key, value))
    fetch = int(spec["fetch"])
    fetched = [(p, rs[i : i + fetch]) for p, rs in routed.items() for i in range(0, len(rs), fetch)]
    out = {path: float("inf") for path in PATHS}
    for _ in range(int(spec["passes"])):
        for path in PATHS:
            stage = stage_for(path)
            work: list[tuple[int, Any]] = (
                fetched
                if path == "repartitioned"
                else [(p, FetchedRecords(b)) for p, bs in batches.items() for b in bs]
            )
            n = sum(len(b) for bs in batches.values() for b in bs)  # input events
            gc.collect()
            gc.freeze()
            c0 = time.process_time()
            for p, records in work:
                if path == "default":
                    dead = stage.route_packed(p, records, now_s=now_s, now_mono_s=0.0)[1]
                else:
                    dead = stage.ingest(
                        p, records, now_s=now_s, now_mono_s=0.0, routed=path == "repartitioned"
                    )
                if dead:
                    raise SystemExit(f"{path}: a bench record was dead-lettered: {dead[0]}")
            out[path] = min(out[path], (time.process_time() - c0) / n * 1e6)
            gc.unfreeze()
            if path == "repartitioned" and stage.metrics.late_events._value.get():
                raise SystemExit("repartitioned: events were taken as late")
    return out


def _run(tree: Path, spec: dict[str, Any]) -> dict[str, float]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.ingest_cpu",
            "--child",
            json.dumps({**spec, "tree": str(tree)}),
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, help="a checkout of the code before")
    parser.add_argument("--after", type=Path, default=REPO, help="(default: this checkout)")
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=2_500)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--passes", type=int, default=3, help="passes per process (best)")
    parser.add_argument(
        "--fetch", type=int, default=8, help="repartition records per stage-1 fetch"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    spec = {
        "events": args.events,
        "batch": args.batch,
        "passes": args.passes,
        "fetch": args.fetch,
        "start_s": int(time.time()) // 60 * 60,
    }
    sides = {"after": args.after}
    if args.before is not None:
        sides = {"before": args.before, **sides}
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    load = [os.getloadavg()[0]]
    for _ in range(args.repeats):
        for side, tree in sides.items():
            runs[side].append(_run(tree, spec))
    load.append(os.getloadavg()[0])
    print(
        f"{args.events:,} events, record batches of {args.batch:,}, {args.repeats} runs per side,"
        f" load average {load[0]:.1f} -> {load[1]:.1f}; CPU µs/event best (median)"
    )
    for rs in runs.values():
        for r in rs:
            r["default + repartitioned"] = r["default"] + r["repartitioned"]
    for path in (*PATHS, "default + repartitioned"):
        cells = [
            f"{side} {min(r[path] for r in rs):.3f} ({statistics.median(r[path] for r in rs):.3f})"
            for side, rs in runs.items()
        ]
        print(f"{path}: " + ", ".join(cells))


if __name__ == "__main__":
    main()
