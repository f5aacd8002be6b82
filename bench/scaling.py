"""Scaling of the pipeline stages in-process (no Kafka): events/s against users and keys, the
release time of a window with 100k keys, and the state kept per retained event.

Ingest is stage 1, :class:`~stream_dp.pipeline.stages.ingest.IngestStage`: what a worker runs for
every fetched batch of a partition it owns. Here it is fed the same JSON records, keyed by
user id (``input.keyed_by_user: true``, so the key check runs as in the worker), in batches of
40,000 (the worker's ``MAX_RECORDS_PER_FETCH``) from one partition, so the figures leave out
the Kafka client (the throughput sections measure that).

A release is three steps, timed together, each the worker's own function
(:mod:`stream_dp.pipeline.stages.offload`): stage 1 seals the window (compaction of the samples,
L0/Linf bounding, exact totals per key: one partial per query) and encodes its partials;
stage 2 (:class:`~stream_dp.pipeline.stages.release_stage.ReleaseStage`) decodes them; then it
merges them, draws selection and noise, builds the records and encodes them for the ledger
and the output topic. Writing to Kafka is not included.
"""

from __future__ import annotations

import gc
import os
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson

from bench.data import START_S, StreamSpec, columns, encode
from stream_dp.config import parse_config
from stream_dp.config.model import Config
from stream_dp.pipeline.formats.partials import SourceWatermark, encode_watermark
from stream_dp.pipeline.local.local import LocalPipeline
from stream_dp.pipeline.stages.ingest import IngestStage
from stream_dp.pipeline.stages.offload import draw_window, gc_paused, output_chunks, seal_windows
from stream_dp.pipeline.stages.release_stage import ReleaseStage
from stream_dp.privacy.pseudonymize import KeyRing, Pseudonymizer
from stream_dp.privacy.user_samples import UserSamples
from stream_dp.windows.tumbling import iso_utc

BATCH = 40_000  # as the worker's MAX_RECORDS_PER_FETCH
K = 40


def stage_config(
    window_size_s: int, public_keys: list[str] | None = None, *, keyed_by_user: bool = True
) -> Config:
    query: dict[str, Any] = {
        "name": "visits_by_domain",
        "group_by": ["domain"],
        "epsilon": 1.0,
        "delta": 1e-6,
    }
    if public_keys is not None:
        query["keys"] = {"domain": public_keys}
    return parse_config(
        {
            "input": {"keyed_by_user": keyed_by_user},
            "window": {
                "size_s": window_size_s,
                "grace_s": 0,
                "idle_close_s": 0.5,
                "start_at": iso_utc(START_S),
            },
            "privacy": {"epsilon_per_window": 1.0, "delta_per_window": 1e-6},
            "bounds": {"max_contributions_per_window": K},
            "queries": [query],
            "metrics": {"enabled": False},
        }
    )


def _keyring() -> KeyRing:
    return KeyRing(Pseudonymizer(os.urandom(32), "bench"))


def keyed_records(values: list[bytes], keys: list[bytes]) -> list[tuple[int, bytes, bytes]]:
    """(offset, key, value) records as one partition of the input topic delivers them."""
    return [(i, k, v) for i, (k, v) in enumerate(zip(keys, values, strict=True))]


def ingest_all(stage: IngestStage, records: list[tuple[int, bytes, bytes]]) -> float:
    """Feed every record through ``stage.ingest`` in worker-sized batches; seconds."""
    stage.assign([0], 0.0, routed=False)
    now = time.time()
    started = time.perf_counter()
    for i in range(0, len(records), BATCH):
        dead = stage.ingest(0, records[i : i + BATCH], now_s=now, now_mono_s=0.0)
        if dead:
            raise RuntimeError(f"bench records dead-lettered: {dead[0].reason}: {dead[0].detail}")
    return time.perf_counter() - started


def throughput_point(spec: StreamSpec) -> dict[str, Any]:
    """Events/s of ingest for one (users, keys) point, and the time to release every window
    (seal partials, merge, release) through :class:`LocalPipeline`."""
    cols = columns(spec)
    values, keys = encode(spec, cols)
    # LocalPipeline turns the key check off for its single partition; the worker reading
    # keyed input (keyed_by_user: true) does it for every record, so it is timed too.
    pipeline = LocalPipeline(stage_config(spec.window_size_s), _keyring(), enforce_user_keys=True)
    seconds = ingest_all(pipeline.ingest_stage, keyed_records(values, keys))
    windows = pipeline.ingest_stage.open_windows()
    started = time.perf_counter()
    releases = pipeline.finish(now_s=time.time())
    release_s = time.perf_counter() - started
    if sorted({r.window_start_s for r in releases}) != windows:
        raise RuntimeError("the pipeline did not release every window of the point")
    return {
        "users": spec.users,
        "keys": spec.keys,
        "events": spec.events,
        "distinct_users": int(np.unique(cols.user).size),
        "distinct_keys": int(np.unique(cols.domain).size),
        "ingest_seconds": seconds,
        "events_per_s": spec.events / seconds,
        "windows": len(windows),
        "release_seconds_per_window": release_s / max(1, len(windows)),
    }


def repartition_point(spec: StreamSpec) -> dict[str, Any]:
    """The path of input not keyed by user (``keyed_by_user: false``), in-process: stage 0
    (:meth:`IngestStage.route_packed`: decode, pseudonymize, packed records per repartition
    partition) and stage 1 on those records, each in worker-sized batches of one partition."""
    values, _ = encode(spec)
    stage = IngestStage(stage_config(spec.window_size_s, keyed_by_user=False), _keyring())
    now = time.time()
    raw = [(i, None, v) for i, v in enumerate(values)]
    routed: list[tuple[int, bytes | None, bytes | None]] = []
    started = time.perf_counter()
    for i in range(0, len(raw), BATCH):
        out, dead = stage.route_packed(0, raw[i : i + BATCH], now_s=now, now_mono_s=0.0)
        if dead:
            raise RuntimeError(f"bench records dead-lettered: {dead[0].reason}")
        # As the worker sends them: the batch's events, then the progress marks.
        values_out = [v for _, v, _ in out] + stage.progress_marks(0.0)
        routed.extend((len(routed) + j, None, v) for j, v in enumerate(values_out))
    route_s = time.perf_counter() - started
    stage.assign([0], 0.0, routed=True)
    started = time.perf_counter()
    for i in range(0, len(routed), BATCH):
        stage.ingest(0, routed[i : i + BATCH], now_s=now, now_mono_s=0.0, routed=True)
    ingest_s = time.perf_counter() - started
    routed_bytes = sum(len(v or b"") for _, _, v in routed)
    return {
        "users": spec.users,
        "keys": spec.keys,
        "events": spec.events,
        "routed_records": len(routed),
        "routed_bytes_per_event": routed_bytes / spec.events,
        "route_seconds": route_s,
        "route_events_per_s": spec.events / route_s,
        "routed_ingest_seconds": ingest_s,
        "routed_ingest_events_per_s": spec.events / ingest_s,
        "both_events_per_s": spec.events / (route_s + ingest_s),
    }


def _release_once(
    stage: IngestStage, config: Config, window_start_s: int
) -> tuple[dict[str, float], int]:
    """Seal the window's partials from the stage's (kept) state, pass them through their
    topic encoding to a fresh ReleaseStage and release; (seconds per step, keys released).

    The steps are the worker's own (:mod:`stream_dp.pipeline.stages.offload`), with the garbage
    collector paused as the worker's off-loop thread runs them: seal and encode the
    partials; decode them into stage 2 (on the worker's loop); draw the release and encode
    its ledger records and output records (a chunk at a time, as the worker writes them).
    """
    max_bytes = config.kafka.max_message_bytes
    release = ReleaseStage(config)  # the worker's lives on: its plan is not a release's work
    release.assign([0])
    t0, c0 = time.perf_counter(), time.process_time()
    with gc_paused():
        ((_, records),) = seal_windows(
            stage, [(0, window_start_s)], lambda ws: 0, max_bytes=max_bytes
        )
    t1, c1 = time.perf_counter(), time.process_time()
    values = [v for _, v in records]
    # What the worker writes after the partials: the partition has sealed up to the end.
    sealed = float(stage.windows.end_of(window_start_s))
    values.append(encode_watermark(SourceWatermark(0, 1, sealed, True, False))[1])
    release.ingest(0, list(enumerate(values)))
    t2, c2 = time.perf_counter(), time.process_time()
    if release.due_windows() != [window_start_s]:
        raise RuntimeError("the sealed window is not due in stage 2")
    with gc_paused():
        ((rel, parts),) = draw_window(
            release, window_start_s, now_s=time.time(), max_bytes=max_bytes
        )
        for first, last in parts.groups():  # the ledger's parts, as the worker writes them
            if parts.take(first, last) is None:
                parts.encode(first, last)
        for _ in output_chunks(rel):  # the output records, as the worker publishes them
            pass
    t3, c3 = time.perf_counter(), time.process_time()
    steps = {"seal": t1 - t0, "transport": t2 - t1, "release": t3 - t2, "total": t3 - t0}
    # The process's CPU seconds of each step (wall varies with the load).
    steps.update(seal_cpu=c1 - c0, transport_cpu=c2 - c1, release_cpu=c3 - c2)
    return steps, len(rel.records) - 1


def release_time(events: int, keys: int, users: int, repeats: int) -> dict[str, Any]:
    """Time the release of one window holding ``keys`` distinct keys.

    Every key is present (domains are assigned round-robin, users heavy-tailed as elsewhere).
    Two queries over the same events: private keys (partition selection over every key; with
    k = 40 and no L0 bound few keys pass) and the same keys as a public list (every key gets
    noise and a record: the most work). Each is ingested once into its own IngestStage; each
    repeat seals the window anew from that state (sealing does not consume it) and releases
    it from a fresh ReleaseStage (a window is released once per stage). Timed: seal
    (compaction, bounding, exact totals, the partials' encoding), transport (their decoding
    in stage 2), release (merge of partials, selection, noise, records and their encoding).
    """
    spec = StreamSpec(events=events, users=users, keys=keys, windows=1, window_size_s=3600)
    cols = columns(spec)
    shuffled = np.random.default_rng(1).permutation(np.arange(events) % keys)
    cols = type(cols)(user=cols.user, domain=shuffled, time_ms=cols.time_ms)
    values, user_keys = encode(spec, cols)
    records = keyed_records(values, user_keys)
    del values, user_keys
    names = [f"site{d:05d}.example" for d in range(keys)]
    out: dict[str, Any] = {"events": events, "users": users, "keys": int(np.unique(shuffled).size)}
    stages = []
    for label, config in (
        ("private", stage_config(spec.window_size_s)),
        ("public", stage_config(spec.window_size_s, public_keys=names)),
    ):
        stage = IngestStage(config, _keyring())
        ingest_all(stage, records)
        stages.append((label, config, stage))
    # As in a worker, the input records are gone when a window is released: a million of
    # them kept alive here would make every garbage collection during the release scan them.
    del records, stage
    gc.collect()
    for label, config, stage in stages:
        (ws,) = stage.open_windows()
        runs: list[dict[str, float]] = []
        released = 0
        for _ in range(repeats):
            steps, released = _release_once(stage, config, ws)
            runs.append(steps)
        gc.collect()
        out[label] = {
            "seconds": statistics.median(r["total"] for r in runs),
            "seal_seconds": statistics.median(r["seal"] for r in runs),
            "transport_seconds": statistics.median(r["transport"] for r in runs),
            "release_seconds": statistics.median(r["release"] for r in runs),
            "seal_cpu_seconds": statistics.median(r["seal_cpu"] for r in runs),
            "transport_cpu_seconds": statistics.median(r["transport_cpu"] for r in runs),
            "release_cpu_seconds": statistics.median(r["release_cpu"] for r in runs),
            "runs": [r["total"] for r in runs],
            "steps": runs,
            "released_keys": released,
        }
    out["seconds"] = max(out["private"]["seconds"], out["public"]["seconds"])
    return out


def _rss_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def state_per_event(
    users: int, events_per_user: int, k: int = K, *, traced: bool = False
) -> dict[str, Any]:
    """Memory of one window's samples (:class:`UserSamples`, stage 1's state) when ``users``
    users each offer ``events_per_user`` events (≥ k: every user keeps k): RSS growth, or
    with ``traced`` the bytes tracemalloc counts. Run it in a fresh process
    (:func:`state_per_event_in_subprocess`) so that freed memory of earlier work does not
    hide growth. Events arrive as the worker hands them over, in batches of 100,000 rows
    (pseudonyms as 16 random bytes, items interned signature ids); what is measured includes
    the rows not compacted yet.
    """
    rng = np.random.default_rng(2)
    chunk = 100_000
    gc.collect()
    if traced:
        tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0] if traced else _rss_bytes()
    words = np.frombuffer(rng.bytes(16 * users), dtype=np.uint64).reshape(users, 2)
    samples = UserSamples(k)
    for _ in range(events_per_user):
        for start in range(0, users, chunk):
            part = words[start : start + chunk]
            items = (np.arange(start, start + len(part)) % 1000).astype(np.int32)
            samples.add_columns(part, items)
    del words
    gc.collect()
    after = tracemalloc.get_traced_memory()[0] if traced else _rss_bytes()
    if traced:
        tracemalloc.stop()
    retained = samples.events_retained  # compacts: the figure above is before that
    out = {
        "users": users,
        "events_per_user": events_per_user,
        "k": k,
        "retained_events": retained,
        "method": "tracemalloc" if traced else "rss",
        "delta_bytes": after - before,
        "bytes_per_retained_event": (after - before) / retained,
    }
    del samples
    gc.collect()
    return out


def state_per_event_in_subprocess(
    users: int, events_per_user: int, *, traced: bool = False
) -> dict[str, Any]:
    args = [str(users), str(events_per_user), "traced" if traced else "rss"]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.scaling", *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=1800,
    )
    result: dict[str, Any] = orjson.loads(proc.stdout.strip().splitlines()[-1])
    return result


def ingest_state_per_event(spec: StreamSpec) -> dict[str, Any]:
    """Bytes allocated (tracemalloc) by stage 1's open-window state for a heavy-tailed
    stream (the throughput data's shape): per-user overhead weighs more for light users."""
    values, keys = encode(spec)
    records = keyed_records(values, keys)
    del values, keys
    stage = IngestStage(stage_config(spec.window_size_s), _keyring())
    stage.assign([0], 0.0, routed=False)
    now = time.time()
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.take_snapshot()
    for i in range(0, len(records), BATCH):
        stage.ingest(0, records[i : i + BATCH], now_s=now, now_mono_s=0.0)
    gc.collect()
    snap = tracemalloc.take_snapshot()
    tracemalloc.stop()
    allocated = sum(s.size_diff for s in snap.compare_to(base, "filename"))
    parts = [p for s in stage.store.parts.values() for p in s.values()]
    retained = sum(p.samples.events_retained for p in parts)
    users = sum(p.samples.users for p in parts)
    return {
        "events": spec.events,
        "users": spec.users,
        "user_windows": users,
        "retained_events": retained,
        "allocated_bytes": allocated,
        "bytes_per_retained_event": allocated / retained,
    }


def measure(size: dict[str, Any], log: Callable[[str], None] = print) -> dict[str, Any]:
    events = int(size["scaling_events"])
    users_sweep: list[dict[str, Any]] = []
    for users in size["users_sweep"]:
        point = throughput_point(StreamSpec(events=events, users=users, keys=1000, windows=4))
        users_sweep.append(point)
        log(f"  users {users:>9,}: {point['events_per_s']:,.0f} events/s")
    keys_sweep: list[dict[str, Any]] = []
    for keys in size["keys_sweep"]:
        point = throughput_point(
            StreamSpec(events=events, users=int(size["keys_sweep_users"]), keys=keys, windows=4)
        )
        keys_sweep.append(point)
        log(f"  keys  {keys:>9,}: {point['events_per_s']:,.0f} events/s")
    release = release_time(
        int(size["release_events"]), int(size["release_keys"]), int(size["release_users"]), 3
    )
    log(f"  release of {release['keys']:,} keys: {release['seconds']:.3f} s")
    large = release_time(  # median of 3: one release's time varies with what ran before it
        int(size["large_release_events"]),
        int(size["large_release_keys"]),
        int(size["large_release_users"]),
        int(size.get("large_release_repeats", 3)),
    )
    log(f"  release of {large['keys']:,} keys: {large['seconds']:.3f} s")
    repartition = repartition_point(
        StreamSpec(events=events, users=int(size["keys_sweep_users"]), keys=1000, windows=4)
    )
    log(
        f"  repartition path: route {repartition['route_events_per_s']:,.0f}/s, "
        f"routed ingest {repartition['routed_ingest_events_per_s']:,.0f}/s"
    )
    memory = state_per_event_in_subprocess(
        int(size["memory_users"]), int(size["memory_events_per_user"])
    )
    log(f"  state: {memory['bytes_per_retained_event']:.1f} bytes per retained event (RSS)")
    memory_traced = state_per_event_in_subprocess(
        max(1000, int(size["memory_users"]) // 10),
        int(size["memory_events_per_user"]),
        traced=True,
    )
    heavy = ingest_state_per_event(
        StreamSpec(events=int(size["heavy_events"]), users=int(size["heavy_users"]), keys=1000)
    )
    return {
        "events_per_point": events,
        "users_sweep": users_sweep,
        "keys_sweep": keys_sweep,
        "keys_sweep_users": int(size["keys_sweep_users"]),
        "release": release,
        "release_large": large,
        "repartition": repartition,
        "memory": memory,
        "memory_traced": memory_traced,
        "memory_target_users": 1_000_000,
        "memory_heavy_tailed": heavy,
    }


if __name__ == "__main__":
    users_arg, per_user_arg, method = sys.argv[1:4]
    result = state_per_event(int(users_arg), int(per_user_arg), traced=method == "traced")
    sys.stdout.write(orjson.dumps(result).decode() + "\n")
