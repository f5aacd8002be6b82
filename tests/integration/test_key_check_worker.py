"""The pseudonym key's check value on real workers (issue 37, item 1): a key id only names
a secret. A worker restarted under a new secret with the same key id refuses to start,
saying how to restore the secret or rotate to a new key id; of two workers started
together under different secrets, the one whose check value came second refuses, and one
person's events are released as one user, bounded once.

Noise is switched off (test mode, ε = 1e6) so released values equal the bounded counts.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from stream_dp.pipeline.formats.packed import decode_binary, is_binary
from stream_dp.windows.tumbling import iso_utc
from tests.helpers import ConfigFactory, TopicFactory
from tests.integration.support import (
    HANG_GUARD_S,
    NOISE_FREE,
    WorkerProcess,
    current_assignment,
    decode_values,
    read_topic,
    run_worker_until_windows,
    stage_partitions,
    start_worker,
    topics_of,
    wait_for_group,
    windows_done,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

T0 = 1_596_240_000  # 2020-08-01T00:00:00Z, the configs' window.start_at
SIZE_S = 10
K = 4  # max_contributions_per_window
PER_PARTITION = 3 * K  # the one person's events on each input partition
QUERIES = ["visits", "users"]
KEY_ENV = "STREAM_DP_PSEUDONYM_KEY"


def _config(config_factory: ConfigFactory, input_topic: str, *, keyed: bool) -> Path:
    return config_factory(
        {
            "input": {"topic": input_topic, "keyed_by_user": keyed},
            "window": {"size_s": SIZE_S, "grace_s": 1, "idle_close_s": 2},
            "privacy": NOISE_FREE,
            "bounds": {"max_contributions_per_window": K},
            "queries": [
                {
                    "name": "visits",
                    "group_by": ["domain"],
                    "epsilon": 1e6,
                    "keys": {"domain": ["a.example"]},
                },
                {"name": "users", "statistic": "count_distinct_users", "epsilon": 1e6, "keys": {}},
            ],
        }
    )


def _secret() -> dict[str, str]:
    return {KEY_ENV: secrets.token_hex(32)}


def _refusal(worker: WorkerProcess) -> str:
    """The refused worker's whole output: exit code 2, one error naming the key id, where
    the secret comes from and both ways out, and no sign that it joined the group."""
    assert worker.proc.returncode == 2, worker.log()
    log = worker.log()
    assert log.count("stream-dp: error:") == 1, log
    (line,) = [x for x in log.splitlines() if x.startswith("stream-dp: error:")]
    assert "cannot join deployment" in line, log
    assert (
        "the pseudonym key 'k1' (from the variable STREAM_DP_PSEUDONYM_KEY) is not the secret "
        "this deployment recorded under the key id 'k1'" in line
    ), log
    assert "Restore the secret 'k1' was recorded with" in line, log
    assert "give the new one a new pseudonymization.key_id and rotate to it" in line, log
    assert "Traceback" not in log, log
    assert "partitions assigned" not in log, log  # it never joined the group
    return line


async def _exited_or_joined(workers: Sequence[WorkerProcess]) -> list[WorkerProcess]:
    """Wait until a worker exits, or every one holds partitions of the group (the hang
    guard is far above either): the workers that exited."""
    deadline = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < deadline:
        exited = [w for w in workers if w.proc.poll() is not None]
        if exited or all(current_assignment(w) for w in workers):
            return exited
        await asyncio.sleep(0.1)
    raise AssertionError("no worker exited and the group did not settle")


def _event(user: str, t_s: float) -> bytes:
    return orjson.dumps({"user_id": user, "timestamp": T0 + t_s, "domain": "a.example"})


async def test_a_restart_under_a_new_secret_with_the_same_key_id_is_refused(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    config_factory: ConfigFactory,
    workers: list[WorkerProcess],
    tmp_path: Path,
) -> None:
    """An operator regenerates the secret and keeps key_id k1: every user of an open window
    would become two pseudonyms. The restart is refused with the fix; the recorded secret
    still starts (the refusal is about the secret, nothing else)."""
    input_topic = await topic_factory(partitions=2)
    path = _config(config_factory, input_topic, keyed=True)
    await apply_topics(load_config(path), kafka_bootstrap, include_input=False)
    original = _secret()
    events = [(b"alice", _event("alice", 1 + i / 10)) for i in range(PER_PARTITION)]
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        for key, value in events:
            await producer.send_and_wait(input_topic, value, key=key)
    finally:
        await producer.stop()
    await run_worker_until_windows(
        kafka_bootstrap, path, tmp_path / "first.log", QUERIES, 1, env=original, timeout_s=60
    )
    workers.append(start_worker(path, tmp_path / "new-secret.log", _secret()))
    assert await _exited_or_joined(workers) == workers
    _refusal(workers[0])
    workers.append(start_worker(path, tmp_path / "restored.log", original))
    assert await _exited_or_joined(workers[1:]) == []
    assert workers[1].terminate() == 0, workers[1].log()


async def test_two_workers_under_different_secrets_never_release_one_person_as_two_users(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    config_factory: ConfigFactory,
    workers: list[WorkerProcess],
    tmp_path: Path,
) -> None:
    """A rolling restart in which pods hold two versions of the secret under key id k1,
    unkeyed input (stage 0 pseudonymizes, packed repartition records): started together,
    exactly one refuses — the one whose key check came second in the ledger. One person's
    events on both input partitions are then released as one user with k events (under
    two secrets: two users, 2k events, noise calibrated for k), and every partial and
    packed record carries the ledger's check value."""
    input_topic = await topic_factory(partitions=2)
    path = _config(config_factory, input_topic, keyed=False)
    config = load_config(path)
    await apply_topics(config, kafka_bootstrap, include_input=False)
    shared = await stage_partitions(kafka_bootstrap, config)
    workers.extend(
        start_worker(path, tmp_path / f"{name}.log", _secret()) for name in ("old", "new")
    )
    exited = await _exited_or_joined(workers)
    assert len(exited) == 1, [w.log()[-2000:] for w in workers]
    _refusal(exited[0])
    (survivor,) = [w for w in workers if w not in exited]
    await wait_for_group([survivor], shared)

    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        for partition in (0, 1):
            for i in range(PER_PARTITION):
                value = _event("alice", 1 + partition + i / 10)
                await producer.send_and_wait(input_topic, value, partition=partition)
    finally:
        await producer.stop()
    topics = topics_of(path)
    out = await read_topic(
        kafka_bootstrap, topics["output"], until=windows_done(QUERIES, 1), settle_s=1.0
    )
    assert survivor.terminate() == 0, survivor.log()
    released: dict[str, Any] = {
        v["query"]: v["value"]
        for _, v in decode_values(out)
        if v["kind"] == "release" and v["window_start"] == iso_utc(T0)
    }
    assert released == {"visits": K, "users": 1}

    ledger = decode_values(await read_topic(kafka_bootstrap, topics["ledger"]))
    (coverage,) = [v for _, v in ledger if v["kind"] == "coverage"][:1]
    recorded = coverage["key_checks"]["k1"]
    partials = decode_values(await read_topic(kafka_bootstrap, config.output.partials_topic))
    assert {v["key_check"] for _, v in partials if v["kind"] == "partial"} == {recorded}
    routed = await read_topic(kafka_bootstrap, config.output.repartition_topic)
    packed = [decode_binary(v, []) for _, v in routed if is_binary(v)]
    assert packed and {p.key_check for p in packed} == {recorded}
    assert sum(len(p) for p in packed) == 2 * PER_PARTITION
