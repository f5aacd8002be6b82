"""A worker frozen past the session timeout at the worst moment, then resumed (issue 13).

The worker freezes itself (SIGSTOP, woken by SIGCONT after the pause) at one of its fault
points; its partitions move to the other worker, which may release the same windows; then
it resumes exactly where it stopped — mid-release, holding a draw, before publishing. The
claims: every (query, window, key) has one value on the output topic and that value is the
ledger's (the first complete draw in log order); every window is released; the paused
worker stays alive, rejoins and stops cleanly (exit 0). Noise is real (small ε over 20
public keys), so a second draw would show as a second value with overwhelming probability:
two independent discrete Laplace draws of scale 5 agree with probability < 0.1 per key, so
all 20 keys of a window agree by chance with probability < 1e-20.

``FENCING_RUNS`` repeats each point (``make chaos`` runs four of each; not a ``STREAM_DP_``
variable, which the workers would refuse as an unknown configuration key).
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from stream_dp.pipeline.faults import CRASH_POINTS, PAUSE_POINT_ENV
from stream_dp.pipeline.formats.ledger import LedgerIndex
from tests.apache_kafka.tier import APACHE_KAFKA, ON_BOTH_BROKERS, TANSU
from tests.integration.support import (
    decode_values,
    noise_free,
    partitions_taken_over,
    produce_events,
    read_topic,
    spread_events,
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
DOMAINS = [f"d{i:02d}.example" for i in range(20)]
WINDOWS = 6
PAUSE_S = 6.0  # three times the session timeout
RUNS = int(os.environ.get("FENCING_RUNS", "1"))
#: On Apache Kafka (its own group coordinator evicts the frozen member), the points around
#: the ledger's draw and publication; every point on the embedded broker.
APACHE_KAFKA_POINTS = ("after_ledger_write", "before_draw", "after_ledger_readback",
                       "after_output_write")  # fmt: skip
BROKER_AND_POINT = [
    *(pytest.param(TANSU, point, id=f"{point}-{TANSU}") for point in CRASH_POINTS),
    *(
        pytest.param(
            APACHE_KAFKA, point, id=f"{point}-{APACHE_KAFKA}", marks=pytest.mark.apache_kafka
        )
        for point in APACHE_KAFKA_POINTS
    ),
]


@pytest.mark.parametrize("run", range(RUNS))
@pytest.mark.parametrize(
    ("kafka_bootstrap", "point"), BROKER_AND_POINT, indirect=["kafka_bootstrap"]
)
async def test_a_worker_paused_past_its_session_never_publishes_a_second_value(
    point: str,
    run: int,
    kafka_bootstrap: str,
    config_factory: MakeConfig,
    tmp_path: Path,
) -> None:
    queries: list[dict[str, Any]] = [
        {"name": "visits", "group_by": ["domain"], "epsilon": 0.2, "keys": {"domain": DOMAINS}}
    ]
    if point == "after_continual_write":
        # frozen right after writing a running total's state: the other worker takes the
        # window over, and both must use the first complete state draw
        queries.append({**queries[0], "name": "visits_so_far", "release": "cumulative",
                        "horizon_windows": 4, "continual_mechanism": "tree_honaker"})  # fmt: skip
    names = [q["name"] for q in queries]
    cfg = config_factory(
        {
            "bounds": {"max_contributions_per_window": 3},
            "privacy": {
                "epsilon_per_window": 0.2 * len(queries),
                "max_epsilon_per_horizon": 100,
            },
            "queries": queries,
        }
    )
    config = load_config(cfg)
    await apply_topics(config, kafka_bootstrap, include_input=True)
    topics = topics_of(cfg)
    expected = await stage_partitions(kafka_bootstrap, config)
    steady = start_worker(cfg, tmp_path / "steady.log")
    paused = start_worker(
        cfg,
        tmp_path / "paused.log",
        {PAUSE_POINT_ENV: f"{point}:1:{PAUSE_S}", "STREAM_DP_ALLOW_UNSAFE_TEST_MODE": "1"},
    )
    try:
        await wait_for_group([steady, paused], expected)
        events = spread_windows(T0, WINDOWS, DOMAINS)
        await produce_events(kafka_bootstrap, topics["input"], events)
        out = await read_topic(
            kafka_bootstrap,
            topics["output"],
            until=windows_done(names, WINDOWS),
            timeout_s=120,
            settle_s=PAUSE_S + 4,  # anything the paused worker does after it wakes
        )
        assert f"test fault point {point} reached" in paused.log(), (
            "the paused worker never reached the point: the run proves nothing"
        )
        # The pause outlasted the session: the group handed the paused worker's partitions
        # to the other one, which could then release the same windows (else: nothing tested).
        taken = partitions_taken_over(
            paused.log(), steady.log(), f"test fault point {point} reached"
        )
        assert taken, f"no takeover during the pause\n{steady.log()[-4000:]}"
        # The paused worker says so: its lost membership is counted and logged, also when
        # only aiokafka's heartbeat saw it (no commit of its own was refused).
        lost = [line for line in paused.log().splitlines() if "lost its membership" in line]
        assert lost and all('"level": "WARNING"' in line for line in lost), paused.log()[-4000:]
        # Both are alive and working: a later window is released after the pause.
        await produce_events(
            kafka_bootstrap,
            topics["input"],
            [
                *spread_events(T0, WINDOWS, DOMAINS),
                {"user_id": "x", "timestamp": T0 + 10 * WINDOWS + 25, "domain": "d"},
            ],
        )
        out = await read_topic(
            kafka_bootstrap,
            topics["output"],
            until=windows_done(names, WINDOWS + 1),
            timeout_s=120,
        )
        assert paused.proc.poll() is None, paused.log()
    finally:
        codes = [steady.terminate(), paused.terminate()]
    assert codes == [0, 0], f"{codes}\n{paused.log()[-4000:]}"
    assert "Traceback" not in paused.log() and "Traceback" not in steady.log()

    # One value per (query, window, key) on the output topic ...
    values: dict[tuple[str, str, str], set[Any]] = defaultdict(set)
    for _, v in decode_values(out):
        if v["kind"] == "release":
            values[(v["query"], v["window_start"], orjson.dumps(v["group"]).decode())].add(
                v["value"]
            )
    assert values and all(len(vs) == 1 for vs in values.values()), {
        k: vs for k, vs in values.items() if len(vs) > 1
    }
    # ... and it is the ledger's value: the first complete draw in log order.
    index = LedgerIndex()
    for key, raw in await read_topic(kafka_bootstrap, topics["ledger"]):
        index.feed(key or "", raw)
    for (query, window, group), (value,) in values.items():
        start = _epoch(window)
        release = index.get(query, start)
        assert release is not None, (query, window)
        by_group = {
            orjson.dumps(r.value["group"]).decode(): r.value["value"]
            for r in release.records
            if r.value["kind"] == "release"
        }
        assert by_group[group] == value


def _epoch(iso: str) -> int:
    from stream_dp.windows.tumbling import epoch_of_iso

    return epoch_of_iso(iso)


@ON_BOTH_BROKERS
async def test_a_slow_ledger_never_starts_a_rebalance_storm(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    """aiokafka sends no heartbeat while an assignment callback runs. A worker whose ledger
    writes take 1 s each needed 3 s to fence the three ledger partitions inside that
    callback: past the 2 s session it was evicted, rejoined, was evicted again — a storm in
    which no window was released (the chaos run found it). Taking partitions in the loop,
    with the fences written at once, keeps the group stable and every window released."""
    cfg = config_factory(
        {
            "privacy": noise_free(1e6),
            "queries": [
                {
                    "name": "visits",
                    "group_by": ["domain"],
                    "epsilon": 1e6,
                    "keys": {"domain": DOMAINS},
                }
            ],
        }
    )
    config = load_config(cfg)
    await apply_topics(config, kafka_bootstrap, include_input=True)
    topics = topics_of(cfg)
    expected = await stage_partitions(kafka_bootstrap, config)
    steady = start_worker(cfg, tmp_path / "steady.log")
    slow = start_worker(
        cfg,
        tmp_path / "slow.log",
        {"STREAM_DP_TEST_LEDGER_DELAY_S": "1.0", "STREAM_DP_ALLOW_UNSAFE_TEST_MODE": "1"},
    )
    try:
        await wait_for_group([steady, slow], expected)
        events = spread_windows(T0, WINDOWS, DOMAINS)
        produced = {T0 + 10 * w for w in range(WINDOWS)}
        await produce_events(kafka_bootstrap, topics["input"], events)
        out = await read_topic(
            kafka_bootstrap,
            topics["output"],
            until=lambda records: _window_starts(records) >= produced,
            timeout_s=180,
        )
    finally:
        codes = [steady.terminate(), slow.terminate()]
    assert codes == [0, 0], slow.log()[-4000:]
    # Every window of the events produced above is released. Two workers release windows
    # independently (the slow ledger holds its own), so they need not come out in order, and
    # the late event's own window may close by wall clock before the read returns.
    assert _window_starts(out) >= produced, sorted(_window_starts(out))
    # A storm shows as an assignment every few seconds for as long as it lasts.
    for worker in (steady, slow):
        assert worker.log().count("partitions assigned") <= 6, worker.log()[-4000:]
    assert "lost its membership" not in slow.log(), slow.log()[-4000:]


def _window_starts(records: list[tuple[str | None, bytes]]) -> set[int]:
    """The window starts (epoch seconds) of the window records among ``records``."""
    return {_epoch(v["window_start"]) for _, v in decode_values(records) if v["kind"] == "window"}
