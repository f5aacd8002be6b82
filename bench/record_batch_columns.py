"""A columnar reader of Kafka record batches, as a measurement only (issue 43's first lever).

``python -m bench.record_batch_columns [--events N] [--batch B,...] [--repeats R] [--keep]``:
the events of issue 43's stream (bench/realistic.py, keyed by user) written into uncompressed
v2 record batches of ``B`` records (aiokafka's batch builder: the bytes a fetch response
carries), then read back, in turn, in one process:

* ``aiokafka``: what the worker's fetch does today (stream_dp/kafka_client/fetched.py):
  ``MemoryRecords`` → ``DefaultRecordBatch``, ``validate_crc``, ``list(batch)`` (its C
  extension builds one record object per record), then the offsets and values as lists
  (``FetchedRecords.offsets`` and ``.values``);
* ``columnar``: the same CRC check (aiokafka's C ``validate_crc`` on the batch's header
  object: no record is parsed), then the batch's bytes read with numpy — the record
  boundaries by one pass over the length prefixes (a varint each: the only sequential step,
  a Python loop), every other field (attributes, timestamp delta, offset delta, key and value
  lengths) as vectorised varint reads at those boundaries — into an int64 offsets array and
  the values' start and end positions: no object per record; ``columnar + values`` also cuts
  the values out as the ``bytes`` objects today's decoders take (one slice per record);
* the CRC check, aiokafka's record objects and the record-boundary loop, each alone, to show
  where the time goes.

The heap is frozen first (``gc.freeze``), as the worker freezes its start-up heap. Prints,
per contender, the best ``time.process_time`` per record of ``R`` passes over every batch, in
µs, after checking that the columnar reader returns exactly aiokafka's offsets and values;
``--keep`` writes the figures to ``bench/record_batch_columns.json``. Control batches,
compression and transactions are left out (the prototype refuses them): a reader for the
worker would have to handle each.
"""

from __future__ import annotations

import argparse
import gc
import json
import struct
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

HEADER_BYTES = 61
RESULTS_FILE = Path(__file__).resolve().parent / "record_batch_columns.json"
_HEADER = struct.Struct(">qiibIhiqqqhii")


def build_batches(values: Sequence[bytes], keys: Sequence[bytes], per_batch: int) -> list[bytes]:
    """The records in uncompressed v2 record batches of ``per_batch`` records each."""
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    out = []
    for first in range(0, len(values), per_batch):
        builder = DefaultRecordBatchBuilder(
            magic=2,
            compression_type=0,
            is_transactional=0,
            producer_id=-1,
            producer_epoch=-1,
            base_sequence=-1,
            batch_size=1 << 30,
        )
        for i in range(first, min(first + per_batch, len(values))):
            builder.append(
                i - first, timestamp=1_700_000_000_000 + i, key=keys[i], value=values[i], headers=[]
            )
        batch = bytearray(builder.build())
        batch[0:8] = struct.pack(">q", first)  # the base offset the broker would assign
        out.append(bytes(batch))
    return out


def read_aiokafka(batch: bytes) -> tuple[list[int], list[bytes | None]]:
    from aiokafka.record.memory_records import MemoryRecords

    parsed = MemoryRecords(batch).next_batch()
    if not parsed.validate_crc():
        raise ValueError("bad CRC")
    records = list(parsed)
    return [r.offset for r in records], [r.value for r in records]


def _varints(data: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The zigzag varints starting at each position of ``at``: (values, sizes in bytes)."""
    value = np.zeros(len(at), dtype=np.int64)
    size = np.zeros(len(at), dtype=np.int64)
    going = np.ones(len(at), dtype=bool)
    for k in range(10):
        if not going.any():
            break
        byte = data[at + k].astype(np.int64)
        value |= np.where(going, (byte & 0x7F) << (7 * k), 0)
        size += going
        going &= byte >= 0x80
    return (value >> 1) ^ -(value & 1), size


def read_columnar(batch: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offsets, value starts, value ends) of one uncompressed, non-control record batch."""
    from aiokafka.record.memory_records import MemoryRecords

    header = MemoryRecords(batch).next_batch()  # the header only: no record is parsed
    if not header.validate_crc():
        raise ValueError("bad CRC")
    base_offset, _, _, magic, _, attributes, *_ = _HEADER.unpack_from(batch)
    if magic != 2 or attributes & 0x37:  # codec bits, transactional, control
        raise ValueError("the prototype reads uncompressed, non-transactional data batches")
    starts = record_starts(batch)  # the one sequential step: each length prefix
    data = np.frombuffer(batch + bytes(10), dtype=np.uint8)  # padded: varint reads stay in
    at = np.asarray(starts, dtype=np.int64) + 1  # past the record's attributes byte
    _, size = _varints(data, at)  # timestamp delta
    at += size
    offset_delta, size = _varints(data, at)
    at += size
    key_length, size = _varints(data, at)
    at += size + np.maximum(key_length, 0)
    value_length, size = _varints(data, at)
    at += size
    if (value_length < 0).any():
        raise ValueError("the prototype reads no tombstones")
    return base_offset + offset_delta, at, at + value_length


def crc_only(batch: bytes) -> bool:
    """The CRC check both readers do (aiokafka's, in C), alone."""
    from aiokafka.record.memory_records import MemoryRecords

    return bool(MemoryRecords(batch).next_batch().validate_crc())


def record_objects(batch: bytes) -> list[Any]:
    """aiokafka's record objects alone (its C extension), without the offsets and values."""
    from aiokafka.record.memory_records import MemoryRecords

    return list(MemoryRecords(batch).next_batch())


def record_starts(batch: bytes) -> list[int]:
    """The columnar reader's one sequential step alone: where each record's body starts."""
    count = int.from_bytes(batch[57:61], "big")
    starts = [0] * count
    pos = HEADER_BYTES
    for i in range(count):
        n, shift = 0, 0
        while True:
            b = batch[pos]
            n |= (b & 0x7F) << shift
            pos += 1
            if b < 0x80:
                break
            shift += 7
        starts[i] = pos
        pos += (n >> 1) ^ -(n & 1)
    return starts


def read_columnar_values(batch: bytes) -> tuple[np.ndarray, list[bytes]]:
    offsets, starts, ends = read_columnar(batch)
    return offsets, [batch[s:e] for s, e in zip(starts.tolist(), ends.tolist(), strict=True)]


def _best_us(read: Callable[[bytes], Any], batches: Sequence[bytes], n: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        c0 = time.process_time()
        for batch in batches:
            read(batch)
        best = min(best, time.process_time() - c0)
    return best / n * 1e6


def main(argv: list[str] | None = None) -> None:
    from bench import realistic

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument(
        "--batch", type=lambda t: [int(b) for b in t.split(",")], default=[100, 1_000, 10_000]
    )
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--keep", action="store_true", help=f"write {RESULTS_FILE.name}")
    opts = parser.parse_args(argv)
    values, keys = realistic.stream(opts.events, realistic.first_window_s(time.time()))
    gc.collect()
    gc.freeze()  # as the worker does with its start-up heap (stream_dp/pipeline/kafka/service.py)
    out: dict[str, Any] = {"events": opts.events, "repeats": opts.repeats, "per_batch": {}}
    for per_batch in opts.batch:
        batches = build_batches(values, keys, per_batch)
        for batch in batches:  # the same records, the same offsets, both ways
            want_offsets, want_values = read_aiokafka(batch)
            offsets, got = read_columnar_values(batch)
            if offsets.tolist() != want_offsets or got != want_values:
                raise SystemExit("the columnar reader disagrees with aiokafka")
        n = len(values)
        figures = {
            "aiokafka": _best_us(read_aiokafka, batches, n, opts.repeats),
            "CRC check alone": _best_us(crc_only, batches, n, opts.repeats),
            "aiokafka's record objects alone": _best_us(record_objects, batches, n, opts.repeats),
            "record boundaries alone (the Python loop)": _best_us(
                record_starts, batches, n, opts.repeats
            ),
            "columnar": _best_us(read_columnar, batches, n, opts.repeats),
            "columnar + values": _best_us(read_columnar_values, batches, n, opts.repeats),
        }
        out["per_batch"][per_batch] = figures
        print(per_batch, {k: round(v, 3) for k, v in figures.items()}, flush=True)
    print(json.dumps(out))
    if opts.keep:
        RESULTS_FILE.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
