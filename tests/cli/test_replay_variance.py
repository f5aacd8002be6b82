"""``stream-dp replay`` releases a ``statistic: variance`` query (issue 40): one record per
public key, valid under the release schema, its value the population variance's estimate in
[0, ((upper − lower)/2)²], close to the exact variance on many events per key."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import yaml

from stream_dp.cli.main import main
from tests.helpers import schema_validator

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "stream_dp" / "examples" / "browser-logs.yaml"
#: Values per country: NL uniform on [0, 1000] (variance ≈ 83,333), DE at 400 or 600
#: (variance 10,000); [lower, upper] = [0, 1000], so the largest variance is 500² = 250,000.
T0_MS = 1596240000000


def _events(path: Path) -> tuple[float, float]:
    rng = random.Random(7)
    lines, nl, de = [], [], []
    for i in range(40_000):
        country = "NL" if i % 2 else "DE"
        value = rng.uniform(0, 1000) if country == "NL" else rng.choice([400, 600])
        (nl if country == "NL" else de).append(value)
        event = {
            "user_id": f"user-{i}",
            "timestamp": T0_MS + i * 50,
            "domain": "site.example",
            "country": country,
            "latency_ms": value,
        }
        lines.append(json.dumps(event))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")

    def var(xs: list[float]) -> float:
        mean = sum(xs) / len(xs)
        return sum((x - mean) ** 2 for x in xs) / len(xs)

    return var(nl), var(de)


def test_replay_releases_a_variance_per_public_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STREAM_DP_PSEUDONYM_KEY", os.urandom(32).hex())
    config = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    config["queries"] = [
        {
            "name": "latency_spread",
            "statistic": "variance",
            "value_field": "latency_ms",
            "lower": 0,
            "upper": 1000,
            "group_by": ["country"],
            "keys": {"country": ["DE", "NL"]},
            "epsilon": 1.0,
        }
    ]
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
    events = tmp_path / "events.jsonl"
    exact_nl, exact_de = _events(events)
    code = main(["replay", "--config", str(config_path), "--input", str(events), "--json"])
    out, _ = capsys.readouterr()
    assert code == 0, out
    *records, summary = (json.loads(line) for line in out.splitlines())
    assert summary["kind"] == "replay_summary" and summary["bad_records"] == 0
    released = [r for r in records if r["kind"] == "release"]
    validator = schema_validator("release.schema.json")
    for record in released:
        validator.validate(record)
    assert {r["statistic"] for r in released} == {"variance"}
    by_country = {r["group"]["country"]: r for r in released}
    assert set(by_country) == {"DE", "NL"}
    for country, exact in (("NL", exact_nl), ("DE", exact_de)):
        record = by_country[country]
        assert 0.0 <= record["value"] <= 500.0**2
        # 20,000 events at ε = 1 and k = 40: the stated 95% half-width (≈ 31,000) is far
        # below the range. If each of the six noise draws (three per key) stays within 5
        # times its half-width at level 1 − 0.05/3 — the discrete Laplace's tail is
        # geometric, so each fails with probability ≈ (0.05/3)^5 ≈ 1.3e-9: false failure
        # < 1e-8 — the error is within 5A + 5B(2D + 5B) < 6 ci95 (B ≈ 25 ≪ D = 500); the
        # + 1 covers the rounding of values to the granularity of 1 (≤ 1/12 on a variance)
        assert record["ci95"] < 0.2 * 500.0**2
        assert abs(record["value"] - exact) <= 6 * record["ci95"] + 1, (country, record, exact)
