"""Stage 2 waits for every input partition, end to end (issue 37): a real `stream-dp run`
worker on the embedded broker, four input partitions keyed by user, one of them late.

Three partitions get their users' visits to window T0 and move past the next window; the
fourth says nothing yet. The test waits until the worker's stage 2 has read the three
watermarks past both windows (its watermark gauge, the slowest watermark it holds, set after
each round of releases). Then the late partition sends one visit to window T0, and the test
waits until stage 2 has read its watermark, still inside the window (the gauge falls back
to it). Only then does the late partition send its second visit and move past both windows.
A worker that waited for fewer than all four partitions (any one of them, those it heard
of, one less than the topic has, the most advanced instead of the slowest) would have
released window T0 by then without the late user's visits. The window must hold them.

The bounds are all different and each is exceeded by a user of its own, on its own
partition (k = 5, L0 = 2, Linf = 3; tests/pipeline/test_bounds_wiring.py has the same
design in memory): a swap of two bounds anywhere between the configuration and the release
changes a released number. Noise-free (test mode, ε = 1e6), so released values are exact.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from stream_dp.pipeline.stages.ingest import user_key
from stream_dp.pipeline.stages.placement import murmur2_partition
from stream_dp.windows.tumbling import iso_utc
from tests.integration.support import (
    HANG_GUARD_S,
    NOISE_FREE,
    WorkerProcess,
    decode_values,
    free_port,
    metric_value,
    produce_events,
    read_topic,
    start_worker,
    topics_of,
    windows_done,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
MakeConfig = Callable[[dict[str, Any] | None], Path]
T0 = 1_596_240_000
K, L0, LINF = 5, 2, 3
INPUT_PARTITIONS = 4  # topics/events.yaml
LATE = 3  # the late partition: the last one, so "one partition less" misses it too
DOMAINS = ["a", "b", "c", "d", "e", "f", "g", "h", "late"]
QUERIES = ["visits", "users"]


def _user_on(partition: int, name: str) -> str:
    """The first of ``name-0``, ``name-1``, … that a producer keying by user id puts on
    ``partition`` (murmur2, the Java client's and aiokafka's default)."""
    return next(
        f"{name}-{i}"
        for i in range(10_000)
        if murmur2_partition(user_key(f"{name}-{i}"), INPUT_PARTITIONS) == partition
    )


HEAVY, WIDE, DOUBLE = (_user_on(p, n) for p, n in enumerate(["heavy", "wide", "double"]))


def _visit(user: str, t: float, domain: str) -> dict[str, Any]:
    return {"user_id": user, "timestamp": T0 + t, "domain": domain}


def _released(out: list[tuple[str | None, bytes]]) -> dict[tuple[str, str, str], Any]:
    return {
        (v["query"], v["window_start"], v["group"]["domain"]): v["value"]
        for _, v in decode_values(out)
        if v["kind"] == "release"
    }


async def _until_stage_2_read(
    port: int, reached: Callable[[float], bool], worker: WorkerProcess
) -> None:
    """Until the worker's slowest source watermark (over the sources it has a watermark
    of) is ``reached``: the gauge is set after a round of releases, so a worker that would
    release the window without the late partition has done so by then. Fails at once when
    the worker released any window meanwhile (none is due before the late partition's
    second visit), or dead-lettered or dropped as late any visit (none is misplaced or
    late)."""
    deadline = time.monotonic() + HANG_GUARD_S  # a hang guard only
    while True:
        assert worker.proc.poll() is None, f"worker exited:\n{worker.log()[-4000:]}"
        value = await asyncio.to_thread(metric_value, port, "stream_dp_watermark_timestamp_seconds")
        released = await asyncio.to_thread(metric_value, port, "stream_dp_windows_released_total")
        assert not released, "a window was released before the late partition reported it"
        for name in ("stream_dp_bad_records_total", "stream_dp_late_events_total"):
            count = await asyncio.to_thread(metric_value, port, name)
            assert not count, f"{name} = {count}: every visit here is placed right and on time"
        if value is not None and reached(value):
            return
        assert time.monotonic() < deadline, f"stage 2 never read the watermarks:\n{worker.log()}"
        await asyncio.sleep(0.2)


async def test_a_window_waits_for_the_late_input_partition_and_holds_every_bound(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    tardy = _user_on(LATE, "tardy")
    port = free_port()
    cfg = config_factory(
        {
            "input": {"keyed_by_user": True},
            # Silence never counts as idleness here: only watermarks close windows.
            "window": {"idle_close_s": 600},
            "privacy": {**NOISE_FREE, "epsilon_per_window": 2e6},
            "bounds": {
                "max_contributions_per_window": K,
                "max_keys_per_user": L0,
                "max_contributions_per_key": LINF,
            },
            "queries": [
                {
                    "name": "visits",
                    "group_by": ["domain"],
                    "epsilon": 1e6,
                    "keys": {"domain": DOMAINS},
                },
                {
                    "name": "users",
                    "statistic": "count_distinct_users",
                    "group_by": ["domain"],
                    "epsilon": 1e6,
                    "keys": {"domain": DOMAINS},
                },
            ],
            "metrics": {"port": port},
        }
    )
    await apply_topics(load_config(cfg), kafka_bootstrap, include_input=True)
    topics = topics_of(cfg)
    on_time = [_visit(HEAVY, 1 + i / 10, "a") for i in range(20)]  # only Linf cuts it
    on_time += [_visit(WIDE, 4 + i / 10, d) for i, d in enumerate("bcdef")]  # only L0
    on_time += [_visit(DOUBLE, 6 + i / 10, d) for i, d in enumerate("gh" * 3)]  # only k
    # each on-time partition moves past windows T0 and T0 + 10 (watermark T0 + 24)
    on_time += [_visit(u, 25, "unlisted") for u in (HEAVY, WIDE, DOUBLE)]
    await produce_events(kafka_bootstrap, topics["input"], on_time)
    worker = start_worker(cfg, tmp_path / "worker.log")
    try:
        # the late partition has no watermark yet (it sealed nothing): the others' count
        await _until_stage_2_read(port, lambda w: w >= T0 + 24, worker)
        await produce_events(kafka_bootstrap, topics["input"], [_visit(tardy, 1, "late")])
        # now it has one, inside the window: the gauge falls back to it
        await _until_stage_2_read(port, lambda w: w < T0 + 10, worker)
        late = [_visit(tardy, 5, "late"), _visit(tardy, 25, "x")]
        await produce_events(kafka_bootstrap, topics["input"], late)
        out = await read_topic(
            kafka_bootstrap, topics["output"], until=windows_done(QUERIES, 2), settle_s=1.0
        )
    finally:
        code = worker.terminate()
    assert code == 0, f"exit code {code}:\n{worker.log()}"
    released = _released(out)
    w0, w1 = iso_utc(T0), iso_utc(T0 + 10)
    visits = {d: released[("visits", w0, d)] for d in DOMAINS}
    users = {d: released[("users", w0, d)] for d in DOMAINS}
    assert visits["late"] == 2, "the late partition's visits are missing"  # both
    assert users["late"] == 1
    assert visits["a"] == LINF and users["a"] == 1
    assert sum(visits[d] for d in "bcdef") == L0 == sum(users[d] for d in "bcdef")
    assert visits["g"] + visits["h"] == K and users["g"] + users["h"] == 2
    assert {released[("visits", w1, d)] for d in DOMAINS} == {0}
    scales = {v["query"]: v["noise_scale"] for _, v in decode_values(out) if v["kind"] == "release"}
    assert scales == {"visits": pytest.approx(min(K, L0 * LINF) / 1e6), "users": L0 / 1e6}
    windows = [v for _, v in decode_values(out) if v["kind"] == "window"]
    assert sorted((v["query"], v["window_start"]) for v in windows) == sorted(
        (q, w) for q in QUERIES for w in (w0, w1)
    ), "each window released once"
