"""A lost ledger is an outage, never a re-release: a worker that finds the ledger topic
recreated (at start) or deleted under it (while running) releases nothing more, is not
ready, says so on /metrics and in its log; ``stream-dp ledger rebuild`` restores the ledger
from the output topic and the worker then releases only later windows — no (query, window,
key) on the output topic ever gets a second value."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from aiokafka.admin import AIOKafkaAdminClient

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from tests.integration.support import (
    HANG_GUARD_S,
    NOISE_FREE,
    ONE_PUBLIC_KEY_QUERY,
    WorkerProcess,
    free_port,
    http_get,
    ledger_release_ids,
    metric_value,
    one_value_per_key,
    produce_events,
    read_topic,
    start_worker,
    topics_of,
    wait_while_running,
    windows_done,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
MakeConfig = Callable[[dict[str, Any] | None], Path]
T0 = 1_596_240_000
W = ["2020-08-01T00:00:00Z", "2020-08-01T00:00:10Z", "2020-08-01T00:00:20Z"]


def _released(worker: WorkerProcess, window: str) -> bool:
    """Whether the worker's log says it released ``window``."""
    for line in worker.log().splitlines():
        if line.startswith("{"):
            entry = orjson.loads(line)
            if entry.get("msg") == "window released" and entry.get("window") == window:
                return True
    return False


async def _wait_outage(port: int, worker: WorkerProcess, *, running: bool = False) -> None:
    """The worker holds: stream_dp_ledger_lost is 1, /health/ready says 503 and why. (A
    worker that does not hold fails this early: started on the lost ledger, it becomes
    ready; running when the ledger goes, it releases window 2.)"""

    def held_or_not() -> bool:
        if metric_value(port, "stream_dp_ledger_lost") == 1.0:
            return True
        if running:
            return _released(worker, W[2])
        return http_get(port, "/health/ready")[0] == 200

    await wait_while_running(held_or_not, "ledger_lost = 1", worker)
    assert metric_value(port, "stream_dp_ledger_lost") == 1.0, worker.log()[-4000:]
    code, body = http_get(port, "/health/ready")
    assert code == 503 and orjson.loads(body)["components"]["ledger_loaded"] is False
    assert http_get(port, "/health/live")[0] == 200  # alive: a restart would find the same loss
    assert "ledger rebuild" in worker.log()


async def _held_run(cfg: Path, log_path: Path, port: int) -> WorkerProcess:
    """A worker started on a lost ledger: it holds (:func:`_wait_outage`), then stops
    cleanly on SIGTERM."""
    held = start_worker(cfg, log_path)
    try:
        await _wait_outage(port, held)
    finally:
        assert held.terminate() == 0, held.log()
    return held


def _events(window: int, users: range) -> list[dict[str, Any]]:
    return [
        {"user_id": f"u{u}", "timestamp": T0 + window * 10 + 3, "domain": "a.example"}
        for u in users
    ]


def _config(config_factory: MakeConfig, port: int) -> Path:
    return config_factory(
        {
            "privacy": NOISE_FREE,
            "metrics": {"port": port},
            "bounds": {"max_contributions_per_window": 100},
            "queries": ONE_PUBLIC_KEY_QUERY,
        }
    )


def _rebuild(cfg: Path, bootstrap: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "stream_dp.cli.main",
            "ledger",
            "rebuild",
            "--config",
            str(cfg),
            "--bootstrap-servers",
            bootstrap,
        ],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        check=False,
    )


async def _recover_and_release_window_2(
    cfg: Path, bootstrap: str, port: int, tmp_path: Path, first: dict[str, dict[str, Any]]
) -> None:
    """Rebuild (twice: idempotent), start a worker: ready, window 2 released once, windows
    0 and 1 never again."""
    topics = topics_of(cfg)
    rebuilt = _rebuild(cfg, bootstrap)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "restored 2 releases" in rebuilt.stdout, rebuilt.stdout
    again = _rebuild(cfg, bootstrap)
    assert again.returncode == 0, again.stderr
    assert "nothing to write" in again.stdout, again.stdout
    worker = start_worker(cfg, tmp_path / "recovered.log")
    try:
        await wait_while_running(lambda: http_get(port, "/health/ready")[0] == 200, "ready", worker)
        assert metric_value(port, "stream_dp_ledger_lost") == 0.0
        await produce_events(bootstrap, topics["input"], _events(2, range(30)))
        out = await read_topic(
            bootstrap, topics["output"], until=windows_done(["visits"], 3), settle_s=1.0
        )
    finally:
        code = worker.terminate()
    assert code == 0, worker.log()
    values = one_value_per_key(out)
    for key, record in first.items():
        assert values[key] == record  # windows 0 and 1: the first draw, unchanged
    released = {v["window_start"]: v["value"] for v in values.values() if v["kind"] == "release"}
    assert released == {W[0]: 20, W[1]: 20, W[2]: 30}
    ids = ledger_release_ids(await read_topic(bootstrap, topics["ledger"]))
    assert all(len(v) == 1 for v in ids.values()), ids


async def _release_windows_0_and_1(
    cfg: Path, bootstrap: str, port: int, tmp_path: Path
) -> tuple[WorkerProcess, dict[str, dict[str, Any]]]:
    topics = topics_of(cfg)
    await apply_topics(load_config(cfg), bootstrap, include_input=True)
    await produce_events(bootstrap, topics["input"], _events(0, range(20)) + _events(1, range(20)))
    worker = start_worker(cfg, tmp_path / "first.log")
    out = await read_topic(bootstrap, topics["output"], until=windows_done(["visits"], 2))
    await wait_while_running(lambda: http_get(port, "/health/ready")[0] == 200, "ready", worker)
    return worker, one_value_per_key(out)


async def _delete_topic(bootstrap: str, topic: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_topics([topic])
    finally:
        await admin.close()


async def test_a_recreated_ledger_topic_holds_the_worker_until_it_is_rebuilt(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    port = free_port()
    cfg = _config(config_factory, port)
    topics = topics_of(cfg)
    worker, first = await _release_windows_0_and_1(cfg, kafka_bootstrap, port, tmp_path)
    assert worker.terminate() == 0, worker.log()
    # The ledger topic is deleted and created again, empty; group and output live on.
    await _delete_topic(kafka_bootstrap, topics["ledger"])
    await apply_topics(load_config(cfg), kafka_bootstrap, include_input=True)
    await _held_run(cfg, tmp_path / "held.log", port)
    # The group's committed offsets alone are a sign of an earlier run: started with
    # window.start_at after the released windows (the output topic shows no release of a
    # window it would cover), the worker holds all the same.
    data = yaml.safe_load(cfg.read_text())
    data["window"]["start_at"] = W[2]
    later = tmp_path / "later.yaml"
    later.write_text(yaml.safe_dump(data))
    held = await _held_run(later, tmp_path / "held-later.log", port)
    assert "committed offsets" in held.log(), held.log()[-4000:]
    one_value_per_key(await read_topic(kafka_bootstrap, topics["output"]))
    await _recover_and_release_window_2(cfg, kafka_bootstrap, port, tmp_path, first)


async def test_a_ledger_topic_deleted_under_a_running_worker_stops_its_releases(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    port = free_port()
    cfg = _config(config_factory, port)
    topics = topics_of(cfg)
    worker, first = await _release_windows_0_and_1(cfg, kafka_bootstrap, port, tmp_path)
    try:
        await _delete_topic(kafka_bootstrap, topics["ledger"])
        # Window 2 closes: its release finds the ledger's log gone backwards, before any
        # output record is written.
        await produce_events(kafka_bootstrap, topics["input"], _events(2, range(30)))
        await _wait_outage(port, worker, running=True)
    finally:
        assert worker.terminate() == 0, worker.log()
    out = await read_topic(kafka_bootstrap, topics["output"])
    assert {v["window_start"] for v in one_value_per_key(out).values()} == {W[0], W[1]}
    # The operator rebuilds into a new ledger topic (the embedded broker keeps a deleted
    # topic that was written to afterwards unwritable under its name, even once created
    # again; on Apache Kafka `stream-dp topics apply` could create the same name again).
    data = yaml.safe_load(cfg.read_text())
    data["output"]["ledger_topic"] += "-restored"
    restored = tmp_path / "restored.yaml"
    restored.write_text(yaml.safe_dump(data))
    await apply_topics(load_config(restored), kafka_bootstrap, include_input=True)
    await _recover_and_release_window_2(restored, kafka_bootstrap, port, tmp_path, first)


async def test_a_new_ledger_and_group_on_an_output_that_shows_releases_holds(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    """A typo'd ledger topic with a new group: no committed offsets, but the output topic
    shows the deployment's releases for windows this start would cover. With window.start_at
    after them, a new deployment on the same output topic starts normally."""
    port = free_port()
    cfg = _config(config_factory, port)
    worker, _ = await _release_windows_0_and_1(cfg, kafka_bootstrap, port, tmp_path)
    assert worker.terminate() == 0, worker.log()
    data = yaml.safe_load(cfg.read_text())
    data["kafka"]["group_id"] += "-new"
    data["output"]["ledger_topic"] += "-typo"
    renamed = tmp_path / "renamed.yaml"
    renamed.write_text(yaml.safe_dump(data))
    await _held_run(renamed, tmp_path / "renamed.log", port)
    data["window"]["start_at"] = W[2]  # after the last window on the output topic
    later = tmp_path / "later.yaml"
    later.write_text(yaml.safe_dump(data))
    fresh = start_worker(later, tmp_path / "later.log")
    try:
        await wait_while_running(lambda: http_get(port, "/health/ready")[0] == 200, "ready", fresh)
        assert metric_value(port, "stream_dp_ledger_lost") == 0.0
    finally:
        assert fresh.terminate() == 0, fresh.log()
