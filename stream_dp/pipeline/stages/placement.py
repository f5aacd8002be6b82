"""Which partition a record belongs on: the checks that make keyed input safe, not trusted.

A user's events must all sit on one partition of the stage-1 topic, or bounding per
partition bounds the user once per partition (docs/privacy.md#invariant-2). Producers that key
by user id put them there only if every producer uses the same partitioner and the topic's
partition count does not change; nothing guarantees either. So stage 1 recomputes, for
every keyed record, the partition its key maps to under the configured partitioner and the
topic's current partition count, and dead-letters a record found elsewhere
(``misplaced_key``). Repartitioned records are placed by stage 0 with
:func:`pseudonym_partition` and checked the same way.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np
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


_M = np.uint32(0x5BD1E995)
_SEED = 0x9747B28C


def murmur2_partitions(keys: Sequence[bytes], partitions: int) -> np.ndarray:
    """:func:`murmur2_partition` of many keys at once (numpy, 32-bit words; keys of one
    length hashed together): the same values, without a Python loop per byte."""
    out = np.empty(len(keys), dtype=np.int64)
    if not keys:
        return out
    lengths = np.fromiter(map(len, keys), np.int64, len(keys))
    one_length = bool(lengths.min() == lengths.max())
    for length in [int(lengths[0])] if one_length else np.unique(lengths).tolist():
        where = np.arange(len(keys)) if one_length else np.flatnonzero(lengths == length)
        group = keys if one_length else [keys[i] for i in where.tolist()]
        raw = np.frombuffer(b"".join(group), dtype=np.uint8).reshape(len(where), length)
        # The key's 4-byte words, little-endian (murmur2's reads), one column each.
        words = raw[:, : length & ~3].copy().view("<u4")
        with np.errstate(over="ignore"):
            h = np.full(len(where), (_SEED ^ length) & 0xFFFFFFFF, dtype=np.uint32)
            for i in range(length // 4):
                k = words[:, i].astype(np.uint32)
                k = k * _M
                k ^= k >> 24
                k = k * _M
                h = h * _M
                h ^= k
            tail = length & ~3
            extra = length % 4
            data = raw[:, tail:].astype(np.uint32)  # the last length % 4 bytes
            if extra >= 3:
                h ^= data[:, 2] << 16
            if extra >= 2:
                h ^= data[:, 1] << 8
            if extra >= 1:
                h ^= data[:, 0]
                h = h * _M
            h ^= h >> 13
            h = h * _M
            h ^= h >> 15
        out[where] = (h & np.uint32(0x7FFFFFFF)).astype(np.int64) % partitions
    return out


def crc32_partitions(keys: Sequence[bytes], partitions: int) -> np.ndarray:
    """:func:`crc32_partition` of many keys (zlib per key: already C)."""
    return np.fromiter((zlib.crc32(k) % partitions for k in keys), np.int64, len(keys))


def partitions_function(name: Partitioner) -> Callable[[Sequence[bytes], int], np.ndarray]:
    return murmur2_partitions if name == "murmur2" else crc32_partitions


def pseudonym_partitions(pseudonyms: bytes, partitions: int) -> np.ndarray:
    """:func:`pseudonym_partition` of concatenated 16-byte pseudonyms."""
    first = np.frombuffer(pseudonyms, dtype=">u8")[::2]
    return (first % np.uint64(partitions)).astype(np.int64)
