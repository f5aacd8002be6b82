"""A restart while the input is idle (issue 28, failure 1), as real `stream-dp run`
processes on the embedded broker: every covered window is released, with or without
events, across restarts — and soon, not at one second of event time per second since the
deployment's first covered window."""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from stream_dp.windows.tumbling import epoch_of_iso, iso_utc
from tests.integration.support import (
    HANG_GUARD_S,
    NOISE_FREE,
    ONE_PUBLIC_KEY_QUERY,
    start_worker,
    topic_partitions,
    topics_of,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MakeConfig = Callable[[dict[str, Any] | None], Path]
SIZE_S, GRACE_S, IDLE_S = 10, 1, 2
#: input.max_future_s, the clock error the deployment tolerates: a restart carries event
#: time by its own clock alone only to the wall clock less this (docs/operations.md,
#: "Clocks"), the rest at one second per second — small here, so the bound below holds.
TOLERANCE_S = 5
#: The first run releases this many windows live, then the worker stays stopped this many
#: windows (100 s) while no event arrives: longer than the restart's bound below, so a start
#: at one second per second — from the first covered window (the old start) or from the
#: first window not released — misses it.
LIVE_WINDOWS = 3
STOPPED_WINDOWS = 10
#: privacy.horizon_windows: a horizon's ε is the sum over its windows, each charged once.
HORIZON_WINDOWS = 24


def _due_windows(first_s: int, now_s: float) -> int:
    """Covered windows whose end plus the grace has passed at ``now_s``."""
    return max(0, math.floor((now_s - GRACE_S - first_s) / SIZE_S))


async def _window_records(
    bootstrap: str, topic: str, *, at_least: int
) -> list[tuple[float, dict[str, Any]]]:
    """The ``window`` records of the output topic with their record time stamps (s), read
    while a worker runs until ``at_least`` windows have one, and a second more (to see a
    duplicate). The deadline is a hang guard only. (Read while the worker runs: the
    embedded broker shows a partition's last batch only once another follows it.)"""
    parts = await topic_partitions(bootstrap, topic)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, p) for p in parts])
        await consumer.seek_to_beginning()
        out: list[tuple[float, dict[str, Any]]] = []
        deadline = time.monotonic() + HANG_GUARD_S
        done_at: float | None = None
        while done_at is None or time.monotonic() < done_at + 1.0:
            assert time.monotonic() < deadline, f"{len(out)} window records, not {at_least}"
            for msgs in (await consumer.getmany(timeout_ms=200)).values():
                for m in msgs:
                    value = orjson.loads(m.value)
                    if value.get("kind") == "window":
                        out.append((m.timestamp / 1000, value))
            if done_at is None and len({v["window_start"] for _, v in out}) >= at_least:
                done_at = time.monotonic()
        return out
    finally:
        await consumer.stop()


@pytest.mark.parametrize("keyed", [False, True], ids=["repartitioned", "keyed-by-user"])
async def test_an_idle_deployment_restarted_releases_its_due_windows_at_once(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path, keyed: bool
) -> None:
    """No event ever arrives. A live deployment (covering from the current window) releases
    its first windows by the wall clock; then the worker stops for ten windows and starts
    again. Every due window (a public key's record and the window record) is released
    once, in order, each charged once, none before its end plus the grace — and the
    restart does so within about a window of starting (idle close plus grace; the releases
    themselves): the restarted worker carries on the deployment's clock from its last
    release."""
    first = math.floor(time.time() / SIZE_S) * SIZE_S
    cfg = config_factory(
        {
            "privacy": {**NOISE_FREE, "horizon_windows": HORIZON_WINDOWS},
            "input": {"keyed_by_user": keyed, "max_future_s": TOLERANCE_S},
            "window": {
                "size_s": SIZE_S,
                "grace_s": GRACE_S,
                "idle_close_s": IDLE_S,
                "start_at": iso_utc(first),
            },
            "queries": ONE_PUBLIC_KEY_QUERY,
        }
    )
    await apply_topics(load_config(cfg), kafka_bootstrap, include_input=True)
    topics = topics_of(cfg)

    worker = start_worker(cfg, tmp_path / "first.log")
    try:
        # The deadline is a hang guard (300 s).
        await _window_records(kafka_bootstrap, topics["output"], at_least=LIVE_WINDOWS)
    finally:
        assert worker.terminate() == 0, worker.log()

    # Stopped while idle until ten windows more are due (a wait for the clock: the scenario
    # itself).
    n_released = worker.log().count('"window released"')  # one line per window
    assert n_released >= LIVE_WINDOWS
    stopped_until = first + (n_released + STOPPED_WINDOWS) * SIZE_S + GRACE_S
    while time.time() < stopped_until:
        await asyncio.sleep(0.1)
    restarted = time.time()
    n_second = _due_windows(first, restarted)
    assert n_second >= n_released + STOPPED_WINDOWS
    worker = start_worker(cfg, tmp_path / "second.log")
    try:
        windows = await _window_records(kafka_bootstrap, topics["output"], at_least=n_second)
    finally:
        assert worker.terminate() == 0, worker.log()

    starts = Counter(epoch_of_iso(v["window_start"]) for _, v in windows)
    expected = [first + i * SIZE_S for i in range(n_second)]
    assert sorted(starts)[:n_second] == expected  # every window from the first, no gap
    assert all(n == 1 for n in starts.values()), starts  # each released once
    for stamp_s, v in windows:
        # Never early: a window's record comes after its end plus the grace (ms stamps).
        assert stamp_s >= epoch_of_iso(v["window_end"]) + GRACE_S - 0.001, v
        assert v["epsilon_spent"] == pytest.approx(1e6)  # charged once: one query's ε
        # Released in a burst, still charged once each over the horizon ending with it.
        index = (epoch_of_iso(v["window_start"]) - first) // SIZE_S
        in_horizon = min(HORIZON_WINDOWS, index + 1)
        assert v["horizon_epsilon_spent"] == pytest.approx(in_horizon * 1e6), v
    due_at_restart = {first + i * SIZE_S for i in range(n_released, n_second)}
    latest = max(
        stamp_s for stamp_s, v in windows if epoch_of_iso(v["window_start"]) in due_at_restart
    )
    # About a window (and the tolerance) after the restart (a start at one second per
    # second: the ten windows' 100 s and more). A generous bound for a loaded machine,
    # below that.
    bound_s = SIZE_S + GRACE_S + IDLE_S + TOLERANCE_S + 60
    assert latest - restarted < bound_s, latest - restarted
