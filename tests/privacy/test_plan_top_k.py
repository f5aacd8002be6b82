"""``stream-dp plan`` for ``top_k`` queries: N, the selection's ε and the lead a key needs,
in the JSON form (schema-valid, equal to the mechanism's own figures) and the table."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from stream_dp.cli.main import main
from stream_dp.privacy.exponential.top_k import TopKPlan

CONFIG: dict[str, Any] = {
    "privacy": {
        "epsilon_per_window": 3.0,
        "delta_per_window": 1e-5,
        "max_epsilon_per_horizon": 72.0,
    },
    "bounds": {
        "max_contributions_per_window": 20,
        "max_keys_per_user": 3,
        "max_contributions_per_key": 4,
    },
    "queries": [
        {"name": "top_domains", "group_by": ["domain"], "epsilon": 1.0, "delta": 1e-6, "top_k": 10},
        {
            "name": "top_countries",
            "statistic": "count_distinct_users",
            "group_by": ["country"],
            "keys": {"country": ["DE", "FR", "NL"]},
            "epsilon": 1.0,
            "top_k": 2,
            "top_k_epsilon_share": 0.25,
        },
    ],
}


def _plan(tmp_path: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(CONFIG), encoding="utf-8")
    code = main(["plan", "--config", str(path), *argv])
    out, _ = capsys.readouterr()
    return code, out


def test_json_states_the_selection_and_the_leads_of_the_mechanism(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _plan(tmp_path, capsys, "--json")
    assert code == 0
    document = json.loads(out)
    text = resources.files("stream_dp.privacy").joinpath("plan.schema.json").read_text("utf-8")
    schema = Draft202012Validator(json.loads(text))
    errors = [f"{list(e.path)}: {e.message}" for e in schema.iter_errors(document)]
    assert not errors, errors[:5]
    domains, countries = document["queries"]
    # private keys, events: Δ = Linf = 4, ε_sel = 0.5 of 1; m over a range
    # public keys, users: Δ = 1, ε_sel = 0.25 of 1; m = 3 public keys − N = 1
    for query, (n, epsilon, delta, competitors) in (
        (domains, (10, 0.5, 4, (10, 100, 1000, 10000))),
        (countries, (2, 0.25, 1, (1,))),
    ):
        mechanism = TopKPlan(n, epsilon, delta)
        assert query["top_k"] == {
            "top_k": n,
            "epsilon": epsilon,
            "sensitivity": delta,
            "scale": mechanism.scale,
            "leads": [
                {"competitors": m, "probability": p, "lead": mechanism.lead_for_probability(p, m)}
                for m in competitors
                for p in (0.9, 0.99)
            ],
        }
        parts = {c["part"]: c["epsilon"] for c in query["charges"]}
        assert parts["selection:top_k"] == epsilon
        assert sum(parts.values()) == pytest.approx(1.0, rel=1e-15)
    assert document["window"]["epsilon"] == pytest.approx(2.0, rel=1e-15)
    assert countries["noise_epsilon"] == 0.75 and domains["noise_epsilon"] == 0.25


def test_the_table_states_n_the_epsilon_and_the_leads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _plan(tmp_path, capsys)
    assert code == 0
    lines = out.splitlines()
    start = lines.index("top_domains: count by domain, private keys")
    assert lines[start + 5 : start + 11] == [
        "  top-k        at most 10 keys per window, chosen by the peeling exponential mechanism "
        "(eps=0.5, scale 80 events)",
        "  top-k lead   events a key needs over the count ranked 11 to be chosen (m: keys "
        "outside the top 10):",
        "               m=10: 360 for p>=0.9, 552 for p>=0.99",
        "               m=100: 545 for p>=0.9, 737 for p>=0.99",
        "               m=1000: 729 for p>=0.9, 921 for p>=0.99",
        "               m=10000: 913 for p>=0.9, 1105 for p>=0.99",
    ]
    start = lines.index("top_countries: count_distinct_users by country, 3 public keys")
    assert lines[start + 4 : start + 7] == [
        "  top-k        at most 2 keys per window, chosen by the peeling exponential mechanism "
        "(eps=0.25, scale 8 users)",
        "  top-k lead   users a key needs over the count ranked 3 to be chosen (m: keys "
        "outside the top 2):",
        "               m=1: 18 for p>=0.9, 37 for p>=0.99",
    ]
    assert "per window   eps=2 of 3, delta=1e-06 of 1e-05 (basic composition)" in lines
