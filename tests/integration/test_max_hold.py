"""A window held back past ``output.max_hold_s`` stops the worker before retention can
delete the internal records it pins; open windows holding more than
``window.max_held_state_bytes`` pause fetching, then stop the worker — never an OOM kill.

One input partition fetches nothing (``STREAM_DP_TEST_STALL_INPUT``) while its events
wait: stage 1 holds window 0 open on the repartition topic, so the group's committed
offsets there stay at its first record. Retention deletes by record age whatever the group
committed; the worker stops first — ERROR saying what to do, not ready, metrics — instead
of waiting until a restart meets the gap.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from tests.helpers import ConfigFactory
from tests.integration.support import (
    HANG_GUARD_S,
    NOISE_FREE,
    ONE_PUBLIC_KEY_QUERY,
    WorkerProcess,
    free_port,
    http_get,
    metric_value,
    start_worker,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
T0 = 1_596_240_000  # 2020-08-01T00:00:00Z, the factory's start_at
STALLED = 1
MAX_HOLD_S = 20  # above a window's life here (10 + 1 + 2 s), far below the stall


async def _wait_for_stop(port: int, worker: WorkerProcess) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while (metric_value(port, "stream_dp_max_hold_exceeded_total") or 0) < 1:
        assert worker.proc.poll() is None, f"worker exited:\n{worker.log()[-4000:]}"
        assert time.monotonic() < deadline, f"no stop:\n{worker.log()[-4000:]}"
        await asyncio.sleep(0.5)


async def test_a_window_held_past_the_maximum_stops_the_worker(
    kafka_bootstrap: str, config_factory: ConfigFactory, tmp_path: Path
) -> None:
    port = free_port()
    cfg = config_factory(
        {
            "privacy": NOISE_FREE,
            "metrics": {"port": port},
            "output": {"internal_retention_s": 600, "max_hold_s": MAX_HOLD_S},
            "bounds": {"max_contributions_per_window": 100},
            "queries": ONE_PUBLIC_KEY_QUERY,
        }
    )
    config = load_config(cfg)
    await apply_topics(config, kafka_bootstrap, include_input=True)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        for p in (0, STALLED):
            event: dict[str, Any] = {"user_id": f"u{p}", "timestamp": T0 + 3, "domain": "a.example"}
            await producer.send_and_wait(config.input.topic, orjson.dumps(event), partition=p)
    finally:
        await producer.stop()
    worker = start_worker(
        cfg, tmp_path / "worker.log", env={"STREAM_DP_TEST_STALL_INPUT": f"{STALLED}:3600"}
    )
    try:
        await _wait_for_stop(port, worker)
        age = metric_value(port, "stream_dp_held_record_age_seconds")
        assert age is not None and age > MAX_HOLD_S
        code, body = http_get(port, "/health/ready")
        assert code == 503 and orjson.loads(body)["components"]["partitions_assigned"] is False
        assert http_get(port, "/health/live")[0] == 200
        errors = [
            orjson.loads(line)
            for line in worker.log().splitlines()
            if line.startswith("{") and '"ERROR"' in line
        ]
        assert any(
            f"more than output.max_hold_s = {MAX_HOLD_S} s" in e["msg"]
            and config.output.repartition_topic in e["msg"]
            for e in errors
        ), worker.log()[-4000:]
        assert "window released" not in worker.log()
    finally:
        code = worker.terminate()
    assert code == 0, worker.log()[-4000:]


async def test_held_state_above_the_cap_pauses_fetching_then_stops_the_worker(
    kafka_bootstrap: str, config_factory: ConfigFactory, tmp_path: Path
) -> None:
    """60,000 events of 6,000 users wait in window 0 for the stalled partition: about 1.7 MB
    of samples, above a 1 MiB cap. The worker pauses fetching (stream_dp_backpressure 1,
    still live and in the group), and after window.max_backpressure_s stops releasing."""
    port = free_port()
    cfg = config_factory(
        {
            "privacy": NOISE_FREE,
            "metrics": {"port": port},
            "window": {"max_held_state_bytes": 1_048_576, "max_backpressure_s": 5},
            "bounds": {"max_contributions_per_window": 100},
            "queries": ONE_PUBLIC_KEY_QUERY,
        }
    )
    config = load_config(cfg)
    await apply_topics(config, kafka_bootstrap, include_input=True)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", linger_ms=20)
    await producer.start()
    try:
        futures = [
            await producer.send(
                config.input.topic,
                orjson.dumps(
                    {"user_id": f"u{i % 6000}", "timestamp": T0 + 3, "domain": "a.example"}
                ),
                partition=i % 4,
            )
            for i in range(60_000)
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    worker = start_worker(
        cfg, tmp_path / "worker.log", env={"STREAM_DP_TEST_STALL_INPUT": f"{STALLED}:3600"}
    )
    try:
        deadline = time.monotonic() + HANG_GUARD_S
        paused_seen = False
        while "window.max_held_state_bytes = 1048576, for" not in worker.log():
            assert worker.proc.poll() is None, f"worker exited:\n{worker.log()[-4000:]}"
            assert time.monotonic() < deadline, f"no stop:\n{worker.log()[-4000:]}"
            paused_seen = paused_seen or metric_value(port, "stream_dp_backpressure") == 1.0
            await asyncio.sleep(0.5)
        assert "fetching paused until sealed windows bring them under" in worker.log()
        held = metric_value(port, "stream_dp_held_state_bytes")
        assert held is not None and held > 1_048_576
        assert paused_seen or metric_value(port, "stream_dp_backpressure") == 1.0
        code, body = http_get(port, "/health/ready")
        assert code == 503 and orjson.loads(body)["components"]["partitions_assigned"] is False
        assert http_get(port, "/health/live")[0] == 200
        assert "window released" not in worker.log()
    finally:
        code = worker.terminate()
    assert code == 0, worker.log()[-4000:]
