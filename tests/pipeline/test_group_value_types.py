"""Break 7 of issue 12, end to end through both stages: group values ``true``, ``1`` and
``1.0`` never merge into one key, the released label never depends on which event came first,
and ``where: {premium: true}`` matches booleans only. Noise-free (test mode, ε = 1e6: the
discrete Laplace noise of scale ≤ 3e-6 is 0 except with probability < e^-300000)."""

from __future__ import annotations

import random
from typing import Any

import orjson

from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.formats.partials import Partial
from stream_dp.pipeline.local.local import LocalPipeline
from stream_dp.pipeline.stages.ingest import IngestStage, InputRecord
from stream_dp.privacy.group_values import JSON_TRUE
from stream_dp.privacy.release import KeyAggregate
from tests.pipeline.support import KEYRING, NOW, T0, config

PRIVATE_BY_PREMIUM = {
    "name": "by_premium",
    "group_by": ["premium"],
    "epsilon": 1e6,
    "delta": 1e-6,
}


def _events(rows: list[tuple[str, Any]]) -> list[InputRecord]:
    return [
        (i, None, orjson.dumps({"user_id": u, "timestamp": T0 + 1, "premium": v}))
        for i, (u, v) in enumerate(rows)
    ]


def _release(queries: list[dict[str, Any]], rows: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    """Every release record (not the window record) of the one window, in published order."""
    pipeline = LocalPipeline(
        config(queries=queries), KEYRING, metrics=Metrics(), sampling_rng=random.Random(0)
    )
    pipeline.ingest(0, _events(rows), now_s=NOW, now_mono_s=0)
    releases = pipeline.finish(now_s=NOW)
    return [dict(r.value) for rel in releases for r in rel.records if r.value["kind"] == "release"]


def test_one_user_sending_true_first_does_not_flip_the_released_label() -> None:
    """On main the key merged with 600 users' ``1`` and was released as ``true`` (601)."""
    rows = [("lone-user", True)] + [(f"user-{i}", 1) for i in range(600)]
    records = _release([PRIVATE_BY_PREMIUM], rows)
    by_label = {orjson.dumps(r["group"]): r["value"] for r in records}
    assert by_label[b'{"premium":1}'] == 600
    # The lone user's key is its own: released only if selection keeps a 1-user key
    # (probability ≤ δ'), and then with its own count, never 601.
    assert by_label.get(b'{"premium":true}', 1) == 1


def test_the_label_of_a_private_key_is_its_canonical_value_whatever_arrives_first() -> None:
    """1.0 first, then 1: one key, released as the integer 1 (decision 1)."""
    rows = [("u0", 1.0)] + [(f"u{i}", 1) for i in range(1, 300)] + [("v", -0.0)]
    rows += [(f"w{i}", 0) for i in range(200)]
    records = _release([PRIVATE_BY_PREMIUM], rows)
    raw = {orjson.dumps(r["group"]): r["value"] for r in records}
    assert raw == {b'{"premium":0}': 201, b'{"premium":1}': 300}


def test_where_true_matches_booleans_only() -> None:
    query = {
        "name": "premium_visits",
        "where": {"premium": True},
        "epsilon": 1e6,
        "keys": {},
    }
    rows = [("a", True), ("b", True), ("c", 1), ("d", 1.0), ("e", "true"), ("f", False)]
    (record,) = _release([query], rows)
    assert record["value"] == 2


def test_where_one_does_not_match_true() -> None:
    query = {"name": "ones", "where": {"premium": [1]}, "epsilon": 1e6, "keys": {}}
    rows = [("a", True), ("b", 1), ("c", 1.0), ("d", "1")]
    (record,) = _release([query], rows)
    assert record["value"] == 2


def test_public_keys_release_with_their_configured_type() -> None:
    query = {
        "name": "by_premium_public",
        "group_by": ["premium"],
        "epsilon": 1e6,
        "keys": {"premium": [True, "1", 2.0, 0]},
    }
    rows = [("a", True), ("b", 1), ("c", 1.0), ("d", "1"), ("e", 2), ("f", False), ("g", 0.0)]
    records = _release([query], rows)
    # true counts only true (not 1 or 1.0), "1" only the string; 2.0 is released as 2
    assert [(orjson.dumps(r["group"]), r["value"]) for r in records] == [
        (b'{"premium":true}', 1),
        (b'{"premium":"1"}', 1),
        (b'{"premium":2}', 1),
        (b'{"premium":0}', 1),
    ]


def test_released_private_keys_are_ordered_by_type_and_value_not_arrival() -> None:
    values: list[Any] = ["b", True, 2, "a", 1.5, False]
    outputs = []
    for seed in range(3):
        order = values[:]
        random.Random(seed).shuffle(order)  # test-only shuffling of arrival order
        rows = [(f"{v!r}-{i}", v) for v in order for i in range(200)]
        records = _release([PRIVATE_BY_PREMIUM], rows)
        outputs.append([orjson.dumps(r["group"]) for r in records])
    assert outputs[0] == [
        b'{"premium":false}',
        b'{"premium":true}',
        b'{"premium":1.5}',
        b'{"premium":2}',
        b'{"premium":"a"}',
        b'{"premium":"b"}',
    ]
    assert outputs[1] == outputs[0] and outputs[2] == outputs[0]


def test_repartitioned_events_keep_booleans_apart_from_one() -> None:
    """Stage 0 writes JSON; stage 1 reads ``true`` back as a boolean, never as 1."""
    cfg = config(queries=[PRIVATE_BY_PREMIUM])
    router = IngestStage(cfg, KEYRING, metrics=Metrics())
    router.assign_routed([0], 0.0)
    owner = IngestStage(cfg, KEYRING, metrics=Metrics(), sampling_rng=random.Random(0))
    owner.assign([0], 0.0, routed=True)
    out, dead = router.route(
        0, _events([("t", True), ("o", 1), ("f", 1.0), ("h", 0.5)]), now_s=NOW, now_mono_s=0
    )
    assert dead == []
    batch = [(i, k, v) for i, (k, v, _) in enumerate(out)]
    assert owner.ingest(0, batch, now_s=NOW, now_mono_s=0, routed=True) == []
    (partial,) = owner.seal(0, T0)
    assert isinstance(partial, Partial)
    assert dict(partial.totals) == {
        (JSON_TRUE,): KeyAggregate(1, 1, 0),
        (1,): KeyAggregate(2, 2, 0),
        (0.5,): KeyAggregate(1, 1, 0),
    }
