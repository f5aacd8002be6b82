"""The three throughput contenders, each run in a fresh process of its own.

``python -m bench.contenders {raw,worker} SPEC_JSON`` prints one JSON line of measurements
(``faust`` lives in :mod:`bench.faust_app`, which needs its own module-level app). Each
contender times itself from just before its Kafka client starts (imports are done) to its
last result, with wall time (``time.perf_counter``) and its own CPU time
(``time.process_time``, user + system, all threads of the process).

* ``raw``: an aiokafka consumer (manual assignment, no group) that fetches the whole topic
  with the worker's fetch settings and JSON-decodes every value with orjson: the floor.
* ``worker``: the stream-dp :class:`~stream_dp.pipeline.kafka.worker.Worker`, consumer group
  included, every stage in the one process (it owns every partition of the input, of the
  partials topic and, for input not keyed by user, of the repartition topic), until the
  window record of its last window is acknowledged on the output topic and its published
  marker is in the ledger. Its phases are: startup (start → first batch taken by stage 1,
  or by stage 0 when it repartitions), processing (→ the last event taken by stage 1) and
  close (→ last window finished by stage 2: grace, ``idle_close_s``, sealing the last
  windows' partials, the round trip through the partials topic, the release and its
  acknowledged writes). Timed by hooking :meth:`IngestStage.ingest` (and, for repartitioned
  input, the packed records it takes) and :meth:`ReleaseStage.finish_window` (the worker's
  ``self.release``) in the worker process.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import sys
import time
from collections.abc import Sequence
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

# as the worker (stream_dp.pipeline.kafka.membership.MAX_RECORDS_PER_FETCH)
FETCH_MAX_RECORDS = 40_000
FETCH_TIMEOUT_MS = 200


async def run_raw(spec: dict[str, Any]) -> dict[str, Any]:
    """Fetch and decode ``spec["events"]`` records of ``spec["topic"]``; no other work."""
    topic, expected = spec["topic"], int(spec["events"])
    t0, c0 = time.perf_counter(), time.process_time()
    consumer = AIOKafkaConsumer(
        bootstrap_servers=spec["bootstrap"],
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=4 * 1_048_576,  # as the worker (membership.FETCH_PARTITION_BYTES)
    )
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(int(spec["partitions"]))])
        await consumer.seek_to_beginning()
        n = 0
        first: float | None = None
        loads = orjson.loads
        while n < expected:
            batch = await consumer.getmany(
                timeout_ms=FETCH_TIMEOUT_MS, max_records=FETCH_MAX_RECORDS
            )
            for msgs in batch.values():
                for m in msgs:
                    loads(m.value)
                n += len(msgs)
            if first is None and batch:
                first = time.perf_counter()
        t1, c1 = time.perf_counter(), time.process_time()
    finally:
        await consumer.stop()
    return {
        "events": n,
        "seconds": t1 - t0,
        "cpu_seconds": c1 - c0,
        "startup_seconds": (first or t1) - t0,
    }


async def run_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Run the stream-dp worker on ``spec["topic"]`` until its last window is released."""
    from stream_dp.config import parse_config
    from stream_dp.ops.metrics import Metrics
    from stream_dp.pipeline.formats.ledger import LedgerRelease
    from stream_dp.pipeline.formats.packed import PackedEvents
    from stream_dp.pipeline.kafka import worker as worker_module
    from stream_dp.pipeline.kafka.service import freeze_startup_heap
    from stream_dp.pipeline.stages.ingest import DeadLetter, IngestStage, InputRecord
    from stream_dp.pipeline.stages.release_stage import ReleaseStage
    from stream_dp.privacy.pseudonymize import KeyRing, Pseudonymizer

    logging.basicConfig(level=logging.WARNING)
    expected_events = int(spec["events"])
    expected_windows = int(spec["windows"])
    done = asyncio.Event()
    marks: dict[str, float] = {}
    counts = {"events": 0, "windows": 0, "dead": 0}

    class TimedIngest(IngestStage):
        """Stage 1, noting when ingest starts and ends (raw or routed records alike)."""

        def ingest(
            self,
            partition: int,
            records: Sequence[InputRecord],
            *,
            now_s: float,
            now_mono_s: float,
            routed: bool = False,
            topic: str | None = None,
        ) -> list[DeadLetter]:
            _mark_first()
            dead = super().ingest(
                partition, records, now_s=now_s, now_mono_s=now_mono_s, routed=routed, topic=topic
            )
            if not routed:
                counts["events"] += len(records)
            counts["dead"] += len(dead)
            self._note_progress()
            return dead

        def route_packed(
            self,
            partition: int,
            records: Sequence[InputRecord],
            *,
            now_s: float,
            now_mono_s: float,
        ) -> tuple[list[tuple[bytes, bytes, int]], list[DeadLetter]]:
            # Repartitioned input: processing starts with stage 0's first batch.
            _mark_first()
            return super().route_packed(partition, records, now_s=now_s, now_mono_s=now_mono_s)

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            columns = self.records.columns
            take_packed = columns.ingest_packed

            def ingest_packed(
                partition: int,
                offset: int,
                packed: PackedEvents,
                topic: str | None,
                seen: dict[int, int],
            ) -> list[DeadLetter]:
                # Repartitioned input: stage 1 takes the events of packed records.
                dead = take_packed(partition, offset, packed, topic, seen)
                counts["events"] += len(packed)
                return dead

            columns.ingest_packed = ingest_packed  # type: ignore[method-assign]

        def _note_progress(self) -> None:
            if counts["events"] >= expected_events and "last_ingest" not in marks:
                marks["last_ingest"] = time.perf_counter()
                marks["last_ingest_cpu"] = time.process_time()

    def _mark_first() -> None:
        if "first_ingest" not in marks:
            marks["first_ingest"] = time.perf_counter()
            marks["first_ingest_cpu"] = time.process_time()

    class TimedRelease(ReleaseStage):
        """Stage 2, noting when windows are finished."""

        def finish_window(
            self, window_start_s: int, releases: Sequence[LedgerRelease], now_s: float
        ) -> int:
            # Called after the window's records and its published marker are acknowledged.
            cursor = super().finish_window(window_start_s, releases, now_s)
            counts["windows"] += 1
            if counts["windows"] >= expected_windows:
                marks["released"] = time.perf_counter()
                marks["released_cpu"] = time.process_time()
                done.set()
            return cursor

    worker_module.IngestStage = TimedIngest  # type: ignore[attr-defined]
    worker_module.ReleaseStage = TimedRelease  # type: ignore[attr-defined]
    config = parse_config(spec["config"])
    keyring = KeyRing(Pseudonymizer(secrets.token_bytes(32), "bench"))
    t0, c0 = time.perf_counter(), time.process_time()
    freeze_startup_heap()  # as the service does before it starts the worker
    metrics = Metrics()
    worker = worker_module.Worker(
        config, keyring, bootstrap_servers=spec["bootstrap"], metrics=metrics
    )
    task = asyncio.create_task(worker.run())
    waiter = asyncio.create_task(done.wait())
    finished, _ = await asyncio.wait(
        {task, waiter}, timeout=float(spec["timeout_s"]), return_when=asyncio.FIRST_COMPLETED
    )
    worker.request_stop()
    await task
    if waiter not in finished:
        raise RuntimeError(
            f"the worker released {counts['windows']} of {expected_windows} windows and "
            f"ingested {counts['events']} of {expected_events} events in {spec['timeout_s']} s"
        )
    first = marks["first_ingest"]
    last = marks["last_ingest"]
    end = marks["released"]
    return {
        "events": counts["events"],
        "dead_letters": counts["dead"],
        "windows": counts["windows"],
        "seconds": end - t0,
        "cpu_seconds": marks["released_cpu"] - c0,
        "startup_seconds": first - t0,
        "processing_seconds": last - first,
        # CPU of the whole process (the release thread's included) from the first batch
        # stage 0 or stage 1 took to the last event ingested: start-up and close left out.
        "processing_cpu_seconds": marks["last_ingest_cpu"] - marks["first_ingest_cpu"],
        "close_seconds": end - last,
        # Events dropped as late (their partition had sealed the window): on a preloaded,
        # replayed topic there should be none, else the worker skipped work it should do.
        "late_events": _counter(metrics, "stream_dp_late_events_total"),
    }


def _counter(metrics: Any, name: str) -> int:
    value = metrics.registry.get_sample_value(name)
    return int(value) if value is not None else 0


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    kind, spec = args[0], orjson.loads(args[1])
    runner = {"raw": run_raw, "worker": run_worker}[kind]
    result = asyncio.run(runner(spec))
    sys.stdout.write(orjson.dumps(result).decode() + "\n")


if __name__ == "__main__":
    main()
