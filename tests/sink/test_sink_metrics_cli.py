"""The sink's metrics follow the project's naming rules; its command refuses bad arguments
with exit code 2 and a message that says what to do."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from stream_dp.sink.metrics import SinkMetrics
from stream_dp.sink.rows import BAD_REASONS
from tests.cli.support import run_cli
from tests.ops.test_metrics_naming import ALLOWED_LABELS, naming_violations


def test_sink_metrics_follow_the_naming_rules() -> None:
    m = SinkMetrics(partitions=[0, 1])
    m.records_consumed.inc(3)
    m.transaction.observe(0.01)
    m.set_consumer_lag(1, -4)  # negative lag (embedded broker) shows as 0
    text = m.exposition().decode()
    assert naming_violations(text) == []
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert all(name.startswith("stream_dp_sink_") for name in families)
    labels = {k for f in families.values() for s in f.samples for k in s.labels}
    assert labels <= ALLOWED_LABELS | {"version", "python"}
    reasons = {s.labels["reason"] for s in families["stream_dp_sink_bad_records"].samples}
    assert reasons == set(BAD_REASONS)  # every reason exists from the start, at 0
    assert "stream_dp_sink_consumer_lag_records" in m.names()


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(
        "kafka: {bootstrap_servers: '127.0.0.1:1'}\n"
        "queries: [{name: q, group_by: [domain], epsilon: 1.0, delta: 1.0e-6}]\n",
        encoding="utf-8",
    )
    return path


def test_sink_needs_a_database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STREAM_DP_POSTGRES_DSN", raising=False)
    result = run_cli("sink", "--config", str(_config(tmp_path)))
    assert result.returncode == 2
    assert "--postgres" in result.stderr and "STREAM_DP_POSTGRES_DSN" in result.stderr


def test_sink_refuses_a_malformed_dsn(tmp_path: Path) -> None:
    result = run_cli("sink", "--config", str(_config(tmp_path)), "--postgres", "host localhost")
    assert result.returncode == 2
    assert "not a valid libpq connection string" in result.stderr


@pytest.mark.parametrize("flag", ["--lock-timeout-s", "--statement-timeout-s"])
def test_sink_refuses_a_timeout_that_is_not_positive(tmp_path: Path, flag: str) -> None:
    result = run_cli(
        "sink", "--config", str(_config(tmp_path)), "--postgres", "host=localhost", flag, "0"
    )
    assert result.returncode == 2
    assert f"{flag} 0" in result.stderr and "positive number of seconds" in result.stderr
