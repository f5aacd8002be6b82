"""A start-up whose ledger read takes longer than the liveness timeout stays live and not
ready until the read is done (issue 28: a liveness probe must not restart a worker that is
reading a long ledger, forever). The read is made slow with the test fault that delays every
ledger write (each catch-up writes fences and waits for them)."""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from stream_dp.ops.health import DEFAULT_LIVE_TIMEOUT_S
from stream_dp.pipeline.faults import LEDGER_DELAY_ENV
from tests.integration.support import (
    HANG_GUARD_S,
    NOISE_FREE,
    ONE_PUBLIC_KEY_QUERY,
    free_port,
    start_worker,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
MakeConfig = Callable[[dict[str, Any] | None], Path]
#: Each ledger write of the start-up (its fences, the coverage record) waits this long: the
#: start-up takes three of them, well past the liveness timeout.
LEDGER_DELAY_S = 15.0


def _status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0  # not serving yet


async def test_a_start_up_longer_than_the_live_timeout_stays_live_and_not_ready(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    port = free_port()
    cfg = config_factory(
        {"privacy": NOISE_FREE, "metrics": {"port": port}, "queries": ONE_PUBLIC_KEY_QUERY}
    )
    await apply_topics(load_config(cfg), kafka_bootstrap, include_input=True)
    worker = start_worker(
        cfg,
        tmp_path / "worker.log",
        {LEDGER_DELAY_ENV: str(LEDGER_DELAY_S), "STREAM_DP_ALLOW_UNSAFE_TEST_MODE": "1"},
    )
    serving_since: float | None = None
    checked_past_timeout = 0
    try:
        deadline = time.monotonic() + HANG_GUARD_S + 4 * LEDGER_DELAY_S
        while "ledger loaded" not in worker.log():
            assert time.monotonic() < deadline, worker.log()[-3000:]
            assert worker.proc.poll() is None, worker.log()[-3000:]
            live = await asyncio.to_thread(_status, port, "/health/live")
            if live:
                serving_since = serving_since or time.monotonic()
                ready = await asyncio.to_thread(_status, port, "/health/ready")
                loaded = "ledger loaded" in worker.log()
                assert live == 200 or loaded, worker.log()[-3000:]
                assert ready == 503 or loaded, worker.log()[-3000:]
                if time.monotonic() - serving_since > DEFAULT_LIVE_TIMEOUT_S + 2:
                    checked_past_timeout += 1
            await asyncio.sleep(0.5)  # the pace of the probe, as an orchestrator's
    finally:
        code = worker.terminate()
    assert checked_past_timeout > 0, (
        "the start-up was shorter than the liveness timeout: nothing was tested"
    )
    assert code == 0, worker.log()[-3000:]
