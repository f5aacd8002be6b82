"""Bad configurations exit with code 2 and a message that names the field and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from stream_dp.cli.main import main
from stream_dp.config import load_config, parse_config
from stream_dp.errors import ConfigError

GOOD = """
queries:
  - name: visits
    group_by: [domain]
    epsilon: 0.5
    delta: 1.0e-6
"""


def _run_with(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    events = tmp_path / "e.jsonl"
    events.write_text("")
    code = main(["replay", "--config", str(cfg), "--input", str(events)])
    return code, capsys.readouterr().err


def test_good_config_loads_with_defaults(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(GOOD)
    config = load_config(tmp_path / "c.yaml")
    assert config.queries[0].statistic == "count"
    assert config.window.size_s == 3600
    assert config.kafka.bootstrap_servers == "127.0.0.1:9092"


def test_missing_file_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["replay", "--config", str(tmp_path / "nope.yaml"), "--input", "x"])
    err = capsys.readouterr().err
    assert code == 2
    assert "nope.yaml not found" in err and "--config" in err


def test_yaml_syntax_error_names_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run_with(tmp_path, "queries: [\n  - name: x\n bad: {", capsys)
    assert code == 2
    assert "not valid YAML at line" in err


@pytest.mark.parametrize(
    ("text", "field", "hint"),
    [
        (
            "privacy: {epsilon_per_window: 0}\n" + GOOD,
            "privacy.epsilon_per_window",
            "greater than 0",
        ),
        (GOOD.replace("epsilon: 0.5", "epsilon: -1"), "queries[0].epsilon", "greater than 0"),
        ("window: {sise_s: 10}\n" + GOOD, "window.sise_s", "allowed here: size_s"),
        (
            GOOD.replace("group_by: [domain]", "statistic: median"),
            "queries[0].statistic",
            "'count', 'count_distinct_users', 'sum', 'mean', 'variance' or 'quantile'",
        ),
        (
            GOOD.replace("epsilon: 0.5", "epsilon: 1.5"),
            "privacy.epsilon_per_window",
            "visits=1.5",
        ),
        (
            "privacy: {horizon_windows: 100}\n" + GOOD,
            "privacy.max_epsilon_per_horizon",
            "100 windows × ε 0.5",
        ),
        (GOOD.replace("delta: 1.0e-6", "delta: 0"), "delta", "private keys need delta > 0"),
    ],
    ids=[
        "epsilon-zero",
        "query-epsilon-negative",
        "unknown-key",
        "unknown-statistic",
        "over-window-budget",
        "over-horizon-budget",
        "private-without-delta",
    ],
)
def test_bad_config_exit_2_names_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, field: str, hint: str
) -> None:
    code, err = _run_with(tmp_path, text, capsys)
    assert code == 2, err
    assert field in err
    assert hint in err


def test_env_overrides_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "c.yaml").write_text(GOOD)
    monkeypatch.setenv("STREAM_DP_WINDOW__SIZE_S", "600")
    monkeypatch.setenv("STREAM_DP_PRIVACY__EPSILON_PER_WINDOW", "0.5")
    config = load_config(tmp_path / "c.yaml")
    assert config.window.size_s == 600
    assert config.privacy.epsilon_per_window == 0.5


def test_env_override_is_validated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "c.yaml").write_text(GOOD)
    monkeypatch.setenv("STREAM_DP_PRIVACY__EPSILON_PER_WINDOW", "0.1")
    with pytest.raises(ConfigError, match=r"epsilon_per_window is 0\.1"):
        load_config(tmp_path / "c.yaml")


def test_config_is_frozen(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(GOOD)
    config = load_config(tmp_path / "c.yaml")
    with pytest.raises(Exception, match="frozen"):
        config.window.size_s = 5  # type: ignore[misc]


def test_secrets_never_printed() -> None:
    config = parse_config(
        {
            "kafka": {
                "security_protocol": "SASL_SSL",
                "sasl_mechanism": "PLAIN",
                "sasl_username": "svc",
                "sasl_password": "hunter2-very-secret",
            },
            "queries": [{"name": "q", "epsilon": 0.5, "delta": 1e-6}],
        }
    )
    assert "hunter2" not in repr(config)
    assert "hunter2" not in str(config.redacted())
    assert config.kafka.sasl_password is not None
    assert config.kafka.sasl_password.get_secret_value() == "hunter2-very-secret"


def test_grouping_by_user_field_refused() -> None:
    with pytest.raises(ConfigError, match="releasing per user is never private"):
        parse_config(
            {"queries": [{"name": "q", "group_by": ["user_id"], "epsilon": 0.5, "delta": 1e-6}]}
        )


def test_unsafe_test_mode_refused_outside_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STREAM_DP_ALLOW_UNSAFE_TEST_MODE", raising=False)
    with pytest.raises(ConfigError, match=r"privacy\.unsafe_test_mode"):
        parse_config(
            {
                "privacy": {"unsafe_test_mode": True},
                "queries": [{"name": "q", "epsilon": 0.5, "delta": 1e-6}],
            }
        )


def test_huge_epsilon_needs_test_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    data = {
        "privacy": {"epsilon_per_window": 1e6, "max_epsilon_per_horizon": 1e9},
        "queries": [{"name": "q", "epsilon": 1e6, "delta": 1e-6}],
    }
    with pytest.raises(ConfigError, match="gives no meaningful privacy"):
        parse_config(data)
    monkeypatch.setenv("STREAM_DP_ALLOW_UNSAFE_TEST_MODE", "1")
    data["privacy"]["unsafe_test_mode"] = True  # type: ignore[index]
    assert parse_config(data).privacy.unsafe_test_mode


def test_scale_out_settings_default_and_override(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "c.yaml").write_text(GOOD)
    config = load_config(tmp_path / "c.yaml")
    # Unkeyed input is the safe default: it is repartitioned by pseudonym.
    assert config.input.keyed_by_user is False
    assert config.output.partials_topic == "stream-dp.partials"
    assert config.output.repartition_topic == "stream-dp.repartition"
    monkeypatch.setenv("STREAM_DP_INPUT__KEYED_BY_USER", "true")
    monkeypatch.setenv("STREAM_DP_OUTPUT__PARTIALS_TOPIC", "p-env")
    config = load_config(tmp_path / "c.yaml")
    assert config.input.keyed_by_user is True
    assert config.output.partials_topic == "p-env"


def test_unknown_output_key_lists_the_internal_topics(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _run_with(tmp_path, "output: {partial_topic: x}\n" + GOOD, capsys)
    assert code == 2
    assert "output.partial_topic" in err
    assert "partials_topic, repartition_topic, internal_retention_s" in err
    code, err = _run_with(tmp_path, "input: {keyed_by_user: maybe}\n" + GOOD, capsys)
    assert code == 2
    assert "input.keyed_by_user" in err


def test_internal_topics_are_named_after_the_group_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a.yaml").write_text("kafka: {group_id: team-a}\n" + GOOD)
    (tmp_path / "b.yaml").write_text(
        "kafka: {group_id: team-b}\noutput: {ledger_topic: b-ledger-by-hand}\n" + GOOD
    )
    a, b = load_config(tmp_path / "a.yaml"), load_config(tmp_path / "b.yaml")
    assert (
        a.output.dead_letter_topic,
        a.output.ledger_topic,
        a.output.partials_topic,
        a.output.repartition_topic,
    ) == ("team-a.dead-letter", "team-a.ledger", "team-a.partials", "team-a.repartition")
    assert b.output.ledger_topic == "b-ledger-by-hand"  # an explicit name wins
    assert b.output.partials_topic == "team-b.partials"
    # the output topic is the consumers' contract: the same default for every deployment
    assert a.output.topic == b.output.topic == "dp-releases"
    monkeypatch.setenv("STREAM_DP_KAFKA__GROUP_ID", "team-c")
    assert load_config(tmp_path / "a.yaml").output.ledger_topic == "team-c.ledger"


@pytest.mark.parametrize(
    ("window", "retention_s"),
    [
        ({}, 6 * 3600),  # hourly windows: the 6 h floor
        ({"size_s": 86_400, "grace_s": 3600, "idle_close_s": 60}, 3 * (86_400 + 3600 + 60)),
        ({"size_s": 10, "grace_s": 0, "idle_close_s": 0.5}, 6 * 3600),
    ],
)
def test_internal_retention_follows_the_window(window: dict[str, float], retention_s: int) -> None:
    data = {"window": window, "queries": [{"name": "q", "epsilon": 0.5, "delta": 1e-6}]}
    config = parse_config(data, environ={})
    assert config.output.internal_retention_s == retention_s
    assert config.output.internal_retention_ms == retention_s * 1000


def test_internal_retention_shorter_than_a_window_is_refused() -> None:
    data = {
        "window": {"size_s": 3600, "grace_s": 60, "idle_close_s": 30},
        "output": {"internal_retention_s": 1800},
        "queries": [{"name": "q", "epsilon": 0.5, "delta": 1e-6}],
    }
    with pytest.raises(ConfigError, match=r"output.internal_retention_s = 1800 is shorter than "
                       r"a window's life \(3690 s"):  # fmt: skip
        parse_config(data, environ={})
    data["output"] = {"internal_retention_s": 7200}
    assert parse_config(data, environ={}).output.internal_retention_s == 7200


def test_a_session_timeout_at_or_above_the_request_timeout_is_refused_with_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The broker may hold a request to join the group for up to the session timeout (the
    embedded broker held a new group's first join for half of it: with 60 s against the
    30 s request timeout a worker never joined); the worker would give up and join again."""
    text = "kafka: {session_timeout_ms: 60000}\n" + GOOD
    code, err = _run_with(tmp_path, text, capsys)
    assert code == 2
    assert "kafka.session_timeout_ms (60000) must be below kafka.request_timeout_ms (30000)" in err
    assert "Raise kafka.request_timeout_ms above the session timeout (for example to 70000)" in err
    assert "Traceback" not in err
    # Either fix loads: a longer request timeout, or a shorter session.
    for fixed in (
        "{session_timeout_ms: 60000, request_timeout_ms: 70000}",
        "{session_timeout_ms: 29000}",
    ):
        (tmp_path / "ok.yaml").write_text(f"kafka: {fixed}\n" + GOOD)
        assert load_config(tmp_path / "ok.yaml").kafka.session_timeout_ms in (60_000, 29_000)
    (tmp_path / "eq.yaml").write_text("kafka: {session_timeout_ms: 30000}\n" + GOOD)
    with pytest.raises(ConfigError, match=r"session_timeout_ms \(30000\) must be below"):
        load_config(tmp_path / "eq.yaml")
