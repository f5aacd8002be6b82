"""A committed offset below a partition's log start stops the worker loudly, never skips.

Records a group still needs can be deleted under it: retention of the internal topics
(``output.internal_retention_s``) passing while a window is held back, retention of the
input topic, ``DeleteRecords``. A client with ``auto_offset_reset=earliest`` then moves to
the log start without a word: stage 1 would never see a user's events, stage 2 would take a
missing partial for "no events" and release an under-count. The embedded broker never moves
a log start; Apache Kafka's ``DeleteRecords`` does, so these run on the Apache Kafka tier.
"""

from __future__ import annotations

import asyncio
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
from prometheus_client.parser import text_string_to_metric_families

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from tests.apache_kafka.tier import ON_APACHE_KAFKA
from tests.integration.support import HANG_GUARD_S, NOISE_FREE, WorkerProcess, start_worker

pytestmark = [pytest.mark.kafka, pytest.mark.slow, ON_APACHE_KAFKA]
MakeConfig = Callable[[dict[str, Any] | None], Path]
#: Records written to the partition; the group commits COMMITTED, DeleteRecords removes
#: everything before DELETED_BEFORE: the committed offset is below the new log start.
WRITTEN, COMMITTED, DELETED_BEFORE = 5, 1, 5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as r:
            return int(r.status), bytes(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, b""


def _out_of_range_count(port: int, topic: str) -> float:
    code, body = _get(port, "/metrics")
    if code != 200:
        return 0.0
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if (
                sample.name == "stream_dp_offset_out_of_range_total"
                and sample.labels.get("topic") == topic
            ):
                return float(sample.value)
    return 0.0


async def _wait(condition: Callable[[], bool], what: str, worker: WorkerProcess) -> None:
    """Until ``condition`` holds (the bound is a hang guard only)."""
    deadline = time.monotonic() + HANG_GUARD_S
    while not await asyncio.to_thread(condition):
        assert worker.proc.poll() is None, f"worker exited:\n{worker.log()[-4000:]}"
        assert time.monotonic() < deadline, f"{what} never happened:\n{worker.log()[-4000:]}"
        await asyncio.sleep(0.2)


async def _lose_records_under_the_group(bootstrap: str, group_id: str, topic: str) -> None:
    """Write WRITTEN records to partition 0, commit COMMITTED for the group, then delete
    the records before DELETED_BEFORE (the log start moves past the committed offset)."""
    tp = TopicPartition(topic, 0)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(WRITTEN):
            await producer.send_and_wait(topic, b"gone %d" % i, partition=0)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group_id, enable_auto_commit=False
    )
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.commit({tp: COMMITTED})
    finally:
        await consumer.stop()
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        low = await admin.delete_records({tp: RecordsToDelete(before_offset=DELETED_BEFORE)})
    finally:
        await admin.close()
    assert low[tp] == DELETED_BEFORE


def _entries(worker: WorkerProcess) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in worker.log().splitlines() if line.startswith("{")]


async def _start_after_loss(
    config_factory: MakeConfig, tmp_path: Path, which: str, overrides: dict[str, Any]
) -> tuple[WorkerProcess, int, str]:
    port = _free_port()
    cfg = config_factory({"privacy": NOISE_FREE, "metrics": {"port": port}, **overrides})
    config = load_config(cfg)
    bootstrap = config.kafka.bootstrap_servers
    await apply_topics(config, bootstrap, include_input=True)
    topic = {
        "input": config.input.topic,
        "repartition": config.output.repartition_topic,
        "partials": config.output.partials_topic,
    }[which]
    await _lose_records_under_the_group(bootstrap, config.kafka.group_id, topic)
    return start_worker(cfg, tmp_path / "worker.log"), port, topic


@pytest.mark.parametrize("which", ["repartition", "partials", "input"])
async def test_a_committed_offset_below_the_log_start_stops_the_worker(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path, which: str
) -> None:
    worker, port, topic = await _start_after_loss(config_factory, tmp_path, which, {})
    try:
        await _wait(lambda: _out_of_range_count(port, topic) >= 1, "the metric", worker)
        await _wait(lambda: _get(port, "/health/ready")[0] == 503, "not ready", worker)
        code, body = _get(port, "/health/ready")
        assert orjson.loads(body)["components"]["partitions_assigned"] is False
        assert _get(port, "/health/live")[0] == 200  # it holds; a restart meets the same
        errors = [e for e in _entries(worker) if e.get("level") == "ERROR"]
        said = f"{topic}[0]: position {COMMITTED} (committed {COMMITTED}) is outside the log"
        assert any(said in e["msg"] and f"[{DELETED_BEFORE}, " in e["msg"] for e in errors), (
            worker.log()[-4000:]
        )
        if which != "input":  # the windows affected, and where a new deployment starts
            affected = (
                "Affected: every window not released yet, from 2020-08-01T00:00:00Z on; "
                "released now they would count the missing records as no events"
            )
            assert any(
                affected in e["msg"] and "window.start_at: 2020-08-01T00:00:00Z," in e["msg"]
                for e in errors
            ), [e["msg"] for e in errors]
        assert worker.proc.poll() is None
    finally:
        code = worker.terminate()
    assert code == 0, worker.log()[-4000:]


async def test_the_input_may_skip_lost_records_when_configured_to(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    worker, port, topic = await _start_after_loss(
        config_factory,
        tmp_path,
        "input",
        {"input": {"on_offset_out_of_range": "skip_to_log_start"}},
    )
    try:
        await _wait(lambda: _out_of_range_count(port, topic) >= 1, "the metric", worker)
        warned = [
            e
            for e in _entries(worker)
            if e.get("level") == "WARNING" and "offset out of range" in e["msg"]
        ]
        assert warned and "skip_to_log_start" in warned[0]["msg"], worker.log()[-4000:]
        # It keeps running and becomes ready: the loss was accepted by configuration.
        await _wait(lambda: _get(port, "/health/ready")[0] == 200, "ready", worker)
        assert not [e for e in _entries(worker) if e.get("level") == "ERROR"]
    finally:
        code = worker.terminate()
    assert code == 0, worker.log()[-4000:]
