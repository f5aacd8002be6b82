"""The Kafka-protocol edge that knows nothing of DP: the embedded broker for the demo and the
tests, broker readiness checks and the topics of ``topics/`` (created, compared). The
clients' security options are the client layer's (``stream_dp.kafka_client.client_options``)."""

from stream_dp.broker.embedded import EmbeddedBroker
from stream_dp.broker.probe import BrokerAddress, wait_for_broker
from stream_dp.broker.topics import (
    Topic,
    TopicSpec,
    TopicState,
    apply_topics,
    default_topics_dir,
    inspect_topics,
    load_topic_specs,
    resolve,
    resolve_all,
)

__all__ = [
    "BrokerAddress",
    "EmbeddedBroker",
    "Topic",
    "TopicSpec",
    "TopicState",
    "apply_topics",
    "default_topics_dir",
    "inspect_topics",
    "load_topic_specs",
    "resolve",
    "resolve_all",
    "wait_for_broker",
]
