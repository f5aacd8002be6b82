"""A window with 200,000 keys is released while the worker stays in its consumer group.

The release of such a window (merge, noise and 200,000 records, their ledger encoding) took
several seconds of computation on the event loop: with a 2 s session timeout and another
member in the group, the coordinator evicted the releasing worker in the middle of it (no
heartbeat task could run): partitions were revoked from both and handed out again. The
computation now runs off the event loop: no membership is lost, no partition moves, and
the window is released once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from stream_dp.pipeline.faults import PAUSE_POINT_ENV
from tests.integration.support import (
    free_port,
    metric_value,
    partitions_taken_over,
    produce_events,
    read_topic,
    stage_partitions,
    start_worker,
    topics_of,
    wait_for_group,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(600)]
MakeConfig = Callable[[dict[str, Any] | None], Path]
T0 = 1_596_240_000
DOMAINS = [f"d{i:04d}.example" for i in range(1000)]
COUNTRIES = [f"C{i:03d}" for i in range(200)]


def _log_messages(log: str) -> list[str]:
    out = []
    for line in log.splitlines():
        try:
            msg = orjson.loads(line).get("msg", "")
        except (orjson.JSONDecodeError, AttributeError):
            continue
        if isinstance(msg, str):
            out.append(msg)
    return out


async def _release_200k_keys(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path, env: dict[str, str]
) -> tuple[list[float | None], list[list[str]], list[tuple[str | None, bytes]], str, list[str]]:
    """Two members release a 200,000-key window; ``env`` is given to both. Returns the
    membership-lost counters, each worker's log messages after the group settled, the
    output records, the logs' tails and the whole logs."""
    ports = [free_port(), free_port()]
    base = {
        # Session timeout 2 s, heartbeats every 0.5 s (the factory's), windows of a minute:
        # only window 0 is due during the test.
        "window": {"size_s": 60, "grace_s": 1, "idle_close_s": 30},
        "queries": [
            {
                "name": "visits",
                "group_by": ["domain", "country"],
                "keys": {"domain": DOMAINS, "country": COUNTRIES},  # 200,000 public keys
                "epsilon": 1.0,
            }
        ],
    }
    cfg = config_factory({**base, "metrics": {"port": ports[0]}})
    config = load_config(cfg)
    await apply_topics(config, kafka_bootstrap, include_input=True)
    # The second member: same deployment, its own /metrics. A member that stops answering
    # for longer than the session timeout is evicted when the other one heartbeats.
    second = tmp_path / "second.yaml"
    data = yaml.safe_load(cfg.read_text(encoding="utf-8"))
    data["metrics"] = {"port": ports[1]}
    second.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    topics = topics_of(cfg)
    shared = await stage_partitions(kafka_bootstrap, config)
    workers = [
        start_worker(cfg, tmp_path / "worker-0.log", env),
        start_worker(second, tmp_path / "worker-1.log", env),
    ]
    try:
        await wait_for_group(workers, shared)
        settled = [len(_log_messages(w.log())) for w in workers]
        events = [
            {
                "user_id": f"u{i}",
                "timestamp": T0 + 1 + i / 100,
                "domain": DOMAINS[i],
                "country": COUNTRIES[i % 200],
            }
            for i in range(300)
        ]
        # Events of window 1 on every input partition move the watermark past window 0.
        events += [
            {"user_id": f"u{i}", "timestamp": T0 + 70, "domain": DOMAINS[0], "country": "C000"}
            for i in range(40)
        ]
        await produce_events(kafka_bootstrap, topics["input"], events)

        def released(records: list[tuple[str | None, bytes]]) -> bool:
            return any(b'"kind":"window"' in v for _, v in records)

        out = await read_topic(
            kafka_bootstrap, topics["output"], until=released, timeout_s=300, settle_s=1.0
        )
        lost = [await _wait_metric(port, "stream_dp_membership_lost_total") for port in ports]
        # Before the stop (a member that leaves makes the other rebalance).
        after = [_log_messages(w.log())[n:] for w, n in zip(workers, settled, strict=True)]
    finally:
        codes = [w.terminate() for w in workers]
    logs = "\n".join(w.log()[-3000:] for w in workers)
    assert codes == [0, 0], logs
    return lost, after, out, logs, [w.log() for w in workers]


MOVED = ("partitions assigned", "partitions revoked")


async def test_a_200k_key_release_costs_no_membership(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    lost, after, out, logs, _ = await _release_200k_keys(
        kafka_bootstrap, config_factory, tmp_path, {}
    )
    # Both members kept their membership and partitions through the release.
    assert lost == [0, 0], logs
    for messages in after:
        assert not [m for m in messages if m.startswith(MOVED)], logs
    assert sum(m == "window released" for messages in after for m in messages) == 1, logs
    (window,) = [orjson.loads(v) for _, v in out if b'"kind":"window"' in v]
    assert window["released_keys"] == 200_000
    assert sum(1 for _, v in out if b'"kind":"release"' in v) == 200_000


async def test_a_member_stalled_mid_release_is_evicted_and_seen_so(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    """Positive control of the test above: the same two members and release, with the
    releasing worker frozen just before its draw for three session timeouts (as a release
    computed on the event loop stalled it). The broker evicts it and hands its partitions
    to the other member, and the checks above see it — so their silence in the test above
    means the membership was kept, not that an eviction went unseen."""
    point = "before_draw"
    env = {PAUSE_POINT_ENV: f"{point}:1:6", "STREAM_DP_ALLOW_UNSAFE_TEST_MODE": "1"}
    lost, after, _, logs, whole = await _release_200k_keys(
        kafka_bootstrap, config_factory, tmp_path, env
    )
    marker = f"test fault point {point} reached"
    # The first to reach the point froze (the other may reach it later, on taking over).
    reached = sorted(
        (line.split('"ts": "')[1][:23], i)
        for i, log in enumerate(whole)
        for line in log.splitlines()
        if marker in line and '"ts": "' in line
    )
    assert reached, logs
    stalled = reached[0][1]
    taken = partitions_taken_over(whole[stalled], whole[1 - stalled], marker)
    assert taken, logs
    seen = lost != [0, 0] or any(m.startswith(MOVED) for messages in after for m in messages)
    assert seen, logs


async def _wait_metric(port: int, name: str) -> float | None:
    deadline = time.monotonic() + 30
    value = metric_value(port, name)
    while value is None and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        value = metric_value(port, name)
    return value
