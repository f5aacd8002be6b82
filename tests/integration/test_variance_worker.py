"""``statistic: variance`` released by the worker on both brokers (issue 40): noise-free (test
mode), the release is the population variance of the users' clamped values, valid under
the release schema, and a public key without data has the whole range as its interval."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from statistics import pvariance
from typing import Any

import jsonschema
import pytest

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from tests.apache_kafka.tier import ON_BOTH_BROKERS
from tests.integration.support import (
    NOISE_FREE,
    decode_values,
    produce_events,
    run_worker_until_windows,
    topics_of,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow, ON_BOTH_BROKERS]

TOPICS = Path(__file__).resolve().parents[2] / "topics"
MakeConfig = Callable[[dict[str, Any] | None], Path]
TEST_MODE = {"STREAM_DP_ALLOW_UNSAFE_TEST_MODE": "1"}


async def test_the_worker_releases_a_variance_of_the_clamped_values(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    cfg = config_factory(
        {
            "privacy": NOISE_FREE,
            "bounds": {"max_contributions_per_window": 2},
            "queries": [
                {
                    "name": "spread",
                    "statistic": "variance",
                    "value_field": "latency_ms",
                    "lower": 0,
                    "upper": 100,
                    "granularity": 1,
                    "group_by": ["domain"],
                    "epsilon": 1e6,
                    "keys": {"domain": ["a.example", "b.example"]},
                }
            ],
        }
    )
    await apply_topics(load_config(cfg), kafka_bootstrap, include_input=True)
    topics = topics_of(cfg)
    t0 = 1_596_240_000
    # 12 users with one value each on a.example; 250 is clamped to 100
    latencies = [3, 10, 17, 25, 40, 41, 55, 60, 72, 80, 99, 250]
    events = [
        {"user_id": f"u{i}", "timestamp": t0 + i / 2, "domain": "a.example", "latency_ms": v}
        for i, v in enumerate(latencies)
    ]
    await produce_events(kafka_bootstrap, topics["input"], events)
    out, _ = await run_worker_until_windows(
        kafka_bootstrap, cfg, tmp_path / "worker.log", ["spread"], 1, env=TEST_MODE
    )
    records = decode_values(out)
    schema = json.loads((TOPICS / "release.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    released = {v["group"]["domain"]: v for _, v in records if v["kind"] == "release"}
    for value in released.values():
        validator.validate(value)
    assert set(released) == {"a.example", "b.example"}
    clamped = [min(v, 100) for v in latencies]
    assert released["a.example"]["statistic"] == "variance"
    assert released["a.example"]["value"] == pytest.approx(pvariance(clamped), abs=1e-9)
    assert released["b.example"]["ci95"] == 50.0**2
