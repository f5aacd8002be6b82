"""The output topic as a plain consumer reads it (issue 14): every record of one (query,
window) on one partition, in order, its `window` record last — with several workers, so that
releases of one window and of its neighbours come from different processes."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from stream_dp.pipeline.formats.records import output_partition
from stream_dp.windows.tumbling import epoch_of_iso
from tests.integration.support import (
    produce_events,
    read_topic,
    start_worker,
    topic_partitions,
    topics_of,
    windows_done,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
MakeConfig = Callable[[dict[str, Any] | None], Path]
T0 = 1_596_240_000
WINDOWS = 6
QUERIES = ["visits", "people"]


async def _one_partition(bootstrap: str, topic: str, partition: int) -> list[dict[str, Any]]:
    """What a plain consumer assigned one partition reads, from its beginning, in order."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    out: list[dict[str, Any]] = []
    try:
        consumer.assign([TopicPartition(topic, partition)])
        await consumer.seek_to_beginning()
        quiet = 0
        while quiet < 5:
            batch = await consumer.getmany(timeout_ms=200)
            quiet = 0 if batch else quiet + 1
            out += [orjson.loads(m.value) for msgs in batch.values() for m in msgs]
    finally:
        await consumer.stop()
    return out


async def test_a_plain_consumer_of_one_partition_sees_releases_before_their_window_record(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    cfg = config_factory(
        {
            "privacy": {"epsilon_per_window": 2.0, "max_epsilon_per_horizon": 100},
            "queries": [
                {
                    "name": "visits",
                    "group_by": ["domain"],
                    "epsilon": 1.0,
                    "keys": {"domain": [f"d{i}" for i in range(12)]},
                },
                {
                    "name": "people",
                    "statistic": "count_distinct_users",
                    "epsilon": 1.0,
                    "keys": {},
                },
            ],
        }
    )
    config = load_config(cfg)
    await apply_topics(config, kafka_bootstrap, include_input=True)
    topics = topics_of(cfg)
    events = [
        {"user_id": f"u{u}", "timestamp": T0 + w * 10 + 1 + u % 8, "domain": f"d{u % 12}"}
        for w in range(WINDOWS)
        for u in range(60)
    ] + [
        {"user_id": f"e{i}", "timestamp": T0 + WINDOWS * 10 + 5, "domain": "d0"} for i in range(40)
    ]
    await produce_events(kafka_bootstrap, topics["input"], events)
    workers = [start_worker(cfg, tmp_path / f"w{i}.log") for i in range(2)]
    try:
        await read_topic(
            kafka_bootstrap,
            topics["output"],
            until=windows_done(QUERIES, WINDOWS),
            timeout_s=120,
            settle_s=1.0,
        )
    finally:
        codes = [w.terminate() for w in workers]
    assert codes == [0, 0]
    partitions = await topic_partitions(kafka_bootstrap, topics["output"])
    assert len(partitions) > 1
    seen_on: dict[tuple[str, str], set[int]] = defaultdict(set)
    complete = 0
    for p in partitions:
        records = await _one_partition(kafka_bootstrap, topics["output"], p)
        pending: dict[tuple[str, str], set[str]] = defaultdict(set)
        for r in records:
            ident = (r["query"], r["window_start"])
            seen_on[ident].add(p)
            assert (
                output_partition(r["query"], epoch_of_iso(r["window_start"]), len(partitions)) == p
            )
            if r["kind"] == "release":
                pending[ident].add(orjson.dumps(r["group"]).decode())
            else:  # the window record: every release of the window came before it, here
                assert len(pending[ident]) == r["released_keys"], (ident, r)
                complete += 1
    assert complete >= len(QUERIES) * WINDOWS
    assert all(len(on) == 1 for on in seen_on.values())  # one partition per (query, window)
