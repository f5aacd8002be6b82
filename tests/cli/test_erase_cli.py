"""``stream-dp erase`` and ``stream-dp replay --erasures`` from the command line
(docs/erasure.md): refusals with the fix, the response records, and a request nobody
answers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import orjson
import pytest

from stream_dp.broker.topics import apply_topics
from stream_dp.cli.main import main
from stream_dp.config import load_config
from tests.apache_kafka.tier import ON_BOTH_BROKERS
from tests.cli.support import arun_cli
from tests.helpers import ConfigFactory, schema_validator
from tests.integration.support import read_topic

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "stream_dp" / "examples" / "browser-logs.yaml"
SAMPLE = ROOT / "stream_dp" / "examples" / "sample-events.jsonl"
USER = "employee-0274@corp.example"


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAM_DP_PSEUDONYM_KEY", os.urandom(32).hex())


def test_erase_refuses_a_deployment_without_erasure(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["erase", "--config", str(CONFIG), "--user-id", USER])
    _, err = capsys.readouterr()
    assert code == 2
    assert "set erasure.enabled: true" in err
    assert USER not in err


def test_erase_refuses_a_bad_requested_at(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STREAM_DP_ERASURE__ENABLED", "true")
    code = main(
        ["erase", "--config", str(CONFIG), "--user-id", USER, "--requested-at", "yesterday"]
    )
    assert code == 2
    assert "--requested-at must be ISO-8601" in capsys.readouterr().err


def test_replay_prints_one_response_per_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    requests = tmp_path / "erasures.jsonl"
    requests.write_text(
        json.dumps(
            {"user_id": USER.upper(), "requested_at": "2020-08-01T01:30:00Z", "request_id": "r1"}
        )
        + "\n\n"
        + json.dumps({"user_id": 17, "requested_at": 1596240000, "request_id": "r2"})
        + "\n"
    )
    args = ["replay", "--config", str(CONFIG), "--input", str(SAMPLE), "--erasures", str(requests)]
    assert main([*args, "--json"]) == 0
    out, _ = capsys.readouterr()
    responses = [r for r in map(json.loads, out.splitlines()) if r["kind"] == "erasure_response"]
    validator = schema_validator("erasure_response.schema.json")
    for response in responses:
        validator.validate(response)
    assert [(r["request_id"], r["open_windows_affected"]["from"]) for r in responses] == [
        ("r1", "2020-08-01T01:00:00Z"),  # window 00:00 was released at 01:01, before 01:30
        ("r2", "2020-08-01T00:00:00Z"),
    ]
    assert USER not in out and USER.upper() not in out
    assert main(args) == 0
    out, _ = capsys.readouterr()
    assert "erasure r1: windows 2020-08-01T01:00:00Z" in out


def test_replay_stops_at_a_bad_request(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    requests = tmp_path / "erasures.jsonl"
    requests.write_text('{"user_id": "x", "request_id": "r1"}\n')
    code = main(
        ["replay", "--config", str(CONFIG), "--input", str(SAMPLE), "--erasures", str(requests)]
    )
    assert code == 2
    assert "line 1 is not an erasure request: requested_at" in capsys.readouterr().err


@ON_BOTH_BROKERS
async def test_erase_sends_a_request_and_says_when_nobody_answers(
    kafka_bootstrap: str, config_factory: ConfigFactory
) -> None:
    cfg = config_factory({"erasure": {"enabled": True}})
    config = load_config(cfg)
    await apply_topics(config, kafka_bootstrap, include_input=False)
    result = await arun_cli(
        "erase", "--config", str(cfg), "--user-id", USER, "--request-id", "dsr-9", "--wait", "2"
    )
    assert (result.returncode, result.stdout, result.stderr) == (
        1,
        f"erasure request dsr-9 sent to {config.erasure.requests_topic}\n",
        f"stream-dp: error: no response to erasure request dsr-9 on "
        f"{config.erasure.responses_topic} within 2 s: is a worker with erasure.enabled "
        "running? The request stays queued and is applied when one reads it\n",
    )
    (record,) = await read_topic(kafka_bootstrap, config.erasure.requests_topic)
    assert record[0] == "dsr-9"
    request = orjson.loads(record[1])
    schema_validator("erasure.schema.json").validate(request)
    assert request["user_id"] == USER
