"""The Kafka client layer: the only part of stream-dp that imports the Kafka client library.

Every other package reaches Kafka through the names here (an import-linter contract in
pyproject.toml, ``one-client-layer``, fails ``make lint`` and the tests otherwise). The
library today is aiokafka; this package owns what depends on it:

- the client types (consumer, producer, admin client, partitions, rebalance listener, config
  resources, fetched records), re-exported below under the library's own names;
- its error classes (:mod:`stream_dp.kafka_client.errors`) and the classification of fetch
  errors into a cause and a fix (:mod:`stream_dp.kafka_client.fetch_errors`);
- the record-batch codecs this install can read (:mod:`stream_dp.kafka_client.codecs`);
- the security settings of every client (:mod:`stream_dp.kafka_client.client_options`);
- the keyed partitioner, murmur2 (:mod:`stream_dp.kafka_client.partitioner`);
- the fetch adapter pinned to the library's private fetcher
  (:mod:`stream_dp.kafka_client.fetched`) and the protocol requests a few probes send
  (:mod:`stream_dp.kafka_client.protocol`);
- the Metadata requests of every client, which never ask the broker to create a topic
  (:mod:`stream_dp.kafka_client.metadata`, installed when this package is imported: a topic
  deleted under a running worker stays deleted, and is reported missing);
- the asyncio TLS layer's close race, lowered from an ERROR with a traceback to DEBUG
  (:mod:`stream_dp.kafka_client.tls_close`, installed when this package is imported).

Swapping or upgrading the client library changes this package, not its importers.
"""

from aiokafka import (
    AIOKafkaConsumer,
    AIOKafkaProducer,
    ConsumerRebalanceListener,
    TopicPartition,
)
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.structs import ConsumerRecord, OffsetAndMetadata

# Imported for its effect, before any client of this layer is built: no Metadata request
# of this process allows topic auto-creation (see the module).
from stream_dp.kafka_client import metadata as _metadata  # noqa: F401

# Imported for its effect too: the asyncio TLS layer's close race is not logged as an error.
from stream_dp.kafka_client import tls_close as _tls_close  # noqa: F401

__all__ = [
    "AIOKafkaAdminClient",
    "AIOKafkaConsumer",
    "AIOKafkaProducer",
    "ConfigResource",
    "ConfigResourceType",
    "ConsumerRebalanceListener",
    "ConsumerRecord",
    "NewTopic",
    "OffsetAndMetadata",
    "TopicPartition",
]
