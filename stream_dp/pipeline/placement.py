"""Which partition a record belongs on: the checks that make keyed input safe, not trusted.

A user's events must all sit on one partition of the stage-1 topic, or bounding per
partition bounds the user once per partition (PRIVACY.md invariant 2). Producers that key
by user id put them there only if every producer uses the same partitioner and the topic's
partition count does not change; nothing guarantees either. So stage 1 recomputes, for
every keyed record, the partition its key maps to under the configured partitioner and the
topic's current partition count, and dead-letters a record found elsewhere
(``misplaced_key``). Repartitioned records are placed by stage 0 with
:func:`pseudonym_partition` and checked the same way.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Literal

from aiokafka.partitioner import murmur2

Partitioner = Literal["murmur2", "crc32"]


def murmur2_partition(key: bytes, partitions: int) -> int:
    """Kafka's Java client (and aiokafka, librdkafka's ``murmur2_random``): positive
    murmur2 of the key modulo the partition count."""
    digest: int = murmur2(key)
    return (digest & 0x7FFFFFFF) % partitions


def crc32_partition(key: bytes, partitions: int) -> int:
    """librdkafka's default ``consistent_random`` (and ``consistent``) for non-empty keys:
    CRC-32 of the key modulo the partition count."""
    return zlib.crc32(key) % partitions


def partition_function(name: Partitioner) -> Callable[[bytes, int], int]:
    return murmur2_partition if name == "murmur2" else crc32_partition


def pseudonym_partition(pseudonym: bytes, partitions: int) -> int:
    """The repartition topic's partition of a pseudonym: its first 8 bytes, which are
    uniform (HMAC output), modulo the partition count."""
    return int.from_bytes(pseudonym[:8], "big") % partitions
