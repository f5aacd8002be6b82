"""bench/idle_probe.py: the measured span's wall time split into busy CPU and each kind of
wait, on synthetic iterations whose split is known by construction (no broker)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from bench.idle_probe import PHASES, SUB_PHASES, BrokerCpu, breakdown, rows

EVENTS = 30_000


def _iteration(
    start: float, end: float, cpu: float, consumed: int, run_queue: float = 0.0, **waits: float
) -> Any:
    zero = dict.fromkeys([*PHASES, *SUB_PHASES], 0.0)
    cpus = {f"{p}_cpu": 0.0 for p in (*PHASES, *SUB_PHASES)}
    return {
        "start": start,
        "end": end,
        "cpu": cpu,
        "records": 10_000,
        "consumed": consumed,
        "run_queue": run_queue,
        **zero,
        **cpus,
        **waits,
    }


def test_the_span_s_wall_time_splits_into_its_waits_and_processing() -> None:
    # Iteration 0 consumed the first batch (the span starts at its end, t = 1.0); each
    # later one: a fetch wait before it (from the previous end to its start), then its
    # own awaits. Wall time 1.0 → 4.0 = 3 s; CPU 0.5 → 2.0 = 1.5 s.
    iterations = [
        _iteration(0.5, 1.0, 0.5, 10_000, run_queue=1.0),
        _iteration(1.2, 2.0, 1.0, 20_000, fetch=0.2, route=0.3, commit=0.1),
        _iteration(2.5, 4.0, 2.0, EVENTS, 1.3, fetch=0.5, seal_release=0.6, release=0.4),
    ]
    # One fetch request in flight from 1.5 to 2.5 (0.5 s of it inside iteration 1) and one
    # from 3.0, never answered (1.0 s inside iteration 2, up to its end).
    got = breakdown(
        {"iterations": iterations, "in_flight": [[1.5, 2.5, 4, True], [3.0, 0.0, 4, None]]}, EVENTS
    )
    assert got["wall_s"] == pytest.approx(3.0)
    assert got["cpu_s"] == pytest.approx(1.5)
    assert got["busy_share"] == pytest.approx(0.5)
    assert got["run_queue_share"] == pytest.approx(0.1)  # 0.3 s runnable, not running
    assert got["events_per_s"] == pytest.approx(20_000 / 3.0)
    assert got["iterations"] == 2
    share = got["share"]
    assert share["fetch_wait"] == pytest.approx(0.7 / 3)
    assert share["route_acks"] == pytest.approx(0.3 / 3)
    assert share["seal_release"] == pytest.approx(0.6 / 3)
    assert share["commit"] == pytest.approx(0.1 / 3)
    # The iterations last 0.8 + 1.5 s, of which 1.0 s awaits other than the fetch.
    assert share["processing"] == pytest.approx((2.3 - 1.0) / 3)
    # What is neither an iteration nor its fetch: 3.0 - 2.3 - 0.7.
    assert share["between_iterations"] == pytest.approx(0.0, abs=1e-9)
    assert got["phases"]["release"]["wall_share"] == pytest.approx(0.4 / 3)
    assert got["fetch_in_flight_while_processing"] == pytest.approx(1.5 / 2.3)
    assert [f[0] for f in got["fetch_requests"]] == [0.5, 2.0]


def test_the_table_splits_each_run_s_span_into_shares_summing_to_one() -> None:
    phases = dict.fromkeys(("fetch", "route", "handoff", "release", "commit"))
    shares = {"fetch": (0.3, 0.1), "route": (0.1, 0.05), "handoff": (0.1, 0.1)}
    run = {
        "events_per_s": 123_456.0,
        "cpu_us_per_event": 2.5,
        "busy_share": 0.5,
        "run_queue_share": 0.1,
        "phases": {
            p: {
                "wall_share": shares.get(p, (0.0, 0.0))[0],
                "cpu_share": shares.get(p, (0.0, 0.0))[1],
            }
            for p in phases
        },
    }
    lines = rows({"load_1min": [1.0], "tansu_keyed_after": [run]})
    # Runs before the broker's CPU was sampled show a dash in its column.
    assert lines[2] == (
        "| tansu, keyed, after | 123,456 | 2.50 | 50% | 10% | 20% | 5% | 0% | 0% | 0% | 15% | – |"
    )
    sampled = rows(
        {"load_1min": [1.0], "kafka_default_after": [{**run, "broker_cpu_us_per_event": 1.404}]}
    )
    assert sampled[2].endswith(" | 15% | 1.40 |")


def test_the_broker_s_cpu_over_a_span_is_read_at_the_samples_nearest_its_ends() -> None:
    cpu = BrokerCpu(pid=1)
    cpu.samples = [(10.0, 1.0), (10.02, 1.01), (10.04, 1.05), (10.06, 1.20)]
    assert cpu.between(10.019, 10.061) == pytest.approx(1.20 - 1.01)
    assert math.isnan(BrokerCpu(pid=1).between(0.0, 1.0))
