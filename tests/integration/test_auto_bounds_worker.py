"""bounds: auto in the streaming worker on the embedded broker (a real `stream-dp run`):
each window is bounded with the bounds decided from the window before, across repartition,
partials and ledger partitions, and released once."""

from __future__ import annotations

import signal
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from tests.helpers import TopicFactory, schema_validator
from tests.integration.support import (
    decode_values,
    group_partitions,
    ledger_release_ids,
    noise_free,
    produce_events,
    produce_records,
    read_topic,
    run_worker_until_windows,
    start_worker,
    topics_of,
    wait_for_group,
    windows_done,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MakeConfig = Callable[[dict[str, Any] | None], Path]
T0 = 1_596_240_000
WINDOWS = 4
USERS = 60


def _per_user(window: int) -> int:
    """Events each user makes in a window: 3, 6, 9, 12."""
    return 3 * (window + 1)


async def test_each_window_is_bounded_with_bounds_decided_from_the_one_before(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    cfg = config_factory(
        {
            # ε so large that the noise is 0: the histograms and counts are exact
            "privacy": noise_free(2000.0),
            "bounds": {
                "max_contributions_per_window": "auto",
                "auto": {"epsilon_share": 0.5, "cap": {"max_contributions_per_window": 64}},
            },
            "queries": [
                {
                    "name": "visits",
                    "group_by": ["domain"],
                    "keys": {"domain": ["a"]},
                    "epsilon": 1000.0,
                }
            ],
        }
    )
    await apply_topics(load_config(cfg), kafka_bootstrap, include_input=True)
    topics = topics_of(cfg)
    events = [
        {"user_id": f"user{u}", "timestamp": T0 + w * 10 + (e % 9) + 0.5, "domain": "a"}
        for w in range(WINDOWS)
        for u in range(USERS)
        for e in range(_per_user(w))
    ]
    await produce_events(kafka_bootstrap, topics["input"], events)
    out, _ = await run_worker_until_windows(
        kafka_bootstrap,
        cfg,
        tmp_path / "worker.log",
        ["visits"],
        WINDOWS,
        env={"STREAM_DP_ALLOW_UNSAFE_TEST_MODE": "1"},
        timeout_s=120,
    )
    records = decode_values(out)
    windows: dict[str, dict[str, Any]] = {}
    counts: dict[str, int] = {}
    for _, value in records:
        if value["kind"] == "window":
            windows[value["window_start"]] = value
        elif value["kind"] == "release":
            counts[value["window_start"]] = value["value"]
    assert len(windows) == WINDOWS
    ledger = [orjson.loads(v) for _, v in await read_topic(kafka_bootstrap, topics["ledger"])]
    decisions = {d["window_start"]: d for d in ledger if d["kind"] == "bounds"}
    ledger_schema = schema_validator("ledger.schema.json")
    for value in ledger:
        ledger_schema.validate(value)
    for w, start in enumerate(sorted(windows)):
        bounds = windows[start]["bounds"]
        k = bounds["max_contributions_per_window"]
        if w == 0:
            assert bounds["chosen"] == "start" and k == 40
        else:
            # decided from the window before, which had 3·w events per user
            assert decisions[start]["max_contributions_per_window"] == k
            assert decisions[start]["chosen_from"] < start
            assert 3 * w <= k <= 64
        assert counts[start] == USERS * min(_per_user(w), k)
    # every window's histograms are ledgered once, charged, and never published
    ids = ledger_release_ids([(None, orjson.dumps(v)) for v in ledger])
    per_query: dict[str, int] = defaultdict(int)
    for (query, _), drawn in ids.items():
        assert len(drawn) == 1
        per_query[query] += 1
    assert per_query == {"visits": WINDOWS, "#bounds": WINDOWS}
    assert all(not (k or "").startswith("#bounds") for k, _ in out)
    assert all(v["kind"] in ("release", "window") for _, v in records)


async def test_two_workers_read_each_others_bounds_from_the_ledger(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    config_factory: MakeConfig,
    tmp_path: Path,
) -> None:
    """Two workers share six unkeyed input partitions, the repartition and the partials
    partitions: stage 1 of a window runs where its users' repartition partition is, its
    release where its partials partition is, and the bounds decided by one worker's release
    are read from the ledger by the other's stage 1 and stage 2."""
    input_topic = await topic_factory(partitions=6)
    cfg = config_factory(
        {
            "input": {"topic": input_topic, "keyed_by_user": False},
            "privacy": noise_free(2000.0),
            "bounds": {
                "max_contributions_per_window": "auto",
                "auto": {"epsilon_share": 0.5, "cap": {"max_contributions_per_window": 64}},
            },
            "queries": [
                {
                    "name": "visits",
                    "group_by": ["domain"],
                    "keys": {"domain": ["a"]},
                    "epsilon": 1000.0,
                }
            ],
        }
    )
    config = load_config(cfg)
    await apply_topics(config, kafka_bootstrap, include_input=False)
    topics = topics_of(cfg)
    group_topics = {input_topic, config.output.repartition_topic, config.output.partials_topic}
    shared = await group_partitions(kafka_bootstrap, group_topics)
    env = {"STREAM_DP_ALLOW_UNSAFE_TEST_MODE": "1"}
    workers = [start_worker(cfg, tmp_path / f"w{i}.log", env) for i in range(2)]
    try:
        await wait_for_group(workers, shared)
        events = [
            {"user_id": f"user{u}", "timestamp": T0 + w * 10 + (e % 9) + 0.5, "domain": "a"}
            for w in range(WINDOWS)
            for u in range(USERS)
            for e in range(_per_user(w))
        ]
        events.sort(key=lambda e: e["timestamp"])
        await produce_records(
            kafka_bootstrap, input_topic, [(None, orjson.dumps(e)) for e in events]
        )
        out = await read_topic(
            kafka_bootstrap,
            topics["output"],
            until=windows_done(["visits"], WINDOWS),
            timeout_s=120,
            settle_s=1.0,
        )
    finally:
        for w in workers:
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGTERM)
        codes = [w.proc.wait(timeout=60) for w in workers]
    assert codes == [0, 0], "\n".join(w.log()[-3000:] for w in workers)
    records = decode_values(out)
    windows = {v["window_start"]: v for _, v in records if v["kind"] == "window"}
    counts = {v["window_start"]: v["value"] for _, v in records if v["kind"] == "release"}
    assert len(windows) == WINDOWS
    ledger = [orjson.loads(v) for _, v in await read_topic(kafka_bootstrap, topics["ledger"])]
    decisions = {d["window_start"]: d for d in ledger if d["kind"] == "bounds"}
    for w, start in enumerate(sorted(windows)):
        k = windows[start]["bounds"]["max_contributions_per_window"]
        if w:
            assert decisions[start]["max_contributions_per_window"] == k
        assert counts[start] == USERS * min(_per_user(w), k)
    ids = ledger_release_ids([(None, orjson.dumps(v)) for v in ledger])
    assert all(len(drawn) == 1 for drawn in ids.values())
    assert all("window released" in w.log() for w in workers)  # both released windows
