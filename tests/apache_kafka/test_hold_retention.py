"""The maximum hold measured against what can really be lost (issue 39, items 1 and 5).

* An outage longer than ``output.max_hold_s`` deletes nothing while the internal topics'
  retention is longer: the restarted worker catches up and releases every window with every
  event, then is ready again (the maximum hold counts the time a running worker could read,
  not the outage).
* An internal topic whose real retention (DescribeConfigs) is shorter than the maximum hold
  would delete a held window's records before the stop: the worker refuses to start, naming
  the topic, its retention and the fix; ``stream-dp topics apply`` sets the retention (and
  keeps the topic's other settings), ``--dry-run`` only reports.

Apache Kafka's retention and AlterConfigs are what is tested: this tier only.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from tests.apache_kafka.tier import ON_APACHE_KAFKA
from tests.helpers import ConfigFactory
from tests.integration.support import (
    HANG_GUARD_S,
    NOISE_FREE,
    ONE_PUBLIC_KEY_QUERY,
    WorkerProcess,
    decode_values,
    free_port,
    http_get,
    metric_value,
    read_topic,
    start_worker,
    wait_while_running,
    windows_done,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow, ON_APACHE_KAFKA]
T0 = 1_596_240_000  # 2020-08-01T00:00:00Z, the factory's start_at
STALLED = 1
MAX_HOLD_S = 20  # above a window's life here (10 + 1 + 2 s)
#: Events of window 0: EVENTS_PER_PARTITION users on each of the 4 input partitions.
EVENTS_PER_PARTITION = 10
PARTITIONS = 4


def _events() -> list[tuple[int, dict[str, Any]]]:
    return [
        (p, {"user_id": f"u{p}-{i}", "timestamp": T0 + 3, "domain": "a.example"})
        for p in range(PARTITIONS)
        for i in range(EVENTS_PER_PARTITION)
    ]


async def _produce_to_partitions(bootstrap: str, topic: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for p, event in _events():
            await producer.send_and_wait(topic, orjson.dumps(event), partition=p)
    finally:
        await producer.stop()


async def _until(condition: Any, what: str) -> None:
    """Until ``condition()`` holds (the bound is a hang guard only)."""
    deadline = time.monotonic() + HANG_GUARD_S
    while not await asyncio.to_thread(condition):
        assert time.monotonic() < deadline, f"{what} never happened"
        await asyncio.sleep(0.5)


async def _released_without_a_stop(
    bootstrap: str, topic: str, port: int, worker: WorkerProcess
) -> None:
    """Until window 0's window record is out; fails at once on a maximum-hold stop (the
    bound is a hang guard only)."""
    deadline = time.monotonic() + HANG_GUARD_S
    while not windows_done(["visits"], 1)(await read_topic(bootstrap, topic)):
        stops = metric_value(port, "stream_dp_max_hold_exceeded_total") or 0
        assert stops == 0, f"the restart stopped on the maximum hold:\n{worker.log()[-4000:]}"
        assert worker.proc.poll() is None, f"worker exited:\n{worker.log()[-4000:]}"
        assert time.monotonic() < deadline, f"window 0 never released:\n{worker.log()[-4000:]}"


def _errors(worker: WorkerProcess) -> list[dict[str, Any]]:
    """stream-dp's own ERROR lines (aiokafka logs a coordinator not found yet at start)."""
    entries = [orjson.loads(line) for line in worker.log().splitlines() if line.startswith("{")]
    return [
        e
        for e in entries
        if e.get("level") == "ERROR" and str(e.get("logger", "")).startswith("stream_dp")
    ]


async def test_an_outage_longer_than_the_maximum_hold_is_recovered_with_every_event(
    kafka_bootstrap: str, config_factory: ConfigFactory, tmp_path: Path
) -> None:
    """Window 0 is held (one input partition stalls) with its records pinned on the
    repartition topic; the worker stops and stays down longer than ``max_hold_s`` (retention
    600 s: nothing is deleted). Restarted without the stall, it catches up: window 0 is
    released once with all 40 events, no maximum-hold stop, ready. On the old code the
    restart stopped on 'held too long' before it could read the backlog."""
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
    await _produce_to_partitions(kafka_bootstrap, config.input.topic)

    first = start_worker(
        cfg, tmp_path / "first.log", env={"STREAM_DP_TEST_STALL_INPUT": f"{STALLED}:3600"}
    )
    try:
        # A repartition record pinned by the held window: its age in the log is measured.
        await wait_while_running(
            lambda: (metric_value(port, "stream_dp_held_record_age_seconds") or 0) > 0,
            "a pinned record",
            first,
        )
        age = metric_value(port, "stream_dp_held_record_age_seconds")
        assert age is not None
        pinned_at_s = time.time() - age  # not later than the pinned record's timestamp
        assert metric_value(port, "stream_dp_max_hold_exceeded_total") == 0
    finally:
        code = first.terminate()
    assert code == 0, first.log()[-4000:]
    assert "window released" not in first.log()

    # The outage: down until the pinned record is older than the maximum hold (and more).
    await _until(lambda: time.time() > pinned_at_s + MAX_HOLD_S + 5, "the outage")

    second = start_worker(cfg, tmp_path / "second.log")
    try:
        await _released_without_a_stop(kafka_bootstrap, config.output.topic, port, second)
        await wait_while_running(
            lambda: http_get(port, "/health/ready")[0] == 200, "ready again", second
        )
        out = await read_topic(kafka_bootstrap, config.output.topic)  # until quiet for 1 s
        assert metric_value(port, "stream_dp_max_hold_exceeded_total") == 0
        assert not _errors(second), second.log()[-4000:]
    finally:
        code = second.terminate()
    assert code == 0, second.log()[-4000:]
    records = [v for _, v in decode_values(out)]
    releases = [v for v in records if v["kind"] == "release"]
    windows = [v for v in records if v["kind"] == "window"]
    # Released once, with every event: 0 of 40 lost.
    assert [(v["window_start"], v["group"], v["value"]) for v in releases] == [
        ("2020-08-01T00:00:00Z", {"domain": "a.example"}, PARTITIONS * EVENTS_PER_PARTITION)
    ]
    assert [v["window_start"] for v in windows] == ["2020-08-01T00:00:00Z"]


async def _retention_ms(bootstrap: str, topic: str) -> dict[str, str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    finally:
        await admin.close()
    (resource,) = responses[0].to_object()["resources"]
    wanted = ("retention.ms", "max.message.bytes")
    return {
        e["config_names"]: e["config_value"]
        for e in resource["config_entries"]
        if e["config_names"] in wanted
    }


async def _set_by_hand(bootstrap: str, topic: str, configs: dict[str, str]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, configs)])
    finally:
        await admin.close()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stream_dp.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        check=False,
    )


def _with_retention(cfg: Path, retention_s: int, max_hold_s: int, to: Path) -> Path:
    """The same deployment (topics, group) with another internal retention and hold."""
    data = yaml.safe_load(cfg.read_text())
    data["output"] = {
        **data["output"],
        "internal_retention_s": retention_s,
        "max_hold_s": max_hold_s,
    }
    to.write_text(yaml.safe_dump(data))
    return to


async def test_a_retention_shorter_than_the_maximum_hold_is_refused_and_topics_apply_sets_it(
    kafka_bootstrap: str, config_factory: ConfigFactory, tmp_path: Path
) -> None:
    """The topics exist with a 60 s retention (an older configuration, or by hand); the
    configuration now says 600 s and a 300 s maximum hold. The worker refuses to start,
    naming each internal topic, its real retention and the fix. ``topics apply --dry-run``
    reports the difference and changes nothing; ``topics apply`` sets retention.ms on both
    internal topics (a setting made by hand stays); then the worker starts and is ready."""
    port = free_port()
    short = config_factory(
        {
            "privacy": NOISE_FREE,
            "metrics": {"port": port},
            "output": {"internal_retention_s": 60, "max_hold_s": MAX_HOLD_S},
            "queries": ONE_PUBLIC_KEY_QUERY,
        }
    )
    config = load_config(short)
    await apply_topics(config, kafka_bootstrap, include_input=True)
    internal = [config.output.partials_topic, config.output.repartition_topic]
    await _set_by_hand(
        kafka_bootstrap,
        config.output.partials_topic,
        {"retention.ms": "60000", "max.message.bytes": "2000000"},
    )
    cfg = _with_retention(short, 600, 300, tmp_path / "long.yaml")

    worker = start_worker(cfg, tmp_path / "refused.log")
    try:  # it exits; a worker that starts instead fails here as soon as it is ready
        await _until(
            lambda: worker.proc.poll() is not None or http_get(port, "/health/ready")[0] == 200,
            "the worker's exit",
        )
    finally:
        if worker.proc.poll() is None:
            worker.terminate()
    assert worker.proc.returncode == 2, worker.log()[-4000:]
    said = [line for line in worker.log().splitlines() if line.startswith("stream-dp: error:")]
    assert len(said) == 1 and "Traceback" not in worker.log(), worker.log()[-4000:]
    for topic in internal:
        assert (
            f"topic {topic} keeps records for retention.ms=60000 (60 s), less than "
            "output.max_hold_s = 300 s plus 10 s" in said[0]
        ), said[0]
    assert said[0].count("run `stream-dp topics apply` with this config") == 2, said[0]
    assert said[0].count("retention.ms=600000") == 4, said[0]  # definition and the command

    # What differs: the internal topics' retention, and the continual topic's (it follows
    # the internal retention).
    long_config = load_config(cfg)
    retention = {
        config.output.partials_topic: ("60000", "600000"),
        config.output.repartition_topic: ("60000", "600000"),
        config.output.continual_topic: (
            str(config.output.continual_retention_ms),
            str(long_config.output.continual_retention_ms),
        ),
    }
    dry = _cli("topics", "apply", "--config", str(cfg), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    differs = sorted(line for line in dry.stdout.splitlines() if line.startswith("differs: "))
    assert differs == sorted(
        f"differs: {t}: retention.ms {old}, definition {new}" for t, (old, new) in retention.items()
    ), dry.stdout
    assert not [line for line in dry.stdout.splitlines() if line.startswith("set: ")]
    assert dry.stdout.splitlines()[-1].startswith("dry run: 0 would be created, "), dry.stdout
    for topic, (old, _) in retention.items():
        assert (await _retention_ms(kafka_bootstrap, topic))["retention.ms"] == old

    applied = _cli("topics", "apply", "--config", str(cfg))
    assert applied.returncode == 0, applied.stderr
    lines = applied.stdout.splitlines()
    assert sorted(line for line in lines if line.startswith("set: ")) == sorted(
        f"set: {t}: retention.ms {old} -> {new}" for t, (old, new) in retention.items()
    ), applied.stdout
    assert not [line for line in lines if line.startswith("differs: ")], applied.stdout
    assert "; 3 had their configs set" in lines[-1], applied.stdout
    for topic, (_, new) in retention.items():
        assert (await _retention_ms(kafka_bootstrap, topic))["retention.ms"] == new
    # The partials topic's own other setting stays.
    assert await _retention_ms(kafka_bootstrap, config.output.partials_topic) == {
        "retention.ms": "600000",
        "max.message.bytes": "2000000",
    }
    again = _cli("topics", "apply", "--config", str(cfg))
    assert again.returncode == 0 and "set: " not in again.stdout, again.stdout
    assert "differs: " not in again.stdout, again.stdout

    worker = start_worker(cfg, tmp_path / "started.log")
    try:
        await wait_while_running(lambda: http_get(port, "/health/ready")[0] == 200, "ready", worker)
        assert not _errors(worker), worker.log()[-4000:]
    finally:
        code = worker.terminate()
    assert code == 0, worker.log()[-4000:]
