"""The keyed partitioner of Kafka's clients: murmur2 of the key bytes (the Java client's,
aiokafka's and librdkafka's ``murmur2_random``), which the repartition stage places
pseudonyms with."""

from aiokafka.partitioner import murmur2

__all__ = ["murmur2"]
