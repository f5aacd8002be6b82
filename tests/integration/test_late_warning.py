"""A worker started without window.start_at on a topic of old events says why nothing is
released: within a minute, a WARNING that names window.start_at. Late events that arrive
while the warning is rate-limited are warned about when the worker stops."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from tests.helpers import wait_until
from tests.integration.support import (
    free_port,
    http_get,
    produce_events,
    start_worker,
    topics_of,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MakeConfig = Callable[[dict[str, Any] | None], Path]
T0_MS = 1_596_240_000_000  # 2020-08-01T00:00:00Z: years before the worker's first start
#: A late-events WARNING of the worker's JSON log, its count captured.
LATE_LINE = re.compile(r'^.*"level": "WARNING".*"msg": "(\d+) events dropped as late: .*$', re.M)


def _without_start_at(path: Path) -> Path:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    del data["window"]["start_at"]  # covered from the first start, as in the README's path
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def _old_events(n: int, first: int = 0) -> list[dict[str, Any]]:
    return [
        {"user_id": f"u{i % 7}", "timestamp": T0_MS + 1000 * i, "domain": "a.example"}
        for i in range(first, first + n)
    ]


async def test_worker_warns_about_old_events_naming_start_at(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    path = _without_start_at(config_factory(None))
    await apply_topics(load_config(path), kafka_bootstrap, include_input=True)
    events = _old_events(40)
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


async def test_late_events_held_back_by_the_rate_limit_are_warned_about_at_the_stop(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    """The first WARNING comes with the first late events read (some or all of the first
    40: the worker may read them in more than one batch); the rest, and 5 more produced
    after it, fall within the 300 s rate limit and are not warned about until the worker
    stops (SIGTERM): then a second WARNING counts exactly those."""
    port = free_port()
    path = _without_start_at(config_factory({"metrics": {"port": port}}))
    await apply_topics(load_config(path), kafka_bootstrap, include_input=True)
    input_topic = topics_of(path)["input"]
    await produce_events(kafka_bootstrap, input_topic, _old_events(40))
    worker = start_worker(path, tmp_path / "worker.log")

    def late_total() -> float:
        _, body = http_get(port, "/metrics")
        found = re.search(rb"^stream_dp_late_events_total (\S+)$", body, re.MULTILINE)
        return float(found.group(1)) if found else -1.0

    try:
        wait_until(
            lambda: LATE_LINE.search(worker.log()) is not None,
            timeout_s=60.0,
            what="the first late-events WARNING",
        )
        first = int(LATE_LINE.findall(worker.log())[0])
        assert 1 <= first <= 40, worker.log()
        await produce_events(kafka_bootstrap, input_topic, _old_events(5, first=40))
        wait_until(lambda: late_total() == 45.0, timeout_s=60.0, what="45 late events counted")
        assert LATE_LINE.findall(worker.log()) == [str(first)], worker.log()
    finally:
        assert worker.terminate() == 0, worker.log()
    warned = LATE_LINE.findall(worker.log())
    assert warned == [str(first), str(45 - first)], worker.log()
