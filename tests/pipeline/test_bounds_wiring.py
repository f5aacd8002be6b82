"""The configured bounds reach both stages as configured (issue 37): k events per user and
window, L0 keys per user, Linf events per key, and sum/mean values clamped to [lower, upper],
each applied where it belongs and each told apart from the others.

Tests before this file used L0 = Linf, a single bound, or data below the bounds, so swapping
two bounds where the configuration is passed into the stages and the privacy core left them
all green. Here k = 5, L0 = 2 and Linf = 3 are all different, L0·Linf = 6 > k, and each bound
has a user of its own that exceeds it and no other:

- ``heavy``: 20 visits to ``a`` (size 100) — only Linf cuts it: 3 visits of a;
- ``wide``: one visit to each of ``b`` … ``f`` (size −50) — only L0 cuts it: 2 keys, 1 each;
- ``double``: 3 visits to ``g`` and 3 to ``h`` (size 5) — only k cuts it: 5 of its 6 visits.

Whichever two bounds trade places, one of these users' totals changes: each has its own
assertion. The values, 100 and −50, are outside [lower, upper] = [1, 10] on both sides.
Both stages run (LocalPipeline: partials encoded and decoded) on two input partitions and
two partials partitions, keyed by user.

The noise scale in every released record is the sensitivity of the configured bounds over ε,
computed here from the formulas of docs/privacy.md#bounding, not from the plan: a bound
swapped where the plan is made changes it (the count of distinct users' scale is L0/ε, the
count's min(k, L0·Linf)/ε).

Noise-free (test mode, ε = 1e6: the largest scale here is 5e-5, and a discrete Laplace draw
of that scale is 0 except with probability < e^-20000), so released values are the exact
bounded totals; the exact totals before noise are checked too."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.formats.ledger import LedgerRelease
from stream_dp.pipeline.local.local import LocalPipeline
from stream_dp.pipeline.stages.ingest import InputRecord, user_key
from stream_dp.pipeline.stages.placement import murmur2_partition
from stream_dp.privacy.release import KeyAggregate
from tests.pipeline.support import KEYRING, NOW, T0, config, rec

K, L0, LINF = 5, 2, 3
LOWER, UPPER = 1, 10
EPSILON = 1e6
DOMAINS = list("abcdefgh")
WIDE_KEYS = list("bcdef")
DOUBLE_KEYS = ["g", "h"]
PARTITIONS = 2

QUERIES: list[dict[str, Any]] = [
    {"name": "visits", "group_by": ["domain"], "epsilon": EPSILON, "keys": {"domain": DOMAINS}},
    {
        "name": "users",
        "statistic": "count_distinct_users",
        "group_by": ["domain"],
        "epsilon": EPSILON,
        "keys": {"domain": DOMAINS},
    },
    {"name": "all", "epsilon": EPSILON, "keys": {}},
    {
        "name": "bytes",
        "statistic": "sum",
        "value_field": "size",
        "lower": LOWER,
        "upper": UPPER,
        "granularity": 1,
        "group_by": ["domain"],
        "epsilon": EPSILON,
        "keys": {"domain": DOMAINS},
    },
    {
        "name": "mean_bytes",
        "statistic": "mean",
        "value_field": "size",
        "lower": LOWER,
        "upper": UPPER,
        "granularity": 1,
        "group_by": ["domain"],
        "epsilon": EPSILON,
        "keys": {"domain": ["a", "g"]},
    },
]


def _events() -> list[tuple[str, float, str, int]]:
    """(user, t, domain, size) in window T0, in time order."""
    heavy = [("heavy", 1 + i / 10, "a", 100) for i in range(20)]
    wide = [("wide", 4 + i / 10, d, -50) for i, d in enumerate(WIDE_KEYS)]
    double = [("double", 6 + i / 10, d, 5) for i, d in enumerate(DOUBLE_KEYS * 3)]
    return sorted([*heavy, *wide, *double], key=lambda e: e[1])


def _run() -> tuple[list[LedgerRelease], dict[str, dict[tuple[Any, ...], KeyAggregate]]]:
    exact: dict[str, dict[tuple[Any, ...], KeyAggregate]] = {}
    p = LocalPipeline(
        config(
            k=K,
            keyed_by_user=True,
            queries=QUERIES,
            bounds={"max_keys_per_user": L0, "max_contributions_per_key": LINF},
            epsilon_per_window=len(QUERIES) * EPSILON,
        ),
        KEYRING,
        partitions=PARTITIONS,
        partials_partitions=2,
        metrics=Metrics(),
        sampling_rng=random.Random(0),
        exact_totals_observer=lambda q, ws, agg: exact.update({q: dict(agg)}),
    )
    batches: dict[int, list[InputRecord]] = {}
    for user, t, domain, size in _events():
        part = murmur2_partition(user_key(user), PARTITIONS)
        batch = batches.setdefault(part, [])
        batch.append(rec(len(batch), user, t, domain, key=user_key(user), size=size))
    assert sorted(batches) == list(range(PARTITIONS))  # both partitions hold a user
    for part, batch in sorted(batches.items()):
        assert p.ingest(part, batch, now_s=NOW, now_mono_s=0) == []
    releases = p.finish(now_s=NOW)
    assert {r.query for r in releases if r.window_start_s == T0} == {q["name"] for q in QUERIES}
    return releases, exact


def _records(releases: list[LedgerRelease], query: str) -> dict[str, dict[str, Any]]:
    """The query's release records of window T0 by domain ('' for no group)."""
    (rel,) = [r for r in releases if r.query == query and r.window_start_s == T0]
    out = {}
    for r in rel.records:
        if r.value.get("kind") == "release":
            group = r.value["group"]
            out[group.get("domain", "")] = r.value
    return out


def _released(releases: list[LedgerRelease], query: str) -> dict[str, Any]:
    return {d: r["value"] for d, r in _records(releases, query).items()}


@pytest.fixture(scope="module")
def run() -> tuple[list[LedgerRelease], dict[str, dict[tuple[Any, ...], KeyAggregate]]]:
    return _run()


def test_linf_caps_the_events_of_one_user_on_one_key(run: Any) -> None:
    """heavy's 20 visits to a: k keeps 5, L0 leaves its one key, Linf keeps 3 (not L0 = 2,
    not k = 5)."""
    releases, exact = run
    assert exact["visits"][("a",)] == KeyAggregate(LINF, 1, 0)
    assert _released(releases, "visits")["a"] == LINF
    assert _released(releases, "users")["a"] == 1


def test_l0_caps_the_keys_of_one_user(run: Any) -> None:
    """wide's one visit to each of 5 keys: k keeps all 5, L0 keeps 2 of its keys (not
    Linf = 3, not k = 5), each with its one visit."""
    releases, exact = run
    visits = {d: exact["visits"].get((d,), KeyAggregate(0, 0, 0)) for d in WIDE_KEYS}
    assert Counter(a.events for a in visits.values()) == Counter({1: L0, 0: len(WIDE_KEYS) - L0})
    released = _released(releases, "visits")
    assert sum(released[d] for d in WIDE_KEYS) == L0
    assert {d for d in WIDE_KEYS if released[d]} == {d for d, a in visits.items() if a.events}
    assert sum(_released(releases, "users")[d] for d in WIDE_KEYS) == L0


def test_k_caps_the_events_of_one_user_in_the_window(run: Any) -> None:
    """double's 3 + 3 visits to g and h: within L0 and Linf, k keeps 5 of the 6 (not
    Linf = 3, not L0 = 2)."""
    releases, exact = run
    kept = [exact["visits"][(d,)].events for d in DOUBLE_KEYS]
    assert sum(kept) == K and max(kept) <= LINF
    released = _released(releases, "visits")
    assert sum(released[d] for d in DOUBLE_KEYS) == K


def test_one_key_for_everyone_is_capped_by_linf_for_each_user(run: Any) -> None:
    """The query without group_by has one key: each of the three users keeps k or fewer
    events and Linf = 3 of them on that key, whatever L0 says."""
    releases, exact = run
    assert exact["all"] == {(): KeyAggregate(3 * LINF, 3, 0)}
    assert _released(releases, "all")[""] == 3 * LINF


def test_values_are_clamped_to_lower_and_upper(run: Any) -> None:
    """heavy's sizes of 100 count as upper = 10, wide's −50 as lower = 1, double's 5 as 5."""
    releases, exact = run
    released = _released(releases, "bytes")
    assert released["a"] == LINF * UPPER
    assert exact["bytes"][("a",)] == KeyAggregate(LINF, 1, LINF * UPPER)
    assert sum(released[d] for d in WIDE_KEYS) == L0 * LOWER
    assert sum(released[d] for d in DOUBLE_KEYS) == K * 5
    means = _released(releases, "mean_bytes")
    assert means == {"a": UPPER, "g": 5}


def test_each_noise_scale_is_the_configured_bounds_sensitivity_over_epsilon(run: Any) -> None:
    """count: L1 = min(k, L0·Linf) = 5; count of distinct users: L1 = L0 = 2; sum: the
    count's L1 times U = max(|lower|, |upper|) / granularity = 10."""
    releases, _ = run
    count_l1 = min(K, L0 * LINF)
    expected = {
        "visits": count_l1 / EPSILON,
        "all": count_l1 / EPSILON,
        "users": L0 / EPSILON,
        "bytes": count_l1 * max(abs(LOWER), abs(UPPER)) / EPSILON,
    }
    for query, scale in expected.items():
        scales = [r["noise_scale"] for r in _records(releases, query).values()]
        assert scales == [pytest.approx(scale, rel=1e-9)] * len(scales), query
