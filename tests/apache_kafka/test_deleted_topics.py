"""Topics deleted under a running worker, on Apache Kafka with ``auto.create.topics.enable``
(Kafka's default; tests/apache_kafka/tier.py's broker states it).

aiokafka's Metadata requests allowed topic creation, and every client asks for the topics it
follows: a topic deleted under a running worker was created again within seconds by the
worker's own clients — the consumer's subscription refresh, the producer sending to it, the
topology watch — with the broker's default partition count and configuration (a ledger with
``cleanup.policy=delete``), and nothing said so. The client layer now refuses creation in
every Metadata request (stream_dp/kafka_client/metadata.py). Each test first shows that this
broker does create a topic a request allowing it names (the control: without it, a topic
not re-created would prove nothing), then deletes a topic under a worker, waits until the
worker says so, and checks that the topic stayed deleted and the worker's outcome is loud.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.client import AIOKafkaClient
from aiokafka.protocol.metadata import MetadataRequest
from prometheus_client.parser import text_string_to_metric_families

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from tests.apache_kafka.tier import ON_APACHE_KAFKA
from tests.integration.support import (
    NOISE_FREE,
    ONE_PUBLIC_KEY_QUERY,
    WorkerProcess,
    free_port,
    http_get,
    listed_topics,
    metric_value,
    one_value_per_key,
    produce_events,
    read_topic,
    start_worker,
    topic_partitions,
    topics_of,
    wait_while_running,
    windows_done,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow, ON_APACHE_KAFKA]
MakeConfig = Callable[[dict[str, Any] | None], Path]
T0 = 1_596_240_000
W = ["2020-08-01T00:00:00Z", "2020-08-01T00:00:10Z", "2020-08-01T00:00:20Z"]
#: The control's bound: auto-creation takes the controller well under a second.
CREATED_WITHIN_S = 60.0
#: How long a worker may take to notice a deleted topic (a write fails after the test's
#: kafka.request_timeout_ms, 11 s; the watch asks every 2 s): a hang guard, far above.
NOTICED_WITHIN_S = 180.0


async def _delete(bootstrap: str, topic: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_topics([topic])
    finally:
        await admin.close()
    deadline = time.monotonic() + CREATED_WITHIN_S
    while topic in await listed_topics(bootstrap):
        assert time.monotonic() < deadline, f"{topic} still listed after its deletion"
        await asyncio.sleep(0.2)


async def _broker_creates_what_a_request_allows(bootstrap: str) -> None:
    """The control: a Metadata request naming a missing topic with
    ``allow_auto_topic_creation=True`` makes this broker create it."""
    canary = f"canary-{uuid.uuid4().hex[:12]}"
    client = AIOKafkaClient(bootstrap_servers=bootstrap)
    await client.bootstrap()
    try:
        node = client.get_random_node()
        await client.send(node, MetadataRequest([canary], allow_auto_topic_creation=True))
    finally:
        await client.close()
    deadline = time.monotonic() + CREATED_WITHIN_S
    while canary not in await listed_topics(bootstrap):
        assert time.monotonic() < deadline, "this broker does not auto-create topics"
        await asyncio.sleep(0.2)
    await _delete(bootstrap, canary)


def _sample(port: int, name: str, **labels: str) -> float:
    """The sample ``name`` with ``labels`` on the worker's /metrics (0 when absent)."""
    code, body = http_get(port, "/metrics")
    assert code == 200, code
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


def _listed(bootstrap: str, topic: str) -> bool:
    """Whether the broker lists ``topic`` (from a thread: a condition of wait_while_running)."""
    return topic in asyncio.run(listed_topics(bootstrap))


def _said(worker: WorkerProcess, level: str, text: str) -> bool:
    for line in worker.log().splitlines():
        if text in line and line.startswith("{"):
            entry = orjson.loads(line)
            if entry.get("level") == level and text in entry.get("msg", ""):
                return True
    return False


def _tail(worker: WorkerProcess) -> str:
    """The worker's log's last lines, without aiokafka's line for each metadata answer that
    lacks a topic it follows (ten a second while a write waits for the topic)."""
    lines = [line for line in worker.log().splitlines() if "not found in cluster" not in line]
    return "\n".join(lines[-60:])


async def _wait(condition: Callable[[], bool], what: str, worker: WorkerProcess) -> None:
    """Until ``condition`` holds, or the worker exits (the caller looks at which), failing
    after :data:`NOTICED_WITHIN_S` (far above the ~30 s the worker takes)."""
    deadline = time.monotonic() + NOTICED_WITHIN_S
    while not await asyncio.to_thread(condition) and worker.proc.poll() is None:
        assert time.monotonic() < deadline, (
            f"{what} not within {NOTICED_WITHIN_S} s:\n{_tail(worker)}"
        )
        await asyncio.sleep(0.5)


def _released(worker: WorkerProcess, window: str) -> bool:
    return any(
        orjson.loads(line).get("msg") == "window released"
        and orjson.loads(line).get("window") == window
        for line in worker.log().splitlines()
        if line.startswith("{")
    )


def _events(window: int, users: range) -> list[dict[str, Any]]:
    return [
        {"user_id": f"u{u}", "timestamp": T0 + window * 10 + 3, "domain": "a.example"}
        for u in users
    ]


async def _running_worker(
    config_factory: MakeConfig, bootstrap: str, tmp_path: Path, port: int, windows: int
) -> tuple[Path, WorkerProcess]:
    """A worker on new topics, ready, with ``windows`` windows of 20 users released."""
    cfg = config_factory(
        {
            "privacy": NOISE_FREE,
            "metrics": {"port": port},
            "bounds": {"max_contributions_per_window": 100},
            "queries": ONE_PUBLIC_KEY_QUERY,
            # a write to a deleted topic fails sooner (the default is 30 s); above the
            # session timeout (10 s), as the configuration requires
            "kafka": {"request_timeout_ms": 11_000, "give_up_after_s": 15},
        }
    )
    topics = topics_of(cfg)
    await apply_topics(load_config(cfg), bootstrap, include_input=True)
    events = [e for w in range(windows) for e in _events(w, range(20))]
    await produce_events(bootstrap, topics["input"], events)
    worker = start_worker(cfg, tmp_path / "worker.log")
    if windows:
        await read_topic(bootstrap, topics["output"], until=windows_done(["visits"], windows))
    await wait_while_running(lambda: http_get(port, "/health/ready")[0] == 200, "ready", worker)
    return cfg, worker


async def test_a_deleted_ledger_topic_stays_deleted_and_the_worker_holds_without_a_rerelease(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    """tests/integration/test_ledger_loss.py's claim on a broker that auto-creates topics:
    the ledger deleted under a running worker is not created again (it came back empty,
    ``cleanup.policy=delete``), window 2 is not released, and the worker holds:
    ``stream_dp_ledger_lost`` 1, not ready, alive, an ERROR naming the topic and the
    recovery."""
    await _broker_creates_what_a_request_allows(kafka_bootstrap)
    port = free_port()
    cfg, worker = await _running_worker(config_factory, kafka_bootstrap, tmp_path, port, 2)
    topics = topics_of(cfg)
    try:
        await _delete(kafka_bootstrap, topics["ledger"])
        await produce_events(kafka_bootstrap, topics["input"], _events(2, range(30)))
        await wait_while_running(
            lambda: metric_value(port, "stream_dp_ledger_lost") == 1.0 or _released(worker, W[2]),
            "the worker noticed the lost ledger (or released window 2)",
            worker,
        )  # (the ledger created again by the worker's clients comes back empty: held too)
        log = worker.log()
        assert metric_value(port, "stream_dp_ledger_lost") == 1.0, log[-4000:]
        code, body = http_get(port, "/health/ready")
        assert code == 503 and orjson.loads(body)["components"]["ledger_loaded"] is False
        assert http_get(port, "/health/live")[0] == 200
        assert _said(worker, "ERROR", f"ledger lost: topic {topics['ledger']} no longer exists")
        assert "ledger rebuild" in log
        assert topics["ledger"] not in await listed_topics(kafka_bootstrap), log[-4000:]
    finally:
        assert worker.terminate() == 0, worker.log()[-4000:]
    assert topics["ledger"] not in await listed_topics(kafka_bootstrap)
    assert not _released(worker, W[2])
    out = await read_topic(kafka_bootstrap, topics["output"])
    released = one_value_per_key(out)
    assert {v["window_start"] for v in released.values()} == {W[0], W[1]}


async def test_a_deleted_input_topic_stays_deleted_and_the_worker_says_so(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    """The input topic deleted under a running worker: not created again by its consumer's
    subscription refresh or the topology watch; the watch says so (an ERROR naming the
    topic and its partition count, ``stream_dp_topology_changes_total``), the worker is not
    ready and stays alive; a SIGTERM stops it cleanly."""
    await _broker_creates_what_a_request_allows(kafka_bootstrap)
    port = free_port()
    cfg, worker = await _running_worker(config_factory, kafka_bootstrap, tmp_path, port, 1)
    topic = topics_of(cfg)["input"]
    partitions = len(await topic_partitions(kafka_bootstrap, topic))
    try:
        await _delete(kafka_bootstrap, topic)
        said = f"topic {topic}, which the worker reads, no longer exists on the broker"
        await wait_while_running(
            lambda: _said(worker, "ERROR", said) or _listed(kafka_bootstrap, topic),
            "the ERROR (or the topic created again)",
            worker,
        )
        assert topic not in await listed_topics(kafka_bootstrap), worker.log()[-4000:]
        assert _said(worker, "ERROR", said), worker.log()[-4000:]
        assert f"with its {partitions} partitions" in worker.log()
        assert _sample(port, "stream_dp_topology_changes_total", topic=topic) == 1.0
        code, body = http_get(port, "/health/ready")
        assert code == 503 and orjson.loads(body)["components"]["topology_stable"] is False
        assert http_get(port, "/health/live")[0] == 200
        assert topic not in await listed_topics(kafka_bootstrap), worker.log()[-4000:]
    finally:
        assert worker.terminate() == 0, worker.log()[-4000:]
    assert topic not in await listed_topics(kafka_bootstrap)


async def test_a_deleted_repartition_topic_stays_deleted_and_the_worker_stops_naming_it(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    """The repartition topic (stage 0 writes its progress marks to it every few seconds,
    stage 1 reads and commits its offsets) deleted under a running worker: its writes and
    the commit of its offsets fail instead of creating it (aiokafka retried that commit for
    ever: the loop hung), and the worker stops without committing, naming the topic and the
    fix; the topic is still gone."""
    await _broker_creates_what_a_request_allows(kafka_bootstrap)
    port = free_port()
    cfg, worker = await _running_worker(config_factory, kafka_bootstrap, tmp_path, port, 0)
    topic = load_config(cfg).output.repartition_topic
    try:
        await _delete(kafka_bootstrap, topic)
        await _wait(lambda: _listed(kafka_bootstrap, topic), "the worker's stop", worker)
        assert worker.proc.returncode == 1, _tail(worker)
        said = f"error: topic {topic} no longer exists on the broker"
        assert said in worker.log() and "stream-dp topics apply" in worker.log(), _tail(worker)
    finally:
        if worker.proc.poll() is None:
            worker.terminate()
    assert topic not in await listed_topics(kafka_bootstrap), _tail(worker)
