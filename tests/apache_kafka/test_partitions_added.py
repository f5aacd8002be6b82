"""Partitions added to keyed input under a running worker (issue 39, item 4).

On Apache Kafka 4.1.1 a 4 → 6 partition change of a keyed input topic was seen only at the
next rebalance, and then through the producer's metadata cache (refreshed every five
minutes): the worker kept checking placement against 4 partitions while producers placed
under 6, and dead-lettered two thirds of the events as ``misplaced_key`` with no log line
or metric. Here a librdkafka producer (confluent-kafka, default partitioner: CRC-32, so
``input.partitioner: crc32``) writes while the topic grows; the worker must say so within
seconds (a WARNING naming the topic and both counts, ``stream_dp_topology_changes_total``)
and keep each window under one count: window 0 (begun before the change) under 4, window 1
under 6. Every record placed under its window's count is released — exact counts, noise
off — and the one user whose home moved is bounded once per window: its window-0 records
placed under 6 by a refreshed producer are the only dead letters (accepting them would hold
the user on two partitions of window 0, bounded on each).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from stream_dp.pipeline.stages.placement import crc32_partition
from stream_dp.windows.tumbling import iso_utc
from tests.apache_kafka.tier import ON_APACHE_KAFKA
from tests.integration.support import (
    HANG_GUARD_S,
    NOISE_FREE,
    WorkerProcess,
    decode_values,
    free_port,
    metric_value,
    read_topic,
    start_worker,
    topics_of,
    windows_done,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow, ON_APACHE_KAFKA]
MakeConfig = Callable[[dict[str, Any] | None], Path]

T0 = 1_596_240_000
K = 5
OLD, NEW = 4, 6
USERS = [f"user-{i}" for i in range(40)]
#: "Within seconds": far below the five minutes of a producer's metadata refresh, and the
#: consumer's own (10 s) plus a loaded machine's slack.
SEEN_WITHIN_S = 60.0


def _heavy() -> str:
    """A user whose CRC-32 home moves when the topic grows."""
    return next(
        u
        for u in (f"heavy-{i}" for i in range(100))
        if crc32_partition(u.encode(), OLD) != crc32_partition(u.encode(), NEW)
    )


def _produce(producer: Any, topic: str, events: list[dict[str, Any]]) -> Counter[tuple[str, int]]:
    """Keyed by user id with the producer's own (default) partitioner; how many records of
    each user the broker acknowledged on each partition."""
    placed: Counter[tuple[str, int]] = Counter()

    def delivered(err: Any, msg: Any) -> None:
        assert err is None, err
        placed[msg.key().decode(), msg.partition()] += 1

    for e in events:
        producer.produce(
            topic, orjson.dumps(e), key=str(e["user_id"]).encode(), on_delivery=delivered
        )
        producer.poll(0)
    assert producer.flush(60) == 0
    return placed


def _homes(events: list[dict[str, Any]], partitions: int) -> Counter[tuple[str, int]]:
    """Where CRC-32 over ``partitions`` places each event (as :func:`_produce` counts)."""
    return Counter(
        (str(e["user_id"]), crc32_partition(str(e["user_id"]).encode(), partitions)) for e in events
    )


def _event(user: str, t: float) -> dict[str, Any]:
    return {"user_id": user, "timestamp": T0 + t, "domain": "shared.example"}


def _released(out: list[tuple[str | None, bytes]]) -> dict[tuple[str, str], Any]:
    return {
        (v["query"], v["window_start"]): v["value"]
        for _, v in decode_values(out)
        if v["kind"] == "release"
    }


async def _wait(
    condition: Callable[[], bool], what: str, worker: WorkerProcess, bound_s: float
) -> float:
    """Seconds until ``condition`` held; fails naming ``what`` after ``bound_s``."""
    started = time.monotonic()
    while not await asyncio.to_thread(condition):
        assert worker.proc.poll() is None, f"worker exited:\n{worker.log()[-4000:]}"
        waited = time.monotonic() - started
        assert waited < bound_s, f"{what} not within {bound_s} s:\n{worker.log()[-4000:]}"
        await asyncio.sleep(0.2)
    return time.monotonic() - started


def _said(worker: WorkerProcess, level: str, text: str) -> bool:
    for line in worker.log().splitlines():
        if line.startswith("{"):
            entry = orjson.loads(line)
            if entry.get("level") == level and text in entry.get("msg", ""):
                return True
    return False


def _keyed_deployment(metrics_port: int) -> dict[str, Any]:
    """The deployment both tests run: keyed input placed by crc32, noise-free counts of one
    public domain and of distinct users."""
    return {
        "input": {"keyed_by_user": True, "partitioner": "crc32"},
        "privacy": NOISE_FREE,
        "bounds": {"max_contributions_per_window": K},
        "metrics": {"port": metrics_port},
        "queries": [
            {
                "name": "visits",
                "group_by": ["domain"],
                "epsilon": 1e6,
                "keys": {"domain": ["shared.example"]},
            },
            {"name": "users", "statistic": "count_distinct_users", "epsilon": 1e6, "keys": {}},
        ],
    }


async def test_added_partitions_are_seen_in_seconds_and_nothing_placed_right_is_lost(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    from confluent_kafka import Producer

    port = free_port()
    cfg = config_factory(_keyed_deployment(port))
    config = load_config(cfg)
    await apply_topics(config, kafka_bootstrap, include_input=True)
    topics = topics_of(cfg)
    heavy = _heavy()
    worker = start_worker(cfg, tmp_path / "worker.log")
    try:
        await _wait(
            lambda: _said(worker, "INFO", "partitions taken"),
            "partitions taken",
            worker,
            HANG_GUARD_S,
        )
        # A producer that read the topic's metadata before the change (and refreshes it only
        # every five minutes, librdkafka's default).
        stale = Producer({"bootstrap.servers": kafka_bootstrap, "acks": "all"})
        first = [_event(u, 1) for u in USERS] + [_event(heavy, 2 + i / 10) for i in range(K)]
        assert _produce(stale, topics["input"], first) == _homes(first, OLD)
        consumed = len(first)
        await _wait(
            lambda: (metric_value(port, "stream_dp_events_consumed_total") or 0) >= consumed,
            "window 0 begun",
            worker,
            HANG_GUARD_S,
        )

        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            await admin.create_partitions({topics["input"]: NewPartitions(total_count=NEW)})
        finally:
            await admin.close()
        said = f"topic {topics['input']} changed from {OLD} to {NEW} partitions"
        seen_after_s = await _wait(
            lambda: (
                _said(worker, "WARNING", said)
                and metric_value(port, "stream_dp_topology_changes_total") == 1.0
            ),
            "the change's WARNING and counter",
            worker,
            SEEN_WITHIN_S,
        )
        assert seen_after_s < SEEN_WITHIN_S

        # Window 0 goes on: the stale producer places under 4 (accepted: window 0's count),
        # a refreshed one under 6 (the heavy user's new home: not window 0's count).
        late_w0 = [_event(u, 5) for u in USERS] + [_event(heavy, 6 + i / 10) for i in range(K)]
        assert _produce(stale, topics["input"], late_w0) == _homes(late_w0, OLD)
        fresh = Producer({"bootstrap.servers": kafka_bootstrap, "acks": "all"})
        moved = [_event(heavy, 7 + i / 10) for i in range(K)]
        new_home = crc32_partition(heavy.encode(), NEW)
        assert _produce(fresh, topics["input"], moved) == Counter({(heavy, new_home): K})
        # Window 1 under 6; window 2's events close it.
        w1 = [_event(u, 12) for u in USERS] + [_event(heavy, 13 + i / 10) for i in range(2 * K)]
        w2 = [_event(u, 25) for u in [*USERS, heavy]]
        placed = _produce(fresh, topics["input"], w1 + w2)
        assert placed == _homes(w1 + w2, NEW)
        assert {p for _, p in placed} >= {OLD, NEW - 1}  # the added partitions are written to

        out = await read_topic(
            kafka_bootstrap, topics["output"], until=windows_done(["visits", "users"], 2)
        )
        dead = decode_values(
            await read_topic(kafka_bootstrap, topics["dead_letter"], until=lambda r: len(r) >= K)
        )
    finally:
        code = worker.terminate()
    assert code == 0, worker.log()[-4000:]
    released = _released(out)
    w0, w1_start = iso_utc(T0), iso_utc(T0 + 10)
    assert released[("visits", w0)] == 2 * len(USERS) + K  # the heavy user: K, never 2K
    assert released[("users", w0)] == len(USERS) + 1
    assert released[("visits", w1_start)] == len(USERS) + K
    assert released[("users", w1_start)] == len(USERS) + 1
    assert Counter((v["reason"], v["source_partition"]) for _, v in dead) == {
        ("misplaced_key", new_home): K
    }


async def test_a_worker_restarted_after_the_change_replays_older_windows_under_their_count(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    """Issue 39 item 4, after a restart: window 0 begun under 4 partitions, the topic grown to
    6, more window-0 records placed under 4, the worker stopped with window 0 still open.
    The restarted worker replays window 0's records from the committed offsets: every one
    was placed under the count in force for window 0 and must be released, none
    dead-lettered as ``misplaced_key`` (checked against 6, most of them would be)."""
    from confluent_kafka import Producer

    port = free_port()
    cfg = config_factory(_keyed_deployment(port))
    config = load_config(cfg)
    await apply_topics(config, kafka_bootstrap, include_input=True)
    topics = topics_of(cfg)
    moving = [
        u for u in USERS if crc32_partition(u.encode(), OLD) != crc32_partition(u.encode(), NEW)
    ]
    assert len(moving) >= len(USERS) // 2  # most homes move: the bug cannot hide
    first_worker = start_worker(cfg, tmp_path / "worker-1.log")
    stale = Producer({"bootstrap.servers": kafka_bootstrap, "acks": "all"})
    try:
        await _wait(
            lambda: _said(first_worker, "INFO", "partitions taken"),
            "partitions taken",
            first_worker,
            HANG_GUARD_S,
        )
        before = [_event(u, 1) for u in USERS]
        assert _produce(stale, topics["input"], before) == _homes(before, OLD)
        await _wait(
            lambda: (metric_value(port, "stream_dp_events_consumed_total") or 0) >= len(before),
            "window 0 begun",
            first_worker,
            HANG_GUARD_S,
        )
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            await admin.create_partitions({topics["input"]: NewPartitions(total_count=NEW)})
        finally:
            await admin.close()
        await _wait(
            lambda: _said(first_worker, "WARNING", f"changed from {OLD} to {NEW} partitions"),
            "the change seen",
            first_worker,
            SEEN_WITHIN_S,
        )
        # More of window 0 from the producer that still places under 4: window 0's count.
        after = [_event(u, 5) for u in USERS]
        assert _produce(stale, topics["input"], after) == _homes(after, OLD)
        consumed = len(before) + len(after)
        await _wait(
            lambda: (metric_value(port, "stream_dp_events_consumed_total") or 0) >= consumed,
            "window 0's later records consumed",
            first_worker,
            HANG_GUARD_S,
        )
    finally:
        code = first_worker.terminate()  # window 0 still open: nothing of it released
    assert code == 0, first_worker.log()[-4000:]
    assert _released(await read_topic(kafka_bootstrap, topics["output"])) == {}

    second_worker = start_worker(cfg, tmp_path / "worker-2.log")
    try:
        await _wait(
            lambda: _said(second_worker, "INFO", "partitions taken"),
            "partitions taken again",
            second_worker,
            HANG_GUARD_S,
        )
        # Windows 1 and 2 from a producer that knows the 6 partitions.
        fresh = Producer({"bootstrap.servers": kafka_bootstrap, "acks": "all"})
        w1 = [_event(u, 12) for u in USERS]
        w2 = [_event(u, 25) for u in USERS]
        assert _produce(fresh, topics["input"], w1 + w2) == _homes(w1 + w2, NEW)
        out = await read_topic(
            kafka_bootstrap, topics["output"], until=windows_done(["visits", "users"], 2)
        )
        dead = decode_values(await read_topic(kafka_bootstrap, topics["dead_letter"]))
    finally:
        code = second_worker.terminate()
    assert code == 0, second_worker.log()[-4000:]
    released = _released(out)
    w0, w1_start = iso_utc(T0), iso_utc(T0 + 10)
    assert Counter(v["reason"] for _, v in dead) == Counter()
    assert released[("visits", w0)] == len(before) + len(after)
    assert released[("users", w0)] == len(USERS)
    assert released[("visits", w1_start)] == len(w1)
    assert released[("users", w1_start)] == len(USERS)
