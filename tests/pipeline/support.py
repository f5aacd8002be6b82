"""Builders shared by the pipeline tests: a small test-mode config, input records, releases."""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterable, Sequence
from typing import Any

import orjson
import pytest

from stream_dp.config import parse_config
from stream_dp.config.model import UNSAFE_TEST_MODE_ENV, Config
from stream_dp.pipeline.formats.ledger import LedgerRelease
from stream_dp.pipeline.stages.ingest import IngestStage, InputRecord
from stream_dp.privacy.pseudonymize import KeyRing, Pseudonymizer

#: A window start for size_s = 10 (2020-08-01T00:00:00Z).
T0 = 1_596_240_000
#: Wall clock for decoding: after every event time used here, within max_future_s.
NOW = T0 + 100
#: A fixed test key made by ``stream-dp keygen`` (a real deployment's comes from a secret).
TEST_KEY = b"46ff7a6a76f3f1bb5f61b59a35707d642e1743dc6ce5b5f4a64d992cbb5899bc"
KEYRING = KeyRing(Pseudonymizer(TEST_KEY, "k1"))

#: Two queries on public keys: with ε = 1e6 in unsafe test mode their releases are exact
#: (discrete Laplace of scale ≤ 3e-6 draws 0 except with probability < e^-300000).
QUERIES: list[dict[str, Any]] = [
    {"name": "visits", "group_by": ["domain"], "epsilon": 1e6, "keys": {"domain": ["a", "b"]}},
    {"name": "all", "epsilon": 1e6, "keys": {}},
]

#: A count per domain on private keys chosen by weighted DP set union (exact in test mode).
WEIGHTED_VISITS: dict[str, Any] = {
    "name": "visits",
    "group_by": ["domain"],
    "epsilon": 1e6,
    "delta": 1e-6,
    "selection": "weighted_gaussian",
}


def config(
    *,
    k: int = 3,
    keyed_by_user: bool = False,
    queries: list[dict[str, Any]] | None = None,
    output: dict[str, Any] | None = None,
    bounds: dict[str, Any] | None = None,
    user_id_normalization: str | None = None,
    **privacy: Any,
) -> Config:
    """Windows of 10 s, grace 1 s, idle after 5 s; k events per user and window."""
    normalization = (
        {} if user_id_normalization is None else {"user_id_normalization": user_id_normalization}
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(UNSAFE_TEST_MODE_ENV, "1")
        return parse_config(
            {
                "input": {"keyed_by_user": keyed_by_user, **normalization},
                "output": output or {},
                "window": {
                    "size_s": 10,
                    "grace_s": 1,
                    "idle_close_s": 5,
                    "start_at": "2020-08-01T00:00:00Z",  # T0
                },
                "privacy": {
                    "unsafe_test_mode": True,
                    "epsilon_per_window": 2e6,
                    "max_epsilon_per_horizon": 1e12,
                    **privacy,
                },
                "bounds": {"max_contributions_per_window": k, **(bounds or {})},
                "queries": QUERIES if queries is None else queries,
            }
        )


def event(user: str | int, t: float, domain: str = "a", **extra: Any) -> bytes:
    """An input event ``t`` seconds after T0."""
    return orjson.dumps({"user_id": user, "timestamp": T0 + t, "domain": domain, **extra})


def rec(
    offset: int,
    user: str | int,
    t: float,
    domain: str = "a",
    *,
    key: bytes | None = None,
    **extra: Any,
) -> InputRecord:
    """An (offset, Kafka key, value) input record of one event."""
    return offset, key, event(user, t, domain, **extra)


def numbered(records: Iterable[tuple[str | int, float, str]], first: int = 0) -> list[InputRecord]:
    """(user, t, domain) events as input records with consecutive offsets from ``first``."""
    return [rec(first + i, u, t, d) for i, (u, t, d) in enumerate(records)]


def values(
    releases: Sequence[LedgerRelease], query: str, window_start_s: int = T0
) -> dict[str, Any]:
    """One release's output as {canonical group JSON or "null" (window record): value/kind}."""
    (rel,) = [r for r in releases if r.query == query and r.window_start_s == window_start_s]
    return {
        orjson.dumps(r.value.get("group")).decode(): r.value.get("value", r.value.get("kind"))
        for r in rel.records
    }


def comparable(releases: Sequence[LedgerRelease]) -> dict[tuple[str, int], list[Any]]:
    """Every release's output records without the (random) release id, by (query, window)."""
    out: dict[tuple[str, int], list[Any]] = {}
    for rel in releases:
        assert (rel.query, rel.window_start_s) not in out, "a window released twice"
        out[(rel.query, rel.window_start_s)] = sorted(
            (r.key, orjson.dumps({k: v for k, v in r.value.items() if k != "release_id"}))
            for r in rel.records
        )
    return out


def packed_as_json(value: bytes, *, key_check: bool = True) -> bytes:
    """A binary packed repartition record as the JSON packed record versions before the
    binary format wrote for the same events (``key_check=False``: as versions before key
    checks wrote it, without ``"c"``). The layout is restated here from the documentation
    (docs/topics.md), not taken from the reader."""
    n, src_partition, meta_bytes, first = struct.unpack_from("<IIIq", value, 4)
    meta = orjson.loads(value[len(value) - meta_bytes :])
    t_at = 24
    u_at = t_at + 8 * n
    o_at = u_at + 16 * n
    s_at = o_at + 4 * n
    columns = {
        "u": value[u_at:o_at],
        "t": value[t_at:u_at],
        "o": value[o_at:s_at],
        "s": value[s_at : s_at + 4 * n],
    }
    body = {"kind": "events", "src": [src_partition, first], "k": meta["k"], "c": meta["c"]}
    if not key_check:
        del body["c"]
    body |= {"n": n, "fields": meta["fields"], "sig": meta["sig"]}
    body |= {name: base64.b64encode(raw).decode() for name, raw in columns.items()}
    return orjson.dumps(body)


def feed_routed(owner: IngestStage, values: Sequence[bytes], first: int = 0) -> list[Any]:
    """Repartition records ``values`` (offsets from ``first``) through stage 1's partition 0."""
    batch = [(first + i, None, v) for i, v in enumerate(values)]
    return owner.ingest(0, batch, now_s=NOW, now_mono_s=0, routed=True, topic="rp")


def sealed_totals(owner: IngestStage) -> dict[tuple[int, str], Any]:
    """Every open window sealed: per (window, query), its totals and events seen."""
    return {
        (ws, partial.query): (dict(partial.totals), partial.events_seen)
        for p, ws in owner.all_open()
        for partial in owner.seal(p, ws)
    }


def partials_as_totals(value: bytes) -> bytes:
    """A partials record in the columns form as versions before it wrote the same part:
    its members, then its ``totals`` last, one entry per key ``[[group values], events,
    users, value sum]``, a fifth item for a selection weight, a fifth (0 without weights)
    and a sixth for a variance's squares, and for a quantile a fifth and sixth (0 when
    unused) and a seventh ``[bins, [bin indices], [counts]]``. Restated here from the
    documentation (docs/topics.md), not taken from the writer."""
    record = orjson.loads(value)
    columns = record.pop("columns")
    n = len(columns["groups"])
    numbers = [columns[name] for name in ("events", "users", "value_sums")]
    weights = columns.get("selection_weights")
    squares = columns.get("value_squares")
    if squares is not None or "bins" in columns:
        numbers += [weights or [0] * n, squares or [0] * n]
    elif weights is not None:
        numbers.append(weights)
    entries = [[group, *rest] for group, *rest in zip(columns["groups"], *numbers, strict=True)]
    if "bins" in columns:
        at = 0
        for entry, size in zip(entries, columns["bin_sizes"], strict=True):
            index = columns["bin_index"][at : at + size]
            entry.append([columns["bins"], index, columns["bin_counts"][at : at + size]])
            at += size
    return orjson.dumps({**record, "totals": entries})
