"""Scaling of the engine in-process (no Kafka): events/s against users and keys, the release
time of a window with 100k keys, and the state kept per retained event.

The Engine is what the worker runs for every fetched batch; here it is fed the same JSON
records in batches of 10,000 (the worker's ``MAX_RECORDS_PER_FETCH``) from one partition, so
the figures leave out the Kafka client (the throughput section measures that).
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

from bench.data import StreamSpec, columns, encode
from stream_dp.config import parse_config
from stream_dp.config.model import Config
from stream_dp.pipeline.engine import Engine
from stream_dp.privacy.bounding import Reservoirs
from stream_dp.privacy.pseudonymize import KeyRing, Pseudonymizer

BATCH = 10_000
K = 40


def engine_config(window_size_s: int, public_keys: list[str] | None = None) -> Config:
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
            "window": {"size_s": window_size_s, "grace_s": 0, "idle_close_s": 0.5},
            "privacy": {"epsilon_per_window": 1.0, "delta_per_window": 1e-6},
            "bounds": {"max_contributions_per_window": K},
            "queries": [query],
            "metrics": {"enabled": False},
        }
    )


def _keyring() -> KeyRing:
    return KeyRing(Pseudonymizer(os.urandom(32), "bench"))


def ingest_all(engine: Engine, values: list[bytes]) -> float:
    """Feed every value through ``engine.ingest`` in worker-sized batches; seconds."""
    engine.assign([0], 0.0)
    now = time.time()
    records = list(enumerate(values))
    started = time.perf_counter()
    for i in range(0, len(records), BATCH):
        engine.ingest(0, records[i : i + BATCH], now_s=now, now_mono_s=0.0)
    return time.perf_counter() - started


def throughput_point(spec: StreamSpec) -> dict[str, Any]:
    """Events/s of ingest for one (users, keys) point, and the time to release every window."""
    cols = columns(spec)
    values, _ = encode(spec, cols)
    engine = Engine(engine_config(spec.window_size_s), _keyring())
    seconds = ingest_all(engine, values)
    started = time.perf_counter()
    windows = engine.open_windows()
    for ws in windows:
        releases = engine.compute_release(ws, now_s=time.time())
        engine.finish_window(ws, releases, time.time())
    release_s = time.perf_counter() - started
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


def release_time(events: int, keys: int, users: int, repeats: int) -> dict[str, Any]:
    """Time ``compute_release`` of one window holding ``keys`` distinct keys.

    Every key is present (domains are assigned round-robin, users heavy-tailed as elsewhere).
    Two queries over the same state: private keys (partition selection over every key; with
    k = 40 and no L0 bound few keys pass) and the same keys as a public list (every key gets
    noise and a record: the most work). The state is ingested once; each repeat releases it
    from a fresh Engine sharing that state (a window is released once per engine).
    """
    spec = StreamSpec(events=events, users=users, keys=keys, windows=1, window_size_s=3600)
    cols = columns(spec)
    shuffled = np.random.default_rng(1).permutation(np.arange(events) % keys)
    cols = type(cols)(user=cols.user, domain=shuffled, time_ms=cols.time_ms)
    values, _ = encode(spec, cols)
    source = Engine(engine_config(spec.window_size_s), _keyring())
    ingest_all(source, values)
    (ws,) = source.open_windows()
    names = [f"site{d:05d}.example" for d in range(keys)]
    out: dict[str, Any] = {"events": events, "users": users, "keys": int(np.unique(shuffled).size)}
    for label, config in (
        ("private", engine_config(spec.window_size_s)),
        ("public", engine_config(spec.window_size_s, public_keys=names)),
    ):
        timings: list[float] = []
        released = 0
        for _ in range(repeats):
            engine = Engine(config, source.keyring)
            # Shared with the source engine, read-only for compute_release: the open state
            # and the interned signatures its items refer to.
            engine._state = source._state
            engine._signatures.extend(source._signatures)
            started = time.perf_counter()
            releases = engine.compute_release(ws, now_s=time.time())
            timings.append(time.perf_counter() - started)
            released = len(releases[0].records) - 1
        out[label] = {
            "seconds": statistics.median(timings),
            "runs": timings,
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
    """Memory of one window's reservoirs when ``users`` users each offer ``events_per_user``
    events (≥ k: every reservoir full): RSS growth, or with ``traced`` the bytes tracemalloc
    counts. Run it in a fresh process (:func:`state_per_event_in_subprocess`) so that freed
    memory of earlier work does not hide growth.

    Pseudonyms are 16 random bytes (as HMAC output) created after the first reading: they
    are part of the state (the reservoirs' keys). Items are interned signature ids, shared
    int objects, as in the engine.
    """
    rng = np.random.default_rng(2)
    items = list(range(1000))
    chunk = 100_000
    gc.collect()
    if traced:
        tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0] if traced else _rss_bytes()
    blob = rng.bytes(16 * users)
    pseudonyms = [blob[i * 16 : i * 16 + 16] for i in range(users)]
    del blob
    reservoirs = Reservoirs(k)
    for _ in range(events_per_user):
        for start in range(0, users, chunk):
            part = pseudonyms[start : start + chunk]
            reservoirs.add_many(part, [items[i % 1000] for i in range(start, start + len(part))])
    del pseudonyms
    gc.collect()
    after = tracemalloc.get_traced_memory()[0] if traced else _rss_bytes()
    if traced:
        tracemalloc.stop()
    retained = reservoirs.events_retained
    out = {
        "users": users,
        "events_per_user": events_per_user,
        "k": k,
        "retained_events": retained,
        "method": "tracemalloc" if traced else "rss",
        "delta_bytes": after - before,
        "bytes_per_retained_event": (after - before) / retained,
    }
    del reservoirs
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


def engine_state_per_event(spec: StreamSpec) -> dict[str, Any]:
    """Bytes allocated (tracemalloc) by the engine's open-window state for a heavy-tailed
    stream (the throughput data's shape): per-user overhead weighs more for light users."""
    values, _ = encode(spec)
    engine = Engine(engine_config(spec.window_size_s), _keyring())
    engine.assign([0], 0.0)
    now = time.time()
    records = list(enumerate(values))
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.take_snapshot()
    for i in range(0, len(records), BATCH):
        engine.ingest(0, records[i : i + BATCH], now_s=now, now_mono_s=0.0)
    gc.collect()
    snap = tracemalloc.take_snapshot()
    tracemalloc.stop()
    allocated = sum(s.size_diff for s in snap.compare_to(base, "filename"))
    parts = [p for s in engine._state.values() for p in s.values()]
    retained = sum(p.reservoirs.events_retained for p in parts)
    users = sum(p.reservoirs.users for p in parts)
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
    memory = state_per_event_in_subprocess(
        int(size["memory_users"]), int(size["memory_events_per_user"])
    )
    log(f"  state: {memory['bytes_per_retained_event']:.1f} bytes per retained event (RSS)")
    memory_traced = state_per_event_in_subprocess(
        max(1000, int(size["memory_users"]) // 10),
        int(size["memory_events_per_user"]),
        traced=True,
    )
    heavy = engine_state_per_event(
        StreamSpec(events=int(size["heavy_events"]), users=int(size["heavy_users"]), keys=1000)
    )
    return {
        "events_per_point": events,
        "users_sweep": users_sweep,
        "keys_sweep": keys_sweep,
        "keys_sweep_users": int(size["keys_sweep_users"]),
        "release": release,
        "memory": memory,
        "memory_traced": memory_traced,
        "memory_target_users": 1_000_000,
        "memory_heavy_tailed": heavy,
    }


if __name__ == "__main__":
    users_arg, per_user_arg, method = sys.argv[1:4]
    result = state_per_event(int(users_arg), int(per_user_arg), traced=method == "traced")
    sys.stdout.write(orjson.dumps(result).decode() + "\n")
