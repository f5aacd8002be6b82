"""``top_k`` on a query: what the configuration accepts and what it refuses, with the fix."""

from __future__ import annotations

from typing import Any

import pytest

from stream_dp.config import parse_config
from stream_dp.config.classification import fingerprinted_paths
from stream_dp.config.fingerprint import Topology, deployment_fingerprint, meaning_fields
from stream_dp.errors import ConfigError

TOPOLOGY = Topology(partials_partitions=3, ledger_partitions=3, continual_partitions=0)
PREFIX = "invalid configuration in config:\n  queries[0] (from config): query visits: "


def config(**query: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "visits",
        "group_by": ["domain"],
        "epsilon": 1.0,
        "delta": 1e-6,
        "top_k": 3,
    }
    base.update(query)
    return {"queries": [{k: v for k, v in base.items() if v is not None}]}


def test_top_k_loads_on_counts_and_distinct_users_with_private_or_public_keys() -> None:
    q = parse_config(config()).queries[0]
    assert (q.top_k, q.top_k_epsilon_share) == (3, 0.5)
    assert q.spec().top_k == 3 and q.spec().top_k_epsilon_share == 0.5
    users = parse_config(
        config(statistic="count_distinct_users", keys={"domain": ["a", "b"]}, delta=0.0)
    ).queries[0]
    assert users.spec().top_k == 3
    shared = parse_config(config(top_k_epsilon_share=0.2)).queries[0]
    assert shared.spec().top_k_epsilon_share == 0.2
    assert parse_config(config(top_k=None)).queries[0].spec().top_k is None


@pytest.mark.parametrize(
    ("query", "message"),
    [
        (
            {"statistic": "sum", "value_field": "v", "lower": 0, "upper": 1},
            "top_k chooses keys by their counts, so it works with statistic count or "
            "count_distinct_users, not sum; remove top_k or use a count query",
        ),
        (
            {"statistic": "mean", "value_field": "v", "lower": 0, "upper": 1},
            "top_k chooses keys by their counts, so it works with statistic count or "
            "count_distinct_users, not mean; remove top_k or use a count query",
        ),
        (
            {"keys": {"domain": ["a"]}, "release": "cumulative", "horizon_windows": 4},
            "top_k is not supported with release: cumulative: choosing keys on exact running "
            "totals would spend the selection's epsilon again in every window of the horizon, "
            "outside the per-window charge; use release: window, or remove top_k and keep "
            "the largest released running totals (post-processing)",
        ),
        (
            {"top_k": None, "top_k_epsilon_share": 0.3},
            "top_k_epsilon_share applies to top_k queries only; set top_k: N or remove it",
        ),
    ],
)
def test_refusals_say_why_and_what_to_do(query: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(config(**query))
    assert str(raised.value) == PREFIX + message


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"top_k": 0}, "queries[0].top_k = 0 (from config): Input should be greater than or "
         "equal to 1"),
        ({"top_k_epsilon_share": 1.0}, "queries[0].top_k_epsilon_share = 1.0 (from config): "
         "Input should be less than or equal to 0.99"),
    ],
)  # fmt: skip
def test_out_of_range_values_are_refused(query: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(config(**query))
    assert str(raised.value) == "invalid configuration in config:\n  " + message


def test_top_k_is_in_the_fingerprint_and_leaves_queries_without_it_unchanged() -> None:
    """It changes which keys are released and what the values cost: workers with another
    top_k must not merge; a query without top_k keeps the fingerprint it had before the
    setting existed."""
    assert {"queries[].top_k", "queries[].top_k_epsilon_share"} <= set(fingerprinted_paths())
    plain = meaning_fields(parse_config(config(top_k=None)), TOPOLOGY)
    assert not any(path.startswith("queries.visits.top_k") for path in plain)
    top_3 = meaning_fields(parse_config(config()), TOPOLOGY)
    assert top_3 == {**plain, "queries.visits.top_k": 3, "queries.visits.top_k_epsilon_share": 0.5}
    digests = {
        deployment_fingerprint(parse_config(config(**q)), TOPOLOGY).digest
        for q in ({"top_k": None}, {}, {"top_k": 4}, {"top_k_epsilon_share": 0.3})
    }
    assert len(digests) == 4
