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
    unknown = kafka_errors.UnknownTopicOrPartitionError()
    while clock.now < FAILING_AFTER_S:
        await fetches.failed(unknown)
        assert health.status()["components"]["input_readable"] is True
        clock.now += 0.5
    assert _error_lines(caplog) == []
    await fetches.failed(unknown)
    assert health.status()["components"]["input_readable"] is False
    (line,) = _error_lines(caplog)
    assert "fetch error unknown_topic, failing for 30 s on the consumer" in line
    assert _errors(metrics, "unknown_topic") == FAILING_AFTER_S / 0.5 + 1
    assert _errors(metrics, "unsupported_codec") == 0
    assert sum(1 for r in caplog.records if r.levelno == logging.WARNING) == 1  # not per retry


async def test_authorization_denied_is_loud_at_once_naming_topic_principal_and_grant(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(fetch_health, "FETCH_RETRY_S", 0.0)
    metrics = Metrics(process=False)
    health = Health(metrics=metrics)
    fetches = FetchHealth(
        metrics, health, FakeMembership(), clock=Clock(), principal="User:worker",
        group_id="clicks",
    )  # fmt: skip
    caplog.set_level(logging.WARNING, logger="stream_dp.pipeline.fetch_health")
    await fetches.failed(kafka_errors.TopicAuthorizationFailedError("events"), [TP])
    assert health.status()["components"]["input_readable"] is False  # at the first failure
    (line,) = _error_lines(caplog)
    assert line.startswith(
        "the input cannot be read (fetch error authorization_failed, failing for 0 s on "
        "events[0]): the broker refuses User:worker Read on the topic events "
    ), line
    assert "kafka-acls.sh --bootstrap-server <broker> --add --allow-principal User:worker " in line
    assert "--topic events --group clicks" in line
    assert _errors(metrics, "authorization_failed") == 1


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


A, B = TopicPartition("events", 0), TopicPartition("events", 1)


class TwoPartitions:
    """A consumer of A (flowing: every fetch gives records) and B (broken: every fetch of
    it raises a codec error, its position stays) until ``b_fixed``; aiokafka's assignment
    state for FetchAges and FetchHealth. Its waiting fetch (no partition named) takes B
    first every other call, raising B's error marked as the fetched-records adapter marks it."""

    def __init__(self) -> None:
        self.b_fixed = False
        self.calls = 0
        self.states = {
            tp: SimpleNamespace(has_valid_position=True, position=7, highwater=100, timestamp=None)
            for tp in (A, B)
        }
        assignment = SimpleNamespace(state_value=self.states.get)
        self._subscription = SimpleNamespace(subscription=SimpleNamespace(assignment=assignment))

    def assignment(self) -> set[TopicPartition]:
        return {A, B}

    def _take(self, tp: TopicPartition, n: int) -> list[int]:
        state = self.states[tp]
        if tp == B and not self.b_fixed:
            exc = kafka_errors.UnsupportedCodecError(
                "Libraries for snappy compression codec not found"
            )
            exc.stream_dp_partition = B  # as fetched.py does
            raise exc
        records = list(range(state.position, state.position + n))
        state.position += n
        state.highwater = state.position + 50  # more keeps coming
        return records

    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: int, max_records: int
    ) -> dict[TopicPartition, list[int]]:
        self.calls += 1
        order = list(partitions) or ([B, A] if self.calls % 2 else [A, B])
        return {order[0]: self._take(order[0], max_records)}


async def test_one_broken_partition_keeps_the_worker_not_ready_while_the_others_flow(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The worker's loop (fetch, then failed or succeeded) over a partition that stays
    broken while another flows: not ready, one ERROR a minute, from the first failure until
    the broken partition itself fetches again, whatever the other's fetches do."""
    from stream_dp.clients.partition_drain import PartitionDrain

    monkeypatch.setattr(fetch_health, "FETCH_RETRY_S", 0.0)
    metrics = Metrics(process=False)
    health = Health(metrics=metrics)
    clock = Clock()
    consumer = TwoPartitions()
    membership = FakeMembership(
        consumer=consumer, owned={A: 0.0, B: 0.0}, fetch_ages=FetchAges(metrics)
    )
    fetches = FetchHealth(metrics, health, membership, clock=clock)
    drain = PartitionDrain(consumer)
    caplog.set_level(logging.WARNING, logger="stream_dp.pipeline.fetch_health")

    async def turn() -> str:
        clock.now += 0.5
        try:
            batch = await drain.getmany(timeout_ms=100, max_records=10)
        except kafka_errors.KafkaError as exc:
            await fetches.failed(exc, drain.partitions_of(exc))
            return "failed"
        fetches.succeeded()
        return "records" if batch else "empty"

    outcomes = []
    ready = []
    while clock.now < 2 * REPEAT_ERROR_S - 1:  # two minutes less a turn
        outcomes.append(await turn())
        ready.append(health.status()["components"]["input_readable"])
    # Both kinds of fetch kept coming: A's records, B's error.
    assert outcomes.count("failed") > 50 and outcomes.count("records") > 50, outcomes
    assert outcomes[0] == "failed"
    assert not any(ready), ready  # not ready from the first failure, never in between
    assert fetches.failing_partitions == {B: "unsupported_codec"}
    lines = _error_lines(caplog)
    assert len(lines) == 2, lines  # at once, and a minute later: not at every flap
    assert all("failing for" in x and "on events[1]): " in x for x in lines), lines
    assert _errors(metrics, "unsupported_codec") == outcomes.count("failed")
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        "fetch failed (unsupported_codec: UnsupportedCodecError); retrying"
    ]
    # B fixed (the codec installed): B's own fetch moves its position, and only that clears.
    consumer.b_fixed = True
    while (outcome := await turn()) != "records" or consumer.states[B].position == 7:
        assert outcome != "failed"
    assert health.status()["components"]["input_readable"] is True
    assert fetches.failing_partitions == {}
    assert caplog.records[-1].getMessage().startswith("fetching again after 1")


async def test_a_failing_partition_clears_at_its_log_end_or_when_revoked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fetch_health, "FETCH_RETRY_S", 0.0)
    metrics = Metrics(process=False)
    health = Health(metrics=metrics)
    consumer = TwoPartitions()
    membership = FakeMembership(consumer=consumer, fetch_ages=FetchAges(metrics))
    fetches = FetchHealth(metrics, health, membership, clock=Clock())
    denied = kafka_errors.TopicAuthorizationFailedError("events")
    await fetches.failed(denied, [A, B])
    fetches.succeeded()  # neither moved: both still failing
    assert fetches.failing_partitions == {A: "authorization_failed", B: "authorization_failed"}
    consumer.states[A].highwater = consumer.states[A].position  # at its end: read
    fetches.succeeded()
    assert fetches.failing_partitions == {B: "authorization_failed"}
    assert health.status()["components"]["input_readable"] is False
    consumer.assignment = lambda: {A}  # type: ignore[method-assign] # B revoked
    fetches.succeeded()
    assert fetches.failing_partitions == {}
    assert health.status()["components"]["input_readable"] is True
