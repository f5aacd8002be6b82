"""The sink end to end: the embedded broker, a real PostgreSQL server, the real worker.

- the sink stores a topic written across partitions in any order, dead-letters bad records
  (one the parser refuses, one only PostgreSQL refuses) and goes on;
- ``kill -9`` of the sink in the middle of a batch's transaction, then a restart: the rows
  equal the topic's content, once;
- the worker killed after publishing and restarted republishes (duplicates on the topic):
  the sink changes nothing it had stored.
"""

from __future__ import annotations

import asyncio
import secrets
import signal
import string
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from stream_dp.sink.rows import ReleaseRow, WindowRow, parse_output_record
from stream_dp.sink.schema import migrate
from stream_dp.sink.service import APPLICATION_NAME, Sink, default_group_id
from stream_dp.synthetic.browser_logs import BrowserLogSpec, browser_log_events
from tests.apache_kafka.tier import ON_BOTH_BROKERS
from tests.helpers import ConfigFactory, TopicFactory
from tests.integration.support import (
    produce_events,
    produce_records,
    read_topic,
    run_worker_until_windows,
    start_worker,
)
from tests.sink.support import releases, sink_http_port, start_sink, window_records, windows

pytestmark = [pytest.mark.kafka, pytest.mark.slow, ON_BOTH_BROKERS]

DEADLINE_S = 90.0


async def _wait_for(what: str, check: Callable[[], bool], timeout_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(0.2)


def _count(dsn: str, sql: str) -> int:
    try:
        with psycopg.connect(dsn) as c:
            row = c.execute(sql).fetchone()
    except psycopg.errors.UndefinedTable:
        return -1
    return int(row[0]) if row else 0


def _expected_rows(
    records: list[tuple[str | None, bytes]],
) -> tuple[set[tuple[Any, ...]], set[tuple[Any, ...]]]:
    """What the tables must hold for these topic records: (releases, windows), as the
    columns the records determine."""
    rels: set[tuple[Any, ...]] = set()
    wins: set[tuple[Any, ...]] = set()
    for _, value in records:
        row = parse_output_record(value)
        if isinstance(row, ReleaseRow):
            rels.add((row.query, row.window_start, row.group_key, row.value, row.ci95,
                      row.epsilon, row.delta, row.mechanism, row.noise_scale,
                      row.release_id))  # fmt: skip
        elif isinstance(row, WindowRow):
            wins.add((row.query, row.window_start, row.release_id, row.released_keys,
                      row.epsilon_spent, row.horizon_epsilon_spent, row.released_keys,
                      True))  # fmt: skip
    return rels, wins


def _stored_rows(dsn: str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    with psycopg.connect(dsn) as c:
        rels = c.execute(
            "SELECT query, window_start, group_key, value, ci95, epsilon, delta, mechanism, "
            "noise_scale, release_id FROM stream_dp.releases"
        ).fetchall()
        wins = c.execute(
            "SELECT query, window_start, release_id, released_keys, epsilon_spent, "
            "horizon_epsilon_spent, releases_stored, complete FROM stream_dp.windows"
        ).fetchall()
    return rels, wins


def _output_config(config_factory: ConfigFactory, topic: str) -> Path:
    return config_factory({"output": {"topic": topic}, "logging": {"format": "json"}})


async def test_the_sink_stores_a_topic_and_dead_letters_bad_records(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    config_factory: ConfigFactory,
    postgres_dsn: str,
) -> None:
    topic = await topic_factory(partitions=3, prefix="releases")
    config = load_config(_output_config(config_factory, topic))
    records: list[tuple[bytes | None, bytes]] = []
    for w in range(4):
        for k, v in window_records("visits", w, ["a", "b", "c", "d"], lean=w % 2 == 1):
            records.append((k.encode(), v))  # keyed by group: spread over the partitions
        for k, v in window_records("users", w, ["DE", "FR"], field="country"):
            records.append((k.encode(), v))
    alphabet = string.ascii_letters + string.digits
    huge_query = "".join(secrets.choice(alphabet) for _ in range(9000))
    refused = window_records(huge_query, 0, ["x"])[0][1]  # parses, but cannot be indexed
    bad = [(None, b"not json at all"), (b"k", refused)]
    await produce_records(kafka_bootstrap, topic, [*records[:20], *bad, *records[20:]])

    sink = Sink(config, postgres_dsn, bootstrap_servers=kafka_bootstrap)
    task = asyncio.create_task(sink.run())
    try:
        await _wait_for(
            "every window complete and both bad records dead-lettered",
            lambda: (
                _count(postgres_dsn, "SELECT count(*) FROM stream_dp.windows WHERE complete") == 8
                and _count(postgres_dsn, "SELECT count(*) FROM stream_dp.dead_letters") == 2
            ),
        )
        assert sink.health.ready()
    finally:
        sink.request_stop()
        await asyncio.wait_for(task, timeout=30)
    assert not task.exception()
    assert not sink.health.ready()
    rels, wins = _expected_rows([(None, v) for _, v in records])
    stored_rels, stored_wins = _stored_rows(postgres_dsn)
    assert set(stored_rels) == rels and len(stored_rels) == 24
    assert set(stored_wins) == wins and len(stored_wins) == 8
    with psycopg.connect(postgres_dsn) as c:
        dead = c.execute(
            "SELECT source_topic, reason FROM stream_dp.dead_letters ORDER BY reason"
        ).fetchall()
    assert dead == [(topic, "not_json"), (topic, "rejected_by_database")]
    m = sink.metrics
    assert m.bad_records.labels(reason="not_json")._value.get() == 1
    assert m.bad_records.labels(reason="rejected_by_database")._value.get() == 1
    assert m.releases_stored._value.get() == 24
    assert m.windows_completed._value.get() == 8
    assert m.records_consumed._value.get() == len(records) + 2
    assert b"stream_dp_sink_ready 0.0" in m.exposition()


def _sink_waiting_on_lock(dsn: str) -> bool:
    """The sink's session is inside a transaction that has written (it has a transaction
    id) and waits for a row lock: it is in the middle of storing a batch."""
    with psycopg.connect(dsn) as c:
        row = c.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
            "AND wait_event_type = 'Lock' AND backend_xid IS NOT NULL",
            (APPLICATION_NAME,),
        ).fetchone()
    return bool(row and row[0])


async def _committed(bootstrap: str, group_id: str, topic: str, partitions: int) -> list[Any]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group_id)
    await consumer.start()
    try:
        return [await consumer.committed(TopicPartition(topic, p)) for p in range(partitions)]
    finally:
        await consumer.stop()


async def test_kill_minus_nine_mid_batch_then_restart_stores_the_topic_once(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    config_factory: ConfigFactory,
    postgres_dsn: str,
    tmp_path: Path,
) -> None:
    topic = await topic_factory(partitions=3, prefix="releases")
    config_path = _output_config(config_factory, topic)
    records: list[tuple[bytes | None, bytes]] = [
        (k.encode(), v)
        for w in range(5)
        for query in ("visits", "searches")
        for k, v in window_records(query, w, [f"site{i:02d}.example" for i in range(12)])
    ]
    records.insert(30, (None, b"\x00 not a record"))
    await produce_records(kafka_bootstrap, topic, records)
    expected_rels, expected_wins = _expected_rows([(None, v) for _, v in records])
    assert len(expected_rels) == 120 and len(expected_wins) == 10

    # Hold the row of one release the sink will write in an open transaction of our own:
    # the sink's transaction then stops in the middle, after it has written other rows.
    held = max(expected_rels, key=lambda r: (r[0], r[1], r[2]))
    async with await psycopg.AsyncConnection.connect(postgres_dsn) as c:
        await migrate(c)
        await c.commit()
    blocker = psycopg.connect(postgres_dsn)
    try:
        blocker.execute(
            "INSERT INTO stream_dp.releases (query, window_start, window_end, group_key, "
            "group_values, group_label, statistic, value, ci95, epsilon, delta, mechanism, "
            "noise_scale, release_id) VALUES (%s, %s, %s, %s, '{}', 'held', 'count', 0, 0, 1, "
            "0, 'discrete_laplace', 1, 'held')",
            (held[0], held[1], held[1], held[2]),
        )
        sink = start_sink(config_path, postgres_dsn, tmp_path / "sink1.log")
        try:
            await _wait_for("the sink to block mid-transaction", lambda: _sink_waiting_on_lock(
                postgres_dsn))  # fmt: skip
        finally:
            sink.send_signal(signal.SIGKILL)
            assert sink.wait(timeout=30) == -signal.SIGKILL
    finally:
        blocker.rollback()
        blocker.close()
    log1 = (tmp_path / "sink1.log").read_text(errors="replace")
    # Whatever the killed sink stored, it committed to Kafka only offsets of stored batches:
    # the batch it was killed in is neither stored nor committed.
    group = default_group_id(load_config(config_path))
    committed = await _committed(kafka_bootstrap, group, topic, 3)
    stored_rels, _ = _stored_rows(postgres_dsn)
    assert len(stored_rels) < len(expected_rels), log1
    assert sum(c or 0 for c in committed) < len(records), (committed, log1)

    sink = start_sink(config_path, postgres_dsn, tmp_path / "sink2.log")
    try:
        await _wait_for(
            "every window complete after the restart",
            lambda: (
                _count(postgres_dsn, "SELECT count(*) FROM stream_dp.windows WHERE complete")
                == len(expected_wins)
            ),
        )
        await _wait_for(
            "the bad record dead-lettered",
            lambda: _count(postgres_dsn, "SELECT count(*) FROM stream_dp.dead_letters") == 1,
        )
        port = sink_http_port(tmp_path / "sink2.log")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health/ready", timeout=10) as r:
            assert r.status == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            exposition = r.read()
        assert b"stream_dp_sink_ready 1.0" in exposition
        assert b"stream_dp_sink_releases_stored_total" in exposition
    finally:
        sink.send_signal(signal.SIGTERM)
        code = sink.wait(timeout=60)
    log2 = (tmp_path / "sink2.log").read_text(errors="replace")
    assert code == 0, log2
    stored_rels, stored_wins = _stored_rows(postgres_dsn)
    assert len(stored_rels) == len(expected_rels) and set(stored_rels) == expected_rels
    assert len(stored_wins) == len(expected_wins) and set(stored_wins) == expected_wins
    assert sum(c or 0 for c in await _committed(kafka_bootstrap, group, topic, 3)) == len(records)


async def test_republished_records_after_a_worker_crash_change_nothing(
    kafka_bootstrap: str, config_factory: ConfigFactory, postgres_dsn: str, tmp_path: Path
) -> None:
    spec = BrowserLogSpec(users=150, windows=3, window_size_s=10, seed=11)
    config_path = config_factory(
        {
            "bounds": {"max_contributions_per_window": 10},
            "queries": [
                {"name": "visits_by_domain", "group_by": ["domain"], "epsilon": 0.5,
                 "delta": 1e-6},
                {"name": "visits_by_country", "group_by": ["country"], "epsilon": 0.5,
                 "keys": {"country": ["DE", "FR", "NL", "US"]}},
            ],
        }
    )  # fmt: skip
    config = load_config(config_path)
    await apply_topics(config, kafka_bootstrap, include_input=True)
    await produce_events(kafka_bootstrap, config.input.topic, browser_log_events(spec))
    crash_env = {"STREAM_DP_ALLOW_UNSAFE_TEST_MODE": "1",
                 "STREAM_DP_TEST_CRASH_POINT": "after_output_write:1"}  # fmt: skip
    crashed = start_worker(config_path, tmp_path / "worker1.log", crash_env)
    assert crashed.proc.wait(timeout=120) == -signal.SIGKILL, crashed.log()
    first = await read_topic(kafka_bootstrap, config.output.topic)
    assert first, crashed.log()

    sink = Sink(config, postgres_dsn, bootstrap_servers=kafka_bootstrap)
    task = asyncio.create_task(sink.run())
    try:
        first_wins = _expected_rows(first)[1]
        await _wait_for(
            "the first window stored",
            lambda: (
                _count(postgres_dsn, "SELECT count(*) FROM stream_dp.windows WHERE complete")
                == len(first_wins)
            ),
        )
        with psycopg.connect(postgres_dsn) as c:
            before = (releases(c), windows(c))
        # The restarted worker republishes the crashed window from its ledger, then goes on.
        await run_worker_until_windows(
            kafka_bootstrap, config_path, tmp_path / "worker2.log",
            [q.name for q in config.queries], spec.windows, timeout_s=120, settle_s=1.0,
        )  # fmt: skip
        everything = await read_topic(kafka_bootstrap, config.output.topic)
        keys = [k for k, _ in everything]
        assert len(keys) > len(set(keys)), "the worker republished nothing"
        expected_rels, expected_wins = _expected_rows(everything)
        await _wait_for(
            "every window stored",
            lambda: (
                _count(postgres_dsn, "SELECT count(*) FROM stream_dp.windows WHERE complete")
                == len(expected_wins)
            ),
        )
    finally:
        sink.request_stop()
        await asyncio.wait_for(task, timeout=30)
    stored_rels, stored_wins = _stored_rows(postgres_dsn)
    assert set(stored_rels) == expected_rels and len(stored_rels) == len(expected_rels)
    assert set(stored_wins) == expected_wins
    with psycopg.connect(postgres_dsn) as c:
        after_rels = {r[1:4]: r for r in releases(c)}
        after_wins = {r[1:3]: r for r in windows(c)}
    # Every row stored before the republication is untouched: same values, same row version.
    for row in before[0]:
        assert after_rels[row[1:4]] == row
    for row in before[1]:
        assert after_wins[row[1:3]] == row
    assert sink.metrics.duplicates_skipped._value.get() >= len(keys) - len(set(keys))
    assert sink.metrics.conflicts._value.get() == 0


async def test_two_sinks_in_one_group_complete_every_window(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    config_factory: ConfigFactory,
    postgres_dsn: str,
) -> None:
    """Releases of one window on several partitions, stored by two sinks at once: the
    window rows they share are locked in turn, so every window ends complete."""
    topic = await topic_factory(partitions=3, prefix="releases")
    config = load_config(_output_config(config_factory, topic))
    sinks = [Sink(config, postgres_dsn, bootstrap_servers=kafka_bootstrap) for _ in range(2)]
    tasks = [asyncio.create_task(s.run()) for s in sinks]
    try:
        await _wait_for(
            "both sinks to hold partitions",
            lambda: all(s.health.status()["components"]["partitions_assigned"] for s in sinks),
        )
        records = [
            (k.encode(), v)
            for w in range(8)
            for k, v in window_records("visits", w, [f"d{i}.example" for i in range(9)])
        ]
        await produce_records(kafka_bootstrap, topic, records)
        await _wait_for(
            "every window complete",
            lambda: (
                _count(postgres_dsn, "SELECT count(*) FROM stream_dp.windows WHERE complete") == 8
            ),
        )
    finally:
        for s in sinks:
            s.request_stop()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)
    rels, wins = _expected_rows([(None, v) for _, v in records])
    stored_rels, stored_wins = _stored_rows(postgres_dsn)
    assert set(stored_rels) == rels and len(stored_rels) == 72
    assert set(stored_wins) == wins
    assert all(s.metrics.releases_stored._value.get() > 0 for s in sinks)  # both worked
    assert sum(s.metrics.conflicts._value.get() for s in sinks) == 0


async def test_a_not_null_column_added_while_running_halts_the_sink_without_loss(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    config_factory: ConfigFactory,
    postgres_dsn: str,
) -> None:
    """A migration adds a NOT NULL column under a running sink: every insert fails alike.
    Nothing is stored, nothing dead-lettered, no offset committed, the sink is not ready and
    says why; once the column has a default, a new sink stores every record."""
    topic = await topic_factory(partitions=2, prefix="releases")
    config = load_config(_output_config(config_factory, topic))
    sink = Sink(config, postgres_dsn, bootstrap_servers=kafka_bootstrap)
    task = asyncio.create_task(sink.run())
    try:
        await _wait_for("the sink ready", sink.health.ready)
        with psycopg.connect(postgres_dsn) as c:
            c.execute("ALTER TABLE stream_dp.releases ADD COLUMN tenant text NOT NULL DEFAULT ''")
            c.execute("ALTER TABLE stream_dp.releases ALTER COLUMN tenant DROP DEFAULT")
        records = [
            (k.encode(), v) for w in range(2) for k, v in window_records("visits", w, ["a", "b"])
        ]
        await produce_records(kafka_bootstrap, topic, records)
        await _wait_for("the sink to halt", lambda: sink.metrics.halted._value.get() == 1)
        assert not sink.health.ready()
        assert b"stream_dp_sink_ready 0.0" in sink.metrics.exposition()
        assert not task.done()  # up, not ready, /metrics says why
    finally:
        sink.request_stop()
        await asyncio.wait_for(task, timeout=30)
    assert not task.exception()
    assert _count(postgres_dsn, "SELECT count(*) FROM stream_dp.releases") == 0
    assert _count(postgres_dsn, "SELECT count(*) FROM stream_dp.windows") == 0
    assert _count(postgres_dsn, "SELECT count(*) FROM stream_dp.dead_letters") == 0
    assert sink.metrics.bad_records.labels(reason="rejected_by_database")._value.get() == 0
    group = default_group_id(config)
    assert await _committed(kafka_bootstrap, group, topic, 2) == [None, None]

    with psycopg.connect(postgres_dsn) as c:
        c.execute("ALTER TABLE stream_dp.releases ALTER COLUMN tenant SET DEFAULT 'main'")
    sink = Sink(config, postgres_dsn, bootstrap_servers=kafka_bootstrap)
    task = asyncio.create_task(sink.run())
    try:
        await _wait_for(
            "both windows complete after the fix",
            lambda: (
                _count(postgres_dsn, "SELECT count(*) FROM stream_dp.windows WHERE complete") == 2
            ),
        )
    finally:
        sink.request_stop()
        await asyncio.wait_for(task, timeout=30)
    assert not task.exception()
    rels, wins = _expected_rows([(None, v) for _, v in records])
    stored_rels, stored_wins = _stored_rows(postgres_dsn)
    assert set(stored_rels) == rels and len(stored_rels) == 4
    assert set(stored_wins) == wins
    assert _count(postgres_dsn, "SELECT count(*) FROM stream_dp.dead_letters") == 0
    committed = await _committed(kafka_bootstrap, group, topic, 2)
    assert sum(c or 0 for c in committed) == len(records)
