"""Issue 12's breaks, end to end on the embedded broker with real `stream-dp run` workers.

- A user's keyed records forced onto several partitions (producers with different
  partitioners, partitions added) are bounded once, not once per partition.
- A producer whose partitioner is not the configured one is caught, not trusted; with the
  matching `input.partitioner` the same producer is safe (confluent-kafka's default is
  CRC-32, the Java client's and aiokafka's murmur2).
- A window nobody was active in is released like any other (its window record, public keys'
  values): the presence of output never tells whether anyone was active.
- A key rotation that would split a window already begun is refused at start.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from stream_dp.pipeline.stages.placement import crc32_partition, murmur2_partition
from stream_dp.windows.tumbling import iso_utc
from tests.apache_kafka.tier import ON_BOTH_BROKERS
from tests.integration.support import (
    NOISE_FREE,
    decode_values,
    produce_events,
    read_topic,
    run_worker_until_windows,
    topics_of,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
MakeConfig = Callable[[dict[str, Any] | None], Path]
T0 = 1_596_240_000
K = 5


def _keyed_config(config_factory: MakeConfig, partitioner: str = "murmur2") -> Path:
    return config_factory(
        {
            "input": {"keyed_by_user": True, "partitioner": partitioner},
            "privacy": NOISE_FREE,
            "bounds": {"max_contributions_per_window": K},
            "queries": [
                {
                    "name": "visits",
                    "group_by": ["domain"],
                    "epsilon": 1e6,
                    "keys": {"domain": ["solo.example", "shared.example"]},
                },
                {"name": "users", "statistic": "count_distinct_users", "epsilon": 1e6, "keys": {}},
            ],
        }
    )


def _released(out: list[tuple[str | None, bytes]]) -> dict[tuple[str, str, str], Any]:
    values = {}
    for _, v in decode_values(out):
        if v["kind"] == "release":
            values[(v["query"], v["window_start"], orjson.dumps(v["group"]).decode())] = v["value"]
    return values


@ON_BOTH_BROKERS
async def test_one_users_keyed_records_on_four_partitions_are_bounded_once(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    """On today's main the worker released 20 for a key only this user visited (k = 5, four
    partitions) and counted the user as four distinct users."""
    cfg = _keyed_config(config_factory)
    config = load_config(cfg)
    await apply_topics(config, kafka_bootstrap, include_input=True)
    topics = topics_of(cfg)
    home = murmur2_partition(b"solo", 4)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        sent = []
        for p in range(4):  # every record keyed "solo", forced onto each partition
            for i in range(4 * K):
                value = {"user_id": "solo", "timestamp": T0 + 1 + i / 10, "domain": "solo.example"}
                sent.append(
                    await producer.send(
                        topics["input"], orjson.dumps(value), key=b"solo", partition=p
                    )
                )
        marker = {"user_id": "m", "timestamp": T0 + 15, "domain": "shared.example"}
        for p in range(4):  # every partition moves past the window
            sent.append(
                await producer.send(topics["input"], orjson.dumps(marker), key=b"m", partition=p)
            )
        await asyncio.gather(*sent)
    finally:
        await producer.stop()
    out, _ = await run_worker_until_windows(
        kafka_bootstrap, cfg, tmp_path / "worker.log", ["visits", "users"], 1
    )
    values = _released(out)
    w0 = iso_utc(T0)
    assert values[("visits", w0, '{"domain":"solo.example"}')] == K  # not 4 × K
    assert values[("users", w0, "{}")] == 1  # "solo", counted once
    # Solo's records on the three other partitions, and the marker's on three: misplaced.
    n_misplaced = 3 * 4 * K + 3
    dead = decode_values(
        await read_topic(
            kafka_bootstrap, topics["dead_letter"], until=lambda r: len(r) >= n_misplaced
        )
    )
    assert Counter(v["reason"] for _, v in dead) == {"misplaced_key": n_misplaced}
    solo_dead = {v["source_partition"] for _, v in dead}
    assert home not in solo_dead or murmur2_partition(b"m", 4) != home


def _confluent_produce(bootstrap: str, topic: str, events: list[dict[str, Any]]) -> None:
    """Keyed by user id with confluent-kafka's default partitioner (consistent_random)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for e in events:
        producer.produce(topic, orjson.dumps(e), key=str(e["user_id"]).encode())
    assert producer.flush(30) == 0


@pytest.mark.parametrize("partitioner", ["crc32", "murmur2"])
@ON_BOTH_BROKERS
async def test_a_librdkafka_producer_is_safe_with_the_crc32_setting_only(
    partitioner: str, kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    cfg = _keyed_config(config_factory, partitioner)
    await apply_topics(load_config(cfg), kafka_bootstrap, include_input=True)
    topics = topics_of(cfg)
    users = [f"user-{i}" for i in range(40)]
    events = [
        {"user_id": u, "timestamp": T0 + 1 + j, "domain": "shared.example"}
        for u in users
        for j in range(2)
    ] + [{"user_id": u, "timestamp": T0 + 15, "domain": "shared.example"} for u in users]
    await asyncio.to_thread(_confluent_produce, kafka_bootstrap, topics["input"], events)
    # crc32 is what librdkafka did; under murmur2 most keys map elsewhere.
    misplaced = sum(
        1 for u in users if crc32_partition(u.encode(), 4) != murmur2_partition(u.encode(), 4)
    )
    assert misplaced > 10
    out, _ = await run_worker_until_windows(
        kafka_bootstrap, cfg, tmp_path / "worker.log", ["visits", "users"], 1
    )
    values = _released(out)
    w0 = iso_utc(T0)
    dead = decode_values(await read_topic(kafka_bootstrap, topics["dead_letter"]))
    if partitioner == "crc32":
        assert dead == []
        assert values[("users", w0, "{}")] == 40
        assert values[("visits", w0, '{"domain":"shared.example"}')] == 80
    else:
        assert Counter(v["reason"] for _, v in dead) == {"misplaced_key": 3 * misplaced}
        assert values[("users", w0, "{}")] == 40 - misplaced


async def test_a_window_nobody_was_active_in_is_released_like_the_others(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    """One user active in windows 0-5 except 3: window 3 was missing from the output, which
    told everyone the user was inactive then (issue 12, break 5)."""
    cfg = config_factory(
        {
            "privacy": NOISE_FREE,
            "queries": [
                {
                    "name": "visits",
                    "group_by": ["domain"],
                    "epsilon": 1e6,
                    "keys": {"domain": ["a"]},
                },
                {"name": "private", "group_by": ["domain"], "epsilon": 1e6, "delta": 1e-6},
            ],
        }
    )
    await apply_topics(load_config(cfg), kafka_bootstrap, include_input=True)
    topics = topics_of(cfg)
    events = [
        {"user_id": "only", "timestamp": T0 + w * 10 + 2, "domain": "a"} for w in (0, 1, 2, 4, 5)
    ] + [{"user_id": "only", "timestamp": T0 + 65, "domain": "a"}]
    await produce_events(kafka_bootstrap, topics["input"], events)
    out, _ = await run_worker_until_windows(
        kafka_bootstrap, cfg, tmp_path / "worker.log", ["visits", "private"], 6
    )
    records = [v for _, v in decode_values(out)]
    for w in range(6):
        start = iso_utc(T0 + w * 10)
        kinds = Counter((v["query"], v["kind"]) for v in records if v["window_start"] == start)
        assert kinds[("visits", "window")] == 1 and kinds[("private", "window")] == 1, start
        assert kinds[("visits", "release")] == 1, start  # the public key, every window
    window3 = [v for v in records if v["window_start"] == iso_utc(T0 + 30)]
    assert {v["value"] for v in window3 if v["kind"] == "release"} == {0}


def _run_cli(config: Path, env: dict[str, str], timeout_s: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "stream_dp.cli.main", "run", "--config", str(config)],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=env,
    )


def _window_size_with_now_in_its_middle(now_s: float) -> int:
    """A window size of about an hour whose window holding ``now_s`` has at least 40% of
    it on either side: the test's worker sees the same window however long (up to ~24
    minutes) the test takes, wherever the wall clock stands (windows are aligned to
    multiples of their size since the epoch)."""
    size = 3600
    while not 0.4 * size <= now_s % size <= 0.6 * size:
        size += 1
    return size


def test_the_window_size_puts_now_in_the_middle_of_its_window() -> None:
    for now in (1_596_240_000, 1_596_243_599.9, 1_800_000_000.5, time.time()):
        size = _window_size_with_now_in_its_middle(now)
        assert 3600 <= size <= 7200
        assert 0.4 * size <= now % size <= 0.6 * size


async def test_a_rotation_that_would_split_a_begun_window_is_refused(
    kafka_bootstrap: str, config_factory: MakeConfig
) -> None:
    """rotate_at before the next window start: a restart would pseudonymize one window's
    users under two keys and bound each twice (issue 12, break 9). The window size is
    chosen so that the wall clock stands in the middle of its window for the whole test
    (no flake near a window boundary); the accepted worker is waited for on the rotation
    record it writes to the ledger, not for a fixed time."""
    size = _window_size_with_now_in_its_middle(time.time())
    now_window = int(time.time()) // size * size
    env = {**os.environ, "STREAM_DP_OLD_KEY": secrets.token_hex(32)}

    def rotating(rotate_at_s: int) -> Path:
        return config_factory(
            {
                "window": {"size_s": size, "start_at": iso_utc(now_window)},
                "pseudonymization": {
                    "previous_key_env": "STREAM_DP_OLD_KEY",
                    "previous_key_id": "k0",
                    "rotate_at": iso_utc(rotate_at_s),
                },
            }
        )

    refused = rotating(now_window)  # the current window began under the old key
    proc = _run_cli(refused, env, 60)
    _, err = await asyncio.to_thread(proc.communicate, timeout=120)
    assert proc.returncode == 2, err
    assert "pseudonymization.rotate_at" in err and iso_utc(now_window + size) in err
    accepted = rotating(now_window + size)  # exactly the next window start: allowed
    await apply_topics(load_config(accepted), kafka_bootstrap)

    def rotation_recorded(records: list[tuple[str | None, bytes]]) -> bool:
        return any(orjson.loads(v).get("kind") == "rotation" for _, v in records)

    proc = _run_cli(accepted, env, 60)
    try:
        ledger = await read_topic(
            kafka_bootstrap,
            topics_of(accepted)["ledger"],
            until=lambda records: rotation_recorded(records) or proc.poll() is not None,
        )
        assert proc.poll() is None  # past the check, and still running (not refused)
    finally:
        proc.terminate()
        _, err = await asyncio.to_thread(proc.communicate, timeout=60)
    assert proc.returncode == 0, err
    # Once applied (recorded in the ledger), a restart after rotate_at is fine.
    assert rotation_recorded(ledger), err
