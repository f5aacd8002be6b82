"""A topic the broker refuses the worker's principal (TopicAuthorizationFailed: an ACL) stops
the worker at once with TopicNotAuthorizedError, naming the principal, the operation, the
topic and the kafka-acls grant (stream_dp/pipeline/kafka/publisher.py, ``_refused``).

Before, a refused write was retried for ``give_up_after_s`` and the stop then advised a longer
wait; a refused Describe left the topic out of the broker's topic list, so the worker stopped
saying the topic had been deleted and should be created again. No broker here: the producer's
answers are the test's (tests/apache_kafka/test_security.py denies a real ACL)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import KafkaError, TopicAuthorizationFailedError

from stream_dp.clients.connect import TopicNotAuthorizedError
from stream_dp.config import parse_config
from stream_dp.config.model import UNSAFE_TEST_MODE_ENV
from stream_dp.errors import StreamDPError
from stream_dp.kafka_client import TopicPartition
from stream_dp.ops.health import Health
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.faults import NO_FAULTS
from stream_dp.pipeline.kafka import publisher as publisher_module
from stream_dp.pipeline.kafka.context import WorkerContext
from stream_dp.pipeline.kafka.publisher import Publisher
from stream_dp.pipeline.kafka.worker import Worker
from stream_dp.privacy.pseudonymize import KeyRing, Pseudonymizer

PRINCIPAL = "User:stream-dp-worker"


def _config(**kafka: Any) -> Any:
    with pytest.MonkeyPatch.context() as env:
        env.setenv(UNSAFE_TEST_MODE_ENV, "1")
        return parse_config(
            {
                "kafka": kafka,
                "input": {"keyed_by_user": True},
                "window": {"size_s": 10, "grace_s": 1, "start_at": "2020-08-01T00:00:00Z"},
                "privacy": {"unsafe_test_mode": True, "epsilon_per_window": 2.0},
                "queries": [{"name": "all", "epsilon": 1.0, "keys": {}}],
            }
        )


SASL = {
    "security_protocol": "SASL_SSL",
    "sasl_mechanism": "SCRAM-SHA-512",
    "sasl_username": "stream-dp-worker",
    "sasl_password": "secret",
}


def _publisher(mp: pytest.MonkeyPatch, looked_up: list[str], **kafka: Any) -> Publisher:
    config = _config(**kafka)
    metrics = Metrics(process=False)
    publisher = Publisher(WorkerContext(config, metrics, Health(), asyncio.Event(), NO_FAULTS))
    publisher.producer = SimpleNamespace(client=object())  # type: ignore[assignment]

    async def topic_gone(client: Any, topic: str) -> bool:
        looked_up.append(topic)
        return True  # a principal refused Describe finds the topic missing from the list

    mp.setattr(publisher_module, "topic_gone", topic_gone)
    return publisher


def _errors(publisher: Publisher) -> float:
    return float(publisher.metrics.broker_errors._value.get())


def _says(exc: BaseException, topic: str, operation: str, who: str) -> None:
    text = str(exc)
    assert text.startswith(f"the broker refuses {who} {operation} on topic {topic} "), text
    assert (
        f"kafka-acls.sh --bootstrap-server <broker> --add --allow-principal {who} "
        f"--operation Describe --operation Read --operation Write --topic {topic})" in text
    ), text
    assert "no longer exists" not in text and "give_up_after_s" not in text, text
    assert isinstance(exc, StreamDPError) and exc.retriable is False


async def test_a_refused_write_stops_at_once_naming_the_principal_and_the_grant(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    looked_up: list[str] = []
    publisher = _publisher(monkeypatch, looked_up, **SASL)
    topic = publisher.config.output.topic
    sent: list[str] = []

    async def send_all(producer: Any, to: str, items: Any, headers: Any = ()) -> None:
        sent.append(to)
        raise TopicAuthorizationFailedError(to)

    monkeypatch.setattr(publisher_module, "send_all", send_all)
    with pytest.raises(TopicNotAuthorizedError) as raised:
        await asyncio.wait_for(publisher.send_many(topic, [(None, b"{}", 0)]), 60)
    _says(raised.value, topic, "Write", PRINCIPAL)
    assert sent == [topic]  # not retried
    assert looked_up == []  # and never taken for a deleted topic
    assert _errors(publisher) == 1.0


async def test_a_refused_partition_count_stops_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Taking partitions asks for the stage-1 topic's count: refused Describe, the answer
    names the topic as unauthorized (and the full topic list leaves it out)."""
    looked_up: list[str] = []
    publisher = _publisher(monkeypatch, looked_up, **SASL)
    topic = publisher.config.output.repartition_topic
    asked: list[list[str]] = []

    async def ask(topics: list[str]) -> dict[str, list[int] | KafkaError]:
        asked.append(list(topics))
        return {t: TopicAuthorizationFailedError(t) for t in topics}

    monkeypatch.setattr(publisher, "_ask_partitions", ask)
    with pytest.raises(TopicNotAuthorizedError) as raised:
        await asyncio.wait_for(publisher.partitions(topic, bounded=True, fresh=True), 60)
    _says(raised.value, topic, "Describe", PRINCIPAL)
    assert asked == [[topic]] and looked_up == []

    async def partitions_for(to: str) -> set[int]:
        asked.append([to])
        raise TopicAuthorizationFailedError(to)

    publisher.producer = SimpleNamespace(partitions_for=partitions_for)  # type: ignore[assignment]
    with pytest.raises(TopicNotAuthorizedError) as raised:
        await asyncio.wait_for(publisher.partitions(topic, bounded=True), 60)
    _says(raised.value, topic, "Describe", PRINCIPAL)
    assert asked == [[topic], [topic]] and looked_up == []


async def test_without_sasl_or_a_certificate_the_grant_names_the_anonymous_principal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Over PLAINTEXT (or TLS without a client certificate) Kafka's default principal builder
    names every client User:ANONYMOUS: the grant names it, not a placeholder."""
    publisher = _publisher(monkeypatch, [])
    assert publisher.config.kafka.security_protocol == "PLAINTEXT"
    topic = publisher.config.output.partials_topic

    async def send_all(producer: Any, to: str, items: Any, headers: Any = ()) -> None:
        raise TopicAuthorizationFailedError(to)

    monkeypatch.setattr(publisher_module, "send_all", send_all)
    with pytest.raises(TopicNotAuthorizedError) as raised:
        await asyncio.wait_for(publisher.send_many(topic, [(None, b"{}", 0)]), 60)
    _says(raised.value, topic, "Write", "User:ANONYMOUS")


async def test_a_refused_single_record_write_stops_the_ledgers_endless_retry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ledger's fences and records are single writes (``Publisher.send``) retried until
    the worker stops (``bounded=False``): a refused one must end that retry at once, not
    repeat for ever with the worker never ready."""
    publisher = _publisher(monkeypatch, [], **SASL)
    topic = publisher.config.output.ledger_topic
    sent: list[str] = []

    async def send_and_wait(to: str, value: bytes, **_: Any) -> Any:
        sent.append(to)
        raise TopicAuthorizationFailedError(to)

    publisher.producer = SimpleNamespace(send_and_wait=send_and_wait)  # type: ignore[assignment]
    record = publisher.retry(
        "record the first covered window",
        lambda: publisher.send(topic, "coverage", b"{}", partition=0),
        bounded=False,
    )
    with pytest.raises(TopicNotAuthorizedError) as raised:
        await asyncio.wait_for(record, 60)
    _says(raised.value, topic, "Write", PRINCIPAL)
    assert sent == [topic] and _errors(publisher) == 1.0


async def test_a_refused_topic_found_while_taking_partitions_stops_the_worker() -> None:
    worker = Worker(_config(), KeyRing(Pseudonymizer(b"k" * 32, "test")))
    m = worker.membership
    tp = TopicPartition(m.partials_topic, 0)
    m.owned = {}
    m.consumer = SimpleNamespace(assignment=lambda: {tp})  # type: ignore[assignment]
    m.to_take = [tp]
    refused = TopicNotAuthorizedError(m.partials_topic, PRINCIPAL, "Describe")

    async def take(pending: list[TopicPartition]) -> None:
        raise refused

    m._take = take  # type: ignore[method-assign]
    await m.take_assigned()
    assert m.fatal is refused and m.owned == {}
    with pytest.raises(TopicNotAuthorizedError):
        m.raise_fatal()
