"""``top_k`` through ``stream-dp replay`` (the local pipeline, the worker's release path
without Kafka): at most N keys per window, the leaders when leads are large, and the
ledger charges the query's whole ε, the choice included."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from stream_dp.cli.main import main
from stream_dp.config import load_config
from stream_dp.privacy.planner import plan_config

T0 = 1_596_240_000
#: Distinct users per domain in each window: two leaders 180 users ahead of the third.
USERS = {"a": 400, "b": 300, "c": 120, "d": 100}
CONFIG: dict[str, Any] = {
    "window": {"size_s": 10, "start_at": "2020-08-01T00:00:00Z"},
    "bounds": {"max_contributions_per_window": 5, "max_keys_per_user": 1},
    "privacy": {"epsilon_per_window": 1.0},
    "queries": [
        {
            "name": "top_domains",
            "statistic": "count_distinct_users",
            "group_by": ["domain"],
            "epsilon": 1.0,
            "delta": 1e-6,
            "top_k": 2,
        }
    ],
}


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAM_DP_PSEUDONYM_KEY", os.urandom(32).hex())


def test_replay_releases_the_two_leaders_per_window_and_charges_the_choice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Partition selection keeps all four domains (≥ 100 users, certain from about 56);
    the choice's scale is N·Δ/ε_sel = 2·1/0.5 = 4 users, so missing a leader 180 users
    ahead has probability below 2·e⁻⁴⁵."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(CONFIG), encoding="utf-8")
    events = tmp_path / "events.jsonl"
    with events.open("w", encoding="utf-8") as out:
        for window in range(2):
            for domain, users in USERS.items():
                for u in range(users):
                    event = {"user_id": f"{domain}{u}", "timestamp": T0 + window * 10 + 1 + u % 7}
                    out.write(json.dumps({**event, "domain": domain}) + "\n")
    ledger = tmp_path / "ledger.jsonl"
    argv = ["replay", "--config", str(config), "--input", str(events), "--json"]
    code = main([*argv, "--ledger", str(ledger)])
    out, _ = capsys.readouterr()
    assert code == 0
    *records, summary = (json.loads(line) for line in out.splitlines())
    assert summary["kind"] == "replay_summary" and summary["releases_drawn"] == 2
    starts = ["2020-08-01T00:00:00Z", "2020-08-01T00:00:10Z"]
    released = sorted(
        (r["window_start"], r["group"]["domain"]) for r in records if r["kind"] == "release"
    )
    assert released == [(s, d) for s in starts for d in ("a", "b")]
    for r in records:
        if r["kind"] == "release":
            assert abs(r["value"] - USERS[r["group"]["domain"]]) <= 60  # noise scale 4
    windows = [r for r in records if r["kind"] == "window"]
    assert [(w["window_start"], w["released_keys"]) for w in windows] == [(s, 2) for s in starts]
    # the ledger charges the whole ε: partition selection, values and the choice of keys
    plan = plan_config(load_config(config).spec()).query("top_domains")
    parts = {c.part: c.epsilon for c in plan.charges}
    assert parts == {"selection": 0.25, "noise:value": 0.25, "selection:top_k": 0.5}
    ledgered = [json.loads(line)["value"] for line in ledger.read_text().splitlines()]
    spent = [(r["window_start"], r["epsilon_spent"], r["delta_spent"])
             for r in ledgered if r.get("epsilon_spent") is not None]  # fmt: skip
    assert spent == [(starts[0], 1.0, 1e-6), (starts[1], 1.0, 1e-6)]
    assert [w["horizon_epsilon_spent"] for w in windows] == [1.0, 2.0]
    assert sum(parts.values()) == 1.0
    assert [(w["epsilon_spent"], w["delta_spent"]) for w in windows] == [(1.0, 1e-6)] * 2
