"""``top_k`` in the streaming worker (a real `stream-dp run`) on the embedded broker and on
Apache Kafka: per window at most N keys, the leaders when their leads are large, each
window charged the query's whole ε."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from tests.apache_kafka.tier import ON_BOTH_BROKERS
from tests.integration.support import (
    decode_values,
    noise_free,
    produce_events,
    read_topic,
    run_worker_until_windows,
    topics_of,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow, ON_BOTH_BROKERS]

MakeConfig = Callable[[dict[str, Any] | None], Path]
T0 = 1_596_240_000
WINDOWS = 2
#: Distinct users per domain in each window: the two leaders are 10 users ahead.
USERS = {"a": 40, "b": 30, "c": 20, "d": 10}


async def test_the_worker_releases_at_most_n_keys_per_window(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    """ε = 1000 (noise-free test mode): partition selection keeps every domain, the choice's
    scale is 2·1/500 users, so the two leaders are chosen (a miss has probability below
    e⁻²⁵⁰⁰), and their values are exact."""
    cfg = config_factory(
        {
            "privacy": noise_free(1000.0),
            "bounds": {"max_contributions_per_window": 5, "max_keys_per_user": 1},
            "queries": [
                {
                    "name": "top_domains",
                    "statistic": "count_distinct_users",
                    "group_by": ["domain"],
                    "epsilon": 1000.0,
                    "delta": 1e-6,
                    "top_k": 2,
                }
            ],
        }
    )
    await apply_topics(load_config(cfg), kafka_bootstrap, include_input=True)
    topics = topics_of(cfg)
    events = [
        {"user_id": f"{d}{u}", "timestamp": T0 + w * 10 + 1 + u % 7 + 0.5, "domain": d}
        for w in range(WINDOWS)
        for d, users in USERS.items()
        for u in range(users)
    ]
    await produce_events(kafka_bootstrap, topics["input"], events)
    out, _ = await run_worker_until_windows(
        kafka_bootstrap,
        cfg,
        tmp_path / "worker.log",
        ["top_domains"],
        WINDOWS,
        env={"STREAM_DP_ALLOW_UNSAFE_TEST_MODE": "1"},
        timeout_s=120,
    )
    records = [value for _, value in decode_values(out)]
    starts = ["2020-08-01T00:00:00Z", "2020-08-01T00:00:10Z"]
    released = sorted(
        (r["window_start"], r["group"]["domain"], r["value"])
        for r in records
        if r["kind"] == "release"
    )
    assert released == [(s, d, USERS[d]) for s in starts for d in ("a", "b")]
    windows = sorted(
        (r["window_start"], r["released_keys"], r["epsilon_spent"])
        for r in records
        if r["kind"] == "window"
    )
    assert windows == [(s, 2, 1000.0) for s in starts]
    assert all(r["kind"] in ("release", "window") for r in records)
    ledger = [orjson.loads(v) for _, v in await read_topic(kafka_bootstrap, topics["ledger"])]
    charged = sorted(
        (r["window_start"], r["epsilon_spent"]) for r in ledger if r.get("kind") == "ledger"
    )
    assert charged == [(s, 1000.0) for s in starts]
