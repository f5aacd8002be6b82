"""``statistic: variance`` through both stages (LocalPipeline, as replay runs it): stage 1
keeps Σ (v − c)² per key beside the sum, the partials carry it from two input partitions,
stage 2 adds them per key and releases the variance of the clamped values.

Noise-free (test mode, ε = 1e6: the largest scale is 3.75e-4 units, and a discrete Laplace
draw of that scale is 0 except with probability < e^-2000), so the released value is the
exact population variance of the bounded values."""

from __future__ import annotations

import json
import random
from pathlib import Path
from statistics import pvariance
from typing import Any

import jsonschema

from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.local.local import LocalPipeline
from stream_dp.pipeline.stages.ingest import InputRecord, user_key
from stream_dp.pipeline.stages.placement import murmur2_partition
from stream_dp.privacy.release import KeyAggregate
from tests.pipeline.support import KEYRING, NOW, T0, config, rec

LOWER, UPPER = 1, 10
PARTITIONS = 2
QUERY: dict[str, Any] = {
    "name": "spread",
    "statistic": "variance",
    "value_field": "size",
    "lower": LOWER,
    "upper": UPPER,
    "granularity": 1,
    "group_by": ["domain"],
    "epsilon": 1e6,
    "keys": {"domain": ["a", "b"]},
}
#: (user, domain, size): a's sizes clamp to 1, 3, 4, 10, 10 (100 counts as upper)
EVENTS = [("u0", "a", 1), ("wide", "a", 3), ("u2", "a", 4), ("u3", "a", 100), ("u4", "a", 10)]
SCHEMA = Path(__file__).parents[2] / "topics" / "release.schema.json"


def test_the_worker_path_releases_the_variance_of_the_clamped_values() -> None:
    exact: dict[str, dict[tuple[Any, ...], KeyAggregate]] = {}
    p = LocalPipeline(
        config(k=3, keyed_by_user=True, queries=[QUERY], epsilon_per_window=1e6),
        KEYRING,
        partitions=PARTITIONS,
        partials_partitions=2,
        metrics=Metrics(),
        sampling_rng=random.Random(0),
        exact_totals_observer=lambda q, ws, agg: exact.update({q: dict(agg)}),
    )
    batches: dict[int, list[InputRecord]] = {}
    for i, (user, domain, size) in enumerate(EVENTS):
        part = murmur2_partition(user_key(user), PARTITIONS)
        batch = batches.setdefault(part, [])
        batch.append(rec(len(batch), user, 1 + i, domain, key=user_key(user), size=size))
    assert sorted(batches) == list(range(PARTITIONS))  # both partitions hold a user
    for part, batch in sorted(batches.items()):
        assert p.ingest(part, batch, now_s=NOW, now_mono_s=0) == []
    releases = p.finish(now_s=NOW)
    (rel,) = [r for r in releases if r.query == "spread" and r.window_start_s == T0]
    records = {
        r.value["group"]["domain"]: r.value for r in rel.records if r.value["kind"] == "release"
    }
    clamped = [min(max(size, LOWER), UPPER) for _, _, size in EVENTS]
    # c = 5 (the centre of [1, 10] in units of 1, floored), so Σ (v − 5)² travels
    assert exact["spread"][("a",)] == KeyAggregate(
        5, 5, sum(clamped), 0, sum((v - 5) ** 2 for v in clamped)
    )
    assert records["a"]["value"] == pvariance(clamped)
    assert records["a"]["statistic"] == "variance"
    assert records["a"]["ci95"] < ((UPPER - LOWER) / 2) ** 2
    # a key without data: a noisy count of 0, so the interval is the whole range
    assert records["b"]["ci95"] == ((UPPER - LOWER) / 2) ** 2
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text()))
    for record in records.values():
        validator.validate(record)
