"""``stream-dp plan``: the JSON form validates against plan.schema.json, the table names every
query, the disclosure-risk helper, and refusals with exit code 2."""

from __future__ import annotations

import json
import math
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from stream_dp.cli._common import text_table
from stream_dp.cli.main import main
from stream_dp.privacy.partition_selection import WEIGHT_SCALE, WeightedGaussian

EXAMPLE = Path(__file__).resolve().parents[2] / "stream_dp" / "examples" / "browser-logs.yaml"

ALL_KINDS: dict[str, Any] = {
    "privacy": {
        "epsilon_per_window": 6.0,
        "delta_per_window": 1e-5,
        "horizon_windows": 24,
        "max_epsilon_per_horizon": 144.0,
    },
    "bounds": {
        "max_contributions_per_window": 40,
        "max_keys_per_user": 3,
        "max_contributions_per_key": 10,
    },
    "queries": [
        {"name": "tg_count", "group_by": ["domain"], "epsilon": 1.0, "delta": 1e-6},
        {
            "name": "lt_users",
            "statistic": "count_distinct_users",
            "group_by": ["domain"],
            "selection": "laplace_threshold",
            "epsilon": 0.5,
            "delta": 1e-6,
        },
        {
            "name": "gt_sum",
            "statistic": "sum",
            "group_by": ["domain"],
            "selection": "gaussian_threshold",
            "mechanism": "discrete_gaussian",
            "value_field": "bytes",
            "lower": 0,
            "upper": 100,
            "granularity": 1,
            "epsilon": 1.0,
            "delta": 2e-6,
        },
        {
            "name": "ct_count",
            "group_by": ["domain"],
            "selection": "count_threshold",
            "epsilon": 1.0,
            "delta": 1e-6,
        },
        {
            "name": "public_mean",
            "statistic": "mean",
            "group_by": ["country", "day"],
            "keys": {"country": ["DE", "FR"], "day": [1, 2, 3]},
            "value_field": "seconds",
            "lower": 0,
            "upper": 600,
            "clamp_negative": True,
            "epsilon": 1.0,
        },
        {
            "name": "ct_gauss_users",
            "statistic": "count_distinct_users",
            "group_by": ["domain"],
            "selection": "count_threshold",
            "mechanism": "discrete_gaussian",
            "epsilon": 1.0,
            "delta": 2e-6,
        },
        {
            "name": "wg_count",
            "group_by": ["domain"],
            "selection": "weighted_gaussian",
            "epsilon": 0.5,
            "delta": 1e-6,
        },
    ],
}


@pytest.fixture
def schema() -> Draft202012Validator:
    text = resources.files("stream_dp.privacy").joinpath("plan.schema.json").read_text("utf-8")
    document = json.loads(text)
    Draft202012Validator.check_schema(document)
    return Draft202012Validator(document)


def write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("source", ["example", "all_kinds"])
def test_json_output_validates_against_the_schema(
    source: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], schema: Draft202012Validator
) -> None:
    path = EXAMPLE if source == "example" else write(tmp_path, ALL_KINDS)
    code, out, _ = run(capsys, "--config", str(path), "--json")
    assert code == 0
    document = json.loads(out)
    errors = sorted(schema.iter_errors(document), key=lambda e: list(e.path))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors[:5]]
    names = [q["name"] for q in document["queries"]]
    expected = [q["name"] for q in yaml.safe_load(path.read_text())["queries"]]
    assert names == expected


def test_schema_rejects_a_broken_document(
    capsys: pytest.CaptureFixture[str], schema: Draft202012Validator
) -> None:
    _, out, _ = run(capsys, "--config", str(EXAMPLE), "--json")
    document = json.loads(out)
    document["queries"][0]["selection"]["threshold"] = "high"
    del document["horizon"]["epsilon"]
    assert len(list(schema.iter_errors(document))) >= 2


def test_json_reference_values_for_every_strategy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = json.loads(json.dumps(ALL_KINDS))
    data["queries"][0]["epsilon"] = 1.0  # truncated geometric at ε_s = 0.5 → 76 / 151
    data["queries"][3]["epsilon"] = 1.0  # count threshold ε = 1 → s = 30, T = 437 / 438
    code, out, _ = run(capsys, "--config", str(write(tmp_path, data)), "--json")
    assert code == 0
    queries = {q["name"]: q for q in json.loads(out)["queries"]}
    tg = queries["tg_count"]["selection"]
    assert (tg["users_for_half_keep"], tg["users_for_certain_keep"]) == (76, 151)
    ct = queries["ct_count"]
    assert ct["noise_scale"] == 30.0
    assert (ct["selection"]["reference_threshold"], ct["selection"]["threshold"]) == (437, 438)
    lt = queries["lt_users"]["selection"]
    assert lt["reference_threshold"] == pytest.approx(1 - 12 * math.log(2 * 3.333334444e-7))
    public = queries["public_mean"]
    assert public["selection"] is None and public["public_key_count"] == 6
    wg = queries["wg_count"]
    selection = WeightedGaussian(epsilon=0.25, delta=1e-6, max_partitions_contributed=3)
    assert wg["selection"]["threshold"] == selection.threshold
    assert wg["selection"]["weight_scale"] == WEIGHT_SCALE
    by_name = {c["part"]: c for c in wg["charges"]}
    assert by_name["selection:noise"]["epsilon"] == pytest.approx(0.25)
    assert by_name["selection:noise"]["delta"] == pytest.approx(0.5e-6)
    assert by_name["selection:noise"]["rho"] == pytest.approx(
        WEIGHT_SCALE**2 / (2 * selection.mechanism.sigma**2), rel=1e-12
    )
    assert by_name["selection:threshold"]["delta"] == pytest.approx(0.5e-6)
    assert math.fsum(c["epsilon"] for c in wg["charges"]) == pytest.approx(0.5, rel=1e-12)
    assert math.fsum(c["delta"] for c in wg["charges"]) == pytest.approx(1e-6, rel=1e-12)


def test_table_mentions_every_query_and_the_totals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "--config", str(write(tmp_path, ALL_KINDS)))
    assert code == 0
    for q in ALL_KINDS["queries"]:
        assert q["name"] in out
    assert "horizon" in out and "24 windows" in out
    assert "with Gaussian parts in zCDP" in out
    assert "keep if noisy count >= 438" in out
    assert "weighted_gaussian: keep if noisy user weights >= " in out


def test_disclosure_risk_prints_the_equivalent_epsilon(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "--config", str(EXAMPLE), "--disclosure-risk", "0.75")
    assert code == 0
    assert "eps=1.099" in out
    code, out, _ = run(
        capsys, "--config", str(EXAMPLE), "--json", "--disclosure-risk", "0.9", "--worlds", "10"
    )
    risk = json.loads(out)["disclosure_risk"]
    assert risk["epsilon"] == pytest.approx(math.log(81))
    assert risk["worlds"] == 10


@pytest.mark.parametrize(
    "argv",
    [
        ["--disclosure-risk", "0.4"],  # below a random guess between 2 worlds
        ["--worlds", "3"],  # --worlds alone
        ["--disclosure-risk", "1.5"],
    ],
)
def test_bad_risk_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "--config", str(EXAMPLE), *argv)
    assert code == 2
    assert "error" in err


def test_over_budget_config_is_refused_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = json.loads(json.dumps(ALL_KINDS))
    data["privacy"]["epsilon_per_window"] = 1.0
    code, out, err = run(capsys, "--config", str(write(tmp_path, data)))
    assert code == 2
    assert out == ""
    assert "epsilon_per_window" in err and "tg_count" in err


def test_count_threshold_on_a_sum_is_refused_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = json.loads(json.dumps(ALL_KINDS))
    data["queries"][2]["selection"] = "count_threshold"
    code, _, err = run(capsys, "--config", str(write(tmp_path, data)))
    assert code == 2
    assert "count_threshold" in err


def test_plan_lists_each_export_and_says_it_is_not_differentially_private(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], schema: Draft202012Validator
) -> None:
    export = {
        "partner": "acme",
        "topic": "to-acme",
        "fields": ["born", "zip"],
        "generalize": {"born": "year", "zip": "prefix:2"},
        "k_anonymity": 5,
        "purpose": "research",
        "legal_basis": "consent",
    }
    data = {**ALL_KINDS, "input": {"keyed_by_user": True}, "exports": [export]}
    path = write(tmp_path, data)
    code, out, _ = run(capsys, "--config", str(path), "--json")
    assert code == 0
    document = json.loads(out)
    assert not list(schema.iter_errors(document))
    assert document["exports"] == [
        {
            "partner": "acme",
            "topic": "to-acme",
            "fields": {"born": "year", "zip": "prefix:2"},
            "k_anonymity": 5,
            "differentially_private": False,
            "purpose": "research",
            "legal_basis": "consent",
        }
    ]
    code, table, _ = run(capsys, "--config", str(path))
    assert code == 0
    _, without, _ = run(capsys, "--config", str(write(tmp_path, ALL_KINDS)))
    assert table.startswith(without)  # the plan itself, then the exports
    assert table[len(without) :].splitlines() == [
        "",
        "Partner exports: event rows, NOT differentially private (no ε is spent or bounded; "
        "see docs/exports.md)",
        *text_table(
            [
                ["partner", "topic", "fields (rule)", "k-anonymity", "purpose"],
                ["acme", "to-acme", "born (year), zip (prefix:2)", "k=5", "research"],
            ]
        ),
    ]


VARIANCE: dict[str, Any] = {
    "privacy": {"epsilon_per_window": 1.0, "delta_per_window": 1e-6},
    "bounds": {"max_contributions_per_window": 5},
    "queries": [
        {
            "name": "latency_spread",
            "statistic": "variance",
            "value_field": "latency_ms",
            "lower": 0,
            "upper": 2000,
            "group_by": ["domain"],
            "keys": {"domain": ["a", "b"]},
            "epsilon": 1.0,
        }
    ],
}


def test_a_variance_plan_validates_and_states_its_interval_by_noisy_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], schema: Draft202012Validator
) -> None:
    """Three noise components (squares, sum, count: ε/3 each), their charges, and the 95%
    half-width at noisy counts of 100, 1,000 and 10,000 events — the whole range (1000²)
    when the noise swamps 100 events; the table says the same."""
    path = write(tmp_path, VARIANCE)
    code, out, _ = run(capsys, "--config", str(path), "--json")
    assert code == 0
    document = json.loads(out)
    errors = sorted(schema.iter_errors(document), key=lambda e: list(e.path))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors[:5]]
    (query,) = document["queries"]
    assert [c["target"] for c in query["noise"]] == ["sum_squares", "sum", "count"]
    assert [c["part"] for c in query["charges"]] == [
        "noise:sum_squares",
        "noise:sum",
        "noise:count",
    ]
    figures = query["variance_ci95"]["at_noisy_count"]
    assert figures["100"] == 1000.0**2
    assert figures["100"] > figures["1000"] > figures["10000"] > 0
    code, out, _ = run(capsys, "--config", str(path))
    assert code == 0
    (line,) = [x for x in out.splitlines() if x.startswith("  variance CI")]
    assert line == (
        "  variance CI  per key, by noisy count of events: 1e+06 at 100, 3.21e+05 at 1,000, "
        "3.075e+04 at 10,000 (the whole range 1e+06 at <= 0)"
    )
