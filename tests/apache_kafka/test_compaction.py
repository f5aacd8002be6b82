"""What Apache Kafka's log compaction does to the ledger and the erasure log.

The embedded broker accepts ``cleanup.policy=compact`` and never applies it; Apache Kafka
keeps only the *last* record of each key. Every reader of the ledger must decide the same
after compaction as before: the same winning draw per (query, window), the same first covered
window, the same progress. The erasure log must erase the same pseudonyms from the same
windows.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from stream_dp.pipeline.faults import CRASH_POINT_ENV
from stream_dp.pipeline.formats.erasure_records import decode_log_record, encode_erasure
from stream_dp.pipeline.formats.ledger import LedgerIndex, encode_coverage
from stream_dp.privacy.erasure import ErasureSet
from tests.apache_kafka.compaction import (
    COMPACT_LATER,
    Stored,
    compact,
    is_probe,
    kinds,
    read_all,
    read_partition,
)
from tests.apache_kafka.tier import ON_APACHE_KAFKA
from tests.helpers import TopicFactory, wait_until
from tests.integration.support import (
    HANG_GUARD_S,
    NOISE_FREE,
    produce_events,
    produce_records,
    run_worker_until_windows,
    start_worker,
    topic_partitions,
    topics_of,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow, ON_APACHE_KAFKA]
MakeConfig = Callable[[dict[str, Any] | None], Path]
T0 = 1_596_240_000
HOUR = 3600


def _start_until_taken(cfg: Path, log_path: Path) -> None:
    """Start a worker, wait until it has read the ledger and taken its partitions, stop it."""
    worker = start_worker(cfg, log_path)
    try:
        wait_until(lambda: "partitions taken" in worker.log(), HANG_GUARD_S, "partitions taken")
    finally:
        code = worker.terminate()
    assert code == 0, worker.log()


def _index(records: Sequence[Stored]) -> LedgerIndex:
    """The ledger as a worker reads it at start (forgetting released windows)."""
    index = LedgerIndex(forget_released=True)
    for _, key, value in records:
        index.feed(key, value)
    return index


def _decided(index: LedgerIndex, window_starts: Sequence[int] = ()) -> dict[str, Any]:
    """Everything a worker takes from the ledger at start."""
    return {
        "released": [ws for ws in window_starts if index.covered(ws)],
        "releases": {
            (r.query, r.window_start_s): (r.release_id, [x.value for x in r.records])
            for r in index.releases()
        },
        "published": sorted((r.query, r.window_start_s) for r in index.releases() if r.published),
        "coverage": index.coverage_start_s,
        "progress": index.progress,
        "partials_partitions": index.partials_partitions,
    }


async def test_racing_coverage_records_keep_their_winner_through_compaction(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    """Two workers of a new deployment start at once and each records the first covered
    window (they may disagree: each takes the window of its own clock, or one has a
    different window.start_at). Readers take the first in log order. Apache Kafka's
    compaction keeps the last record of a key: with one key for every writer, the loser's
    record would replace the winner's, and a worker restarted after compaction would
    cover windows the first workers never did."""
    topic = await topic_factory(1, config=COMPACT_LATER, prefix="ledger")
    racers = [encode_coverage(HOUR, HOUR), encode_coverage(2 * HOUR, HOUR)]
    # Two producers at once, as two workers: the broker decides the order.
    await asyncio.gather(
        *(produce_records(kafka_bootstrap, topic, [(k.encode(), v)]) for k, v in racers)
    )
    before = await read_partition(kafka_bootstrap, topic, 0)
    assert kinds(before)["coverage"] == 2, before  # both racers wrote
    first = orjson.loads(next(v for _, _, v in before if v and b'"coverage"' in v))
    decided_before = _index(before).coverage_start_s

    await compact(kafka_bootstrap, topic, [0])
    after = await read_partition(kafka_bootstrap, topic, 0)

    assert [k for _, k, _ in after if k.encode() == b"__fence__|compaction-probe"] == [
        "__fence__|compaction-probe"
    ], "positive control: the cleaner compacted the partition"
    assert decided_before == HOUR * (1 if first["first_window_start"].endswith("01:00:00Z") else 2)
    assert _index(after).coverage_start_s == decided_before


async def test_compaction_keeps_every_decision_of_a_real_ledger(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    """A worker releases windows into a ledger topic as defined (3 partitions, compact, kept
    forever); after the cleaner ran, the ledger decides exactly
    what it decided before, and a worker restarted on it releases no window again."""
    windows = 6
    cfg = config_factory(
        {
            "privacy": NOISE_FREE,
            "queries": [
                {"name": "visits", "group_by": ["domain"], "epsilon": 1e6,
                 "keys": {"domain": ["a.example", "b.example"]}},
                {"name": "users", "statistic": "count_distinct_users", "epsilon": 1e6,
                 "keys": {}},
            ],
        }
    )  # fmt: skip
    config = load_config(cfg)
    topics = topics_of(cfg)
    ledger = topics["ledger"]
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(ledger, 3, 1, None, COMPACT_LATER)])
    finally:
        await admin.close()
    await apply_topics(config, kafka_bootstrap, include_input=True)
    events = [
        {"user_id": f"u{u}", "timestamp": T0 + 10 * w + u % 9, "domain": "ab"[u % 2] + ".example"}
        for w in range(windows)
        for u in range(12)
    ]
    events.append({"user_id": "late", "timestamp": T0 + 10 * windows + 5, "domain": "a.example"})
    await produce_events(kafka_bootstrap, topics["input"], events)
    queries = ["visits", "users"]
    await run_worker_until_windows(kafka_bootstrap, cfg, tmp_path / "first.log", queries, windows)
    # A restart of the same deployment: it reads the ledger and writes its fences.
    await asyncio.to_thread(_start_until_taken, cfg, tmp_path / "second.log")
    before = await read_all(kafka_bootstrap, ledger, range(3))

    await compact(kafka_bootstrap, ledger, range(3))
    after = await read_all(kafka_bootstrap, ledger, range(3))

    starts = [T0 + 10 * w for w in range(windows + 2)]
    assert _decided(_index(after), starts) == _decided(_index(before), starts)
    assert _decided(_index(before), starts)["released"] == starts[:windows]
    counted_before, counted_after = kinds(before), kinds(after)
    print(  # the figure of the report: records per kind before and after compaction
        f"\nledger records before/after compaction: {sum(counted_before.values())} -> "
        f"{sum(counted_after.values())}; per kind: "
        + ", ".join(f"{k} {counted_before[k]}->{counted_after[k]}" for k in sorted(counted_before))
    )
    # Every window is released: its parts and published markers were tombstoned behind its
    # progress record, and the cleaner removed them. What is left does not depend on the
    # number of windows: per ledger partition one progress record per partials partition
    # (and the tombstoned ones' successors), the coverage record, one fence per reader.
    assert counted_before["ledger"] >= len(queries) * windows
    assert counted_after["ledger"] == 0 and counted_after["published"] == 0, counted_after
    partials = len(await topic_partitions(kafka_bootstrap, config.output.partials_topic))
    assert counted_after["progress"] <= 3 * partials, counted_after
    readers = 2 * 3  # two worker starts, one ledger reader each, fenced on every partition
    assert counted_after["fence"] <= readers, counted_after  # probes and rolls not counted

    # A start on the compacted ledger, with one more window to release, releases no earlier
    # window again: every (query, window) on the output topic has one release id.
    late = {"user_id": "later", "timestamp": T0 + 10 * windows + 15, "domain": "b.example"}
    await produce_events(kafka_bootstrap, topics["input"], [late])
    out, _ = await run_worker_until_windows(
        kafka_bootstrap, cfg, tmp_path / "third.log", queries, windows + 1
    )
    ids: dict[tuple[str, str], set[str]] = {}
    for _, value in out:
        record = orjson.loads(value)
        ids.setdefault((record["query"], record["window_start"]), set()).add(record["release_id"])
    assert len(ids) == len(queries) * (windows + 1)
    assert all(len(v) == 1 for v in ids.values()), ids


async def test_compacting_the_erasure_log_erases_the_same_pseudonyms(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    """The erasure log is keyed by the user's first pseudonym: a second request for a user
    replaces the first when Apache Kafka compacts. Each window must still exclude the same
    pseudonyms; the user's erasure moves to the later request's position in the log."""
    topic = await topic_factory(
        1, config={**COMPACT_LATER, "cleanup.policy": "compact,delete"}, prefix="erasure-log"
    )
    alice = {"k1": bytes(range(16))}
    bob = {"k1": bytes(range(16, 32))}
    records = [
        encode_erasure(alice, recorded_at_s=T0, expires_at_s=T0 + 10 * HOUR),
        encode_erasure(bob, recorded_at_s=T0 + 60, expires_at_s=T0 + 60 + 10 * HOUR),
        encode_erasure(alice, recorded_at_s=T0 + 120, expires_at_s=T0 + 120 + 10 * HOUR),
    ]
    await produce_records(kafka_bootstrap, topic, [(k.encode(), v) for k, v in records])

    def erasures(stored: Sequence[Stored]) -> ErasureSet:
        out = ErasureSet()
        for offset, key, value in stored:
            erasure = None if is_probe(key) else decode_log_record(value, offset)
            if erasure is not None:
                out.add(erasure)
        return out

    before = erasures(await read_partition(kafka_bootstrap, topic, 0))
    await compact(kafka_bootstrap, topic, [0])
    after = erasures(await read_partition(kafka_bootstrap, topic, 0))
    assert (len(before), len(after)) == (3, 2)  # alice's first request is compacted away
    for window in range(T0 - HOUR, T0 + 12 * HOUR, 600):
        assert after.erased("k1", window) == before.erased("k1", window), window


async def test_a_kill_between_progress_and_tombstones_then_compaction_draws_nothing_again(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    """kill -9 in the middle of a window's compaction writes: its progress record is durable,
    its tombstones are not. The cleaner then runs on what was written (earlier windows'
    parts removed, that window's kept). A restart on the compacted ledger draws no released
    window again, tombstones what the kill left behind, and after the cleaner ran again no
    released window's part is left."""
    windows = 4
    cfg = config_factory(
        {
            "privacy": NOISE_FREE,
            "queries": [
                {"name": "visits", "group_by": ["domain"], "epsilon": 1e6,
                 "keys": {"domain": ["a.example", "b.example"]}},
            ],
        }
    )  # fmt: skip
    config = load_config(cfg)
    topics = topics_of(cfg)
    ledger = topics["ledger"]
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(ledger, 3, 1, None, COMPACT_LATER)])
    finally:
        await admin.close()
    await apply_topics(config, kafka_bootstrap, include_input=True)
    events = [
        {"user_id": f"u{u}", "timestamp": T0 + 10 * w + u % 9, "domain": "ab"[u % 2] + ".example"}
        for w in range(windows)
        for u in range(12)
    ]
    events.append({"user_id": "late", "timestamp": T0 + 10 * windows + 5, "domain": "a.example"})
    await produce_events(kafka_bootstrap, topics["input"], events)
    env = {"STREAM_DP_ALLOW_UNSAFE_TEST_MODE": "1", CRASH_POINT_ENV: "after_progress:2"}
    killed = start_worker(cfg, tmp_path / "killed.log", env)
    code = await asyncio.to_thread(killed.proc.wait, HANG_GUARD_S)
    assert code == -signal.SIGKILL, killed.log()
    assert "test fault point after_progress reached" in killed.log()
    written = await read_all(kafka_bootstrap, ledger, range(3))
    left_behind = [k for _, k, v in written if "|part-" in k and v is not None]
    tombstoned = {k for _, k, v in written if v is None}
    assert set(left_behind) - tombstoned, "the kill left no window's parts untombstoned"

    await compact(kafka_bootstrap, ledger, range(3))
    out, _ = await run_worker_until_windows(
        kafka_bootstrap, cfg, tmp_path / "restarted.log", ["visits"], windows
    )
    ids: dict[str, set[str]] = {}
    for _, value in out:
        record = orjson.loads(value)
        ids.setdefault(record["window_start"], set()).add(record["release_id"])
    assert len(ids) == windows and all(len(v) == 1 for v in ids.values()), ids

    await compact(kafka_bootstrap, ledger, range(3))
    after = kinds(await read_all(kafka_bootstrap, ledger, range(3)))
    assert after["ledger"] == 0 and after["published"] == 0, after
