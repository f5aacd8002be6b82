"""Starting and stopping a Kafka client with one error line that tells the user what to check, and
a topic's partitions as the broker says now."""

from __future__ import annotations

import asyncio
from typing import Any

from stream_dp.broker.connection_errors import (
    connection_reason,
    held_connection_errors,
    what_to_check,
)
from stream_dp.errors import BrokerError
from stream_dp.kafka_client.errors import KafkaError
from stream_dp.kafka_client.fetch_errors import UNNAMED_PRINCIPAL


async def start_client(client: Any, bootstrap_servers: str) -> None:
    """``await client.start()``; on failure stop it and raise BrokerError naming the address."""
    with held_connection_errors() as held:
        try:
            await client.start()
        except (KafkaError, OSError) as exc:
            await client.stop()
            reason = connection_reason(held, exc)
            check = what_to_check(
                reason,
                "check kafka.bootstrap_servers (or --bootstrap-servers) and that the broker is up",
            )
            raise BrokerError(
                f"cannot reach the broker at {bootstrap_servers}: {reason}; {check}"
            ) from None


async def topic_partitions(client: Any, topic: str) -> list[int] | None:
    """The partitions of ``topic`` as the broker says now; None when it has no such topic.

    Asks for every topic's metadata (a request naming ``topic`` alone would make a broker
    with ``auto.create.topics.enable`` create it). A client's own metadata is no answer: a
    consumer without a subscription holds none right after it starts (Apache Kafka answers
    its empty topic list with no topic), and it is refreshed only every
    ``metadata_max_age_ms`` (five minutes by default). KafkaError when the broker does not
    answer."""
    return await listed_partitions(client._client, topic)


async def listed_partitions(cluster_client: Any, topic: str) -> list[int] | None:
    """:func:`topic_partitions` asked through an aiokafka cluster client (a consumer's
    ``_client``, a producer's ``client``): None when the broker's topic list has no
    ``topic``; KafkaError when the broker does not answer."""
    cluster = await cluster_client.fetch_all_metadata()
    partitions = cluster.partitions_for_topic(topic)
    return sorted(partitions) if partitions else None


class TopicGoneError(BrokerError):
    """A topic the worker writes or commits offsets of is gone from the broker: deleted while
    it ran, and created again by no client of stream-dp. The worker stops at once without
    committing, naming it, instead of retrying a write or a commit that cannot succeed."""

    retriable = False

    def __init__(self, topic: str) -> None:
        super().__init__(
            f"topic {topic} no longer exists on the broker: it was deleted while the worker "
            "ran, and nothing creates it again. Create it as defined (`stream-dp topics apply "
            "--config FILE`; the records it held are lost), then restart the worker"
        )
        self.topic = topic


class TopicNotAuthorizedError(BrokerError):
    """The broker refuses the worker's principal a topic it writes (TopicAuthorizationFailed
    on a produce or on the topic's metadata): an ACL, which no retry clears. The worker stops
    at once without committing, naming the grant, instead of retrying the write for
    ``kafka.give_up_after_s`` and then suggesting a longer wait, or calling the topic
    deleted (a broker leaves a topic its principal may not Describe out of its topic list,
    so that list alone cannot tell the two apart; an ACL outlives its topic, so a deleted
    topic the principal could use is answered as unknown, never as refused)."""

    retriable = False

    def __init__(self, topic: str, principal: str | None, operation: str) -> None:
        who = principal or UNNAMED_PRINCIPAL
        super().__init__(
            f"the broker refuses {who} {operation} on topic {topic} "
            "(TopicAuthorizationFailedError): an ACL denies it or grants it no longer. Grant "
            "the principal what the worker needs on its own topics (kafka-acls.sh "
            f"--bootstrap-server <broker> --add --allow-principal {who} --operation Describe "
            f"--operation Read --operation Write --topic {topic}), or fix kafka.sasl_* / "
            "kafka.ssl_* so that it authenticates as the principal that has them; then "
            "restart the worker (it stopped without committing: the restart redoes what was "
            "not safely done)"
        )
        self.topic = topic
        self.operation = operation


async def topic_gone(cluster_client: Any, topic: str) -> bool:
    """True only when the broker answered and its topic list has no ``topic`` (no client of
    stream-dp creates a topic, so one deleted stays so); False when it has it or does not
    answer."""
    try:
        return await listed_partitions(cluster_client, topic) is None
    except KafkaError:
        return False


async def stop_client(client: Any) -> None:
    """``await client.stop()``. aiokafka's consumer, stopped before its coordinator task had a
    turn (a command that fails right after the start), raises that task's CancelledError
    from ``stop()``: it would replace the error being raised with a traceback. Swallowed
    here unless this task itself is being cancelled (Ctrl-C)."""
    try:
        await client.stop()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise


def partitions_without_leader(consumer: Any | None) -> set[Any]:
    """A consumer's assigned partitions whose leader is unknown (an outage, not idleness);
    none without a consumer."""
    if consumer is None:
        return set()
    cluster = consumer._client.cluster  # aiokafka has no public accessor for leaders
    out = set()
    for tp in consumer.assignment():
        leader = cluster.leader_for_partition(tp)
        if leader is None or leader < 0:
            out.add(tp)
    return out
