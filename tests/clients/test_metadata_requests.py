"""The Metadata requests of every client built through the client layer never ask the broker
to create a topic (stream_dp/kafka_client/metadata.py): checked on the request aiokafka's
own code paths hand to the connection, encoded at the version a broker would negotiate.

Only the package :mod:`stream_dp.kafka_client` is imported here (what every client of
stream-dp imports): the change must come with it, not with a module a caller could forget.
"""

from __future__ import annotations

from typing import Any

import pytest
from aiokafka.client import AIOKafkaClient, ConnectionGroup
from aiokafka.protocol.metadata import MetadataRequest, MetadataResponse_v0

import stream_dp.kafka_client as client_layer
from stream_dp.kafka_client.errors import KafkaError

#: What Apache Kafka 4 advertises for Metadata (api key 3): aiokafka picks its newest, v5.
KAFKA_4_METADATA = {MetadataRequest.API_KEY: (0, 13)}


class _Connection:
    """A connection that records the requests sent on it and answers with no brokers."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def connected(self) -> bool:
        return True

    async def send(self, request: Any, expect_response: bool = True) -> Any:
        self.sent.append(request)
        return MetadataResponse_v0([], [])


def _on_the_wire(request: Any, versions: dict[int, tuple[int, int]]) -> dict[str, Any]:
    struct = request.prepare(versions)
    fields: dict[str, Any] = struct.to_object()
    fields["version"] = struct.API_VERSION
    return fields


async def _requests_of(topics: set[str] | None) -> list[Any]:
    """The requests aiokafka's client sends for a metadata refresh of ``topics`` (None: as
    ``fetch_all_metadata`` asks, for every topic)."""
    client = AIOKafkaClient(bootstrap_servers="127.0.0.1:1")
    connection = _Connection()
    client._conns[("bootstrap", ConnectionGroup.DEFAULT)] = connection
    try:
        if topics is None:
            with pytest.raises(KafkaError):  # the answer names no broker: not updated
                await client.fetch_all_metadata()
        else:
            await client._metadata_update(client.cluster, topics)
    finally:
        client._conns.clear()
    return connection.sent


async def test_the_metadata_refresh_of_followed_topics_refuses_topic_creation() -> None:
    """What a consumer's subscription, a producer's ``partitions_for``/``send`` and the
    Publisher's topology watch all go through (``add_topic``/``set_topics`` →
    ``force_metadata_update`` → ``_metadata_update`` with the followed topics)."""
    sent = await _requests_of({"ledger", "input"})
    assert len(sent) == 1
    fields = _on_the_wire(sent[0], KAFKA_4_METADATA)
    assert fields["version"] == 5
    assert sorted(fields["topics"]) == ["input", "ledger"]
    assert fields["allow_auto_topic_creation"] is False


async def test_every_version_refuses_topic_creation() -> None:
    """Versions 0-3 have no flag: a request naming topics asks for all of them instead (a
    broker creates only topics a request names)."""
    for version in range(6):
        fields = _on_the_wire(MetadataRequest(["ledger"]), {MetadataRequest.API_KEY: (0, version)})
        assert fields["version"] == version
        if version >= 4:
            assert fields == {
                "topics": ["ledger"],
                "allow_auto_topic_creation": False,
                "version": version,
            }
        else:
            assert "ledger" not in (fields["topics"] or []), fields
            assert fields["topics"] == ([] if version == 0 else None)  # every topic


async def test_a_topic_list_asks_for_every_topic() -> None:
    """``fetch_all_metadata`` (``topic_partitions``, ``consumer.topics()``): every topic, a
    request no broker answers by creating one."""
    sent = await _requests_of(None)
    assert len(sent) == 1
    fields = _on_the_wire(sent[0], KAFKA_4_METADATA)
    assert fields["topics"] is None
    assert fields["allow_auto_topic_creation"] is False


async def test_the_admin_client_describes_topics_without_creating_them() -> None:
    admin = client_layer.AIOKafkaAdminClient(bootstrap_servers="127.0.0.1:1")
    sent: list[Any] = []

    async def send_request(request: Any) -> Any:
        sent.append(request)
        return None

    admin._send_request = send_request
    await admin._get_cluster_metadata(["ledger"])
    fields = _on_the_wire(sent[0], KAFKA_4_METADATA)
    assert fields["topics"] == ["ledger"]
    assert fields["allow_auto_topic_creation"] is False


def test_an_explicit_request_for_creation_is_kept() -> None:
    """Only the default changes: a request built with ``allow_auto_topic_creation=True``
    (nothing in stream-dp builds one) is sent as asked."""
    fields = _on_the_wire(MetadataRequest(["t"], True), KAFKA_4_METADATA)
    assert fields["allow_auto_topic_creation"] is True
