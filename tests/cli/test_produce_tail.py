"""``stream-dp produce`` and ``stream-dp tail`` as real processes against the session broker,
with a worker (``stream-dp run``) between them."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from stream_dp.synthetic.browser_logs import BrowserLogSpec, browser_log_events
from tests.apache_kafka.tier import ON_BOTH_BROKERS
from tests.cli.support import arun_cli
from tests.helpers import ConfigFactory, schema_validator
from tests.integration.support import read_topic, start_worker, topics_of

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

QUERIES = [
    {"name": "visits_by_domain", "group_by": ["domain"], "epsilon": 0.5, "delta": 1e-6},
    {
        "name": "users_by_country",
        "statistic": "count_distinct_users",
        "group_by": ["country"],
        "keys": {"country": ["DE", "FR", "NL", "US"]},
        "epsilon": 0.5,
    },
]
T0 = 1_596_240_000  # 2020-08-01T00:00:00Z, BrowserLogSpec's default start
CAP = 3000
RATE = 4000.0


def _report(stdout: str) -> dict[str, Any]:
    (line,) = stdout.strip().splitlines()
    report: dict[str, Any] = json.loads(line)
    assert report["kind"] == "produce_report"
    return report


async def test_produce_then_tail(
    kafka_bootstrap: str, config_factory: ConfigFactory, tmp_path: Path
) -> None:
    cfg = config_factory(
        {
            "bounds": {
                "max_contributions_per_window": 20,
                "max_keys_per_user": 3,
                "max_contributions_per_key": 10,
            },
            "queries": QUERIES,
        }
    )
    await apply_topics(load_config(cfg), kafka_bootstrap, include_input=True)
    topics = topics_of(cfg)
    worker = start_worker(cfg, tmp_path / "worker.log")
    try:
        # Windows 1-2: synthetic browser logs, capped by --events.
        synthetic = list(browser_log_events(BrowserLogSpec(users=200, windows=2)))
        assert len(synthetic) > CAP  # so the cap is what stops it
        done = await arun_cli(
            "produce", "--config", str(cfg), "--synthetic", "browser-logs",
            "--users", "200", "--windows", "2", "--events", str(CAP), "--json",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        first = _report(done.stdout)
        assert first["records"] == CAP
        assert first["bytes"] == sum(len(orjson.dumps(e)) for e in synthetic[:CAP])
        assert first["topic"] == topics["input"]

        # Window 3: a JSON-lines file with one line that is not JSON, throttled by --rate.
        later = list(browser_log_events(BrowserLogSpec(users=100, windows=1, start_s=T0 + 20)))
        lines = [orjson.dumps(e) for e in later] + [b"", b"not json"]
        path = tmp_path / "events.jsonl"
        path.write_bytes(b"\n".join(lines) + b"\n")
        done = await arun_cli(
            "produce", "--config", str(cfg), "--file", str(path), "--rate", str(RATE), "--json"
        )
        assert done.returncode == 0, done.stderr
        second = _report(done.stdout)
        assert second["records"] == len(later) + 1  # blank line skipped
        assert second["unkeyed"] == 1
        assert second["seconds"] >= 0.95 * second["records"] / RATE

        # The input topic holds exactly what produce reported, keyed by user id.
        total = first["records"] + second["records"]
        records = await read_topic(
            kafka_bootstrap, topics["input"], until=lambda r: len(r) >= total, settle_s=0.5
        )
        assert len(records) == total
        for key, value in records:
            if value == b"not json":
                assert key is None
            else:
                assert key == orjson.loads(value)["user_id"]

        # tail: every (query, window) once, releases before their window record.
        n_groups = len(QUERIES) * 3
        done = await arun_cli(
            "tail", "--config", str(cfg), "--from-beginning", "--json",
            "--max-windows", str(n_groups), timeout_s=90,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        shown = [json.loads(line) for line in done.stdout.splitlines()]
        validator = schema_validator("output.schema.json")
        for record in shown:
            validator.validate(record)
        window_records = [r for r in shown if r["kind"] == "window"]
        assert len(window_records) == n_groups
        assert len({(r["query"], r["window_start"]) for r in window_records}) == n_groups
        assert {r["window_start"] for r in window_records} == {
            "2020-08-01T00:00:00Z", "2020-08-01T00:00:10Z", "2020-08-01T00:00:20Z",
        }  # fmt: skip
        releases_seen: Counter[tuple[str, str]] = Counter()
        for r in shown:
            group = (r["query"], r["window_start"])
            if r["kind"] == "release":
                releases_seen[group] += 1
            else:  # the window record closes its group: all its releases came first
                assert releases_seen[group] == r["released_keys"]
        assert not any(
            r["group"].get("domain", "").startswith("rare-")
            for r in shown
            if r["kind"] == "release"
        )

        # Byte for byte what an independent reader finds on the topic (deduplicated).
        raw_lines = [line.encode() for line in done.stdout.splitlines()]
        # Wait for at least what tail showed (a loaded machine can pause the reader for more
        # than its quiet second), then a second more for any extra record (a second draw).
        on_topic = await read_topic(
            kafka_bootstrap,
            topics["output"],
            until=lambda r: len({v for _, v in r}) >= len(set(raw_lines)),
            settle_s=1.0,
        )
        assert sorted(raw_lines) == sorted({v for _, v in on_topic})

        # The readable form: one table per (query, window).
        done = await arun_cli(
            "tail", "--config", str(cfg), "--from-beginning", "--max-windows", "2"
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.count(" · 2020-08-01T00:00:00Z → 2020-08-01T00:00:10Z · ") == 2
        assert "users_by_country" in done.stdout and "95% CI" in done.stdout
    finally:
        code = worker.terminate()
    assert code == 0, worker.log()


@ON_BOTH_BROKERS
async def test_produce_refuses_a_missing_topic(
    kafka_bootstrap: str, config_factory: ConfigFactory
) -> None:
    cfg = config_factory()
    done = await arun_cli(
        "produce", "--config", str(cfg), "--synthetic", "browser-logs", "--events", "10"
    )
    assert (done.returncode, done.stdout, done.stderr) == (
        1,
        "",
        f"stream-dp: error: topic {topics_of(cfg)['input']} does not exist on "
        f"{kafka_bootstrap}; create it with `stream-dp topics apply --config FILE`\n",
    )


@ON_BOTH_BROKERS
async def test_tail_waits_for_its_topic_then_idles_out(
    kafka_bootstrap: str, config_factory: ConfigFactory
) -> None:
    cfg = config_factory()
    done = await arun_cli("tail", "--config", str(cfg), "--idle-timeout", "1")
    assert (done.returncode, done.stdout, done.stderr) == (
        0,
        "",
        f"stream-dp tail: waiting for topic {topics_of(cfg)['output']} on {kafka_bootstrap} "
        "to appear\n",
    )
