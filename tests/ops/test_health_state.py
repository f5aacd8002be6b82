"""Liveness follows the loop's beats (injectable clock, no sleeps); readiness the components."""

from __future__ import annotations

import asyncio

import pytest

from stream_dp.ops.health import COMPONENTS, Health
from stream_dp.ops.metrics import Metrics
from stream_dp.ops.progress import report_progress, reporting_progress


class FakeClock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_ready_only_when_every_component_is_set() -> None:
    health = Health(clock=FakeClock())
    assert not health.ready()
    for component in COMPONENTS[:-1]:
        health.set(component, True)
        assert not health.ready(), f"ready before {COMPONENTS[-1]}"
    health.set(COMPONENTS[-1], True)
    assert health.ready()
    health.set("producer_connected", False)
    assert not health.ready()


def test_components_are_the_agreed_five() -> None:
    assert set(COMPONENTS) == {
        "partitions_assigned",
        "producer_connected",
        "ledger_loaded",
        "topology_stable",
        "input_readable",
    }


def test_unknown_component_is_refused() -> None:
    with pytest.raises(ValueError, match="partitions_assigned"):
        Health().set("partition_assigned", True)


def test_live_is_independent_of_readiness() -> None:
    clock = FakeClock()
    health = Health(clock=clock)
    health.beat()
    assert health.live() and not health.ready()
    for component in COMPONENTS:
        health.set(component, True)
    clock.now += 31
    assert health.ready() and not health.live()


def test_live_fails_when_beats_stop_and_recovers_on_the_next_beat() -> None:
    clock = FakeClock()
    health = Health(live_timeout_s=30, clock=clock)
    health.beat()
    clock.now += 30
    assert health.live()
    clock.now += 0.001
    assert not health.live()
    health.beat()
    assert health.live()


def test_a_long_step_that_progresses_stays_live_and_a_hang_does_not() -> None:
    """One iteration, no loop beat for 3 × the timeout: live while its chunks keep coming,
    not live once they stop for longer than the timeout."""
    clock = FakeClock()
    health = Health(live_timeout_s=30, clock=clock)
    health.beat()
    for _ in range(9):  # a draw reporting a chunk every 10 s for 90 s
        clock.now += 10
        health.progress("draw")
        assert health.live(), clock.now
    assert health.status()["last_progress_step"] == "draw"
    assert health.status()["progress_beats"] == 9
    clock.now += 30
    assert health.live()
    clock.now += 0.001
    assert not health.live()  # the step hangs: nothing moved for the timeout
    health.beat()
    assert health.live()


async def test_progress_reported_in_a_thread_reaches_the_reporting_context() -> None:
    """The draw runs in asyncio.to_thread: its reports go to the health of the worker task
    that installed the reporter (the thread runs in a copy of that context)."""
    clock = FakeClock()
    health = Health(live_timeout_s=30, clock=clock)
    report_progress("outside")  # no reporter installed: dropped
    assert health.status()["progress_beats"] == 0
    with reporting_progress(health.progress):
        await asyncio.to_thread(report_progress, "draw")
    assert health.status()["progress_beats"] == 1
    report_progress("after")  # the reporter is gone with its context
    assert health.status()["progress_beats"] == 1


def test_start_up_counts_as_a_beat() -> None:
    clock = FakeClock()
    health = Health(live_timeout_s=10, clock=clock)
    assert health.live()
    clock.now += 10.5
    assert not health.live()


def test_live_accepts_an_explicit_now() -> None:
    clock = FakeClock(100.0)
    health = Health(live_timeout_s=5, clock=clock)
    health.beat()
    assert health.live(now=104.0)
    assert not health.live(now=106.0)


def test_status_is_plain_data_for_the_json_body() -> None:
    clock = FakeClock()
    health = Health(live_timeout_s=30, clock=clock)
    health.set("ledger_loaded", True)
    health.beat()
    clock.now += 2.5
    assert health.status() == {
        "live": True,
        "ready": False,
        "components": {
            "partitions_assigned": False,
            "producer_connected": False,
            "ledger_loaded": True,
            "topology_stable": False,
            "input_readable": False,
        },
        "last_beat_age_s": 2.5,
        "live_timeout_s": 30,
        "beats": 1,
        "progress_beats": 0,
        "last_progress_step": "",
    }


def test_ready_gauge_follows_readiness() -> None:
    metrics = Metrics()
    health = Health(metrics=metrics, clock=FakeClock())
    assert metrics.ready._value.get() == 0
    for component in COMPONENTS:
        health.set(component, True)
    assert metrics.ready._value.get() == 1
    health.set("partitions_assigned", False)
    assert metrics.ready._value.get() == 0


def test_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="live_timeout_s"):
        Health(live_timeout_s=0)


def test_a_service_names_its_own_components() -> None:
    from stream_dp.sink.metrics import SinkMetrics
    from stream_dp.sink.service import SINK_COMPONENTS

    metrics = SinkMetrics()
    health = Health(clock=FakeClock(), metrics=metrics, components=SINK_COMPONENTS)
    assert set(health.status()["components"]) == set(SINK_COMPONENTS)
    with pytest.raises(ValueError, match="database_connected"):
        health.set("ledger_loaded", True)  # a worker's component, not the sink's
    for component in SINK_COMPONENTS:
        health.set(component, True)
    assert health.ready() and metrics.ready._value.get() == 1
    with pytest.raises(ValueError, match="at least one"):
        Health(components=())
