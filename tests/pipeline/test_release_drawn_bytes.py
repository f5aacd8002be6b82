"""Releases drawn through the privacy core and encoded as the worker writes them are byte for
byte what the code before the noised values were kept as an int64 array wrote (issue 43's
seventh pass): the same draws from the same (scripted) randomness, the same output records,
ledger parts and window record.

Each case releases a window through :func:`release_query` with ``secrets`` replaced by a
seeded generator, builds the release as :func:`draw_release` does (fixed release id) and
hashes every output record and ledger part; :data:`DIGESTS` were made by this test on
``5ff2674`` (values held as Python ints from the draw to the records). The cases cover
public keys (with keys without data), private keys kept by selection, ``clamp_negative``
on and off, every statistic, top-k, counts at the int64 limit (the noise saturates) and
negative noisy values. The encoder is also checked directly on int64 arrays against the
same values as Python ints, at the int64 limits.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import secrets
from typing import Any

import numpy as np
import pytest

from stream_dp.config import BoundsConfig, QueryConfig
from stream_dp.pipeline.formats.ledger import LedgerParts, close_release
from stream_dp.pipeline.formats.records import ReleaseTemplate
from stream_dp.privacy.planner import plan_query
from stream_dp.privacy.release import KeyAggregate, ReleasedValues, release_query
from tests.pipeline.test_release_encoding import (
    NOW_S,
    WINDOW_S,
    _reference,
    _reference_parts,
)

BOUNDS = BoundsConfig(
    max_contributions_per_window=40, max_keys_per_user=3, max_contributions_per_key=10
)
BIG = 2**63 - 1

#: What each statistic's query needs besides its name.
STATISTIC_FIELDS: dict[str, dict[str, Any]] = {
    "count": {},
    "count_distinct_users": {"statistic": "count_distinct_users"},
    "sum": {"statistic": "sum", "value_field": "v", "lower": -5.0, "upper": 10.0},
    "mean": {
        "statistic": "mean",
        "value_field": "v",
        "lower": -5.0,
        "upper": 10.0,
        "granularity": 0.5,
    },
    "variance": {
        "statistic": "variance",
        "value_field": "v",
        "lower": 0.0,
        "upper": 10.0,
        "granularity": 0.01,
    },
    "quantile": {
        "statistic": "quantile",
        "value_field": "v",
        "lower": 0.0,
        "upper": 10.0,
        "quantiles": [0.25, 0.5],
        "bins": 10,
    },
    "top_k": {"top_k": 5},
}

CASES = [
    (statistic, keys, clamp)
    for statistic in STATISTIC_FIELDS
    for keys in ("public", "private")
    for clamp in (False, True)
]


def _scripted_secrets(monkeypatch: pytest.MonkeyPatch, seed: str) -> None:
    """``secrets``' bytes and integers from a seeded generator: the same draws each run."""
    rng = random.Random(seed)
    monkeypatch.setattr(secrets, "token_bytes", lambda n: rng.randbytes(n))
    monkeypatch.setattr(secrets, "randbelow", lambda n: rng.randrange(n))


def _aggregates(statistic: str, n: int) -> dict[tuple[Any, ...], KeyAggregate]:
    """Keys d0 … d(n−1) with data of every size: none to little (negative noisy values),
    heavy enough for selection to keep, and counts at the int64 limit (the noise saturates)."""
    rng = random.Random(f"aggregates|{statistic}")
    out: dict[tuple[Any, ...], KeyAggregate] = {}
    for i in range(n):
        if i % 7 == 3:
            continue  # a listed key without data
        users = rng.choice([1, 2, 300, 5000])
        events = users * rng.randint(1, 3)
        if statistic == "count" and i % 11 == 5:
            events = BIG - rng.randint(0, 3)
        bins: tuple[int, ...] = ()
        if statistic == "quantile":
            bins = tuple(rng.randint(0, 40) for _ in range(10))
        out[(f"d{i}",)] = KeyAggregate(
            events=events,
            users=users,
            value_sum=rng.randint(-3 * users, 10 * users),
            value_squares=rng.randint(0, 10_000 * users),
            value_bins=bins,
        )
    return out


def _drawn_bytes(statistic: str, keys: str, clamp: bool) -> list[tuple[str, bytes]]:
    n = 60
    fields: dict[str, Any] = {
        "name": "q.1",
        "group_by": ["domain"],
        "epsilon": 1.0,
        **STATISTIC_FIELDS[statistic],
    }
    if keys == "public":
        fields["keys"] = {"domain": [f"d{i}" for i in range(n)]}
    else:
        fields["delta"] = 1e-6
    if statistic not in ("variance", "quantile"):
        fields["clamp_negative"] = clamp
    plan = plan_query(QueryConfig(**fields).spec(), BOUNDS.spec())
    result = release_query(_aggregates(statistic, n), plan)
    selection = plan.selection.record_parameters() if plan.selection is not None else None
    window: dict[str, Any] = {
        "release_id": "cd" * 16,
        "query": plan.name,
        "window_start_s": WINDOW_S[0],
        "window_end_s": WINDOW_S[1],
    }
    template = ReleaseTemplate(
        **window,
        group_by=["domain"],
        statistic=plan.statistic,
        epsilon=1.0,
        delta=fields.get("delta", 0.0),
        mechanism="discrete_laplace",
        selection=selection,
    )
    rel = close_release(
        (),
        **window,
        released_keys=len(result.values),
        epsilon_spent=1.0,
        delta_spent=fields.get("delta", 0.0),
        horizon_epsilon_spent=2.0,
        sources={0: "v1"},
        drawn=(template, result.values),
    )
    out = list(itertools.chain(*rel.output_chunks(7)))
    parts = LedgerParts(rel, now_s=NOW_S, max_bytes=3_000, records_per_chunk=7)
    out += parts.encode(0, len(parts))
    return out


def _digest(records: list[tuple[str, bytes]]) -> str:
    h = hashlib.sha256()
    for key, value in records:
        h.update(key.encode() + b"\x00" + value + b"\x00")
    return h.hexdigest()[:16]


#: sha256 (first 16 hex digits) of each case's output records and ledger parts, made on
#: 5ff2674 (the noised values held as Python ints from the draw to the records).
DIGESTS: dict[str, str] = {
    "count|public|False": "fcad975bde97350d",  # 81 records and parts
    "count|public|True": "492c73a749002a17",  # 81 records and parts
    "count|private|False": "b37e9ff35aed6f8b",  # 43 records and parts
    "count|private|True": "23aa04abb4715b5e",  # 43 records and parts
    "count_distinct_users|public|False": "61524d390627b200",  # 81 records and parts
    "count_distinct_users|public|True": "c57f62f644383a21",  # 81 records and parts
    "count_distinct_users|private|False": "12eee65e96dd8c09",  # 31 records and parts
    "count_distinct_users|private|True": "5a89abf193b9bf42",  # 31 records and parts
    "sum|public|False": "da5644a33d83c0b0",  # 81 records and parts
    "sum|public|True": "f474ee9a593dfd9f",  # 81 records and parts
    "sum|private|False": "11f4a827c934198b",  # 46 records and parts
    "sum|private|True": "22dbcfb5ee796b77",  # 46 records and parts
    "mean|public|False": "cfa21d2a47a940c8",  # 81 records and parts
    "mean|public|True": "e451ee5723a85c55",  # 81 records and parts
    "mean|private|False": "99b84d950f28fd8f",  # 48 records and parts
    "mean|private|True": "6b44ab87d58faee9",  # 48 records and parts
    "variance|public|False": "ed271d2e25637c5f",  # 82 records and parts
    "variance|public|True": "3583b1874df528f9",  # 81 records and parts
    "variance|private|False": "cc9a2ba8bcff081a",  # 37 records and parts
    "variance|private|True": "4168898bb58fbfac",  # 37 records and parts
    "quantile|public|False": "b13ca210a2f79a20",  # 82 records and parts
    "quantile|public|True": "f542b60d0e579bc2",  # 82 records and parts
    "quantile|private|False": "9518d51d8a89947d",  # 42 records and parts
    "quantile|private|True": "f0bd860a206f046f",  # 42 records and parts
    "top_k|public|False": "d60c0fa1a6f3a15c",  # 8 records and parts
    "top_k|public|True": "7d56268a81de0983",  # 8 records and parts
    "top_k|private|False": "adb6c187cac10c67",  # 9 records and parts
    "top_k|private|True": "f2806830032014f2",  # 9 records and parts
}


@pytest.mark.parametrize(("statistic", "keys", "clamp"), CASES)
def test_a_drawn_release_encodes_as_before(
    monkeypatch: pytest.MonkeyPatch, statistic: str, keys: str, clamp: bool
) -> None:
    """The same scripted randomness gives the same records and ledger parts, byte for byte,
    as before."""
    case = f"{statistic}|{keys}|{clamp}"
    _scripted_secrets(monkeypatch, case)
    made = _drawn_bytes(statistic, keys, clamp)
    released = made[: -1 - sum(1 for k, _ in made if "|part-" in k)]
    assert len(released) >= 5  # a release of some keys, not an empty one
    assert _digest(made) == DIGESTS[case]


def test_int64_values_encode_as_the_same_python_ints() -> None:
    """Released values held as an int64 array are written as the same values as Python
    ints: at both int64 limits, around zero and negative, clamped or not, in output
    records, ledger parts and their cut."""
    ints = [-(2**63), -(2**63) + 1, -1, 0, 1, 9, 10, 99, -10, 2**63 - 2, BIG, -123456789]
    ints += random.Random(5).choices([-(2**40), 7, 2**62, -(2**53) - 1], k=40)
    n = len(ints)
    groups = [(f"k{i}",) for i in range(n)]
    for clamped in ([False] * n, [i % 3 == 0 for i in range(n)]):
        as_list = ReleasedValues(groups, list(ints), 2.5, 7.25, clamped)
        as_array = ReleasedValues(groups, np.array(ints, dtype=np.int64), 2.5, 7.25, clamped)
        assert as_array.value == ints and all(type(v) is int for v in as_array.value)
        assert list(as_array) == list(as_list)
        made = []
        for cols in (as_list, as_array):
            common: dict[str, Any] = {
                "release_id": "ef" * 16,
                "query": "q",
                "window_start_s": WINDOW_S[0],
                "window_end_s": WINDOW_S[1],
            }
            template = ReleaseTemplate(
                **common,
                group_by=["domain"],
                statistic="count",
                epsilon=0.5,
                delta=0.0,
                mechanism="discrete_laplace",
                selection=None,
            )
            rel = close_release(
                (),
                **common,
                released_keys=n,
                epsilon_spent=0.5,
                delta_spent=0.0,
                horizon_epsilon_spent=0.5,
                sources={0: "v1", 3: "v2"},
                drawn=(template, cols),
            )
            records = list(itertools.chain(*rel.output_chunks(5)))
            parts = LedgerParts(rel, now_s=NOW_S, max_bytes=3_000, records_per_chunk=5)
            made.append((records, parts.encode(0, len(parts))))
            reference = _reference(
                {
                    **common,
                    "statistic": "count",
                    "epsilon": 0.5,
                    "delta": 0.0,
                    "mechanism": "discrete_laplace",
                    "selection": None,
                },
                ["domain"],
                as_list,
                rel.records[-1].value,
            )
            assert records == reference
            assert made[-1][1] == _reference_parts(rel, reference, 3_000)
        assert made[0] == made[1]
