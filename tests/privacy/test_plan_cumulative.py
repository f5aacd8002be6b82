"""``stream-dp plan`` and the planner for cumulative queries: every option's predicted error
after 1, T/2 and T windows, the chosen one, the accounting, and the guards that keep the
per-window path away from cumulative queries."""

from __future__ import annotations

import json
import math
import secrets
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from stream_dp.cli.main import main
from stream_dp.config import parse_config
from stream_dp.errors import ConfigError, PrivacyError
from stream_dp.privacy.planner import compose, plan_config, plan_query
from stream_dp.privacy.release import release_query

KEYS = {"domain": ["mail.com", "bank.com", "news.com"]}
CONFIG: dict[str, Any] = {
    "window": {"size_s": 3600},
    "privacy": {
        "epsilon_per_window": 2.0,
        "delta_per_window": 2e-6,
        "horizon_windows": 24,
        "max_epsilon_per_horizon": 48.0,
    },
    "bounds": {"max_contributions_per_window": 10},
    "queries": [
        {
            "name": "visits_long",
            "group_by": ["domain"],
            "keys": KEYS,
            "epsilon": 1.0,
            "release": "cumulative",
            "horizon_windows": 2048,
            "horizon_origin": "2024-01-01T00:00:00Z",
        },
        {
            "name": "bytes_week",
            "statistic": "sum",
            "value_field": "bytes",
            "lower": 0,
            "upper": 100,
            "granularity": 0.5,
            "group_by": ["domain"],
            "keys": KEYS,
            "epsilon": 0.5,
            "delta": 1e-6,
            "mechanism": "discrete_gaussian",
            "release": "cumulative",
            "horizon_windows": 168,
        },
        {"name": "per_window", "group_by": ["domain"], "keys": KEYS, "epsilon": 0.5,
         "delta": 1e-6},
    ],
}  # fmt: skip


def write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_planner_chooses_by_predicted_error_and_charges_like_a_window_query() -> None:
    config = parse_config(CONFIG)
    plan = plan_config(config.spec())
    long, week, window = plan.queries
    assert long.continual is not None and long.continual_auto
    assert long.continual.option == "tree_honaker"  # pure ε, T = 2048
    assert [p.option for p in long.continual_options] == ["per_window_sum", "tree", "tree_honaker"]
    assert long.horizon_origin_s == 1704067200
    assert week.continual is not None and week.continual.option == "per_window_sum"  # zCDP
    assert week.continual.unit == 0.5  # granularity: released units per counter unit
    assert window.continual is None
    # charges: exactly what a per-window query with the same (ε, δ) is charged
    for cumulative in (long, week):
        q = next(q for q in CONFIG["queries"] if q["name"] == cumulative.name)
        as_window = {k: v for k, v in q.items() if k not in ("release", "horizon_windows",
                                                               "horizon_origin")}  # fmt: skip
        reference = plan_query(
            parse_config({"queries": [as_window]}).queries[0].spec(), config.bounds.spec()
        )
        assert compose(cumulative.charges, 1) == compose(reference.charges, 1)
    assert plan.window.epsilon == 2.0 and plan.horizon.epsilon == 48.0
    # the plan's headline figures for a cumulative query: a draw and the last window's CI
    assert long.noise_scale == long.continual.draw_scale
    assert long.ci95 == long.continual.ci95(2048)


def test_json_has_every_option_and_validates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["plan", "--config", str(write(tmp_path, CONFIG)), "--json"])
    out = capsys.readouterr().out
    assert code == 0
    document = json.loads(out)
    text = resources.files("stream_dp.privacy").joinpath("plan.schema.json").read_text("utf-8")
    validator = Draft202012Validator(json.loads(text))
    errors = [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(document)]
    assert not errors, errors[:5]
    long = document["queries"][0]["continual"]
    assert long["horizon_windows"] == 2048 and long["chosen"] == "tree_honaker"
    options = {o["option"]: o for o in long["options"]}
    honaker = options["tree_honaker"]
    # tree + Honaker, pure ε, Δ = k = 10, ε = 1: after 1 window one leaf of scale L·Δ/ε
    assert honaker["draw_scale"] == 12 * 10 / 1.0
    assert honaker["sd"]["1"] == pytest.approx(math.sqrt(2) * 120, rel=1e-3)
    assert honaker["worst"]["step"] == 2047
    assert honaker["accounting"]["epsilon_over_horizon"] == 2048.0
    assert options["per_window_sum"]["sd"]["last"] == pytest.approx(
        math.sqrt(2 * 2048) * 10, rel=1e-3
    )
    assert document["queries"][2]["continual"] is None
    broken = json.loads(out)
    broken["queries"][0]["continual"]["chosen"] = "magic"
    assert not validator.is_valid(broken)


def test_table_shows_options_and_accounting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["plan", "--config", str(write(tmp_path, CONFIG))])
    out = capsys.readouterr().out
    assert code == 0
    assert "cumulative   running total since the start of each horizon of 2048 windows" in out
    assert "horizons start at 2024-01-01T00:00:00Z" in out
    assert "* tree_honaker" in out and "  per_window_sum" in out
    assert "sd after 1" in out and "after 1024" in out and "after 2048" in out
    assert "a user present in all 2048 windows of a horizon: eps=2048" in out
    assert "* per_window_sum" in out and "sqrt_factorization" in out  # the zCDP query
    assert "zCDP rho=" in out


def test_explicit_square_root_with_too_much_state_is_refused() -> None:
    data = json.loads(json.dumps(CONFIG))
    q = data["queries"][1]
    q["continual_mechanism"] = "sqrt_factorization"
    q["horizon_windows"] = 65536
    q["keys"] = {"domain": [f"d{i}.com" for i in range(300)]}
    with pytest.raises(ConfigError, match="more state than allowed"):
        parse_config(data)  # the configuration is planned when it loads


def test_the_per_window_path_refuses_cumulative_queries_and_replay_runs_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STREAM_DP_PSEUDONYM_KEY", secrets.token_hex(32))
    config = parse_config(CONFIG)
    with pytest.raises(PrivacyError, match="is cumulative"):
        release_query({}, plan_query(config.queries[0].spec(), config.bounds.spec()))
    # the release stage takes cumulative queries (stream_dp.pipeline.stages.cumulative): replay
    # prints their running totals with the horizon fields
    events = tmp_path / "events.jsonl"
    events.write_text(
        '{"user_id": "u1", "timestamp": "2024-01-01T00:10:00Z", "domain": "mail.com", '
        '"bytes": 10}\n'
    )
    window = {"size_s": 3600, "start_at": "2024-01-01T00:00:00Z"}
    path = write(tmp_path, {**CONFIG, "window": window})
    code = main(["replay", "--config", str(path), "--input", str(events), "--json"])
    assert code == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]
    cumulative = [r for r in printed if r.get("release") == "cumulative"]
    assert {r["query"] for r in cumulative} == {"visits_long", "bytes_week"}
    assert {(r["horizon_step"], r["horizon_start"]) for r in cumulative} == {
        (1, "2024-01-01T00:00:00Z")
    }


def test_the_table_warns_where_a_running_total_s_range_can_be_reached(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A window total beyond 2^42 units is clamped (it no longer stops every release): plan
    says how many users at the bound reach it, when that is few enough to happen."""
    assert main(["plan", "--config", str(write(tmp_path, CONFIG))]) == 0
    assert "WARNING      a window's exact total" not in capsys.readouterr().out
    data = json.loads(json.dumps(CONFIG))
    data["queries"][1].update(upper=10**8, granularity=1)  # 10 events × 10⁸ units per user
    assert main(["plan", "--config", str(write(tmp_path, data))]) == 0
    out = capsys.readouterr().out
    assert f"{2**42 // 10**9 + 1} users at the bound on one key exceed it" in out
