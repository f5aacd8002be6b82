"""Cumulative queries on the embedded broker: running totals released by real workers —
exact without noise, one value per (query, window, key) through kill -9 at every fault
point, consistent with the persisted state, and continued across workers.

Two cumulative queries run side by side: ``running`` without noise (test mode, ε = 1e6), so
its values must equal the exact running totals of the bounded counts, and ``noisy`` with
real noise (ε = 0.5), so that a window drawn twice would show as two different values and
as a published value the persisted state does not give.
"""

from __future__ import annotations

import random
import signal
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from stream_dp.pipeline.faults import CRASH_POINTS
from stream_dp.pipeline.formats.continual_state import ContinualStore
from stream_dp.pipeline.stages.release_stage import ReleaseStage
from stream_dp.privacy.continual.counter import restore_counter
from stream_dp.windows.tumbling import iso_utc
from tests.helpers import ConfigFactory, TopicFactory
from tests.integration.support import (
    WorkerProcess,
    decode_values,
    group_partitions,
    ledger_release_ids,
    noise_free,
    produce_records,
    read_topic,
    start_worker,
    wait_for_group,
    windows_done,
)
from tests.integration.test_scale_out import (
    DOMAINS,
    T0,
    K,
    expected_releases,
    keyed_by_user,
    make_events,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

SIZE = 10
HORIZON = 4  # windows per horizon; horizons start at T0 (a multiple of 4 windows)
#: Three horizons: windows 0-3, 4-7, 8-11. (After them the workers go on releasing empty
#: windows, slowly: a restarted worker's event time starts again at the first covered
#: window and advances with the wall clock. So every crash below happens in these windows.)
N_WINDOWS = 12
QUERIES = ["running", "noisy", "hourly"]
TEST_MODE = {"STREAM_DP_ALLOW_UNSAFE_TEST_MODE": "1"}


def _config(config_factory: ConfigFactory, input_topic: str) -> Path:
    public = {"domain": DOMAINS}
    return config_factory(
        {
            "input": {"topic": input_topic, "keyed_by_user": True},
            "window": {"size_s": SIZE, "grace_s": 1, "idle_close_s": 2},
            "privacy": noise_free(3e6),
            "bounds": {"max_contributions_per_window": K},
            "queries": [
                {
                    "name": "running",
                    "group_by": ["domain"],
                    "keys": public,
                    "epsilon": 1e6,
                    "release": "cumulative",
                    "horizon_windows": HORIZON,
                    "continual_mechanism": "tree_honaker",
                },
                {
                    "name": "noisy",
                    "group_by": ["domain"],
                    "keys": public,
                    "epsilon": 0.5,
                    "release": "cumulative",
                    "horizon_windows": HORIZON,
                    "continual_mechanism": "tree_honaker",
                },
                {"name": "hourly", "group_by": ["domain"], "keys": public, "epsilon": 1e6},
            ],
        }
    )


async def _setup(
    bootstrap: str, topic_factory: TopicFactory, config_factory: ConfigFactory, partitions: int
) -> tuple[Path, dict[str, str], list[dict[str, Any]]]:
    """A config on a fresh input topic, its other topics created, and the events to send."""
    input_topic = await topic_factory(partitions=partitions)
    cfg = _config(config_factory, input_topic)
    config = load_config(cfg)
    await apply_topics(config, bootstrap, include_input=False)
    events = make_events(seed=17, n_windows=N_WINDOWS, size_s=SIZE, users=40, heavy=2)
    topics = {
        "input": input_topic,
        "output": config.output.topic,
        "ledger": config.output.ledger_topic,
        "continual": config.output.continual_topic,
        "partials": config.output.partials_topic,
    }
    return cfg, topics, events


def _exact_running(events: Sequence[dict[str, Any]]) -> dict[tuple[str, str], int]:
    """(window start, domain) → the exact running total since the window's horizon start."""
    per_window = expected_releases(events, SIZE, N_WINDOWS)
    out: dict[tuple[str, str], int] = {}
    for domain in DOMAINS:
        total = 0
        for w in range(N_WINDOWS):
            if w % HORIZON == 0:
                total = 0
            window = iso_utc(T0 + w * SIZE)
            total += int(per_window[("visits_by_domain", window, domain)])
            out[(window, domain)] = total
    return out


def _released(output: list[tuple[str | None, bytes]]) -> dict[tuple[str, str, str], set[Any]]:
    """(query, window, domain) → every value published for it (duplicates included)."""
    out: dict[tuple[str, str, str], set[Any]] = defaultdict(set)
    for _, v in decode_values(output):
        if v["kind"] == "release":
            out[(v["query"], v["window_start"], v["group"]["domain"])].add(v["value"])
    return out


def _check(
    cfg: Path,
    events: list[dict[str, Any]],
    output: list[tuple[str | None, bytes]],
    ledger: list[tuple[str | None, bytes]],
    continual: list[tuple[str | None, bytes]],
) -> None:
    windows = [iso_utc(T0 + w * SIZE) for w in range(N_WINDOWS)]
    values = _released(output)
    # one value per (query, window, key), ever: republished copies are identical
    for key, seen in values.items():
        assert len(seen) == 1, f"{key} was published with {len(seen)} different values: {seen}"
    ids = ledger_release_ids(ledger)
    for q in QUERIES:
        for w in windows:
            assert len(ids[(q, w)]) == 1, (q, w, ids.get((q, w)))
    # without noise: the exact running totals of the bounded counts, restarting per horizon
    exact = _exact_running(events)
    got = {(w, d): next(iter(values[("running", w, d)])) for w in windows for d in DOMAINS}
    assert got == exact
    # with noise: exactly what the persisted state gives — no published value came from a
    # draw that is not the window's winning draw in the continual topic
    store = ContinualStore()
    store.load([(k or "", v) for k, v in continual])
    query = ReleaseStage(load_config(cfg)).cumulative.queries["noisy"]
    for w in windows:
        last = store.winner("noisy", T0 + windows.index(w) * SIZE)
        assert last is not None, w
        chain = [d.draws for d in store.chain(last)]
        restored = restore_counter(query.continual, query.keys, chain).values
        assert restored is not None
        published = [next(iter(values[("noisy", w, d)])) for d in DOMAINS]
        assert published == restored.tolist(), w


def test_the_crash_points_include_the_continual_write() -> None:
    assert "after_continual_write" in CRASH_POINTS


async def test_kill_minus_nine_at_every_fault_point_keeps_one_value_per_window_and_key(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    config_factory: ConfigFactory,
    workers: list[WorkerProcess],
    tmp_path: Path,
) -> None:
    cfg, topics, events = await _setup(kafka_bootstrap, topic_factory, config_factory, 2)
    await produce_records(kafka_bootstrap, topics["input"], keyed_by_user(events))
    # Each run dies at the n-th visit of its point, having released about n − 1 windows
    # (a restart first publishes what its predecessor left in the state or the ledger).
    crash_plan: list[str | None] = [
        "after_continual_write:1",  # a window's state written, nothing ledgered
        "after_continual_write:2",  # the restart uses that state, then dies at the next
        "before_draw:2",
        "after_ledger_write:1",  # state and ledger written, nothing published
        "after_output_write:1",  # republishing it at start, before its marker
        "after_output_write:2",
        "after_ledger_readback:2",
        "after_ingest:2",  # mid-batch: open windows only in memory
        None,  # a plain SIGKILL at a random moment
        "after_continual_write:1",
    ]
    rng = random.Random()
    for i, point in enumerate(crash_plan):
        env = dict(TEST_MODE)
        if point is not None:
            env["STREAM_DP_TEST_CRASH_POINT"] = point
        worker = start_worker(cfg, tmp_path / f"worker{i}.log", env)
        workers.append(worker)
        if point is None:
            try:
                worker.proc.wait(timeout=rng.uniform(1.5, 4.0))
            except Exception:  # noqa: BLE001 — still running: kill it where it is
                worker.kill()
        else:
            code = worker.proc.wait(timeout=90)
            assert code == -signal.SIGKILL, worker.log()
    final = start_worker(cfg, tmp_path / "final.log", TEST_MODE)
    workers.append(final)
    output = await read_topic(
        kafka_bootstrap,
        topics["output"],
        until=windows_done(QUERIES, N_WINDOWS),
        timeout_s=120,
        settle_s=1.0,
    )
    assert final.terminate() == 0, final.log()
    ledger = await read_topic(kafka_bootstrap, topics["ledger"])
    continual = await read_topic(kafka_bootstrap, topics["continual"])
    _check(cfg, events, output, ledger, continual)


async def test_two_workers_continue_each_other_s_horizons(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    config_factory: ConfigFactory,
    workers: list[WorkerProcess],
    tmp_path: Path,
) -> None:
    """Windows go round-robin to the 6 partials partitions, which the two workers share:
    consecutive windows of one horizon are released by different workers, each continuing
    the state the other wrote."""
    cfg, topics, events = await _setup(kafka_bootstrap, topic_factory, config_factory, 4)
    config = load_config(cfg)
    shared = await group_partitions(kafka_bootstrap, (topics["input"], topics["partials"]))
    workers.extend(start_worker(cfg, tmp_path / f"w{i}.log", TEST_MODE) for i in range(2))
    shares = await wait_for_group(workers, shared)
    # the data arrives once the group has settled, so the windows' owners stay put
    await produce_records(kafka_bootstrap, topics["input"], keyed_by_user(events))
    output = await read_topic(
        kafka_bootstrap,
        topics["output"],
        until=windows_done(QUERIES, N_WINDOWS),
        timeout_s=120,
        settle_s=1.0,
    )
    for w in workers:
        w.proc.send_signal(signal.SIGTERM)
    for w in workers:
        assert w.proc.wait(timeout=30) == 0, w.log()
    ledger = await read_topic(kafka_bootstrap, topics["ledger"])
    continual = await read_topic(kafka_bootstrap, topics["continual"])
    _check(cfg, events, output, ledger, continual)
    # who released which window: the owner of its partials partition, as the group decided
    owner = {
        p: i
        for i, share in enumerate(shares)
        for t, p in share
        if t == config.output.partials_topic
    }
    released_by = [owner[w % 6] for w in range(N_WINDOWS)]
    assert set(released_by) == {0, 1}
    handovers = [
        w for w in range(1, N_WINDOWS) if w % HORIZON and released_by[w] != released_by[w - 1]
    ]
    assert handovers, released_by  # some window continued a horizon the other worker began
    for i, w in enumerate(workers):
        logged = [
            orjson.loads(line)
            for line in w.log().splitlines()
            if line.startswith("{") and '"window released"' in line
        ]
        mine = {rec["window"] for rec in logged}
        assert {iso_utc(T0 + n * SIZE) for n in range(N_WINDOWS) if released_by[n] == i} <= mine
