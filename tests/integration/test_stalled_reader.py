"""A reader that cannot fetch is not an idle partition.

The CI chaos smoke once released a window a third short: events of partitions whose reader
was stalled around a broker pause became late, because silence (nothing delivered for
``idle_close_s``) was taken for an idle partition. Idleness is now proven by fetch answers
that find the reader at the partition's end. Here one input partition fetches nothing for
far longer than ``idle_close_s`` (``STREAM_DP_TEST_STALL_INPUT``) while its events wait and
the other partitions move on: the window waits for it and holds every event — on the default
path (stage 0 reports the partition's progress) and on keyed input (stage 1 reads it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from stream_dp.pipeline.stages.placement import partition_function
from tests.helpers import ConfigFactory
from tests.integration.support import (
    HANG_GUARD_S,
    NOISE_FREE,
    ONE_PUBLIC_KEY_QUERY,
    decode_values,
    run_worker_until_windows,
    topics_of,
)

T0 = 1_596_240_000  # 2020-08-01T00:00:00Z, the factory's start_at
STALLED = 1
PARTITIONS = 4  # the input topic's default (topics/events.yaml)
STALL_S = 25  # ≫ idle_close_s (2 s) + a window (10 s) + grace (1 s): long enough to close it


async def _produce_placed(
    bootstrap: str, topic: str, events: list[tuple[int, dict[str, Any]]]
) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        futures = [
            await producer.send(topic, orjson.dumps(e), key=str(e["user_id"]).encode(), partition=p)
            for p, e in events
        ]
        for f in futures:
            await f
    finally:
        await producer.stop()


@pytest.mark.parametrize("keyed", [False, True], ids=["default-path", "keyed-input"])
async def test_a_window_waits_for_a_partition_whose_reader_cannot_fetch(
    kafka_bootstrap: str, config_factory: ConfigFactory, tmp_path: Path, keyed: bool
) -> None:
    cfg = config_factory(
        {
            "input": {"keyed_by_user": keyed},
            "privacy": NOISE_FREE,
            "bounds": {"max_contributions_per_window": 100},
            "queries": ONE_PUBLIC_KEY_QUERY,
        }
    )
    config = load_config(cfg)
    await apply_topics(config, kafka_bootstrap, include_input=True)
    place = partition_function(config.input.partitioner)
    users = [f"user-{i}" for i in range(80)]
    home = {u: place(u.encode(), PARTITIONS) for u in users}
    assert set(home.values()) == set(range(PARTITIONS))
    # Window 0: every user, every partition. Windows 1 and 2: only users off the stalled
    # partition, so the others' progress passes window 0 while the stalled one waits.
    events = [
        (home[u], {"user_id": u, "timestamp": T0 + 1 + i % 8, "domain": "a.example"})
        for i, u in enumerate(users)
    ]
    events += [
        (home[u], {"user_id": u, "timestamp": T0 + 10 * w + 2, "domain": "a.example"})
        for w in (1, 2)
        for u in users
        if home[u] != STALLED
    ]
    await _produce_placed(kafka_bootstrap, topics_of(cfg)["input"], events)
    out, worker = await run_worker_until_windows(
        kafka_bootstrap,
        cfg,
        tmp_path / "worker.log",
        ["visits"],
        1,
        env={"STREAM_DP_TEST_STALL_INPUT": f"{STALLED}:{STALL_S}"},
        timeout_s=HANG_GUARD_S,
    )
    log = worker.log()
    assert f"input partition {STALLED} fetches nothing" in log, log
    first = [
        v
        for _, v in decode_values(out)
        if v["kind"] == "release" and v["window_start"] == "2020-08-01T00:00:00Z"
    ]
    assert [v["value"] for v in first] == [len(users)], log
    assert log.index(f"input partition {STALLED} fetches again") < log.index("window released"), log
