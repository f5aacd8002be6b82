"""The worker's failed fetches (stream_dp/pipeline/fetch_health.py): classified, counted,
loud once a cause cannot clear (not at every retry), readiness down until a fetch succeeds;
and the fetch age of a partition counted from the last fetch that made progress."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka import errors as kafka_errors

from stream_dp.ops.health import Health
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline import fetch_health
from stream_dp.pipeline.fetch_health import FAILING_AFTER_S, REPEAT_ERROR_S, FetchAges, FetchHealth

TP = TopicPartition("events", 0)
SNAPPY = kafka_errors.UnsupportedCodecError("Libraries for snappy compression codec not found")


class FakeConsumer:
    """What FetchAges reads of aiokafka's assignment state for one partition."""

    def __init__(self) -> None:
        self.state = SimpleNamespace(
            has_valid_position=True, position=0, highwater=100, timestamp=None
        )
        assignment = SimpleNamespace(state_value=lambda tp: self.state if tp == TP else None)
        self._subscription = SimpleNamespace(subscription=SimpleNamespace(assignment=assignment))


@dataclass
class FakeMembership:
    consumer: Any = None
    owned: dict[TopicPartition, float] = field(default_factory=dict)
    to_take: list[TopicPartition] = field(default_factory=list)
    input_topic: str = "events"
    stage1_topic: str = "repartition"
    keyed: bool = False
    fetch_ages: Any = None


def _age(metrics: Metrics) -> float:
    return float(metrics.fetch_age.labels(topic="events", partition="0")._value.get())


def _errors(metrics: Metrics, reason: str) -> float:
    return float(metrics.fetch_errors.labels(reason=reason)._value.get())


def test_a_stuck_partition_ages_from_its_last_progress() -> None:
    metrics = Metrics(process=False)
    ages = FetchAges(metrics)
    consumer = FakeConsumer()
    consumer.state.timestamp = 1_000_000  # ms: the broker answered at t = 1000 s
    ages.observe(consumer, TP, taken_s=900.0, now_s=1001.0)
    assert _age(metrics) == 1.0
    # The broker keeps answering (bytes the client cannot read): the position stays.
    consumer.state.timestamp = 1_050_000
    ages.observe(consumer, TP, taken_s=900.0, now_s=1051.0)
    assert _age(metrics) == 51.0
    # A fetch moves the position: progress, the age restarts from that answer.
    consumer.state.position, consumer.state.timestamp = 40, 1_060_000
    ages.observe(consumer, TP, taken_s=900.0, now_s=1061.0)
    assert _age(metrics) == 1.0
    # At the log's end an answer is progress, even though the position does not move.
    consumer.state.position = consumer.state.highwater = 40
    consumer.state.timestamp = 1_070_000
    ages.observe(consumer, TP, taken_s=900.0, now_s=1071.0)
    assert _age(metrics) == 1.0
    # No answer at all (a broker stall): the age grows from the last one.
    ages.observe(consumer, TP, taken_s=900.0, now_s=1200.0)
    assert _age(metrics) == 130.0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _health(monkeypatch: pytest.MonkeyPatch) -> tuple[FetchHealth, Metrics, Health, Clock]:
    monkeypatch.setattr(fetch_health, "FETCH_RETRY_S", 0.0)
    metrics = Metrics(process=False)
    health = Health(metrics=metrics)
    clock = Clock()
    membership = FakeMembership(fetch_ages=FetchAges(metrics))
    return FetchHealth(metrics, health, membership, clock=clock), metrics, health, clock


def _error_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]


async def test_a_cause_that_cannot_clear_is_loud_at_once_and_once_a_minute(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fetches, metrics, health, clock = _health(monkeypatch)
    caplog.set_level(logging.WARNING, logger="stream_dp.pipeline.fetch_health")
    assert health.status()["components"]["input_readable"] is True
    for _ in range(10):  # five seconds of retries
        await fetches.failed(SNAPPY)
        clock.now += 0.5
    assert _errors(metrics, "unsupported_codec") == 10
    assert health.status()["components"]["input_readable"] is False
    (line,) = _error_lines(caplog)
    assert line.startswith("the input cannot be read (fetch error unsupported_codec, failing ")
    assert "compressed with snappy" in line and "pip install 'cramjam>=2.8'" in line
    clock.now = REPEAT_ERROR_S
    await fetches.failed(SNAPPY)
    assert len(_error_lines(caplog)) == 2  # repeated once a minute while it lasts
    fetches.succeeded()
    assert health.status()["components"]["input_readable"] is True
    assert caplog.records[-1].getMessage().startswith("fetching again after ")


async def test_a_cause_that_may_clear_is_loud_only_once_it_lasts(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fetches, metrics, health, clock = _health(monkeypatch)
    caplog.set_level(logging.WARNING, logger="stream_dp.pipeline.fetch_health")
    denied = kafka_errors.TopicAuthorizationFailedError("events")
    while clock.now < FAILING_AFTER_S:
        await fetches.failed(denied)
        assert health.status()["components"]["input_readable"] is True
        clock.now += 0.5
    assert _error_lines(caplog) == []
    await fetches.failed(denied)
    assert health.status()["components"]["input_readable"] is False
    (line,) = _error_lines(caplog)
    assert "fetch error authorization_failed, failing for 30 s" in line
    assert _errors(metrics, "authorization_failed") == FAILING_AFTER_S / 0.5 + 1
    assert _errors(metrics, "unsupported_codec") == 0
    assert sum(1 for r in caplog.records if r.levelno == logging.WARNING) == 1  # not per retry


class StartingConsumer:
    """A consumer whose start (the group join) is refused ``refusals[0]`` times."""

    def __init__(self, refusals: list[int]) -> None:
        self.refusals, self.started, self.stopped = refusals, 0, False

    async def start(self) -> None:
        # aiokafka's own check: a consumer's start cannot be tried twice.
        assert self.started == 0, "Did you call `start` twice?"
        self.started += 1
        if self.refusals[0] > 0:
            self.refusals[0] -= 1
            raise kafka_errors.GroupAuthorizationFailedError("stream-dp")

    async def stop(self) -> None:
        self.stopped = True


class FakePublisher:
    def __init__(self) -> None:
        self.never_retried: tuple[type[BaseException], ...] = ()

    async def retry(self, what: str, op: Any, *, bounded: bool, never_retry: Any) -> None:
        self.never_retried = never_retry
        await op()


async def test_a_refused_group_join_is_a_loud_fetch_failure_retried_on_a_fresh_consumer(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fetches, metrics, health, clock = _health(monkeypatch)
    caplog.set_level(logging.WARNING, logger="stream_dp.pipeline.fetch_health")
    refusals = [int(FAILING_AFTER_S / 0.5) + 2]
    consumers: list[StartingConsumer] = []

    def subscribe(options: dict[str, Any]) -> StartingConsumer:
        clock.now += 0.5
        consumers.append(StartingConsumer(refusals))
        return consumers[-1]

    membership = SimpleNamespace(subscribe=subscribe)
    publisher = FakePublisher()
    started = await fetch_health.start_group_consumer(
        membership, {}, publisher, fetches, asyncio.Event()
    )
    assert started and refusals == [0]
    assert kafka_errors.GroupAuthorizationFailedError in publisher.never_retried
    assert [c.started for c in consumers] == [1] * len(consumers)  # one start each
    assert all(c.stopped for c in consumers[:-1]) and not consumers[-1].stopped
    assert _errors(metrics, "authorization_failed") == len(consumers) - 1
    (line,) = _error_lines(caplog)
    assert "fetch error authorization_failed" in line and "Read on its consumer group" in line
    assert health.status()["components"]["input_readable"] is False  # until a fetch succeeds


async def test_a_stop_while_the_join_is_refused_ends_the_start() -> None:
    metrics = Metrics(process=False)
    fetches = FetchHealth(metrics, Health(metrics=metrics), FakeMembership())
    stopping = asyncio.Event()
    stopping.set()
    membership = SimpleNamespace(subscribe=lambda options: StartingConsumer([1]))
    started = await fetch_health.start_group_consumer(
        membership, {}, FakePublisher(), fetches, stopping
    )
    assert started is False
