"""Invariant 8: the worker refuses to start without a secret pseudonym key; keys never print."""

from __future__ import annotations

import base64
import logging
import secrets
from pathlib import Path

import pytest

from stream_dp.cli.main import main
from stream_dp.config import parse_config
from stream_dp.errors import ConfigError
from stream_dp.pipeline.stages.keys import ephemeral_keyring, load_keyring

CONFIG = "queries: [{name: q, epsilon: 0.5, delta: 1.0e-6}]\n"


def test_run_refuses_without_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STREAM_DP_PSEUDONYM_KEY", raising=False)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(CONFIG)
    assert main(["run", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "STREAM_DP_PSEUDONYM_KEY" in err and "openssl rand -hex 32" in err


def test_short_key_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAM_DP_PSEUDONYM_KEY", "tooshort")
    with pytest.raises(ConfigError, match="at least 32"):
        load_keyring(
            parse_config({"queries": [{"name": "q", "epsilon": 1, "delta": 1e-6}]}).pseudonymization
        )


def test_key_file_and_rotation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    new_key, old_key = secrets.token_hex(32), base64.b64encode(secrets.token_bytes(32))
    (tmp_path / "new.key").write_text(new_key + "\n")
    monkeypatch.setenv("OLD_KEY", old_key.decode())
    config = parse_config(
        {
            "pseudonymization": {
                "key_file": str(tmp_path / "new.key"),
                "key_id": "new",
                "previous_key_env": "OLD_KEY",
                "previous_key_id": "old",
                "rotate_at": "2020-08-01T00:00:00Z",
            },
            "queries": [{"name": "q", "epsilon": 1, "delta": 1e-6}],
        }
    )
    ring = load_keyring(config.pseudonymization)
    assert ring.for_window(1596240000 - 3600).key_id == "old"
    assert ring.for_window(1596240000).key_id == "new"
    # the HMAC key is the configured text's bytes, never its decoded form
    assert ring.current.key == new_key.encode()
    assert ring.previous is not None and ring.previous.key == old_key


def test_ephemeral_key_says_so(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        ring = ephemeral_keyring()
    assert "ephemeral pseudonym key" in caplog.text
    assert ring.current.key.hex() not in caplog.text
