"""Crash safety and graceful shutdown: every window released exactly once, nothing lost."""

from __future__ import annotations

import random
import signal
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from stream_dp.synthetic.browser_logs import BrowserLogSpec, browser_log_events
from tests.apache_kafka.tier import ON_BOTH_BROKERS
from tests.integration.support import (
    NOISE_FREE,
    ONE_PUBLIC_KEY_QUERY,
    decode_values,
    noise_free,
    produce_events,
    read_topic,
    run_worker_until_windows,
    start_worker,
    topics_of,
    windows_done,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow, ON_BOTH_BROKERS]
MakeConfig = Callable[[dict[str, Any] | None], Path]
TEST_MODE = {"STREAM_DP_ALLOW_UNSAFE_TEST_MODE": "1"}
QUERIES = ["visits_by_domain", "visits_by_country"]


def _ledger_release_ids(records: list[tuple[str | None, bytes]]) -> dict[tuple[str, str], set[str]]:
    """(query, window) → release ids of *complete* ledger entries (all parts present)."""
    parts: dict[tuple[str, str, str], set[int]] = defaultdict(set)
    n_parts: dict[tuple[str, str, str], int] = {}
    for _, raw in records:
        v = orjson.loads(raw)
        if v["kind"] == "ledger":
            ident = (v["query"], v["window_start"], v["release_id"])
            parts[ident].add(v["part"])
            n_parts[ident] = v["parts"]
    out: dict[tuple[str, str], set[str]] = defaultdict(set)
    for ident, got in parts.items():
        if len(got) == n_parts[ident]:
            out[(ident[0], ident[1])].add(ident[2])
    return out


async def test_kill_minus_nine_repeatedly_releases_each_window_once(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    spec = BrowserLogSpec(users=120, windows=6, window_size_s=10, seed=3)
    cfg = config_factory(
        {
            "bounds": {"max_contributions_per_window": 10},
            "queries": [
                {"name": "visits_by_domain", "group_by": ["domain"], "epsilon": 0.5, "delta": 1e-6},
                {
                    "name": "visits_by_country",
                    "group_by": ["country"],
                    "epsilon": 0.5,
                    "keys": {"country": ["DE", "FR", "NL", "US"]},
                },
            ],
        }
    )
    await apply_topics(load_config(cfg), kafka_bootstrap, include_input=True)
    topics = topics_of(cfg)
    await produce_events(kafka_bootstrap, topics["input"], browser_log_events(spec))
    rng = random.Random()
    crash_plan = [
        "after_ledger_write:1",  # between ledger write and output write
        "after_output_write:2",  # after output, before the published marker
        "after_ingest:1",  # mid-window, state only in memory
        "after_ledger_write:2",
        None,  # a plain SIGKILL at a random moment
        "after_ledger_write:1",
        "after_progress:1",  # progress durable, the window's tombstones not yet written
    ]
    for i, point in enumerate(crash_plan):
        env = dict(TEST_MODE)
        if point is not None:
            env["STREAM_DP_TEST_CRASH_POINT"] = point
        worker = start_worker(cfg, tmp_path / f"worker{i}.log", env)
        if point is None:
            try:
                worker.proc.wait(timeout=rng.uniform(1.5, 4.0))
            except Exception:  # noqa: BLE001 — still running: kill it where it is
                worker.kill()
        else:
            code = worker.proc.wait(timeout=60)
            done = "window released" in worker.log() and code == 0
            assert code == -signal.SIGKILL or done, worker.log()
    out, _ = await run_worker_until_windows(
        kafka_bootstrap,
        cfg,
        tmp_path / "final.log",
        QUERIES,
        spec.windows,
        timeout_s=90,
        settle_s=1.0,
    )
    ledger = await read_topic(kafka_bootstrap, topics["ledger"])
    ids = _ledger_release_ids(ledger)
    assert len(ids) == len(QUERIES) * spec.windows  # no window missing
    assert all(len(v) == 1 for v in ids.values()), ids  # each drawn exactly once
    by_key: dict[str | None, set[bytes]] = defaultdict(set)
    for key, value in out:
        by_key[key].add(value)
    assert all(len(v) == 1 for v in by_key.values())  # duplicates are byte-identical
    released_ids = {v["release_id"] for _, v in decode_values(out)}
    assert released_ids == {rid for v in ids.values() for rid in v}


async def test_sigterm_mid_window_then_restart_releases_once_with_all_events(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    cfg = config_factory(
        {
            "privacy": NOISE_FREE,
            "window": {"size_s": 10, "grace_s": 1, "idle_close_s": 20},
            "bounds": {"max_contributions_per_window": 100},
            "queries": ONE_PUBLIC_KEY_QUERY,
        }
    )
    await apply_topics(load_config(cfg), kafka_bootstrap, include_input=True)
    topics = topics_of(cfg)
    t0 = 1_596_240_000

    def events(window: int, users: range, at: float) -> list[dict[str, Any]]:
        return [
            {"user_id": f"u{u}", "timestamp": t0 + window * 10 + at, "domain": "a.example"}
            for u in users
        ]

    # Window 0 complete; first half of window 1.
    await produce_events(
        kafka_bootstrap, topics["input"], events(0, range(20), 1) + events(1, range(20), 2)
    )
    worker = start_worker(cfg, tmp_path / "w1.log", TEST_MODE)
    await read_topic(
        kafka_bootstrap, topics["output"], until=windows_done(["visits"], 1), timeout_s=60
    )
    assert worker.terminate() == 0, worker.log()  # graceful: exit 0
    first = decode_values(await read_topic(kafka_bootstrap, topics["output"]))
    assert {v["window_start"] for _, v in first} == {"2020-08-01T00:00:00Z"}  # w1 not early
    # Second half of window 1, and window 2 on every partition so the watermark passes
    # window 1 (a partition with nothing new holds it back until idle_close_s).
    await produce_events(
        kafka_bootstrap, topics["input"], events(1, range(20, 35), 8) + events(2, range(40), 5)
    )
    out, _ = await run_worker_until_windows(
        kafka_bootstrap, cfg, tmp_path / "w2.log", ["visits"], 2, env=TEST_MODE, settle_s=0.5
    )
    w1 = [
        v
        for _, v in decode_values(out)
        if v["kind"] == "release" and v["window_start"] == "2020-08-01T00:00:10Z"
    ]
    assert len(w1) == 1
    assert w1[0]["value"] == 35  # all of window 1's events, across the restart
    ids = _ledger_release_ids(await read_topic(kafka_bootstrap, topics["ledger"]))
    assert all(len(v) == 1 for v in ids.values())


async def test_a_failed_ledger_read_keeps_new_partitions_paused_until_it_succeeds(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    """Issue 13, 3: aiokafka logs and swallows an exception from the assignment callback, so
    a failed ledger read there let the worker take partials with a stale ledger. Now taking
    happens in the loop; a failure keeps the new partitions paused (nothing fetched, nothing
    released) and is retried until the ledger has been read."""
    cfg = config_factory(
        {
            "privacy": noise_free(1e6),
            "queries": [
                {
                    "name": "visits",
                    "group_by": ["domain"],
                    "epsilon": 1e6,
                    "keys": {"domain": ["a", "b"]},
                }
            ],
        }
    )
    config = load_config(cfg)
    await apply_topics(config, kafka_bootstrap, include_input=True)
    t0 = 1_596_240_000
    events = [
        {"user_id": f"u{u}", "timestamp": t0 + w * 10 + 1 + u % 5, "domain": "ab"[u % 2]}
        for w in range(3)
        for u in range(20)
    ] + [{"user_id": "x", "timestamp": t0 + 35, "domain": "a"}]
    await produce_events(kafka_bootstrap, topics_of(cfg)["input"], events)
    out, worker = await run_worker_until_windows(
        kafka_bootstrap,
        cfg,
        tmp_path / "worker.log",
        ["visits"],
        3,
        env={**TEST_MODE, "STREAM_DP_TEST_TAKE_FAILURES": "3"},
        timeout_s=120,
    )
    log = worker.log()
    assert log.count("taking new partitions failed") == 3, log
    taken = log.index("partitions taken")
    assert log.rfind("taking new partitions failed") < taken
    assert "window released" not in log[:taken], "a window was released before the ledger read"
    exact: dict[tuple[int, str], int] = defaultdict(int)
    for e in events[:-1]:
        exact[((e["timestamp"] - t0) // 10, e["domain"])] += 1
    for _, v in decode_values(out):
        if v["kind"] == "release" and v["window_start"] < "2020-08-01T00:00:30Z":
            window = (int(v["window_start"][17:19]) // 10, v["group"]["domain"])
            assert v["value"] == exact[window], (v, exact)
