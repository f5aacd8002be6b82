"""bounds: auto in the configuration and in `stream-dp plan`: what is accepted, what is
refused with which fix, and the exact accounting of the histograms' share."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from stream_dp.cli.main import main
from stream_dp.config import load_config, parse_config
from stream_dp.errors import ConfigError
from stream_dp.privacy.budget import BOUNDS_CHARGE
from stream_dp.privacy.planner import plan_config

ALL_AUTO = {
    "max_contributions_per_window": "auto",
    "max_keys_per_user": "auto",
    "max_contributions_per_key": "auto",
}
SCHEMA = Path(__file__).parents[2] / "stream_dp" / "privacy" / "plan.schema.json"


def _data(bounds: dict[str, Any], *queries: dict[str, Any], **privacy: Any) -> dict[str, Any]:
    qs = list(queries) or [
        {"name": "visits", "group_by": ["domain"], "epsilon": 0.8, "delta": 1e-6}
    ]
    return {
        "privacy": {"epsilon_per_window": 1.0, "delta_per_window": 1e-6, **privacy},
        "bounds": bounds,
        "queries": qs,
    }


def test_auto_bounds_start_at_their_start_values_and_stop_at_their_caps() -> None:
    config = parse_config(
        _data(
            {
                **ALL_AUTO,
                "max_keys_per_user": 3,
                "auto": {
                    "start": {"max_contributions_per_window": 20},
                    "cap": {"max_contributions_per_key": 200},
                },
            }
        )
    )
    assert config.bounds.auto_fields == (
        "max_contributions_per_window",
        "max_contributions_per_key",
    )
    assert config.bounds.start_bounds().values() == (20, 3, 10)
    assert config.bounds.cap_bounds().values() == (1000, 3, 200)
    with pytest.raises(ConfigError, match="auto"):
        config.bounds.values()
    plain = parse_config(
        _data({"max_contributions_per_window": 40}, {"name": "v", "epsilon": 1.0, "delta": 1e-6})
    )
    assert not plain.bounds.is_auto
    assert plain.bounds.start_bounds() is plain.bounds
    assert plain.bounds_epsilon == 0.0


def test_the_histograms_share_is_charged_to_every_window_exactly() -> None:
    config = parse_config(
        _data(
            {**ALL_AUTO, "auto": {"epsilon_share": 0.2}},
            horizon_windows=24,
            max_epsilon_per_horizon=24.0,
        )
    )
    plan = plan_config(config.spec())
    assert config.bounds_epsilon == 0.2
    assert plan.auto_bounds is not None
    assert plan.auto_bounds.epsilon == 0.2
    assert plan.window.epsilon == pytest.approx(1.0, rel=1e-15)
    assert plan.horizon.epsilon == pytest.approx(24.0, rel=1e-15)
    assert plan.window.delta == 1e-6  # the histograms are pure ε-DP
    # 1 + 2 projections' worth of histograms: events, keys/p0, per_key/p0 → H = 3
    assert plan.auto_bounds.layout.names == ("events", "keys/p0", "per_key/p0")
    assert plan.auto_bounds.noise_scales == {n: 3 / 0.2 for n in plan.auto_bounds.layout.names}


def test_queries_and_histograms_over_the_window_budget_are_refused_naming_the_share() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(
            _data(
                {"max_contributions_per_window": "auto"},
                {"name": "visits", "group_by": ["domain"], "epsilon": 1.0, "delta": 1e-6},
            )
        )
    message = str(info.value)
    assert f"{BOUNDS_CHARGE} (bounds.auto.epsilon_share)=0.2" in message  # the default
    assert "1.2" in message


def test_auto_bounds_are_refused_with_cumulative_queries() -> None:
    query = {
        "name": "running",
        "group_by": ["domain"],
        "keys": {"domain": ["a", "b"]},
        "epsilon": 0.9,
        "release": "cumulative",
        "horizon_windows": 24,
    }
    with pytest.raises(ConfigError, match="one noise scale over their horizon"):
        parse_config(_data({"max_contributions_per_window": "auto"}, query))


@pytest.mark.parametrize(
    ("bounds", "message"),
    [
        ({"max_contributions_per_window": 40, "auto": {}}, "only when a bound is auto"),
        (
            {
                "max_contributions_per_window": "auto",
                "auto": {"start": {"max_contributions_per_window": 2000}},
            },
            "above bounds.auto.cap.max_contributions_per_window",
        ),
        ({"max_contributions_per_window": "automatic"}, "or auto"),
        ({"max_contributions_per_window": 0}, "at least 1"),
        ({"max_keys_per_user": "auto", "auto": {"epsilon_share": 0.9}}, "epsilon_share"),
        ({"max_keys_per_user": "auto", "auto": {"cap": {"max_keys_per_user": 10**6}}}, "100000"),
    ],
)
def test_bad_auto_settings_are_refused_with_the_fix(bounds: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(_data(bounds))


def test_a_cap_whose_noise_would_leave_64_bit_arithmetic_is_refused_at_load() -> None:
    # at the start values the sum is fine; at the cap one user could move it by 10^12 units
    query = {
        "name": "spend",
        "statistic": "sum",
        "value_field": "amount",
        "lower": 0,
        "upper": 2_000_000,
        "granularity": 1,
        "group_by": ["shop"],
        "keys": {"shop": ["a"]},
        "epsilon": 0.8,
    }
    parse_config(_data({"max_contributions_per_window": 10}, {**query, "epsilon": 1.0}))
    with pytest.raises(ConfigError, match="query spend"):
        parse_config(
            _data(
                {
                    "max_contributions_per_window": "auto",
                    "auto": {"start": {"max_contributions_per_window": 10}},
                },
                query,
            )
        )


def test_auto_comes_from_the_environment_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        yaml.safe_dump(
            _data(
                {"max_contributions_per_window": 40}, {"name": "v", "epsilon": 0.8, "delta": 1e-6}
            )
        ),
        encoding="utf-8",
    )
    monkeypatch.setenv("STREAM_DP_BOUNDS__MAX_CONTRIBUTIONS_PER_WINDOW", "auto")
    monkeypatch.setenv("STREAM_DP_BOUNDS", '{"auto": {"epsilon_share": 0.2}}')
    config = load_config(path)
    assert config.bounds.auto_fields == ("max_contributions_per_window",)
    assert config.bounds_epsilon == 0.2


def test_plan_shows_the_split_and_its_json_validates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_data(ALL_AUTO)), encoding="utf-8")
    assert main(["plan", "--config", str(path)]) == 0
    text = capsys.readouterr().out
    assert "auto bounds" in text
    assert "split: queries eps=0.8 + bounds histograms eps=0.2" in text
    assert main(["plan", "--config", str(path), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    jsonschema.validate(plan, json.loads(SCHEMA.read_text(encoding="utf-8")))
    auto = plan["bounds"]["auto"]
    assert auto["epsilon"] == 0.2
    assert auto["l1_sensitivity"] == 3
    assert auto["start"] == {
        "max_contributions_per_window": 40,
        "max_keys_per_user": 5,
        "max_contributions_per_key": 10,
    }
    assert math.isclose(plan["window"]["epsilon"], 1.0)
    # the queries are planned at the first window's bounds (the start values)
    assert plan["queries"][0]["sensitivity"]["l1"] == 40


@pytest.mark.parametrize(
    "spelling", ["AUTO", "Auto", "' auto'", "yes", "on", "true", "40.5", "1e3"]
)
@pytest.mark.parametrize("bound", sorted(ALL_AUTO))
def test_only_the_exact_word_auto_or_an_integer_is_a_bound(bound: str, spelling: str) -> None:
    """YAML turns `yes`/`on`/`true` into True and `40.0` into a float: none of these, nor
    another spelling of auto, may silently become a bound (a True read as 1, a fraction
    rounded, or a misspelt auto taken as fixed) — each is refused with what to write."""
    text = f"bounds:\n  {bound}: {spelling}\n"
    data = _data(yaml.safe_load(text)["bounds"])
    with pytest.raises(ConfigError, match="or auto"):
        parse_config(data)


def test_the_histograms_end_at_each_bounds_own_cap() -> None:
    """A bound chosen automatically is chosen from its histogram, whose last edge is the
    bound's configured cap (not the larger cap of max_contributions_per_window)."""
    from stream_dp.privacy.adaptive_bounds import EVENTS, KEYS_PREFIX, PER_KEY_PREFIX

    config = parse_config(
        _data(
            {
                **ALL_AUTO,
                "auto": {
                    "cap": {
                        "max_contributions_per_window": 500,
                        "max_keys_per_user": 12,
                        "max_contributions_per_key": 200,
                    }
                },
            }
        )
    )
    plan = plan_config(config.spec())
    assert plan.auto_bounds is not None
    edges = plan.auto_bounds.layout.edges
    assert max(edges[EVENTS]) == 500
    assert {max(e) for n, e in edges.items() if n.startswith(KEYS_PREFIX)} == {12}
    assert {max(e) for n, e in edges.items() if n.startswith(PER_KEY_PREFIX)} == {200}


def test_each_querys_model_carries_its_name() -> None:
    """The bound choice finds a query's released values (how far its keys stood above the
    selection threshold) by the model's name: each model is named after its query."""
    config = parse_config(
        _data(
            ALL_AUTO,
            {"name": "visits", "group_by": ["domain"], "epsilon": 0.4, "delta": 5e-7},
            {"name": "pages", "group_by": ["domain"], "epsilon": 0.4, "delta": 5e-7},
        )
    )
    plan = plan_config(config.spec())
    assert plan.auto_bounds is not None
    assert [m.name for m in plan.auto_bounds.models] == ["visits", "pages"]
