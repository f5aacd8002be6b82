"""Long draws against the probes and the group (issue 28, failure 6).

A draw runs in a thread while the worker's iteration waits for it. Before: the loop beat only
once per iteration, so ``/health/live`` failed after ``live_timeout_s`` of any long draw (a
probe then restarted the worker mid-draw, and a window whose draw always took longer than the
probe's patience was redrawn for ever); and ``on_revoked`` waited on the iteration's lock, so a
draw longer than the rebalance timeout (the session timeout, 2 s here) got the member removed
from the group while the others waited.

The draw is made long by the ``STREAM_DP_TEST_LONG_DRAW`` fault: the worker's first draw lasts
until a file exists that the test creates (no timing guess), reporting a chunk every 0.1 s
(``progress``) or nothing (``hang``).
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from stream_dp.pipeline.faults import LONG_DRAW_ENV
from stream_dp.pipeline.formats.ledger import LedgerIndex
from stream_dp.windows.tumbling import epoch_of_iso
from tests.integration.support import (
    HANG_GUARD_S,
    NOISE_FREE,
    ONE_PUBLIC_KEY_QUERY,
    WorkerProcess,
    decode_values,
    free_port,
    http_get,
    produce_events,
    read_topic,
    spread_windows,
    stage_partitions,
    start_worker,
    topics_of,
    wait_for_group,
    windows_done,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
MakeConfig = Callable[[dict[str, Any] | None], Path]
T0 = 1_596_240_000
LIVE_TIMEOUT_S = 2.0
STARTED = "test fault: long draw started"
ENDS = "test fault: long draw ends"
DOMAINS = [f"d{i:02d}.example" for i in range(20)]
WINDOWS = 4


async def _wait_status(port: int, status: int) -> dict[str, Any]:
    """Poll /health/live until it answers ``status`` (hang guard only); its JSON body."""
    deadline = time.monotonic() + HANG_GUARD_S
    while True:
        code, body = await asyncio.to_thread(http_get, port, "/health/live")
        if code == status:
            return dict(orjson.loads(body))
        assert time.monotonic() < deadline, f"/health/live never returned {status} ({code})"
        await asyncio.sleep(0.1)


async def _wait_log(worker: WorkerProcess, text: str) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while text not in worker.log():
        assert worker.proc.poll() is None, worker.log()[-4000:]
        assert time.monotonic() < deadline, f"never logged {text!r}\n{worker.log()[-4000:]}"
        await asyncio.sleep(0.1)


def _visits(window: int, users: range) -> list[dict[str, Any]]:
    return [
        {"user_id": f"u{u}", "timestamp": T0 + window * 10 + 1 + u % 7, "domain": "a.example"}
        for u in users
    ]


@pytest.mark.parametrize("mode", ["progress", "hang"])
async def test_live_while_a_long_draw_moves_and_not_live_when_it_hangs(
    mode: str, kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    """``progress``: a draw lasting 3 × the liveness timeout keeps /health/live 200 (its
    chunks are the beats), and the window is released. ``hang``: the same draw reporting
    nothing turns /health/live 503 — progress beats are what keep it up, nothing else."""
    port, end = free_port(), tmp_path / "end-draw"
    cfg = config_factory(
        {
            "privacy": NOISE_FREE,
            "metrics": {"port": port, "live_timeout_s": LIVE_TIMEOUT_S},
            "window": {"size_s": 10, "grace_s": 1, "idle_close_s": 30},
            "bounds": {"max_contributions_per_window": 100},
            "queries": ONE_PUBLIC_KEY_QUERY,
        }
    )
    await apply_topics(load_config(cfg), kafka_bootstrap, include_input=True)
    topics = topics_of(cfg)
    worker = start_worker(cfg, tmp_path / "worker.log", {LONG_DRAW_ENV: f"{mode}:{end}"})
    try:
        await _wait_status(port, 200)
        await produce_events(
            kafka_bootstrap, topics["input"], _visits(0, range(30)) + _visits(1, range(5))
        )
        await _wait_log(worker, STARTED)
        if mode == "progress":
            started = time.monotonic()
            codes: list[int] = []
            while time.monotonic() - started < 3 * LIVE_TIMEOUT_S:
                code, body = await asyncio.to_thread(http_get, port, "/health/live")
                codes.append(code)
                await asyncio.sleep(0.1)
            assert ENDS not in worker.log(), "the draw ended early: nothing was tested"
            assert 503 not in codes, codes
            assert codes.count(200) >= 10, codes
            assert orjson.loads(body)["last_progress_step"] == "draw (test fault)"
        else:
            status = await _wait_status(port, 503)
            assert not status["live"] and ENDS not in worker.log()
        end.touch()
        out = await read_topic(
            kafka_bootstrap, topics["output"], until=windows_done(["visits"], 1), timeout_s=60
        )
        await _wait_status(port, 200)  # a hang that ends is live again
        assert worker.proc.poll() is None, worker.log()[-4000:]
    finally:
        end.touch()
        code = worker.terminate()
    assert code == 0, worker.log()[-4000:]
    first = [
        v["value"]
        for _, v in decode_values(out)
        if v["kind"] == "release" and v["window_start"] == "2020-08-01T00:00:00Z"
    ]
    assert first == [30]  # the long draw's window, released once


async def test_a_rebalance_completes_while_a_draw_runs_and_each_window_has_one_value(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    """A second worker joins while the first holds a draw past the rebalance timeout (2 s).
    The revocation does not wait on the draw: the group settles with both members while the
    draw still runs. Once it ends, the draw goes through the ledger like any other (the first
    complete draw wins): every window is released, each (query, window, key) has one value on
    the output topic, the ledger's. Noise is real (ε = 0.2 over 20 public keys): a second
    draw shows as a second value with overwhelming probability."""
    end = tmp_path / "end-draw"
    cfg = config_factory(
        {
            "bounds": {"max_contributions_per_window": 3},
            "privacy": {"epsilon_per_window": 0.2, "max_epsilon_per_horizon": 100},
            "queries": [
                {
                    "name": "visits",
                    "group_by": ["domain"],
                    "epsilon": 0.2,
                    "keys": {"domain": DOMAINS},
                }
            ],
        }
    )
    config = load_config(cfg)
    await apply_topics(config, kafka_bootstrap, include_input=True)
    topics = topics_of(cfg)
    expected = await stage_partitions(kafka_bootstrap, config)
    drawing = start_worker(cfg, tmp_path / "drawing.log", {LONG_DRAW_ENV: f"progress:{end}"})
    joining: WorkerProcess | None = None
    try:
        await wait_for_group([drawing], expected)
        events = spread_windows(T0, WINDOWS, DOMAINS)
        await produce_events(kafka_bootstrap, topics["input"], events)
        await _wait_log(drawing, STARTED)
        joining = start_worker(cfg, tmp_path / "joining.log")
        await wait_for_group([drawing, joining], expected)
        # The group settled while the draw still ran: the revocation did not wait on it.
        assert ENDS not in drawing.log(), "the draw ended before the group settled"
        end.touch()
        out = await read_topic(
            kafka_bootstrap,
            topics["output"],
            until=windows_done(["visits"], WINDOWS),
            timeout_s=120,
            settle_s=3.0,  # anything either worker does after the draw ends
        )
        assert ENDS in drawing.log()
        assert drawing.proc.poll() is None, drawing.log()[-4000:]
    finally:
        end.touch()
        codes = [drawing.terminate()] + ([joining.terminate()] if joining else [])
    assert joining is not None
    assert codes == [0, 0], f"{codes}\n{drawing.log()[-4000:]}"
    assert "Traceback" not in drawing.log() and "Traceback" not in joining.log()

    values: dict[tuple[str, str, str], set[Any]] = defaultdict(set)
    for _, v in decode_values(out):
        if v["kind"] == "release":
            values[(v["query"], v["window_start"], orjson.dumps(v["group"]).decode())].add(
                v["value"]
            )
    windows = {window for _, window, _ in values}
    assert len(windows) >= WINDOWS, sorted(windows)  # and the late event's, once idle
    assert all(len(vs) == 1 for vs in values.values()), {
        k: vs for k, vs in values.items() if len(vs) > 1
    }
    index = LedgerIndex()
    for key, raw in await read_topic(kafka_bootstrap, topics["ledger"]):
        index.feed(key or "", raw)
    for (query, window, group), (value,) in values.items():
        release = index.get(query, epoch_of_iso(window))
        assert release is not None, (query, window)
        by_group = {
            orjson.dumps(r.value["group"]).decode(): r.value["value"]
            for r in release.records
            if r.value["kind"] == "release"
        }
        assert by_group[group] == value
