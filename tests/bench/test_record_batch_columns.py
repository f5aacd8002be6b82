"""The columnar record-batch reader of bench/record_batch_columns.py reads what aiokafka reads
(its figures are only worth reporting if it does), and refuses the batches it does not read."""

from __future__ import annotations

import random
import struct

import pytest

from bench import record_batch_columns as columns


def _records(n: int, seed: int) -> tuple[list[bytes], list[bytes]]:
    """Values and keys of every length class a varint has (1, 2 and 3 bytes)."""
    rng = random.Random(seed)
    values = [
        bytes(rng.randrange(32, 127) for _ in range(rng.choice((3, 70, 200, 9000))))
        for _ in range(n)
    ]
    keys = [b"user%d" % rng.randrange(10 ** rng.randrange(1, 9)) for _ in range(n)]
    return values, keys


@pytest.mark.parametrize("per_batch", [1, 7, 100])
def test_offsets_and_values_are_aiokafkas(per_batch: int) -> None:
    values, keys = _records(250, seed=per_batch)
    batches = columns.build_batches(values, keys, per_batch)
    seen_offsets: list[int] = []
    seen_values: list[bytes] = []
    for batch in batches:
        want_offsets, want_values = columns.read_aiokafka(batch)
        offsets, got = columns.read_columnar_values(batch)
        assert (offsets.tolist(), got) == (want_offsets, want_values)
        seen_offsets += offsets.tolist()
        seen_values += got
    assert (seen_offsets, seen_values) == (list(range(len(values))), values)


def test_a_corrupt_batch_is_refused() -> None:
    values, keys = _records(10, seed=1)
    batch = bytearray(columns.build_batches(values, keys, 10)[0])
    batch[-5] ^= 0x01  # a byte of the last value: the CRC no longer matches
    with pytest.raises(ValueError, match="bad CRC"):
        columns.read_columnar(bytes(batch))


def test_a_compressed_batch_is_refused() -> None:
    values, keys = _records(10, seed=2)
    batch = bytearray(columns.build_batches(values, keys, 10)[0])
    attributes = struct.unpack_from(">h", batch, 21)[0] | 1  # gzip
    struct.pack_into(">h", batch, 21, attributes)
    from aiokafka.record._crc32c import crc as crc32c  # the CRC covers the attributes

    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
    with pytest.raises(ValueError, match="uncompressed"):
        columns.read_columnar(bytes(batch))
