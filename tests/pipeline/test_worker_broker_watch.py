"""What the worker does with each broker check (stream_dp.broker.probe.watch_broker gives the
results): readiness follows it, and the idle clocks restart when the broker comes back —
silence during an outage is no idleness."""

from __future__ import annotations

from typing import Any

from stream_dp.pipeline.kafka.worker import Worker
from tests.pipeline.support import KEYRING, config


class _Ingest:
    def __init__(self) -> None:
        self.restarts: list[float] = []

    def restart_idle_clocks(self, now_mono_s: float) -> None:
        self.restarts.append(now_mono_s)


def test_each_check_sets_readiness_and_a_return_restarts_the_idle_clocks() -> None:
    worker = Worker(config(), KEYRING, bootstrap_servers="127.0.0.1:1")
    ingest: Any = _Ingest()
    worker.ingest = ingest
    seen = []
    for ok in (True, False, False, True, True):
        worker._broker_checked(ok)
        seen.append(worker.health.status()["components"]["producer_connected"])
    assert seen == [True, False, False, True, True]
    assert len(ingest.restarts) == 1  # once, when the broker came back
    assert worker._leaderless == set()  # refreshed with each check (no consumer yet)
