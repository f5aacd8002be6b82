"""A worker started before its broker (a compose stack, a node reboot) waits for it —
``kafka.startup_wait_s``, a WARNING naming what it waits for — instead of exiting at once
into a supervisor's crash loop; past the wait it stops with one line naming the setting."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

import stream_dp
from tests.cli.support import LineReader
from tests.helpers import read_line, tansu_pids

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "stream_dp.cli.main"]
#: Hang guards only: each wait ends on a line the child prints.
LINE_TIMEOUT_S = 120.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _config(tmp_path: Path, bootstrap: str, wait_s: float, metrics_port: int = 0) -> Path:
    path = tmp_path / "c.yaml"
    data = {
        "kafka": {
            "bootstrap_servers": bootstrap,
            "startup_wait_s": wait_s,
            "group_id": f"wait-{secrets.token_hex(4)}",
        },
        "input": {"topic": f"in-{secrets.token_hex(4)}"},
        "queries": [{"name": "q", "epsilon": 1.0, "group_by": ["d"], "keys": {"d": ["a"]}}],
        "metrics": {"enabled": metrics_port > 0, "port": metrics_port, "live_timeout_s": 1},
        "logging": {"format": "json"},
    }
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def _env() -> dict[str, str]:
    return {**os.environ, "STREAM_DP_PSEUDONYM_KEY": secrets.token_hex(32)}


def _messages(lines: list[str]) -> list[tuple[str, str]]:
    out = []
    for line in lines:
        record = json.loads(line)
        out.append((record["level"], record["msg"]))
    return out


def test_past_the_wait_the_worker_stops_with_one_line_naming_the_setting(tmp_path: Path) -> None:
    port = _free_port()  # nothing listens there
    done = subprocess.run(
        [*CLI, "run", "--config", str(_config(tmp_path, f"127.0.0.1:{port}", 3))],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=LINE_TIMEOUT_S,
        env=_env(),
        check=False,
    )
    assert (done.returncode, done.stdout) == (1, ""), done.stderr
    build, *logged, last = done.stderr.splitlines()
    level, message = _messages([build])[0]
    assert level == "INFO" and message.startswith(f"stream-dp {stream_dp.__version__} (Python ")
    assert _messages(logged) == [
        (
            "WARNING",
            f"worker: no Kafka broker answers at 127.0.0.1:{port} yet ([Errno 111] Connect "
            f"call failed ('127.0.0.1', {port})); waiting up to 3 s for one "
            "(kafka.startup_wait_s)",
        )
    ]
    assert last.startswith(f"stream-dp: error: no Kafka broker answered at 127.0.0.1:{port} ")
    assert last.endswith(
        "waited kafka.startup_wait_s = 3 s (raise it to wait longer for a broker that starts "
        "slowly)"
    )


def _next_warning(lines: LineReader) -> list[tuple[str, str]]:
    """The next WARNING (or worse) line's (level, message), past INFO lines."""
    while (line := lines.next(LINE_TIMEOUT_S)) is not None:
        [(level, msg)] = _messages([line])
        if level != "INFO":
            return [(level, msg)]
    raise AssertionError("the worker's output ended without a warning")


def _health(port: int, path: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def _wait_for_progress_beats(port: int, beats: int) -> dict[str, Any]:
    """/health/live once the wait has beaten ``beats`` times (each round without a broker
    is one: the back-off's ceiling is 1 s, so this takes seconds)."""
    deadline = time.monotonic() + LINE_TIMEOUT_S
    while time.monotonic() < deadline:
        status, body = _health(port, "/health/live")
        if body["progress_beats"] >= beats:
            assert status == 200, body
            return body
        time.sleep(0.2)  # polling a condition, bounded by the deadline
    raise AssertionError(f"fewer than {beats} progress beats in {LINE_TIMEOUT_S:g} s")


def test_a_broker_that_comes_up_during_the_wait_is_used(tmp_path: Path) -> None:
    port, http_port = _free_port(), _free_port()
    worker = subprocess.Popen(
        [*CLI, "run", "--config", str(_config(tmp_path, f"127.0.0.1:{port}", 600, http_port))],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    broker: subprocess.Popen[str] | None = None
    assert worker.stderr is not None
    lines = LineReader(worker.stderr)
    try:
        assert _next_warning(lines) == [
            (
                "WARNING",
                f"worker: no Kafka broker answers at 127.0.0.1:{port} yet ([Errno 111] "
                f"Connect call failed ('127.0.0.1', {port})); waiting up to 600 s for one "
                "(kafka.startup_wait_s)",
            )
        ]
        # Waiting is alive (restarting would not help) and not ready; live_timeout_s is 1 s
        # and the wait outlasts it, so only the wait's own beats keep /health/live at 200.
        live = _wait_for_progress_beats(http_port, 5)
        assert live["last_progress_step"] == "waiting for the broker"
        status, ready = _health(http_port, "/health/ready")
        assert (status, ready["ready"]) == (503, False)
        broker = subprocess.Popen(
            [*CLI, "broker", "--port", str(port)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert broker.stdout is not None
        started = read_line(broker.stdout, timeout_s=LINE_TIMEOUT_S)
        assert started == f"bootstrap: 127.0.0.1:{port}\n"
        assert _next_warning(lines) == [
            ("WARNING", f"worker: the broker at 127.0.0.1:{port} answers; starting")
        ]
        # Still running: it went on to the topics and its group, not into an error.
        assert worker.poll() is None
        worker.send_signal(signal.SIGTERM)
        rest = lines.rest(LINE_TIMEOUT_S)
        assert worker.wait(timeout=LINE_TIMEOUT_S) == 0, rest
        assert not [m for m in _messages(rest) if m[0] in {"ERROR", "CRITICAL"}], rest
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        lines.close()
        if broker is not None:
            broker.send_signal(signal.SIGTERM)
            broker.communicate(timeout=LINE_TIMEOUT_S)
        for pid in tansu_pids(port):  # only after a failure: leave nothing behind
            os.kill(pid, signal.SIGKILL)
