"""A compiled query projects new signatures a column at a time (``CompiledQuery``'s
``_project_new``): every signature must get the key and value the per-signature rule gives —
the ``where`` filter, the public list (an unlisted key is not taken), a missing value (not
taken by a sum), clamping to [lower, upper] and rounding to the granularity."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from stream_dp.pipeline.stages.queries import CompiledQuery, needed_fields
from stream_dp.privacy.group_values import JSON_FALSE, JSON_TRUE, canonical_value
from tests.pipeline.support import config

QUERIES: list[dict[str, Any]] = [
    {"name": "all", "group_by": ["domain"], "epsilon": 1e6, "delta": 1e-6},
    {"name": "listed", "group_by": ["domain"], "epsilon": 1e6, "keys": {"domain": ["b", "c"]}},
    {
        "name": "pairs",
        "group_by": ["country", "domain"],
        "where": {"premium": True},
        "epsilon": 1e6,
        "keys": {"country": ["DE", "FR"], "domain": ["a", "c"]},
    },
    {
        "name": "bytes",
        "statistic": "sum",
        "value_field": "size",
        "lower": -2,
        "upper": 7,
        "granularity": 0.5,
        "group_by": ["domain"],
        "where": {"country": ["DE", "NL"]},
        "epsilon": 1e6,
        "keys": {"domain": ["a", "b", "c"]},
    },
    {"name": "total", "epsilon": 1e6, "keys": {}},
]


def expected(query: dict[str, Any], fields: list[str], sig: tuple[Any, ...]) -> Any:
    """The per-signature rule, written out: (key, units) or None. Signatures hold canonical
    values (a JSON true is not 1), and so do the ``where`` values."""
    value = dict(zip(fields, sig, strict=True))
    for f, allowed in query.get("where", {}).items():
        if value[f] not in map(
            canonical_value, allowed if isinstance(allowed, list) else [allowed]
        ):
            return None
    key = tuple(value[f] for f in query.get("group_by", []))
    listed = query.get("keys")
    if listed:
        names = query["group_by"]
        if any(value[f] not in listed[f] for f in names):
            return None
    if query.get("statistic") != "sum":
        return key, 0
    if value["size"] is None:
        return None
    return key, round(min(max(float(value["size"]), query["lower"]), query["upper"]) / 0.5)


@pytest.mark.parametrize("query", QUERIES, ids=[q["name"] for q in QUERIES])
def test_column_projection_equals_the_per_signature_rule(query: dict[str, Any]) -> None:
    cfg = config(queries=[query])
    fields, _, _ = needed_fields(cfg.queries)
    compiled = CompiledQuery(cfg.queries[0], cfg.bounds, fields)
    rng = random.Random(7)  # test data only
    choices = {
        "domain": ["a", "b", "c", "d"],
        "country": ["DE", "FR", "NL"],
        "premium": [JSON_TRUE, JSON_FALSE],  # canonical, as the decoder makes them
        "size": [None, -5, -2, 0, 1.25, 3, 6.74, 7, 40],
    }
    signatures: list[tuple[Any, ...]] = []
    compiled.bind(signatures)
    for batch in range(3):  # signatures arrive in batches: each projected once, when new
        for _ in range(60):
            sig = tuple(rng.choice(choices[f]) for f in fields)
            if sig not in signatures:
                signatures.append(sig)
        items = np.array([rng.randrange(len(signatures)) for _ in range(200)], dtype=np.int64)
        keys, values, groups = compiled.project_columns(items)
        got = [
            None if k < 0 else (groups[k], v)
            for k, v in zip(keys.tolist(), values.tolist(), strict=True)
        ]
        want = [expected(query, fields, signatures[i]) for i in items.tolist()]
        assert got == want, batch
        assert [compiled.project(i) for i in items.tolist()] == want
