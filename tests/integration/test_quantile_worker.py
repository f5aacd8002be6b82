"""``statistic: quantile`` released by the worker over Kafka on both brokers (issue 40): in
test mode at ε = 1000 the exponential mechanism picks the best edge (any other with
probability below e^-200); each key's record carries the configured quantiles in order with
monotone values, valid under the release schema; a public key without data gets monotone
edges within [lower, upper]."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.apache_kafka.tier import ON_BOTH_BROKERS
from tests.integration.support import NOISE_FREE, ONE_QUERY_T0_S, release_one_public_query

pytestmark = [pytest.mark.kafka, pytest.mark.slow, ON_BOTH_BROKERS]

MakeConfig = Callable[[dict[str, Any] | None], Path]


async def test_the_worker_releases_monotone_quantiles_per_key(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    cfg = config_factory(
        {
            "privacy": NOISE_FREE,
            "bounds": {"max_contributions_per_window": 1},
            "queries": [
                {
                    "name": "latency_q",
                    "statistic": "quantile",
                    "value_field": "latency_ms",
                    "lower": 0,
                    "upper": 100,
                    "granularity": 1,
                    "quantiles": [0.5, 0.9],
                    "bins": 10,
                    "group_by": ["domain"],
                    "epsilon": 1000,
                    "keys": {"domain": ["a.example", "b.example"]},
                }
            ],
        }
    )
    # 10 users, one value in each bin of 10 on a.example (250 is clamped into the last):
    # ranks below edge j are j, so the median's only best edge is 50 and the 0.9's is 90
    latencies = [5, 15, 25, 35, 45, 55, 65, 75, 85, 250]
    events = [
        {
            "user_id": f"u{i}",
            "timestamp": ONE_QUERY_T0_S + i / 2,
            "domain": "a.example",
            "latency_ms": v,
        }
        for i, v in enumerate(latencies)
    ]
    released = await release_one_public_query(
        kafka_bootstrap, cfg, tmp_path / "worker.log", "latency_q", events
    )
    assert set(released) == {"a.example", "b.example"}
    assert released["a.example"]["statistic"] == "quantile"
    assert released["a.example"]["value"] == [
        {"quantile": 0.5, "value": 50.0},
        {"quantile": 0.9, "value": 90.0},
    ]
    empty = released["b.example"]["value"]
    assert [q["quantile"] for q in empty] == [0.5, 0.9]
    assert 0.0 <= empty[0]["value"] <= empty[1]["value"] <= 100.0
