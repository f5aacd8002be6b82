"""The topology watch (issue 39, item 4): partition counts asked of the broker every few
seconds, a change of keyed input named in a WARNING, counted, and applied per window; a
lookup that fails leaves the loop running and is tried again, and one topic whose metadata
fails hides no other topic's change."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError, KafkaError, UnknownTopicOrPartitionError

from stream_dp.kafka_client.client_options import client_kwargs
from stream_dp.ops.health import Health
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.faults import NO_FAULTS
from stream_dp.pipeline.kafka import topology_watch
from stream_dp.pipeline.kafka.context import WorkerContext
from stream_dp.pipeline.kafka.publisher import Publisher
from stream_dp.pipeline.kafka.topology_watch import TopologyWatch
from stream_dp.pipeline.stages.ingest import IngestStage
from tests.helpers import TopicFactory
from tests.pipeline.support import KEYRING, NOW, T0, config

TOPIC = "events"


class _Broker:
    """Answers ``partitions`` with the topic's current count (or fails: the whole request,
    or for the topics in ``missing`` only, as a Metadata response with a topic's error),
    counting asks and metadata requests."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.fails = False
        self.missing: set[str] = set()
        self.asked: list[tuple[str, bool]] = []
        self.requests = 0

    async def fresh_partitions(
        self, topics: list[str], *, bounded: bool = False
    ) -> dict[str, list[int] | KafkaError]:
        self.requests += 1
        self.asked.extend((topic, True) for topic in topics)
        if self.fails:
            raise KafkaConnectionError("the broker is away")
        return {
            topic: UnknownTopicOrPartitionError(topic)
            if topic in self.missing
            else list(range(self.count))
            for topic in topics
        }

    async def partitions(
        self, topic: str, *, bounded: bool = False, fresh: bool = False
    ) -> list[int]:
        self.requests += 1
        self.asked.append((topic, fresh))
        if self.fails:
            raise KafkaConnectionError("the broker is away")
        return list(range(self.count))


def _watch(broker: _Broker) -> tuple[TopologyWatch, Metrics, Health]:
    metrics = Metrics()
    health = Health(metrics=metrics)
    health.set("topology_stable", True)
    watch = TopologyWatch(broker, metrics=metrics, health=health, window_size_s=10)  # type: ignore[arg-type]
    watch.keyed_topic = TOPIC
    return watch, metrics, health


def _changes(metrics: Metrics) -> float:
    value: Any = metrics.topology_changes.labels(topic=TOPIC)._value.get()
    return float(value)


async def test_a_keyed_topic_that_grows_is_named_counted_and_checked_per_window(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = _Broker(4)
    watch, metrics, health = _watch(broker)
    ingest = IngestStage(config(keyed_by_user=True), KEYRING)
    ingest.learn_partitions(await watch.partitions(TOPIC, watermark_s=None, ingest=ingest))
    assert (ingest.source_partitions, broker.asked) == (4, [(TOPIC, True)])  # fresh, not cached
    ingest.layout.saw(T0)  # window T0 has begun
    monkeypatch.setattr(topology_watch, "WATCH_INTERVAL_S", 0.0)
    broker.count = 6
    with caplog.at_level(logging.WARNING, logger=topology_watch.__name__):
        await watch.tick(None, ingest)
    said = [
        (r.levelname, r.getMessage()) for r in caplog.records if r.name == topology_watch.__name__
    ]
    assert said == [
        ("WARNING", f"topic {TOPIC} changed from 4 to 6 partitions while the worker ran"),
        (
            "WARNING",
            f"keyed input: windows from 2020-08-01T00:00:10Z on are checked against the 6 "
            f"partitions of {TOPIC}, earlier ones against the 4 before (one count per window)",
        ),
    ]
    assert _changes(metrics) == 1.0
    assert health.ready() is False  # not ready until the windows open at the change are out
    assert ingest.source_partitions == 6
    assert [ingest.layout.count_for(ws, 6) for ws in (T0, T0 + 10)] == [4, 6]
    await watch.tick(None, ingest)  # no change since: nothing more said or counted
    assert _changes(metrics) == 1.0
    assert [r for r in caplog.records if r.name == topology_watch.__name__][2:] == []


async def test_the_watch_asks_only_every_interval_and_a_failed_ask_is_retried_later() -> None:
    broker = _Broker(4)
    watch, metrics, _ = _watch(broker)
    ingest = IngestStage(config(keyed_by_user=True), KEYRING)
    await watch.partitions(TOPIC, watermark_s=None, ingest=ingest)
    await watch.tick(NOW, ingest)  # within the interval since start: not asked
    assert len(broker.asked) == 1
    watch._watched_at_s -= topology_watch.WATCH_INTERVAL_S
    broker.fails, broker.count = True, 6
    await watch.tick(NOW, ingest)  # the loop goes on
    assert len(broker.asked) == 2 and _changes(metrics) == 0.0
    watch._watched_at_s -= topology_watch.WATCH_INTERVAL_S
    broker.fails = False
    await watch.tick(NOW, ingest)
    assert len(broker.asked) == 3 and _changes(metrics) == 1.0


async def test_one_tick_asks_for_every_watched_topic_in_one_metadata_request() -> None:
    broker = _Broker(4)
    watch, metrics, _ = _watch(broker)
    ingest = IngestStage(config(keyed_by_user=True), KEYRING)
    await watch.partitions(TOPIC, watermark_s=None, ingest=ingest)
    await watch.partitions("repartition", watermark_s=None, ingest=ingest)
    assert broker.requests == 2
    watch._watched_at_s -= topology_watch.WATCH_INTERVAL_S
    broker.count = 6
    await watch.tick(NOW, ingest)
    assert broker.requests == 3  # both topics, one request
    assert broker.asked[2:] == [(TOPIC, True), ("repartition", True)]
    assert _changes(metrics) == 1.0 and watch.counts == {TOPIC: 6, "repartition": 6}


async def test_a_topic_whose_metadata_fails_hides_no_change_of_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One watched topic is gone (its own error in the Metadata response) while the other
    grows: the growth is seen at once, the failing topic is asked again at the next
    interval — and compared once it answers."""
    broker = _Broker(4)
    watch, metrics, _ = _watch(broker)
    ingest = IngestStage(config(keyed_by_user=True), KEYRING)
    await watch.partitions(TOPIC, watermark_s=None, ingest=ingest)
    await watch.partitions("repartition", watermark_s=None, ingest=ingest)
    broker.missing, broker.count = {"repartition"}, 6
    watch._watched_at_s -= topology_watch.WATCH_INTERVAL_S
    await watch.tick(NOW, ingest)
    assert _changes(metrics) == 1.0 and watch.counts == {TOPIC: 6, "repartition": 4}
    broker.missing = set()
    watch._watched_at_s -= topology_watch.WATCH_INTERVAL_S
    await watch.tick(NOW, ingest)
    assert broker.asked[-2:] == [(TOPIC, True), ("repartition", True)]
    assert watch.counts == {TOPIC: 6, "repartition": 6}


async def test_a_deleted_topic_is_said_once_counted_and_the_worker_is_not_ready_until_it_is_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The clients create no deleted topic again (stream_dp/kafka_client/metadata.py), so
    the watch sees it gone: an ERROR once that names it and its count, the topology counter,
    not ready for as long as it is gone (not only for two windows); ready again once it is
    back with its count."""
    broker = _Broker(4)
    watch, metrics, health = _watch(broker)
    ingest = IngestStage(config(), KEYRING)
    await watch.partitions(TOPIC, watermark_s=None, ingest=ingest)
    broker.missing = {TOPIC}
    with caplog.at_level(logging.INFO, logger=topology_watch.__name__):
        for _ in range(3):
            watch._watched_at_s -= topology_watch.WATCH_INTERVAL_S
            await watch.tick(NOW, ingest)
            watch.settle(NOW + 100 * 10)  # windows pass: still not ready while it is gone
    said = [
        (r.levelname, r.getMessage()) for r in caplog.records if r.name == topology_watch.__name__
    ]
    assert len(said) == 1 and said[0][0] == "ERROR", said
    assert said[0][1].startswith(
        f"topic {TOPIC}, which the worker reads, no longer exists on the broker"
    )
    assert "with its 4 partitions" in said[0][1] and "stream-dp topics apply" in said[0][1]
    assert _changes(metrics) == 1.0
    assert health.ready() is False and health.status()["components"]["topology_stable"] is False
    assert watch.gone == {TOPIC}
    broker.missing = set()
    watch._watched_at_s -= topology_watch.WATCH_INTERVAL_S
    with caplog.at_level(logging.INFO, logger=topology_watch.__name__):
        await watch.tick(NOW, ingest)
    assert caplog.records[-1].getMessage() == f"topic {TOPIC} exists again, with 4 partitions"
    assert watch.gone == set() and _changes(metrics) == 1.0
    assert health.status()["components"]["topology_stable"] is True


async def test_on_a_broker_one_failing_topic_leaves_the_others_counted_at_once(
    kafka_bootstrap: str, topic_factory: TopicFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """The real lookup (the worker's Publisher) on the embedded broker: one watched topic's
    metadata fails for as long as the test runs (an invalid name: its own error in each
    Metadata response, which the watch cannot tell from a deleted topic's) and another's
    count differs from the one recorded. The tick sees the change at once and reports the
    failing topic alone (gone: an ERROR). Before, the lookup waited on the failing
    topic until the tick's 5 s ran out, every tick: no count was compared, ever."""
    cfg = config()
    metrics = Metrics()
    health = Health(metrics=metrics)
    publisher = Publisher(WorkerContext(cfg, metrics, health, asyncio.Event(), NO_FAULTS))
    await publisher.start(client_kwargs(cfg.kafka, bootstrap_servers=kafka_bootstrap))
    try:
        grown, failing = await topic_factory(3), "no such topic!"
        watch = TopologyWatch(publisher, metrics=metrics, health=health, window_size_s=10)
        watch.record(grown, 1, fixed=False)  # seen with 1 partition at start; 3 now
        watch.record(failing, 1, fixed=False)
        watch._watched_at_s -= topology_watch.WATCH_INTERVAL_S
        started = time.monotonic()
        with caplog.at_level(logging.INFO, logger=topology_watch.__name__):
            await watch.tick(NOW, IngestStage(cfg, KEYRING))
        elapsed = time.monotonic() - started
    finally:
        await publisher.stop()
    assert elapsed < topology_watch.WATCH_TIMEOUT_S, f"{elapsed:.1f} s"
    assert watch.counts == {grown: 3, failing: 1}
    said = [
        (r.levelname, r.getMessage()) for r in caplog.records if r.name == topology_watch.__name__
    ]
    assert [level for level, _ in said] == ["ERROR", "WARNING"], said
    assert said[0][1].startswith(f"topic {failing}, which the worker reads, no longer exists")
    assert said[1][1] == f"topic {grown} changed from 1 to 3 partitions while the worker ran"


async def test_a_failed_lookup_is_said_once_until_the_counts_read_again(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An outage lasts: its lookup failure is said once (not every 2 s), and again only after
    a lookup succeeded in between."""
    broker = _Broker(4)
    watch, metrics, _ = _watch(broker)
    ingest = IngestStage(config(keyed_by_user=True), KEYRING)
    await watch.partitions(TOPIC, watermark_s=None, ingest=ingest)
    monkeypatch.setattr(topology_watch, "WATCH_INTERVAL_S", 0.0)

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == topology_watch.__name__]

    broker.fails = True
    with caplog.at_level(logging.INFO, logger=topology_watch.__name__):
        for _ in range(3):
            await watch.tick(NOW, ingest)
        once = (
            "the partition counts of ['events'] could not be read (KafkaConnectionError("
            "'the broker is away')); said once until they are read again"
        )
        assert (said(), broker.requests) == ([once], 4)
        broker.fails = False
        await watch.tick(NOW, ingest)  # read again: nothing to say
        broker.fails = True
        await watch.tick(NOW, ingest)
        assert said() == [once, once]
    assert _changes(metrics) == 0.0
