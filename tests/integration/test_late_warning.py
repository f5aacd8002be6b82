"""A worker started without window.start_at on a topic of old events says why nothing is
released: within a minute, a WARNING that names window.start_at."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from tests.helpers import wait_until
from tests.integration.support import produce_events, start_worker, topics_of

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MakeConfig = Callable[[dict[str, Any] | None], Path]
T0_MS = 1_596_240_000_000  # 2020-08-01T00:00:00Z: years before the worker's first start


async def test_worker_warns_about_old_events_naming_start_at(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    path = config_factory(None)
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    del data["window"]["start_at"]  # covered from the first start, as in the README's path
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    await apply_topics(load_config(path), kafka_bootstrap, include_input=True)
    events = [
        {"user_id": f"u{i % 7}", "timestamp": T0_MS + 1000 * i, "domain": "a.example"}
        for i in range(40)
    ]
    await produce_events(kafka_bootstrap, topics_of(path)["input"], events)
    worker = start_worker(path, tmp_path / "worker.log")
    try:
        wait_until(
            lambda: "events dropped as late" in worker.log(),
            timeout_s=60.0,
            what="the late-events WARNING in the worker's log",
        )
    finally:
        assert worker.terminate() == 0, worker.log()
    line = next(ln for ln in worker.log().splitlines() if "events dropped as late" in ln)
    assert "WARNING" in line and "window.start_at" in line, line
    assert "u1" not in line  # counts and windows only, never a user id
