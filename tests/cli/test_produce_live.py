"""``stream-dp produce --synthetic browser-logs --live``: events stamped *now*, continuously,
at a configurable rate, until stopped (the docker-compose producer)."""

from __future__ import annotations

import itertools
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from stream_dp.synthetic.browser_logs import (
    BrowserLogSpec,
    browser_log_events,
    live_browser_log_events,
    rare_domain,
    user_id,
)
from tests.cli.support import arun_cli, cli_argv, run_cli
from tests.helpers import ConfigFactory
from tests.integration.support import read_topic


def test_live_events_are_stamped_by_the_clock_when_taken() -> None:
    ticks = itertools.count(1_700_000_000_000, 7)
    spec = BrowserLogSpec(users=50, rare_domains=4, seed=3)
    events = list(itertools.islice(live_browser_log_events(spec, lambda: next(ticks)), 20_000))
    # one clock reading per event, in the order they are taken
    assert [e["timestamp"] for e in events] == list(
        range(1_700_000_000_000, 1_700_000_000_000 + 7 * len(events), 7)
    )
    assert {e["user_id"] for e in events} <= {user_id(u) for u in range(50)}
    # the same population as the batch generator of that seed (countries per user)
    batch = {e["user_id"]: e["country"] for e in browser_log_events(spec)}
    assert all(batch.get(e["user_id"], e["country"]) == e["country"] for e in events)
    # rare domains appear, each visited by one user only
    rare: dict[str, set[str]] = {
        e["domain"]: set() for e in events if e["domain"].startswith("rare-")
    }
    for e in events:
        if e["domain"] in rare:
            rare[e["domain"]].add(e["user_id"])
    assert rare and set(rare) <= {rare_domain(r) for r in range(4)}
    assert all(len(owners) == 1 for owners in rare.values())
    # heavy tail: the busiest user makes far more than the median user
    per_user = sorted(Counter(e["user_id"] for e in events).values())
    assert per_user[-1] > 5 * per_user[len(per_user) // 2]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--file", "x.jsonl", "--live"], "use it with --synthetic"),
        (["--synthetic", "browser-logs", "--live", "--windows", "2"], "remove --windows"),
        (["--synthetic", "browser-logs", "--live", "--start", "now"], "remove --windows"),
    ],
)
def test_live_refuses_options_that_make_no_sense(
    config_factory: ConfigFactory, extra: list[str], message: str
) -> None:
    done = run_cli("produce", "--config", str(config_factory()), *extra)
    assert done.returncode == 2
    assert message in done.stderr


@pytest.mark.kafka
async def test_live_events_are_now_and_paced(
    kafka_bootstrap: str, config_factory: ConfigFactory
) -> None:
    cfg = config_factory()
    config = load_config(cfg)
    await apply_topics(config, kafka_bootstrap, include_input=True)
    started_ms = time.time() * 1000
    done = await arun_cli(
        "produce", "--config", str(cfg), "--synthetic", "browser-logs", "--live",
        "--rate", "200", "--events", "300", "--json",
    )  # fmt: skip
    ended_ms = time.time() * 1000
    assert done.returncode == 0, done.stderr
    report = orjson.loads(done.stdout)
    assert report["records"] == 300
    # paced: 300 events at 200/s cannot take less than 1.5 s (a lower bound only)
    assert report["seconds"] >= 1.5 - 0.05
    records = await read_topic(kafka_bootstrap, config.input.topic, until=lambda r: len(r) >= 300)
    assert len(records) == 300
    stamps = [orjson.loads(value)["timestamp"] for _, value in records]
    assert all(started_ms <= t <= ended_ms for t in stamps)  # stamped now, not in 2020
    assert max(stamps) - min(stamps) >= 1000  # spread over the run, not one instant
    assert all(key == orjson.loads(value)["user_id"] for key, value in records)


@pytest.mark.kafka
async def test_live_runs_until_stopped(
    kafka_bootstrap: str, config_factory: ConfigFactory, tmp_path: Path
) -> None:
    cfg = config_factory()
    config = load_config(cfg)
    await apply_topics(config, kafka_bootstrap, include_input=True)
    out = tmp_path / "out"
    with out.open("wb") as handle:
        proc = subprocess.Popen(
            cli_argv(
                "produce",
                "--config",
                str(cfg),
                "--synthetic",
                "browser-logs",
                "--live",
                "--rate",
                "100",
                "--json",
            ),
            stdout=handle,
            stderr=subprocess.PIPE,
        )
    try:
        # 250 events at 100/s: no fixed batch, it is still going after 2.5 s
        records = await read_topic(
            kafka_bootstrap, config.input.topic, until=lambda r: len(r) >= 250, timeout_s=60
        )
        assert len(records) >= 250
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        report = orjson.loads(out.read_bytes())
        assert report["interrupted"] is True and report["records"] >= len(records)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stderr is not None
        proc.stderr.close()
