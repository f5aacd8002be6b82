"""Operations against a running worker: /metrics moves as the events say, health transitions,
and a paused broker (SIGSTOP/SIGCONT) costs no window and releases none twice."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from stream_dp.broker.embedded import EmbeddedBroker
from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from tests.integration.support import (
    NOISE_FREE,
    ONE_PUBLIC_KEY_QUERY,
    decode_values,
    free_port,
    http_get,
    produce,
    produce_events,
    read_topic,
    start_worker,
    topics_of,
    wait_status,
    windows_done,
)
from tests.integration.test_recovery import _ledger_release_ids

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
MakeConfig = Callable[[dict[str, Any] | None], Path]
T0 = 1_596_240_000


def _samples(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    code, body = http_get(port, "/metrics")
    assert code == 200
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _events(window: int, users: range, at: float) -> list[dict[str, Any]]:
    return [
        {"user_id": f"u{u}", "timestamp": T0 + window * 10 + at, "domain": "a.example"}
        for u in users
    ]


async def test_metrics_count_what_the_events_say(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    port = free_port()
    cfg = config_factory(
        {
            "privacy": NOISE_FREE,
            "metrics": {"port": port},
            "window": {"size_s": 10, "grace_s": 1, "idle_close_s": 30},
            "bounds": {"max_contributions_per_window": 100},
            "queries": ONE_PUBLIC_KEY_QUERY,
        }
    )
    await apply_topics(load_config(cfg), kafka_bootstrap, include_input=True)
    topics = topics_of(cfg)
    worker = start_worker(cfg, tmp_path / "worker.log")
    try:
        await wait_status(port, "/health/live", 200, 30)
        await wait_status(port, "/health/ready", 200, 30)  # ready only after assignment
        good_w0 = _events(0, range(40), 3)
        bad = [b"{nope", b"[]", b'{"user_id": "x"}']
        await produce_events(kafka_bootstrap, topics["input"], good_w0 + _events(1, range(40), 4))
        await produce(kafka_bootstrap, topics["input"], bad, lambda v: None)
        await read_topic(
            kafka_bootstrap, topics["output"], until=windows_done(["visits"], 1), timeout_s=30
        )
        late = _events(0, range(7), 5)  # window 0 is closed: these are late
        await produce_events(kafka_bootstrap, topics["input"], late)
        expected_consumed = len(good_w0) + 40 + len(bad) + len(late)
        deadline = time.monotonic() + 30
        while True:
            m = _samples(port)
            # Late events are counted by stage 1, after the repartition round trip.
            if m.get(("stream_dp_events_consumed_total", ()), 0) >= expected_consumed and m.get(
                ("stream_dp_late_events_total", ()), 0
            ) >= len(late):
                break
            assert time.monotonic() < deadline, m
            await asyncio.sleep(0.2)
    finally:
        assert worker.terminate() == 0, worker.log()
    assert m[("stream_dp_events_consumed_total", ())] == expected_consumed
    assert m[("stream_dp_late_events_total", ())] == len(late)
    assert m[("stream_dp_bad_records_total", (("reason", "not_json"),))] == 1
    assert m[("stream_dp_bad_records_total", (("reason", "not_object"),))] == 1
    assert m[("stream_dp_bad_records_total", (("reason", "missing_timestamp"),))] == 1
    assert m[("stream_dp_windows_released_total", (("query", "visits"),))] == 1
    assert m[("stream_dp_releases_published_total", (("query", "visits"),))] == 1
    assert m[("stream_dp_windows_open", ())] == 1
    assert m[("stream_dp_ready", ())] == 1


@pytest.fixture
def own_broker() -> Iterator[EmbeddedBroker]:
    """A broker of this test's own: it is paused, which must not stall other tests."""
    with EmbeddedBroker() as broker:
        yield broker


async def test_paused_broker_not_ready_then_resumes_exactly_once(
    own_broker: EmbeddedBroker, config_factory: MakeConfig, tmp_path: Path
) -> None:
    port = free_port()
    bootstrap = own_broker.bootstrap_servers
    cfg = config_factory(
        {
            "kafka": {"bootstrap_servers": bootstrap},
            "privacy": NOISE_FREE,
            "metrics": {"port": port},
            "window": {"size_s": 10, "grace_s": 1, "idle_close_s": 5},
            "bounds": {"max_contributions_per_window": 100},
            "queries": ONE_PUBLIC_KEY_QUERY,
        }
    )
    await apply_topics(load_config(cfg), bootstrap, include_input=True)
    topics = topics_of(cfg)
    await produce_events(
        bootstrap, topics["input"], _events(0, range(30), 2) + _events(1, range(30), 3)
    )
    worker = start_worker(cfg, tmp_path / "worker.log")
    try:
        await wait_status(port, "/health/ready", 200, 30)
        await read_topic(
            bootstrap, topics["output"], until=windows_done(["visits"], 1), timeout_s=30
        )
        os.kill(own_broker.pid, signal.SIGSTOP)  # mid-window 1
        paused_at = time.monotonic()
        try:
            await wait_status(port, "/health/ready", 503, 15)
            code, _ = await asyncio.to_thread(http_get, port, "/health/live")
            assert code == 200  # liveness does not depend on the broker
            remaining = 22 - (time.monotonic() - paused_at)
            await asyncio.sleep(max(0.0, remaining))  # keep the broker paused ~22 s
        finally:
            os.kill(own_broker.pid, signal.SIGCONT)
        await wait_status(port, "/health/ready", 200, 60)
        await produce_events(
            bootstrap, topics["input"], _events(1, range(30, 45), 8) + _events(2, range(40), 5)
        )
        out = await read_topic(
            bootstrap,
            topics["output"],
            until=windows_done(["visits"], 2),
            timeout_s=60,
            settle_s=1.0,
        )
        assert worker.proc.poll() is None, worker.log()  # no crash
    finally:
        assert worker.terminate() == 0, worker.log()
    values: dict[str, list[int]] = defaultdict(list)
    for _, v in decode_values(out):
        if v["kind"] == "release":
            values[v["window_start"]].append(v["value"])
    assert values["2020-08-01T00:00:00Z"] == [30]
    assert values["2020-08-01T00:00:10Z"] == [45]  # nothing lost across the outage
    ids = _ledger_release_ids(await read_topic(bootstrap, topics["ledger"]))
    assert len(ids) == 2 and all(len(v) == 1 for v in ids.values())
    assert b"u1" not in b"".join(orjson.dumps(v) for _, v in decode_values(out))
