"""The Kafka client library's error classes that stream-dp catches or raises, in one place."""

from aiokafka.errors import (
    CommitFailedError,
    IllegalGenerationError,
    IllegalStateError,
    IncompatibleBrokerVersion,
    KafkaError,
    NoError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    RebalanceInProgressError,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
    UnknownMemberIdError,
    UnknownTopicOrPartitionError,
    UnsupportedVersionError,
    for_code,
)

__all__ = [
    "CommitFailedError",
    "IllegalGenerationError",
    "IllegalStateError",
    "IncompatibleBrokerVersion",
    "KafkaError",
    "NoError",
    "NoOffsetForPartitionError",
    "OffsetOutOfRangeError",
    "RebalanceInProgressError",
    "TopicAlreadyExistsError",
    "TopicAuthorizationFailedError",
    "UnknownMemberIdError",
    "UnknownTopicOrPartitionError",
    "UnsupportedVersionError",
    "for_code",
]
