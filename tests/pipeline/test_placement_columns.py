"""The column forms of the placement functions give the per-key values."""

from __future__ import annotations

import os
import random

from stream_dp.pipeline.stages.placement import (
    crc32_partition,
    crc32_partitions,
    murmur2_partition,
    murmur2_partitions,
    pseudonym_partition,
    pseudonym_partitions,
)


def test_murmur2_of_many_keys_matches_the_per_key_function() -> None:
    rng = random.Random(7)
    keys = [b"", b"a", b"21", b"abc", b"foobar", "é-ü".encode()]
    keys += [os.urandom(rng.randrange(0, 40)) for _ in range(2000)]
    keys += [b"u%07d" % rng.randrange(10**7) for _ in range(500)]  # one length, many keys
    for partitions in (1, 4, 6, 2**31 - 1):
        assert murmur2_partitions(keys, partitions).tolist() == [
            murmur2_partition(k, partitions) for k in keys
        ]
    assert crc32_partitions(keys, 7).tolist() == [crc32_partition(k, 7) for k in keys]
    assert murmur2_partitions([], 3).tolist() == []
    # Batches of keys of one length (the usual: ids of one format) take one pass.
    for length in (0, 3, 8, 9, 13):
        same = [os.urandom(length) for _ in range(300)]
        assert murmur2_partitions(same, 6).tolist() == [murmur2_partition(k, 6) for k in same]


def test_pseudonym_partitions_match_the_per_pseudonym_function() -> None:
    pseudonyms = [os.urandom(16) for _ in range(1000)]
    for partitions in (1, 4, 5):
        assert pseudonym_partitions(b"".join(pseudonyms), partitions).tolist() == [
            pseudonym_partition(p, partitions) for p in pseudonyms
        ]
