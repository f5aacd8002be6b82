"""STREAM_DP_* environment variables: overrides that cannot surprise.

A misspelt variable is an error naming it; a value's error says whether it came from the file
or from a variable; replacing the file's queries is reported; `plan` shows the origin.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from stream_dp.cli.main import main
from stream_dp.config import load_config
from stream_dp.config.environment import NON_CONFIG_VARIABLES, RETIRED_VARIABLES
from stream_dp.config.model import UNSAFE_TEST_MODE_ENV
from stream_dp.errors import ConfigError
from stream_dp.pipeline.faults import CRASH_POINT_ENV, PAUSE_POINT_ENV

REPO = Path(__file__).resolve().parents[2]
PLAN_SCHEMA = REPO / "stream_dp" / "privacy" / "plan.schema.json"
GOOD = """
kafka: {bootstrap_servers: "broker:9092"}
queries:
  - name: visits
    group_by: [domain]
    epsilon: 0.5
    delta: 1.0e-6
"""


@pytest.fixture
def good(tmp_path: Path) -> Path:
    path = tmp_path / "good.yaml"
    path.write_text(GOOD)
    return path


@pytest.fixture(autouse=True)
def _no_stray_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the shell running the tests exports, each test starts without it."""
    for name in list(os.environ):
        if name.upper().startswith("STREAM_DP_"):
            monkeypatch.delenv(name)


@pytest.mark.parametrize(
    ("variable", "message"),
    [
        (
            "STREAM_DP_PRIVACYY__EPSILON_PER_WINDOW",
            "no configuration section 'privacyy' (did you mean privacy?)",
        ),
        (
            "STREAM_DP_PRIVACY__EPSILONN_PER_WINDOW",
            "privacy has no key 'epsilonn_per_window' (did you mean epsilon_per_window?)",
        ),
        ("STREAM_DP_KAFKA__GROUP_ID__X", "kafka has no key 'group_id__x'"),
        ("STREAM_DP_QUERIES__0__EPSILON", "queries cannot be set key by key"),
        ("STREAM_DP_PSEUDONYM_KEYS", "no configuration section 'pseudonym_keys'"),
        ("stream_dp_windw__size_s", "no configuration section 'windw'"),
    ],
)
def test_an_unknown_variable_is_an_error_naming_it(
    good: Path, monkeypatch: pytest.MonkeyPatch, variable: str, message: str
) -> None:
    monkeypatch.setenv(variable, "1")
    with pytest.raises(ConfigError, match="unknown stream-dp environment variable") as info:
        load_config(good)
    assert f"{variable}: {message}" in str(info.value)
    assert "1" not in str(info.value).split(variable)[0]  # the value is never echoed


def test_the_cli_exits_2_on_a_misspelt_variable(
    good: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("STREAM_DP_PRIVACYY__EPSILON_PER_WINDOW", "0.5")
    assert main(["plan", "--config", str(good)]) == 2
    assert "STREAM_DP_PRIVACYY__EPSILON_PER_WINDOW" in capsys.readouterr().err


@pytest.mark.parametrize("variable", sorted(RETIRED_VARIABLES))
def test_a_retired_variable_says_what_replaced_it(
    good: Path, monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    monkeypatch.setenv(variable, "3")
    with pytest.raises(ConfigError, match=f"{variable}: no longer read: "):
        load_config(good)


def test_variables_read_elsewhere_are_allowed(good: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The test switches are the ones the code reads (a rename would turn them into errors).
    assert {UNSAFE_TEST_MODE_ENV, CRASH_POINT_ENV, PAUSE_POINT_ENV} <= set(NON_CONFIG_VARIABLES)
    for variable in NON_CONFIG_VARIABLES:
        monkeypatch.setenv(variable, "0")
    assert load_config(good).queries[0].name == "visits"


def test_every_stream_dp_variable_the_code_reads_is_a_setting_or_listed() -> None:
    # A variable stream-dp reads for something else (a test switch, the broker's jars)
    # but does not list would make every worker started with it set refuse its config.
    source = Path(__file__).resolve().parents[2] / "stream_dp"
    named = {
        name
        for path in source.rglob("*.py")
        for name in re.findall(r"\bSTREAM_DP_[A-Z0-9_]*[A-Z0-9]\b", path.read_text("utf-8"))
        if "__" not in name  # a configuration key's override (section__field)
    }
    unknown = named - set(NON_CONFIG_VARIABLES) - set(RETIRED_VARIABLES) - {"STREAM_DP_QUERIES"}
    assert not unknown, f"read by stream_dp but neither a setting nor listed: {sorted(unknown)}"


def test_key_variables_named_by_the_config_are_allowed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "rotating.yaml"
    path.write_text(
        GOOD
        + "pseudonymization:\n  key_env: STREAM_DP_TEAM_KEY\n"
        + "  previous_key_env: STREAM_DP_TEAM_KEY_2024\n  previous_key_id: k0\n"
        + "  rotate_at: '2030-01-01T00:00:00Z'\n"
    )
    monkeypatch.setenv("STREAM_DP_TEAM_KEY", "a" * 64)
    monkeypatch.setenv("STREAM_DP_TEAM_KEY_2024", "b" * 64)
    assert load_config(path).pseudonymization.key_env == "STREAM_DP_TEAM_KEY"
    # ... and only those: the same names are errors for a config that reads other ones
    with pytest.raises(ConfigError, match="STREAM_DP_TEAM_KEY: no configuration section"):
        load_config(_write(tmp_path, GOOD))


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "other.yaml"
    path.write_text(text)
    return path


def test_an_error_says_where_the_value_came_from(
    good: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STREAM_DP_PRIVACY__EPSILON_PER_WINDOW", "lots")
    with pytest.raises(ConfigError) as info:
        load_config(good)
    message = str(info.value)
    assert "with environment overrides STREAM_DP_PRIVACY__EPSILON_PER_WINDOW" in message
    assert (
        "privacy.epsilon_per_window = 'lots' (from environment variable "
        "STREAM_DP_PRIVACY__EPSILON_PER_WINDOW)"
    ) in message

    monkeypatch.delenv("STREAM_DP_PRIVACY__EPSILON_PER_WINDOW")
    bad_file = _write(good.parent, GOOD.replace("epsilon: 0.5", "epsilon: lots"))
    monkeypatch.setenv("STREAM_DP_WINDOW__SIZE_S", "600")  # an unrelated override
    with pytest.raises(ConfigError) as info:
        load_config(bad_file)
    assert f"queries[0].epsilon = 'lots' (from {bad_file})" in str(info.value)


def test_a_misspelt_key_inside_a_section_variable_names_the_variable(
    good: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STREAM_DP_KAFKA", '{"group_idd": "g"}')
    with pytest.raises(ConfigError, match=r"kafka.group_idd \(from environment variable "
                       r"STREAM_DP_KAFKA\): unknown key"):  # fmt: skip
        load_config(good)
    monkeypatch.setenv("STREAM_DP_KAFKA", "{group_id: g}")
    with pytest.raises(ConfigError, match="STREAM_DP_KAFKA: not valid JSON"):
        load_config(good)


def test_section_variables_merge_and_single_keys_win(
    good: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STREAM_DP_KAFKA", '{"group_id": "from-json", "client_id": "c"}')
    monkeypatch.setenv("STREAM_DP_KAFKA__GROUP_ID", "from-key")
    config = load_config(good)
    assert config.kafka.bootstrap_servers == "broker:9092"  # the file's, kept
    assert (config.kafka.group_id, config.kafka.client_id) == ("from-key", "c")
    assert config.origin.file == str(good)
    assert config.origin.environment == {
        "kafka.client_id": "STREAM_DP_KAFKA",
        "kafka.group_id": "STREAM_DP_KAFKA__GROUP_ID",
    }
    # derived defaults follow the effective group id
    assert config.output.ledger_topic == "from-key.ledger"


def test_replacing_the_queries_is_reported(
    good: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    queries = [
        {"name": "other", "epsilon": 0.25, "keys": {"x": [1, 2]}, "group_by": ["x"]},
        {"name": "more", "epsilon": 0.25, "delta": 1e-6, "group_by": ["x"]},
    ]
    monkeypatch.setenv("STREAM_DP_QUERIES", json.dumps(queries))
    with caplog.at_level(logging.WARNING, logger="stream_dp.config.loader"):
        config = load_config(good)
    assert [q.name for q in config.queries] == ["other", "more"]
    assert config.origin.environment == {"queries": "STREAM_DP_QUERIES"}
    assert (
        f"the queries come from environment variable STREAM_DP_QUERIES, replacing the 1 query "
        f"in {good}"
    ) in caplog.text


def _plan(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.upper().startswith("STREAM_DP_")}
    return subprocess.run(
        [sys.executable, "-m", "stream_dp.cli.main", "plan", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean, **env},
        check=False,
    )


def test_plan_prints_where_the_configuration_came_from(good: Path) -> None:
    alone = _plan("--config", str(good), env={})
    assert alone.returncode == 0, alone.stderr
    assert "configuration: the file alone (no STREAM_DP_* overrides)" in alone.stdout

    env = {
        "STREAM_DP_KAFKA__GROUP_ID": "team-a",
        "STREAM_DP_QUERIES": json.dumps([{"name": "q", "epsilon": 0.5, "delta": 1e-6}]),
        "STREAM_DP_KAFKA__SASL_PASSWORD": "hunter2-very-secret",
    }
    text = _plan("--config", str(good), env=env)
    assert text.returncode == 0, text.stderr
    assert "configuration: the file, with keys from the environment:" in text.stdout
    assert "  kafka.group_id <- STREAM_DP_KAFKA__GROUP_ID" in text.stdout
    assert "  queries <- STREAM_DP_QUERIES (replaces the file's queries)" in text.stdout
    assert "replacing the 1 query" in text.stderr
    assert "hunter2" not in text.stdout + text.stderr

    as_json = _plan("--config", str(good), "--json", env=env)
    assert as_json.returncode == 0, as_json.stderr
    document = json.loads(as_json.stdout)
    Draft202012Validator(json.loads(PLAN_SCHEMA.read_text(encoding="utf-8"))).validate(document)
    assert document["config_origin"] == {
        "file": str(good),
        "environment": {
            "kafka.group_id": "STREAM_DP_KAFKA__GROUP_ID",
            "kafka.sasl_password": "STREAM_DP_KAFKA__SASL_PASSWORD",
            "queries": "STREAM_DP_QUERIES",
        },
    }


@pytest.mark.parametrize("raw", ['{"a": 1}', "[1, 2]", "123", "null", "true"])
def test_a_text_setting_keeps_the_text_even_when_it_looks_like_json(
    good: Path, monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    """pydantic-settings collects the variables; a single key's value reaches the model as
    the text of the variable, never decoded as JSON on the way (only section variables
    hold JSON)."""
    monkeypatch.setenv("STREAM_DP_KAFKA__CLIENT_ID", raw)
    assert load_config(good).kafka.client_id == raw
