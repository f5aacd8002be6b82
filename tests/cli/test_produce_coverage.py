"""`produce --file` warns, before sending, when the file's events are stamped before the
first window a worker covers (the worker would drop them as late and release nothing)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import orjson
import pytest
import yaml

from stream_dp.cli.main import main

T0_MS = 1_596_240_000_000  # 2020-08-01T00:00:00Z


def _config(tmp_path: Path, window: dict[str, object]) -> Path:
    path = tmp_path / "c.yaml"
    data = {
        "kafka": {"bootstrap_servers": "127.0.0.1:1"},
        "window": window,
        "queries": [{"name": "q", "epsilon": 1.0, "delta": 1e-6, "group_by": ["domain"]}],
    }
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def _events(tmp_path: Path) -> Path:
    path = tmp_path / "events.jsonl"
    lines = [
        orjson.dumps({"user_id": f"secret-user-{i}", "timestamp": T0_MS + i, "domain": "d.example"})
        for i in range(5)
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAM_DP_PSEUDONYM_KEY", secrets.token_hex(32))


def test_old_file_without_start_at_warns_naming_start_at(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path, {"size_s": 60})
    assert main(["produce", "--config", str(config), "--file", str(_events(tmp_path))]) == 1
    err = capsys.readouterr().err
    warning = next(line for line in err.splitlines() if "warning" in line)
    assert "5 of 5 usable events are stamped before the first window" in warning
    assert "window.start_at: 2020-08-01T00:00:00Z" in warning
    assert "secret-user" not in err  # counts and windows only
    assert "cannot reach the broker" in err  # the warning comes before sending


def test_file_within_coverage_gets_no_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path, {"size_s": 60, "start_at": "2020-08-01T00:00:00Z"})
    assert main(["produce", "--config", str(config), "--file", str(_events(tmp_path))]) == 1
    assert "warning" not in capsys.readouterr().err
    assert os.environ["STREAM_DP_PSEUDONYM_KEY"]
