"""``stream-dp replay`` releases a ``statistic: quantile`` query (issue 40): one record per
public key, valid under the release schema, carrying each configured quantile with its value,
monotone across the list, each within the plan's rank error of the exact quantile."""

from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path

import jsonschema
import pytest
import yaml

from stream_dp.cli.main import main
from stream_dp.privacy.exponential.quantiles import alpha_fraction
from tests.helpers import schema_validator

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "stream_dp" / "examples" / "browser-logs.yaml"
T0_MS = 1596240000000
QUANTILES = [0.5, 0.9, 0.99]
#: With β = 1e-7 the rank error E holds for every quantile of a key with probability
#: ≥ 1 − 1e-7 (QuantilePlan.rank_error): the test's false-failure rate is below 1e-6.
BETA = 1e-7


def _events(path: Path) -> dict[str, list[float]]:
    rng = random.Random(11)
    lines, values = [], {"NL": [], "DE": []}
    for i in range(20_000):
        country = "NL" if i % 2 else "DE"
        value = rng.uniform(0, 1000) if country == "NL" else rng.expovariate(1 / 100)
        values[country].append(min(value, 1000.0))
        event = {
            "user_id": f"user-{i}",
            "timestamp": T0_MS + i * 50,
            "domain": "site.example",
            "country": country,
            "latency_ms": value,
        }
        lines.append(json.dumps(event))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return values


def test_replay_releases_monotone_quantiles_per_public_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STREAM_DP_PSEUDONYM_KEY", os.urandom(32).hex())
    config = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    config["queries"] = [
        {
            "name": "latency_quantiles",
            "statistic": "quantile",
            "value_field": "latency_ms",
            "lower": 0,
            "upper": 1000,
            "quantiles": QUANTILES,
            "bins": 100,
            "group_by": ["country"],
            "keys": {"country": ["NL", "DE"]},
            "epsilon": 1.0,
        }
    ]
    # one event per user: L0 = Linf = 1 loses nothing and makes the rank error small
    config["bounds"] = {
        "max_contributions_per_window": 1,
        "max_keys_per_user": 1,
        "max_contributions_per_key": 1,
    }
    cfg_path = tmp_path / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(config), encoding="utf-8")
    events = tmp_path / "events.jsonl"
    values = _events(events)
    code = main(["replay", "--config", str(cfg_path), "--input", str(events), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    *records, summary = (json.loads(line) for line in out.splitlines())
    assert summary["kind"] == "replay_summary" and summary["bad_records"] == 0
    released = [r for r in records if r["kind"] == "release"]
    validator = schema_validator("release.schema.json")
    for record in released:
        validator.validate(record)
    assert sorted(r["group"]["country"] for r in released) == ["DE", "NL"]
    assert {r["statistic"] for r in released} == {"quantile"}
    # chosen by the exponential mechanism, its interval in ranks: the records say so
    assert {(r["mechanism"], r["ci95_unit"]) for r in released} == {("exponential", "ranks")}

    # the plan's rank error at β (ranks), computed from the bounds the example enforces
    code = main(["plan", "--config", str(cfg_path), "--json"])
    plan_out = capsys.readouterr().out
    assert code == 0, plan_out
    described = json.loads(plan_out)
    plan_schema = json.loads((ROOT / "stream_dp" / "privacy" / "plan.schema.json").read_text())
    jsonschema.Draft202012Validator(plan_schema).validate(described)
    query = described["queries"][0]
    assert query["statistic"] == "quantile" and query["noise"] == []
    assert (query["mechanism"], query["ci95_unit"]) == ("exponential", "ranks")
    assert {r["ci95"] for r in released} == {query["ci95"]}
    code = main(["plan", "--config", str(cfg_path)])
    table = capsys.readouterr().out
    assert code == 0, table
    (row,) = [line.split() for line in table.splitlines() if line.startswith("latency_quantiles ")]
    scale, ci = f"{query['noise_scale']:.4g}", f"+/-{query['ci95']:.4g}"
    assert row[:8] == ["latency_quantiles", "quantile", "1", "0", "exponential", scale, "ranks", ci]
    assert row[8] == "ranks", row
    rank_scale = max(query["quantile"]["rank_scales"])
    error = rank_scale * math.log(100 * len(QUANTILES) / BETA)
    for record in released:
        xs = sorted(values[record["group"]["country"]])
        n = len(xs)
        got = record["value"]
        assert [q["quantile"] for q in got] == QUANTILES
        assert [q["value"] for q in got] == sorted(q["value"] for q in got)
        for q in got:
            num, den = alpha_fraction(q["quantile"])
            rank = sum(1 for x in xs if x < q["value"])
            # OPT is at most half the count of the bin (10 wide) holding rank α·n
            target = xs[min(n - 1, math.floor(num / den * n))]
            holding = math.floor(target / 10)
            bin_count = sum(1 for x in xs if holding * 10 <= x < (holding + 1) * 10)
            assert abs(rank - num / den * n) <= error + bin_count / 2 + 1, (q, rank, n, error)
