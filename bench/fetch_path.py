"""The input fetch and stage 0 in one process, before and after a change, alternating.

``python -m bench.fetch_path --before DIR [--events N] [--runs R]``: starts the embedded
broker, preloads a topic of ``N`` bench events (4 partitions, keyed by user), then per run
measures, each in a fresh process and in turn:

* ``raw``: aiokafka's fetch and one orjson decode per record (contender a of the throughput
  bench), the yardstick;
* ``stage0 before``: the worker's fetch and stage 0 (decode, validate, pseudonymize, pack:
  ``route_packed`` on every fetched partition batch) with the ``stream_dp`` of ``DIR`` (a
  checkout of the code before);
* ``stage0 after``: the same with this checkout's ``stream_dp``.

Nothing is produced: this is the CPU of the fetch and the decode path alone (the repartition
writes, stage 1 and the release are left out). Reported per contender: median wall and
process CPU from the first fetch to the last record, in µs per event.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

PARTITIONS = 4
FETCH_TIMEOUT_MS = 200
MAX_RECORDS = 40_000
REPO = Path(__file__).resolve().parent.parent


async def _child(spec: dict[str, Any]) -> dict[str, Any]:
    """One contender, in its own process (``stream_dp`` from its PYTHONPATH)."""
    import orjson
    from aiokafka import AIOKafkaConsumer, TopicPartition

    options: dict[str, Any] = {}
    stage = None
    fetched: Any = None
    if spec["mode"] == "stage0":
        from stream_dp.config import parse_config
        from stream_dp.ops.metrics import Metrics
        from stream_dp.pipeline.stages.ingest import IngestSettings, IngestStage
        from stream_dp.pipeline.stages.ingest_columns import FetchedRecords
        from stream_dp.privacy.pseudonymize import KeyRing, Pseudonymizer

        try:  # the worker's consumer options, where this checkout has them
            from stream_dp.kafka_client.fetched import fetch_options
        except ImportError:
            pass
        else:
            options.update(fetch_options())
        fetched = FetchedRecords
        cfg = parse_config(spec["config"])
        stage = IngestStage(
            cfg,
            KeyRing(Pseudonymizer(b"ab" * 32, "k1")),
            metrics=Metrics(),
            settings=IngestSettings(routed_partitions=PARTITIONS),
        )
        stage.assign_routed(range(PARTITIONS), time.monotonic(), now_s=time.time())
    consumer = AIOKafkaConsumer(
        bootstrap_servers=spec["bootstrap"],
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=4 * 1_048_576,
        **options,
    )
    await consumer.start()
    loads = orjson.loads
    try:
        consumer.assign([TopicPartition(spec["topic"], p) for p in range(PARTITIONS)])
        await consumer.seek_to_beginning()
        n, expected = 0, int(spec["events"])
        t0 = c0 = None
        while n < expected:
            batch = await consumer.getmany(timeout_ms=FETCH_TIMEOUT_MS, max_records=MAX_RECORDS)
            if t0 is None and batch:
                t0, c0 = time.perf_counter(), time.process_time()
            now, mono = time.time(), time.monotonic()
            for tp, msgs in batch.items():
                if stage is None:
                    for m in msgs:
                        loads(m.value)
                else:
                    stage.route_packed(tp.partition, fetched(msgs), now_s=now, now_mono_s=mono)
                n += len(msgs)
        t1, c1 = time.perf_counter(), time.process_time()
    finally:
        await consumer.stop()
    assert t0 is not None and c0 is not None
    return {"events": n, "wall_s": t1 - t0, "cpu_s": c1 - c0}


def _run(mode: str, tree: Path, spec: dict[str, Any]) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "--child",
            json.dumps({**spec, "mode": mode}),
        ],
        env=env,
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, help="a checkout of the code before")
    parser.add_argument("--events", type=int, default=400_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(asyncio.run(_child(json.loads(args.child)))))
        return
    if args.before is None:
        parser.error("--before DIR is required")

    from bench.data import StreamSpec, encode
    from bench.throughput import create_topics, produce, worker_config
    from stream_dp.broker.embedded import EmbeddedBroker

    spec_stream = StreamSpec(events=args.events, users=50_000, keys=1_000)
    values, keys = encode(spec_stream)
    topic = f"fetch-path-{uuid.uuid4().hex[:8]}"
    rows: dict[str, list[dict[str, Any]]] = {"raw": [], "before": [], "after": []}
    with EmbeddedBroker() as broker:
        bootstrap = broker.bootstrap_servers
        asyncio.run(create_topics(bootstrap, [topic], PARTITIONS))
        produce(bootstrap, topic, values, keys)
        config = worker_config(bootstrap, topic, "fetch", 60, keyed_by_user=False)
        spec = {"bootstrap": bootstrap, "topic": topic, "events": args.events, "config": config}
        for run in range(args.runs):
            load = os.getloadavg()[0]
            rows["raw"].append(_run("raw", REPO, spec))
            rows["before"].append(_run("stage0", args.before.resolve(), spec))
            rows["after"].append(_run("stage0", REPO, spec))
            print(
                f"run {run + 1}: load {load:.2f}; "
                + ", ".join(f"{k} {v[-1]['cpu_s']:.2f} s CPU" for k, v in rows.items()),
                file=sys.stderr,
            )
    print(f"{args.events:,} events, {PARTITIONS} partitions, median of {args.runs} runs")
    print("| contender | wall µs/event | CPU µs/event | vs raw (CPU) |")
    print("|---|---|---|---|")
    raw_cpu = statistics.median(r["cpu_s"] for r in rows["raw"])
    for name, label in (
        ("raw", "raw fetch + orjson decode"),
        ("before", "fetch + stage 0, before"),
        ("after", "fetch + stage 0, after"),
    ):
        wall = statistics.median(r["wall_s"] for r in rows[name]) / args.events * 1e6
        cpu = statistics.median(r["cpu_s"] for r in rows[name])
        print(f"| {label} | {wall:.2f} | {cpu / args.events * 1e6:.2f} | {raw_cpu / cpu:.2f}× |")


if __name__ == "__main__":
    if sys.path and sys.path[0] == str(Path(__file__).resolve().parent):
        sys.path.pop(0)  # run as a script: bench/ must not shadow the standard library
    main()
