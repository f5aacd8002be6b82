"""No metadata request of this process asks the broker to create a topic.

A Kafka client learns a topic's partitions from a Metadata request that names the topic.
On a broker with ``auto.create.topics.enable=true`` (Apache Kafka's default) such a request
creates a topic it names that does not exist, with the broker's default partition count and
configuration: aiokafka's requests allow it (``allow_auto_topic_creation`` True from version
4 of the request, and versions 0–3 have no way to refuse). Every client asks for the topics
it follows — the consumer for its subscription, the producer for a topic it sends to, the
admin client for the topics it describes, the Publisher's topology watch for the counts it
compares — so a topic deleted under a running worker was created again by the worker's own
clients within seconds: a ledger, erasure or partials topic with ``cleanup.policy=delete``
and a week's retention, an input topic with another partition count. Nothing said so.

:func:`_install` changes what aiokafka's one request builder
(``aiokafka.protocol.metadata.MetadataRequest.build``, which every client, the admin client
and the broker probe go through) puts on the wire: a request of version 4 or later says
``allow_auto_topic_creation=False``; one of an older version (brokers before Kafka 0.11)
that names topics asks for every topic instead, which no broker answers by creating one. A
request built with ``allow_auto_topic_creation=True`` explicitly is left as it was asked.

A topic that is gone is then reported as gone: the metadata response says
``UNKNOWN_TOPIC_OR_PARTITION`` for it, a producer sending to it fails with
``UnknownTopicOrPartitionError`` (after its ``request_timeout_ms``), a consumer's
subscription loses its partitions, and the topology watch and the ledger reader see the
topic missing. The module is imported by :mod:`stream_dp.kafka_client`, so every client
built through the client layer has it; an aiokafka whose builder this does not fit stops the
import with an error saying which version to install, rather than run with clients that
create topics.
"""

from __future__ import annotations

from typing import Any, Final

import aiokafka
from aiokafka.protocol import metadata as _metadata

from stream_dp.errors import StreamDPError

__all__ = ["auto_creation_refused", "metadata_request_fields"]

#: The first version of the Metadata request with ``allow_auto_topic_creation`` (KIP-204).
FIRST_VERSION_WITH_FLAG: Final = 4

_ORIGINAL_BUILD: Final = _metadata.MetadataRequest.build


class MetadataPatchError(StreamDPError):
    """The installed aiokafka builds Metadata requests in a way this module cannot change."""


def _build_without_auto_creation(self: Any, request_struct_class: Any) -> Any:
    """aiokafka's ``MetadataRequest.build``, never asking the broker to create a topic
    (module docstring)."""
    if self._allow_auto_topic_creation:  # asked for explicitly: as aiokafka builds it
        return _ORIGINAL_BUILD(self, request_struct_class)
    topics = self._topics
    if request_struct_class.API_VERSION >= FIRST_VERSION_WITH_FLAG:
        return request_struct_class(topics, False)
    if topics:
        topics = None  # no flag to refuse creation: every topic (v1+: a null array) instead
    if request_struct_class.API_VERSION < 1:
        return request_struct_class(topics or [])  # v0: an empty array is every topic
    return request_struct_class(topics)


def metadata_request_fields(topics: list[str] | None, version: int) -> dict[str, Any]:
    """The fields of the Metadata request this process sends for ``topics`` at protocol
    ``version`` (what the broker reads: ``topics`` and, from version 4,
    ``allow_auto_topic_creation``)."""
    request = _metadata.MetadataRequest(topics)
    struct = request.prepare({_metadata.MetadataRequest.API_KEY: (version, version)})
    fields: dict[str, Any] = struct.to_object()
    return fields


def auto_creation_refused() -> bool:
    """Whether every Metadata request this process builds refuses topic creation (checked
    on the request as built, at the oldest and the newest version aiokafka knows)."""
    newest = max(cls.API_VERSION for cls in _metadata.MetadataRequest._CLASSES)
    flag = metadata_request_fields(["t"], newest).get("allow_auto_topic_creation")
    if newest >= FIRST_VERSION_WITH_FLAG and flag is not False:
        return False
    return metadata_request_fields(["t"], 1)["topics"] is None


def _install() -> None:
    request_class = _metadata.MetadataRequest
    if request_class.build is not _build_without_auto_creation:
        probe = request_class(["t"])
        if not {"_topics", "_allow_auto_topic_creation"} <= vars(probe).keys():
            raise MetadataPatchError(
                f"aiokafka {aiokafka.__version__} builds Metadata requests differently from "
                "the 0.14 this client layer was written for (stream_dp/kafka_client/"
                "metadata.py), so its clients could create deleted topics again: install "
                "aiokafka 0.14 (pip install 'aiokafka[lz4,snappy,zstd]==0.14.*')"
            )
        request_class.build = _build_without_auto_creation
    if not auto_creation_refused():
        raise MetadataPatchError(
            f"aiokafka {aiokafka.__version__}: the Metadata requests still allow topic "
            "auto-creation after stream_dp/kafka_client/metadata.py changed them; install "
            "aiokafka 0.14 (pip install 'aiokafka[lz4,snappy,zstd]==0.14.*')"
        )


_install()
