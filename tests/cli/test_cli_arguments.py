"""Argument and configuration errors of ``demo``, ``produce`` and ``tail``: exit code 2 and a
message that says the fix — checked in-process, no broker needed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from stream_dp.cli.main import main

MINIMAL = {
    "kafka": {"bootstrap_servers": "embedded"},
    "queries": [{"name": "visits", "group_by": ["domain"], "epsilon": 1.0, "delta": 1e-6}],
}


@pytest.fixture
def embedded_config(tmp_path: Path) -> Path:
    path = tmp_path / "embedded.yaml"
    path.write_text(yaml.safe_dump(MINIMAL), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "argv",
    [
        ["produce", "--synthetic", "browser-logs"],
        ["tail"],
    ],
)
def test_embedded_broker_is_not_a_running_broker(
    argv: list[str], embedded_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--config", str(embedded_config)]) == 2
    err = capsys.readouterr().err
    assert "needs a running broker" in err
    assert "stream-dp broker" in err and "--bootstrap-servers" in err


def test_produce_file_options_are_checked(
    embedded_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = tmp_path / "events.jsonl"
    events.write_text("{}\n", encoding="utf-8")
    argv = ["produce", "--config", str(embedded_config), "--bootstrap-servers", "127.0.0.1:1"]
    assert main([*argv, "--file", str(events), "--users", "5"]) == 2
    assert "--synthetic only" in capsys.readouterr().err
    assert main([*argv, "--file", str(tmp_path / "missing.jsonl")]) == 2
    assert "missing.jsonl" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--epsilon", "0"], "ε must be above 0"),
        (["demo", "--epsilon", "1000"], "at most 100"),
        (["demo", "--windows", "0"], "from 1 to"),
        (["demo", "--users", "abc"], "not a whole number"),
        (["produce", "--config", "x.yaml"], "one of the arguments --synthetic --file"),
        (
            ["produce", "--config", "x.yaml", "--synthetic", "browser-logs", "--rate", "-5"],
            "above 0",
        ),
        (["produce", "--config", "x.yaml", "--file", "f", "--start", "yesterday"], "ISO-8601"),
        (["tail", "--config", "x.yaml", "--idle-timeout", "0"], "above 0"),
        (["tail", "--config", "x.yaml", "--max-windows", "0"], "at least 1"),
    ],
)
def test_bad_arguments_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
