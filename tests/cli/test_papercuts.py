"""The small things a new user meets first: help text, `python -m stream_dp`, `run
--bootstrap-servers`, a typo in a config file key, and an unreachable broker in one line."""

from __future__ import annotations

import json
import os
import platform
import re
import secrets
import socket
import subprocess
import sys
from pathlib import Path

import aiokafka
import msgspec
import numpy
import pytest
import yaml

import stream_dp
from stream_dp.cli.main import main
from tests.cli.support import run_cli

UNREACHABLE = "127.0.0.1:1"
CONFIG = {
    "kafka": {"bootstrap_servers": UNREACHABLE, "startup_wait_s": 0},
    "queries": [{"name": "q", "epsilon": 1.0, "group_by": ["d"], "keys": {"d": ["a"]}}],
    "metrics": {"enabled": False},
}


def _write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def _key_env() -> dict[str, str]:
    return {**os.environ, "STREAM_DP_PSEUDONYM_KEY": secrets.token_hex(32)}


def test_plan_help_prints_single_percent_signs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    out = capsys.readouterr().out
    assert "95% interval" in out and "%%" not in out


#: ``stream-dp --version`` and a service's first log line: what a report from the field needs.
BUILD_LINE = re.compile(
    rf"stream-dp {re.escape(stream_dp.__version__)} \(Python "
    rf"{re.escape(platform.python_version())}; aiokafka {re.escape(aiokafka.__version__)}, "
    rf"msgspec {re.escape(msgspec.__version__)}, numpy {re.escape(numpy.__version__)}; "
    rf"{re.escape(platform.system())} {re.escape(platform.machine())}\)"
)


def test_python_dash_m_stream_dp_is_the_cli_and_its_version_names_the_build() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "stream_dp", "--version"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "COLUMNS": "40"},  # one line however narrow the terminal
    )
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert done.stdout.endswith("\n") and BUILD_LINE.fullmatch(done.stdout[:-1]), done.stdout


def test_config_file_key_typo_gets_did_you_mean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = {**CONFIG, "window": {"size_sec": 60}, "qeries": []}
    assert main(["plan", "--config", str(_write(tmp_path, data))]) == 2
    err = capsys.readouterr().err
    assert "window.size_sec" in err and "did you mean size_s?" in err
    assert "did you mean queries?" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["tail"],
        ["produce", "--synthetic", "browser-logs", "--events", "3"],
        ["run"],
    ],
)
def test_unreachable_broker_is_one_clean_line(argv: list[str], tmp_path: Path) -> None:
    done = run_cli(*argv, "--config", str(_write(tmp_path, CONFIG)), timeout_s=120, env=_key_env())
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    if argv == ["run"]:  # a service's log starts with the build it runs
        build, *lines = lines
        message = json.loads(build)["msg"]
        assert re.fullmatch(BUILD_LINE.pattern + ": worker of deployment stream-dp", message)
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("stream-dp: error: cannot ")
    assert UNREACHABLE in lines[0] and "kafka.bootstrap_servers" in lines[0]
    assert "KafkaConnectionError: KafkaConnectionError" not in lines[0]


def test_run_bootstrap_servers_overrides_the_config(tmp_path: Path) -> None:
    """The file names a broker that does not exist: --bootstrap-servers is the one tried."""
    data = {**CONFIG, "kafka": {"bootstrap_servers": "127.0.0.1:2", "startup_wait_s": 0}}
    argv = ["run", "--config", str(_write(tmp_path, data)), "--bootstrap-servers", UNREACHABLE]
    done = run_cli(*argv, timeout_s=120, env=_key_env())
    assert done.returncode == 1, done.stderr
    assert f"on {UNREACHABLE}:" in done.stderr and "127.0.0.1:2" not in done.stderr


def test_a_metrics_port_in_use_is_one_line_naming_the_setting(tmp_path: Path) -> None:
    """A second sink beside another on the same host: its --metrics-port is taken. The
    command ends in one line that names the address and the option to change — no
    traceback — before it reaches the database or the broker (both unreachable here)."""
    data = {**CONFIG, "metrics": {"enabled": True, "host": "127.0.0.1"}}
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        argv = ["sink", "--config", str(_write(tmp_path, data)), "--metrics-port", str(port)]
        done = run_cli(
            *argv, "--postgres", "postgresql://u@127.0.0.1:1/db", timeout_s=120, env=_key_env()
        )
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    build, *rest = done.stderr.splitlines()  # a service's log starts with its build
    message = json.loads(build)["msg"]
    assert re.fullmatch(BUILD_LINE.pattern + ": sink of deployment stream-dp", message)
    assert rest == [
        f"stream-dp: error: metrics and health endpoints: 127.0.0.1:{port} is already in "
        "use; set --metrics-port to a free port (another process, e.g. a second worker or "
        "sink on this host, may hold it)"
    ]


def _plan(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["plan", "--json", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_configuration_defaults_to_stream_dp_config_then_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--config, else $STREAM_DP_CONFIG, else ./stream-dp.yaml: each gives the plan of its
    own file (two files with different ε tell which one was read)."""
    named = _write(tmp_path, CONFIG)
    other = {**CONFIG, "queries": [{**CONFIG["queries"][0], "epsilon": 0.5}]}  # type: ignore[index]
    (tmp_path / "cwd").mkdir()
    (tmp_path / "cwd" / "stream-dp.yaml").write_text(yaml.safe_dump(other), encoding="utf-8")
    monkeypatch.chdir(tmp_path / "cwd")
    monkeypatch.delenv("STREAM_DP_CONFIG", raising=False)

    code, from_cwd, err = _plan(capsys)
    assert (code, err) == (0, "")
    code, explicit, err = _plan(capsys, "--config", str(named))
    assert (code, err) == (0, "")
    monkeypatch.setenv("STREAM_DP_CONFIG", str(named))
    code, from_env, err = _plan(capsys)
    assert (code, err) == (0, "")
    code, overridden, err = _plan(capsys, "--config", str(tmp_path / "cwd" / "stream-dp.yaml"))
    assert (code, err) == (0, "")

    assert from_env == explicit != from_cwd == overridden
    assert '"epsilon":0.5' in from_cwd.replace(" ", "")


def test_no_configuration_anywhere_is_one_line_with_the_three_ways(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("STREAM_DP_CONFIG", raising=False)
    code, out, err = _plan(capsys)
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        "stream-dp: error: no configuration file: pass --config FILE, set "
        f"STREAM_DP_CONFIG=FILE, or put stream-dp.yaml in the working directory ({tmp_path}); "
        "`stream-dp examples DIR` writes configurations to adapt"
    ]
