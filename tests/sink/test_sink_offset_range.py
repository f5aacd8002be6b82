"""The sink's committed offset out of its partition's range: said loudly, then read on.

The sink was down longer than the output topic's retention (or someone ran DeleteRecords),
or the topic was deleted and recreated with fewer records than the committed offset. A
client with ``auto_offset_reset=earliest`` moves to the log start without a word and the
windows in between never reach the database. The sink must log an ERROR naming the topic,
partition, committed offset and log range, count it, and go on from the log start.

The embedded broker never moves a log start and answers a fetch past its log end with no
records (not OFFSET_OUT_OF_RANGE), so both cases run on Apache Kafka only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import psycopg
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete

from stream_dp.config import Config, load_config
from stream_dp.sink.service import Sink, default_group_id
from tests.apache_kafka.tier import ON_APACHE_KAFKA
from tests.helpers import ConfigFactory, TopicFactory
from tests.integration.support import produce_records
from tests.sink.support import SIZE_S, W0, window_records

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

#: A hang guard only: every wait is on a condition.
DEADLINE_S = 90.0
#: Records per window below: two releases and the window record.
PER_WINDOW = 3


async def _wait_for(what: str, check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {DEADLINE_S:g} s waiting for {what}")
        await asyncio.sleep(0.2)


def _complete_windows(dsn: str) -> list[int]:
    """The complete windows' starts (seconds), in order; [] before the tables exist."""
    try:
        with psycopg.connect(dsn) as c:
            rows = c.execute(
                "SELECT extract(epoch FROM window_start)::bigint FROM stream_dp.windows"
                " WHERE complete ORDER BY window_start"
            ).fetchall()
    except psycopg.errors.UndefinedTable:
        return []
    return [int(r[0]) for r in rows]


def _count(dsn: str, table: str) -> int:
    with psycopg.connect(dsn) as c:
        row = c.execute(f"SELECT count(*) FROM stream_dp.{table}").fetchone()  # noqa: S608
    return int(row[0]) if row else 0


async def _produce_windows(bootstrap: str, topic: str, windows: range) -> None:
    records = [(k.encode(), v) for w in windows for k, v in window_records("visits", w, ["a", "b"])]
    assert len(records) == PER_WINDOW * len(windows)
    await produce_records(bootstrap, topic, records)


async def _commit(bootstrap: str, group_id: str, tp: TopicPartition, offset: int) -> None:
    """The sink's group has read ``tp`` up to ``offset`` (as a sink stopped there would)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group_id, enable_auto_commit=False
    )
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.commit({tp: offset})
    finally:
        await consumer.stop()


async def _run_sink_until(
    config: Config, dsn: str, bootstrap: str, what: str, check: Callable[[], bool]
) -> Sink:
    sink = Sink(config, dsn, bootstrap_servers=bootstrap)
    task = asyncio.create_task(sink.run())
    try:
        await _wait_for(what, lambda: check() or task.done())
        assert not task.done(), "the sink stopped on its own"
        assert sink.health.ready()  # it reads on: ready, not held
    finally:
        sink.request_stop()
        await asyncio.wait_for(task, timeout=30)
    assert not task.exception()
    return sink


def _errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.levelno == logging.ERROR and r.name == "stream_dp.sink.service"
    ]


def _value(sink: Sink, counter: str, topic: str) -> float:
    return float(getattr(sink.metrics, counter).labels(topic=topic)._value.get())


@ON_APACHE_KAFKA
async def test_records_deleted_below_the_committed_offset_are_reported_then_read_on(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    config_factory: ConfigFactory,
    postgres_dsn: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Windows 0-5 on the topic; the sink had stored window 0 (committed 3); windows 1-2
    are deleted (log start 9) while it is down: it says so (6 records skipped), stores 3-5."""
    topic = await topic_factory(partitions=1, prefix="releases")
    config = load_config(config_factory({"output": {"topic": topic}}))
    tp = TopicPartition(topic, 0)
    await _produce_windows(kafka_bootstrap, topic, range(6))
    committed, log_start = PER_WINDOW, 3 * PER_WINDOW
    await _commit(kafka_bootstrap, default_group_id(config), tp, committed)
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        low = await admin.delete_records({tp: RecordsToDelete(before_offset=log_start)})
    finally:
        await admin.close()
    assert low[tp] == log_start

    caplog.set_level(logging.INFO, logger="stream_dp.sink.service")
    sink = await _run_sink_until(
        config,
        postgres_dsn,
        kafka_bootstrap,
        "windows 3-5 complete",
        lambda: len(_complete_windows(postgres_dsn)) == 3,
    )
    assert _complete_windows(postgres_dsn) == [W0 + w * SIZE_S for w in (3, 4, 5)]
    assert _count(postgres_dsn, "releases") == 6  # windows 3-5 only: nothing made up
    assert _value(sink, "offset_out_of_range", topic) == 1
    assert _value(sink, "records_skipped", topic) == log_start - committed
    (error,) = _errors(caplog)
    said = f"{topic}[0]: position {committed} (committed {committed}) is outside the log [9, 18)"
    assert said in error.getMessage()
    assert "6 records" in error.getMessage()


@ON_APACHE_KAFKA
async def test_a_committed_offset_past_the_log_end_is_reported_then_read_from_the_start(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    config_factory: ConfigFactory,
    postgres_dsn: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The topic was recreated: it holds 2 windows (6 records), the sink's group had
    committed 100. It says so and stores both windows of the new topic."""
    topic = await topic_factory(partitions=1, prefix="releases")
    config = load_config(config_factory({"output": {"topic": topic}}))
    tp = TopicPartition(topic, 0)
    await _produce_windows(kafka_bootstrap, topic, range(2))
    await _commit(kafka_bootstrap, default_group_id(config), tp, 100)

    caplog.set_level(logging.INFO, logger="stream_dp.sink.service")
    sink = await _run_sink_until(
        config,
        postgres_dsn,
        kafka_bootstrap,
        "both windows complete",
        lambda: len(_complete_windows(postgres_dsn)) == 2,
    )
    assert _complete_windows(postgres_dsn) == [W0, W0 + SIZE_S]
    assert _count(postgres_dsn, "releases") == 4
    assert _value(sink, "offset_out_of_range", topic) == 1
    assert _value(sink, "records_skipped", topic) == 0  # unknowable: none counted
    (error,) = _errors(caplog)
    said = f"{topic}[0]: position 100 (committed 100) is outside the log [0, 6)"
    assert said in error.getMessage()
