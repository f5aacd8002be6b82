"""release: cumulative — what the configuration accepts and what it refuses, with the fix."""

from __future__ import annotations

from typing import Any

import pytest

from stream_dp.config import parse_config
from stream_dp.errors import ConfigError

KEYS = {"domain": ["mail.com", "bank.com", "news.com"]}


def config(**query: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "visits_week",
        "group_by": ["domain"],
        "keys": KEYS,
        "epsilon": 0.5,
        "release": "cumulative",
        "horizon_windows": 168,
    }
    base.update(query)
    return {"queries": [{k: v for k, v in base.items() if v is not None}]}


def test_a_cumulative_query_loads() -> None:
    q = parse_config(config(horizon_origin="2024-01-01T00:00:00Z")).queries[0]
    assert q.cumulative and q.horizon_windows == 168 and q.continual_mechanism == "auto"
    assert q.horizon_origin is not None and q.horizon_origin.timestamp() == 1704067200
    window = parse_config(config(release=None, horizon_windows=None)).queries[0]
    assert not window.cumulative and window.release == "window"


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"horizon_windows": None}, "needs horizon_windows"),
        ({"horizon_windows": 1}, "greater than or equal to 2"),
        ({"horizon_windows": 2**20 + 1}, "less than or equal to 1048576"),
        ({"keys": "private", "delta": 1e-6}, "need public keys in this version"),
        ({"statistic": "count_distinct_users"}, "would count user-windows"),
        (
            {"statistic": "mean", "value_field": "v", "lower": 0, "upper": 1},
            "cumulative means are not supported",
        ),
        ({"continual_mechanism": "sqrt_factorization"}, "needs mechanism discrete_gaussian"),
        (
            {
                "continual_mechanism": "sqrt_factorization",
                "mechanism": "discrete_gaussian",
                "delta": 1e-6,
                "horizon_windows": 70_000,
            },
            "up to 65536",
        ),
        ({"continual_mechanism": "fancy"}, "continual_mechanism"),
        ({"horizon_origin": "2024-01-01T00:00:00"}, "needs a UTC offset"),
        ({"horizon_origin": "2024-01-01T00:30:00Z"}, "is not the start of a window"),
        ({"release": None}, "applies to cumulative queries only"),
        (
            {"release": None, "horizon_windows": None, "continual_mechanism": "tree"},
            "continual_mechanism applies to cumulative queries only",
        ),
    ],
)
def test_refusals_name_the_fix(query: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(config(**query))


def test_budget_is_charged_per_window_as_for_window_queries() -> None:
    """A cumulative query draws its ε from every window like any query: the window and
    horizon budget checks apply unchanged."""
    data = config(epsilon=0.8)
    data["privacy"] = {"epsilon_per_window": 1.0, "horizon_windows": 24}
    data["queries"].append({"name": "other", "keys": {}, "epsilon": 0.3, "delta": 1e-6})
    with pytest.raises(ConfigError, match=r"ε = 1\.1 per window"):
        parse_config(data)
    data["privacy"]["max_epsilon_per_horizon"] = 10.0
    data["queries"].pop()
    with pytest.raises(ConfigError, match=r"19\.2 over the horizon"):
        parse_config(data)


def test_continual_retention_shorter_than_a_horizon_is_refused() -> None:
    """The continual topic holds the running totals' state (exact per-window totals): kept
    twice the longest horizon plus the internal retention by default (not forever: exact
    counts must not linger), and never less than a horizon plus the internal retention, or
    a horizon would lose its state mid-way."""
    data = config()  # 168 hourly windows: 604,800 s, plus output.internal_retention_s
    data["output"] = {"continual_retention_s": 604_800}
    with pytest.raises(ConfigError, match=r"continual_retention_s = 604800 is shorter than"):
        parse_config(data)
    needed = 168 * 3600 + parse_config(config()).output.internal_retention_s
    data["output"] = {"continual_retention_s": needed}
    output = parse_config(data).output
    assert output.continual_retention_ms == needed * 1000
    internal = parse_config(config()).output.internal_retention_s
    default = parse_config(config()).output.continual_retention_s
    assert default == 2 * 168 * 3600 + internal  # two weeks of hourly windows, plus
    # without cumulative queries the topic is unused: the internal topics' retention
    plain = parse_config({"queries": [{"name": "q", "epsilon": 1.0, "keys": {}}]}).output
    assert plain.continual_retention_s == plain.internal_retention_s
    assert parse_config(config()).output.continual_topic == "stream-dp.continual"


def test_erasure_with_a_tree_or_factorisation_running_total_is_refused_with_the_fix() -> None:
    """A tree's later nodes add up exact totals of windows released before an erasure, so an
    erased user's events would feed releases after the request; a per-window sum adds only
    each window's own noisy total, drawn after its cut."""
    data = config(continual_mechanism="tree_honaker")
    data["erasure"] = {"enabled": True}
    with pytest.raises(ConfigError, match=r"erasure\.enabled cannot be combined.*visits_week"):
        parse_config(data)
    with pytest.raises(ConfigError, match="per_window_sum"):
        parse_config({**config(), "erasure": {"enabled": True}})  # auto may pick a tree
    allowed = config(continual_mechanism="per_window_sum")
    allowed["erasure"] = {"enabled": True}
    assert parse_config(allowed).erasure.enabled
