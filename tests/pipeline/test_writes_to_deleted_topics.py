"""A write that fails to one of the deployment's own topics is checked against the broker's
topic list (stream_dp/pipeline/kafka/publisher.py, ``_unless_gone``): a deleted ledger,
continual topic or erasure log holds the worker as a lost ledger (TopicDeletedError); any other
topic it writes — output, dead letters, partials, repartition, the erasure responses and each
partner export — stops it at once, naming the topic and the command that makes it again
(TopicGoneError), instead of a retry for ``give_up_after_s`` that cannot succeed. A topic
that is not the deployment's is never looked up. No broker: the topic list is the test's."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import KafkaError, UnknownTopicOrPartitionError

from stream_dp.clients.compacted import TopicDeletedError
from stream_dp.clients.connect import TopicGoneError
from stream_dp.config import parse_config
from stream_dp.config.model import UNSAFE_TEST_MODE_ENV
from stream_dp.ops.health import Health
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.faults import NO_FAULTS
from stream_dp.pipeline.kafka import publisher as publisher_module
from stream_dp.pipeline.kafka.context import WorkerContext
from stream_dp.pipeline.kafka.publisher import Publisher

EXPORT = {
    "partner": "acme",
    "topic": "to-acme",
    "fields": ["age"],
    "generalize": {"age": "bucket:10"},
    "purpose": "research",
    "legal_basis": "GDPR Art. 6(1)(a) consent",
}


def _publisher(mp: pytest.MonkeyPatch, deleted: set[str], looked_up: list[str]) -> Publisher:
    with pytest.MonkeyPatch.context() as env:
        env.setenv(UNSAFE_TEST_MODE_ENV, "1")
        config = parse_config(
            {
                "input": {"keyed_by_user": True},
                "window": {"size_s": 10, "grace_s": 1, "start_at": "2020-08-01T00:00:00Z"},
                "privacy": {"unsafe_test_mode": True, "epsilon_per_window": 2.0},
                "queries": [{"name": "all", "epsilon": 1.0, "keys": {}}],
                "erasure": {"enabled": True},
                "exports": [EXPORT],
            }
        )
    publisher = Publisher(
        WorkerContext(config, Metrics(process=False), Health(), asyncio.Event(), NO_FAULTS)
    )
    publisher.producer = SimpleNamespace(client=object())  # type: ignore[assignment]

    async def topic_gone(client: Any, topic: str) -> bool:
        looked_up.append(topic)
        return topic in deleted

    mp.setattr(publisher_module, "topic_gone", topic_gone)
    return publisher


async def test_every_topic_the_worker_writes_is_checked_when_a_write_to_it_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    looked_up: list[str] = []
    publisher = _publisher(monkeypatch, set(), looked_up)
    cfg = publisher.config
    stopped = [
        cfg.output.topic,
        cfg.output.dead_letter_topic,
        cfg.output.partials_topic,
        cfg.output.repartition_topic,
        cfg.erasure.responses_topic,
        "to-acme",
    ]
    held = [cfg.output.ledger_topic, cfg.output.continual_topic, cfg.erasure.log_topic]
    for topic in [*stopped, *held]:
        deleted_publisher = _publisher(monkeypatch, {topic}, looked_up)
        expected = TopicGoneError if topic in stopped else TopicDeletedError
        with pytest.raises(expected) as raised:
            await deleted_publisher._unless_gone(topic)
        assert topic in str(raised.value)
        # Still there: the write's own error stands (retried as before).
        assert await _publisher(monkeypatch, set(), looked_up)._unless_gone(topic) is None
    # Not the deployment's topic: never looked up, never a reason to stop.
    looked_up.clear()
    assert (
        await _publisher(monkeypatch, {"someone-elses"}, looked_up)._unless_gone("someone-elses")
        is None
    )
    assert looked_up == []


async def test_a_fresh_partition_count_of_a_deleted_topic_stops_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Taking partitions asks the broker for the repartition topic's count (the stage-1
    topic of the default path). Deleted, the answer has no partitions for it: retried until
    ``give_up_after_s``, then again at every iteration, the worker never stopped."""
    looked_up: list[str] = []
    topic = _publisher(monkeypatch, set(), looked_up).config.output.repartition_topic
    for deleted, expected in (({topic}, TopicGoneError), (set(), None)):
        publisher = _publisher(monkeypatch, deleted, looked_up)
        asked: list[list[str]] = []

        async def ask(
            topics: list[str], asked: list[list[str]] = asked
        ) -> dict[str, list[int] | KafkaError]:
            asked.append(list(topics))
            if len(asked) == 1:  # the broker's answer names the topic without partitions
                return {t: UnknownTopicOrPartitionError() for t in topics}
            return {t: [0, 1] for t in topics}

        monkeypatch.setattr(publisher, "_ask_partitions", ask)
        if expected is None:  # still listed: the error is retried, and the next ask answers
            assert await publisher.partitions(topic, bounded=True, fresh=True) == [0, 1]
            assert len(asked) == 2
            continue
        with pytest.raises(expected) as raised:
            await publisher.partitions(topic, bounded=True, fresh=True)
        assert topic in str(raised.value) and "stream-dp topics apply" in str(raised.value)
        assert len(asked) == 1  # not asked again
