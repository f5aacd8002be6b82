"""Workers whose wall clocks are wrong (issue 39, item 2), as real `stream-dp run` processes
under libfaketime, on the embedded broker and on Apache Kafka: one worker 300 s fast and one
300 s slow join a correct one while sparse live events arrive (inside ``input.max_future_s``,
so none is dead-lettered). Event time is the stream's, not one worker's clock: no window is released
before its end plus the grace (on the test's correct clock), and every event is counted
exactly once (noise off)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import shutil
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from stream_dp.windows.tumbling import epoch_of_iso, iso_utc
from tests.apache_kafka.tier import ON_BOTH_BROKERS
from tests.integration.support import (
    HANG_GUARD_S,
    NOISE_FREE,
    ONE_PUBLIC_KEY_QUERY,
    WorkerProcess,
    start_worker,
    topic_partitions,
    topics_of,
    wait_for_group,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MakeConfig = Callable[[dict[str, Any] | None], Path]
SIZE_S, GRACE_S, IDLE_S = 10, 1, 2
SKEW_S = 300.0
#: Above the skew: a slow worker keeps events stamped ahead of its clock.
MAX_FUTURE_S = 600.0
#: One event every this many seconds: sparser than idle_close_s per partition, so quiet
#: partitions (where a worker's own clock would drive event time) are the rule.
EVENT_EVERY_S = 1.5
#: Debian's libfaketime (package faketime), under the architecture's library directory.
LIBFAKETIME = next(iter(sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))), None)


def _faketime(offset_s: float) -> dict[str, str]:
    """The environment of a process whose wall clock is ``offset_s`` off (monotonic real)."""
    assert LIBFAKETIME is not None
    return {
        "LD_PRELOAD": str(LIBFAKETIME),
        "FAKETIME": f"{offset_s:+.0f}s",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_NO_CACHE": "1",
    }


async def _produce_live(bootstrap: str, topic: str, stop: asyncio.Event) -> Counter[int]:
    """Sparse live events stamped with this (correct) clock until ``stop``; per window."""
    sent: Counter[int] = Counter()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        i = 0
        while not stop.is_set():
            now_s = time.time()
            event = {"user_id": f"u{i}", "timestamp": now_s, "domain": "a.example"}
            await producer.send_and_wait(topic, orjson.dumps(event))
            sent[math.floor(now_s / SIZE_S) * SIZE_S] += 1
            i += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), EVENT_EVERY_S)
    finally:
        await producer.stop()
    return sent


class _Output:
    """Reads the output topic while the workers run, noting when (on this correct clock)
    each window record arrived."""

    def __init__(self) -> None:
        self.windows: list[tuple[float, dict[str, Any]]] = []
        self.releases: list[dict[str, Any]] = []

    async def follow(self, bootstrap: str, topic: str, stop: asyncio.Event) -> None:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            parts = await topic_partitions(bootstrap, topic)
            consumer.assign([TopicPartition(topic, p) for p in parts])
            await consumer.seek_to_beginning()
            while not stop.is_set():
                for msgs in (await consumer.getmany(timeout_ms=200)).values():
                    seen_s = time.time()
                    for m in msgs:
                        value = orjson.loads(m.value)
                        if value.get("kind") == "window":
                            self.windows.append((seen_s, value))
                        elif value.get("kind") == "release":
                            self.releases.append(value)
        finally:
            await consumer.stop()

    def windows_through(self, last_s: int) -> bool:
        return any(epoch_of_iso(v["window_start"]) >= last_s for _, v in self.windows)


@ON_BOTH_BROKERS
@pytest.mark.skipif(
    shutil.which("faketime") is None or LIBFAKETIME is None,
    reason="needs libfaketime (Debian package faketime; make test installs it)",
)
async def test_a_fast_and_a_slow_worker_clock_lose_nothing_and_release_nothing_early(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    first = math.floor(time.time() / SIZE_S) * SIZE_S
    cfg = config_factory(
        {
            "privacy": NOISE_FREE,
            "input": {"keyed_by_user": False, "max_future_s": MAX_FUTURE_S},
            "window": {
                "size_s": SIZE_S,
                "grace_s": GRACE_S,
                "idle_close_s": IDLE_S,
                "start_at": iso_utc(first),
            },
            "queries": ONE_PUBLIC_KEY_QUERY,
        }
    )
    config = load_config(cfg)
    await apply_topics(config, kafka_bootstrap, include_input=True)
    topics = topics_of(cfg)
    shared = {
        (t, p)
        for t in (config.input.topic, config.output.repartition_topic, config.output.partials_topic)
        for p in await topic_partitions(kafka_bootstrap, t)
    }
    output, stop_output, stop_events = _Output(), asyncio.Event(), asyncio.Event()
    follower = asyncio.create_task(output.follow(kafka_bootstrap, topics["output"], stop_output))
    producing = asyncio.create_task(_produce_live(kafka_bootstrap, topics["input"], stop_events))
    workers: list[WorkerProcess] = []
    try:
        # The middle worker is fast, the last slow; each join is a rebalance.
        for name, offset_s in (("correct", 0.0), ("fast", SKEW_S), ("slow", -SKEW_S)):
            env = _faketime(offset_s) if offset_s else None
            workers.append(start_worker(cfg, tmp_path / f"{name}.log", env))
            await wait_for_group(workers, shared)
            # Two windows each (a wait for the clock: the scenario itself).
            until_s = time.time() + 2 * SIZE_S
            while time.time() < until_s:
                assert not follower.done() and not producing.done()
                await asyncio.sleep(0.2)
        stop_events.set()
        sent = await producing
        last = max(sent)
        deadline = time.monotonic() + HANG_GUARD_S
        while not output.windows_through(last):
            assert time.monotonic() < deadline, f"no window record from {iso_utc(last)}"
            for w in workers:
                assert w.proc.poll() is None, w.log()
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)  # a duplicate would follow its original closely
    finally:
        stop_events.set()
        for w in workers:
            assert w.terminate() == 0, w.log()
        stop_output.set()
        await asyncio.wait_for(follower, timeout=HANG_GUARD_S)

    released = Counter(epoch_of_iso(v["window_start"]) for _, v in output.windows)
    assert all(n == 1 for n in released.values()), released  # each window released once
    for seen_s, v in output.windows:
        # Never early: on a correct clock, a window's record comes after its end + grace.
        assert seen_s >= epoch_of_iso(v["window_end"]) + GRACE_S, (seen_s, v)
    counted: Counter[int] = Counter()
    for v in output.releases:
        assert v["query"] == "visits", v
        counted[epoch_of_iso(v["window_start"])] += round(v["value"])
    # Nothing lost, nothing twice: every event counted in its window (noise off).
    assert {w: n for w, n in counted.items() if n} == dict(sent)
