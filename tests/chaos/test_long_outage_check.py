"""The chaos run's "long outage" check, judged on made-up outcomes (no broker): it passes when
every window due at each restart came out and no worker stopped on output.max_hold_s, however
long the catch-up took on a loaded machine, and fails when the due windows never all came out
(the wait's hang guard passed first) or a worker's log says it stopped on the maximum hold."""

from __future__ import annotations

import random
from pathlib import Path

import orjson

from chaos.run import (
    HELD_TOO_LONG,
    MAX_HOLD_S,
    OUTAGE_S,
    SMOKE,
    Run,
    _long_outage_check,
)

#: A worker's log: its JSON lines (an INFO line about holding, which is not a stop).
LOG = b"\n".join(
    orjson.dumps(line)
    for line in (
        {"level": "INFO", "message": "partitions assigned"},
        {"level": "INFO", "message": "window released", "window": "2026-01-01T00:00:05Z"},
    )
)


def _run(tmp_path: Path, outages: list[tuple[float, int, float | None]]) -> Run:
    run = Run(settings=SMOKE, out=tmp_path, workdir=tmp_path, rng=random.Random(0))
    run.outages = outages
    return run


def test_a_slow_catch_up_that_releases_every_due_window_passes(tmp_path: Path) -> None:
    # 13 windows due, out 300 s after the restart: slow (a loaded machine), but caught up
    check = _long_outage_check(_run(tmp_path, [(OUTAGE_S, 13, 300.0)]), {"log worker 0": LOG})
    assert check.ok, check
    assert f"output.max_hold_s = {MAX_HOLD_S} s" in check.name


def test_due_windows_that_never_all_came_out_fail(tmp_path: Path) -> None:
    outages = [(OUTAGE_S, 13, 20.0), (OUTAGE_S, 40, None)]  # the second: the hang guard passed
    check = _long_outage_check(_run(tmp_path, outages), {"log worker 0": LOG})
    assert not check.ok
    assert f"never all out: [({OUTAGE_S}, 40, None)]" in check.detail


def test_a_worker_stopped_on_the_maximum_hold_fails(tmp_path: Path) -> None:
    stop = orjson.dumps(
        {"level": "ERROR", "message": "held records " + HELD_TOO_LONG.decode() + " (60 s)"}
    )
    scanned = {"log worker 0": LOG, "log worker 1": LOG + b"\n" + stop, "topic output": stop}
    check = _long_outage_check(_run(tmp_path, [(OUTAGE_S, 13, 20.0)]), scanned)
    assert not check.ok
    assert "['log worker 1']" in check.detail  # a worker's log, not a topic's records
