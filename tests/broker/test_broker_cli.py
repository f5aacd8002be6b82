"""`stream-dp broker` in the foreground, and the command list of `stream-dp --help`."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from stream_dp.broker import EmbeddedBroker
from stream_dp.broker.probe import probe_sync
from tests.helpers import read_line, tansu_pids, wait_for_exit

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "stream_dp.cli.main"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_help_lists_broker_and_topics() -> None:
    result = subprocess.run([*CLI, "--help"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    commands = result.stdout.split("positional arguments:")[1]
    assert "broker" in commands and "topics" in commands


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_broker_command_runs_until_signalled(sig: signal.Signals) -> None:
    port = _free_port()
    proc = subprocess.Popen(
        [*CLI, "broker", "--port", str(port)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert read_line(proc.stdout, timeout_s=30) == f"bootstrap: 127.0.0.1:{port}\n"
        [broker_pid] = tansu_pids(port)
        assert probe_sync("127.0.0.1", port, timeout_s=5)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err
        wait_for_exit(broker_pid, timeout_s=10)
        assert tansu_pids(port) == []
    finally:
        proc.kill()
        proc.communicate()
        for pid in tansu_pids(port):  # only after a failure: leave nothing behind
            os.kill(pid, signal.SIGKILL)


def test_broker_command_on_a_taken_port_fails_with_the_reason(
    embedded_broker: EmbeddedBroker,
) -> None:
    result = subprocess.run(
        [*CLI, "broker", "--port", str(embedded_broker.port), "--startup-timeout-s", "10"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert f"port {embedded_broker.port} is taken" in result.stderr
    assert result.stdout == ""
