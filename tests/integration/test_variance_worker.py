"""``statistic: variance`` released by the worker on both brokers (issue 40): noise-free (test
mode), the release is the population variance of the users' clamped values, valid under
the release schema, and a public key without data has the whole range as its interval."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from statistics import pvariance
from typing import Any

import pytest

from tests.apache_kafka.tier import ON_BOTH_BROKERS
from tests.integration.support import NOISE_FREE, ONE_QUERY_T0_S, release_one_public_query

pytestmark = [pytest.mark.kafka, pytest.mark.slow, ON_BOTH_BROKERS]

MakeConfig = Callable[[dict[str, Any] | None], Path]


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
    t0 = ONE_QUERY_T0_S
    # 12 users with one value each on a.example; 250 is clamped to 100
    latencies = [3, 10, 17, 25, 40, 41, 55, 60, 72, 80, 99, 250]
    events = [
        {"user_id": f"u{i}", "timestamp": t0 + i / 2, "domain": "a.example", "latency_ms": v}
        for i, v in enumerate(latencies)
    ]
    released = await release_one_public_query(
        kafka_bootstrap, cfg, tmp_path / "worker.log", "spread", events
    )
    assert set(released) == {"a.example", "b.example"}
    clamped = [min(v, 100) for v in latencies]
    assert released["a.example"]["statistic"] == "variance"
    assert released["a.example"]["value"] == pytest.approx(pvariance(clamped), abs=1e-9)
    assert released["b.example"]["ci95"] == 50.0**2
