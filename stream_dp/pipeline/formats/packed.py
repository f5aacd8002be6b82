"""Packed records of the repartition topic: many pseudonymized events in one Kafka record.

Stage 0 used to write one repartition record per input event (a JSON object, one producer
``send`` each), which stage 1 then fetched and decoded one by one: that was most of the cost
of input not keyed by user. Now stage 0 writes, per fetched batch of an input partition and
per repartition partition, one *packed* record (more when it would exceed
``kafka.max_message_bytes``) holding only what stage 1 needs, as columns, in binary
(all integers little-endian; ``n`` events)::

    offset       bytes  what
    0            1      0xB7: a binary packed record (no JSON text starts with it)
    1            1      format version: 1
    2            2      reserved: 0
    4            4      n: events (uint32, at least 1)
    8            4      input partition (uint32)
    12           4      m: bytes of the metadata at the end (uint32)
    16           8      first input offset (int64, at least 0)
    24           8n     event times: float64 Unix seconds
    24 + 8n      16n    pseudonyms: 16 bytes each
    24 + 24n     4n     input offsets after the first (uint32, added to it)
    24 + 28n     4n     per event, its index into "sig" (uint32)
    24 + 32n     m      metadata, JSON: {"k": key id, "c": key check value,
                        "fields": [query fields], "sig": [[values of one signature], …]}

and the record is exactly ``24 + 32n + m`` bytes. The columns are the arrays' own bytes, so
stage 0 copies them and stage 1 reads them with ``np.frombuffer``: versions before this one
wrote the same record as JSON with the columns in base64 (``{"kind": "events", "src": [input
partition, first offset], "k", "c", "n", "fields", "sig", "u", "t", "o", "s"}``), whose
base64 was 5-6% of the worker's profile samples on the default path (issue 43's stream;
``python -m bench.ingest_cpu`` measures both stages: ``default``, ``repartitioned``).
Stage 1 reads both (:func:`decode_binary`, :func:`decode_events`): such records stay on the
topic after an upgrade. A worker of an earlier version cannot read a binary record (it
dead-letters it as ``bad_internal_record``): docs/operations.md says to stop every older
worker before the first worker of this version starts.

Every event still carries its pseudonym, event time, query fields (through the record's
dictionary of distinct signatures), input offset, key id and key check value (which secret
the key id named: :mod:`stream_dp.pipeline.key_check_gate`): the same as a per-event record,
so stage 1 checks each event's placement, drops re-sent ones and stale keys as before,
with numpy instead of a loop, and never takes a record under another secret (or without a
key check value: a worker from before key checks). No raw id is in it. A record that breaks
the layout (cut short, longer than its header says, another version, a column or its
metadata wrong) is refused by the reader, which stage 1 dead-letters as any malformed
record of the topic. Per-event records of earlier versions on the topic are still read
(:meth:`IngestStage.ingest`).
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any, Final, TypeGuard

import numpy as np
import orjson

from stream_dp.pipeline.formats.partials import RECORD_OVERHEAD_BYTES, RecordTooLargeError
from stream_dp.privacy.group_values import canonical_key, json_default
from stream_dp.privacy.pseudonymize import PSEUDONYM_BYTES

PACKED_KIND: Final = "events"
#: Record key of packed records: ``__events__|<input partition>``.
PACKED_KEY_PREFIX: Final = "__events__|"
#: First byte of a binary packed record: no JSON text starts with it (a JSON packed record of
#: earlier versions starts with ``{``), and it is not valid UTF-8 on its own.
PACKED_MAGIC: Final = 0xB7
PACKED_VERSION: Final = 1
_MAGIC_BYTE: Final = bytes((PACKED_MAGIC,))
#: magic, version, reserved (0), n, input partition, metadata bytes, first offset.
_HEADER: Final = struct.Struct("<BBHIIIq")
#: Column bytes per event: time (8), pseudonym (16), offset delta (4), signature index (4).
_COLUMN_BYTES: Final = 8 + PSEUDONYM_BYTES + 4 + 4
_MAX_DELTA = 2**32 - 1
_LIST: Final = frozenset((list,))
#: Decoded JSON values that are their own canonical form (canonical_value is the identity).
_CANONICAL_SCALARS: Final = frozenset((str, int, type(None)))


@dataclass(slots=True)
class PackedEvents:
    """The events of one packed record, as columns."""

    src_partition: int
    #: Input offsets (int64).
    offsets: np.ndarray
    key_id: str
    fields: list[str]
    #: Distinct signatures (canonical values, in ``fields`` order).
    signatures: list[tuple[Any, ...]]
    #: Concatenated pseudonyms (16 bytes each).
    pseudonyms: bytes
    #: Event times in seconds (float64).
    times: np.ndarray
    #: Per event, its index into ``signatures``.
    signature_index: np.ndarray
    #: The check value of the pseudonym key (``""``: a record from before key checks).
    key_check: str = ""

    def __len__(self) -> int:
        return len(self.offsets)


def encode_events(
    *,
    src_partition: int,
    offsets: np.ndarray,
    key_id: str,
    fields: Sequence[str],
    pseudonyms: bytes,
    times: np.ndarray,
    signatures: Sequence[tuple[Any, ...]],
    signature_index: np.ndarray,
    max_bytes: int,
    key_check: str,
) -> list[bytes]:
    """The packed records of these events (in order), each under ``max_bytes``."""
    n = len(offsets)
    if n == 0:
        return []
    budget = max_bytes - RECORD_OVERHEAD_BYTES
    out: list[bytes] = []
    pending = [(0, n)]
    while pending:
        lo, hi = pending.pop()
        value = _encode_slice(
            src_partition,
            offsets[lo:hi],
            (key_id, key_check),
            fields,
            pseudonyms[lo * PSEUDONYM_BYTES : hi * PSEUDONYM_BYTES],
            times[lo:hi],
            signatures,
            signature_index[lo:hi],
        )
        span = int(offsets[hi - 1] - offsets[lo])
        if len(value) <= budget and span <= _MAX_DELTA:
            out.append(value)
        elif hi - lo == 1:
            raise RecordTooLargeError(
                f"one repartitioned event needs {len(value)} bytes, more than fit in one record "
                "of kafka.max_message_bytes; raise it (and the brokers' message.max.bytes) or "
                "lower input.max_record_bytes"
            )
        else:
            mid = (lo + hi) // 2
            pending += [(mid, hi), (lo, mid)]
    return out


def _encode_slice(
    src_partition: int,
    offsets: np.ndarray,
    key: tuple[str, str],
    fields: Sequence[str],
    pseudonyms: bytes,
    times: np.ndarray,
    signatures: Sequence[tuple[Any, ...]],
    signature_index: np.ndarray,
) -> bytes:
    # The signatures these events use (ascending), and each event's index among them: as
    # np.unique(signature_index, return_inverse=True), by marking instead of sorting.
    marked = np.zeros(len(signatures), dtype=bool)
    marked[signature_index] = True
    used = np.flatnonzero(marked)
    local = (np.cumsum(marked) - 1)[signature_index]
    first = int(offsets[0])
    meta = orjson.dumps(
        {
            "k": key[0],
            "c": key[1],
            "fields": list(fields),
            "sig": [list(signatures[i]) for i in used.tolist()],
        },
        default=json_default,
    )
    header = _HEADER.pack(
        PACKED_MAGIC, PACKED_VERSION, 0, len(offsets), src_partition, len(meta), first
    )
    return b"".join(
        (
            header,
            np.ascontiguousarray(times, dtype="<f8").tobytes(),
            pseudonyms,
            np.ascontiguousarray(offsets - first, dtype="<u4").tobytes(),
            np.ascontiguousarray(local, dtype="<u4").tobytes(),
            meta,
        )
    )


def is_binary(value: bytes | None) -> TypeGuard[bytes]:
    """Whether a repartition record's value is a binary packed record (its first byte)."""
    return value is not None and value[:1] == _MAGIC_BYTE


def decode_binary(value: bytes, fields: Sequence[str]) -> PackedEvents:
    """A binary packed record's events (see the module docstring for its layout), with
    signatures in the order of ``fields``; ValueError/TypeError/KeyError if it is malformed
    (truncated, extended, another version, a column or its metadata wrong)."""
    try:
        magic, version, reserved, n, src_partition, meta_bytes, first = _HEADER.unpack_from(value)
    except struct.error:
        raise ValueError("a binary packed record shorter than its header") from None
    if magic != PACKED_MAGIC or version != PACKED_VERSION or reserved != 0:
        raise ValueError(f"a binary packed record of another version ({magic}, {version})")
    at = _HEADER.size
    columns_end = at + _COLUMN_BYTES * n
    if len(value) != columns_end + meta_bytes:
        raise ValueError("a binary packed record's length is not the one its header states")
    view = memoryview(value)
    meta = orjson.loads(view[columns_end:])
    if type(meta) is not dict:
        raise TypeError("a binary packed record's metadata is not an object")
    t_end = at + 8 * n
    u_end = t_end + PSEUDONYM_BYTES * n
    o_end = u_end + 4 * n
    return _events(
        (n, src_partition, first),
        (meta["k"], meta["c"]),
        meta["fields"],
        meta["sig"],
        fields,
        (value[t_end:u_end], view[at:t_end], view[u_end:o_end], view[o_end:columns_end]),
    )


def _column(raw: Any, name: str, dtype: str, n: int) -> np.ndarray:
    array = np.frombuffer(raw, dtype=dtype)
    if len(array) != n:
        raise ValueError(f"column {name} holds {len(array)} values, not {n}")
    return array


def decode_events(body: dict[str, Any], fields: Sequence[str]) -> PackedEvents:
    """A JSON packed record's events (written by earlier versions), with signatures in the
    order of ``fields`` (fields the record does not carry are None); ValueError/TypeError/
    KeyError if it is malformed."""
    src_partition, first = body["src"]
    columns = tuple(base64.b64decode(body[name], validate=True) for name in ("u", "t", "o", "s"))
    return _events(
        (body["n"], src_partition, first),
        (body["k"], body.get("c", "")),  # no "c" in records of versions before key checks
        body["fields"],
        body["sig"],
        fields,
        columns,  # type: ignore[arg-type]
    )


def _events(
    place: tuple[Any, Any, Any],
    key: tuple[Any, Any],
    carried: Any,
    listed: Any,
    fields: Sequence[str],
    columns: tuple[bytes, Any, Any, Any],
) -> PackedEvents:
    """A packed record's events, checked the same for either format: ``place`` is its event
    count, input partition and first offset, ``key`` its key id and check value, ``carried``
    its field names, ``listed`` its signature dictionary, ``columns`` the pseudonyms and the
    buffers of its times, offset deltas and signature indexes."""
    n, src_partition, first = place
    if type(n) is not int or n < 1 or type(src_partition) is not int or type(first) is not int:
        raise TypeError("a packed record needs integer n, src partition and first offset")
    if src_partition < 0 or first < 0:
        raise ValueError("negative source position")
    key_id, key_check = key
    if type(key_id) is not str or type(key_check) is not str or type(carried) is not list:
        raise TypeError("a packed record needs a key id, a key check and its field names")
    pseudonyms, raw_times, raw_offsets, raw_index = columns
    if len(pseudonyms) != PSEUDONYM_BYTES * n:
        raise ValueError("pseudonyms do not match the event count")
    times = _column(raw_times, "t", "<f8", n).astype(np.float64)
    if not np.isfinite(times).all():
        raise ValueError("an event time is not finite")
    offsets = _column(raw_offsets, "o", "<u4", n).astype(np.int64) + first
    index = _column(raw_index, "s", "<u4", n).astype(np.int64)
    where = [carried.index(f) if f in carried else -1 for f in fields]
    signatures = _signatures(listed, len(carried), where)
    if n and (index.max() >= len(signatures)):
        raise ValueError("a signature index is out of range")
    return PackedEvents(
        src_partition=src_partition,
        offsets=offsets,
        key_id=key_id,
        fields=list(carried),
        signatures=signatures,
        pseudonyms=pseudonyms,
        times=times,
        signature_index=index,
        key_check=key_check,
    )


def _signatures(listed: Any, width: int, where: list[int]) -> list[tuple[Any, ...]]:
    """The record's dictionary of signatures, each in canonical form and reordered to
    ``where`` (per wanted field, its position among the record's, -1 if absent).

    Strings, integers and nulls are canonical as they are: a dictionary of only those
    (the common case) is checked and converted per column type, not value by value."""
    if (
        type(listed) is list
        and set(map(type, listed)) <= _LIST
        and set(map(len, listed)) <= {width}
        and set(map(type, chain.from_iterable(listed))) <= _CANONICAL_SCALARS
    ):
        if where == list(range(width)):
            return list(map(tuple, listed))
        return [tuple(None if i < 0 else entry[i] for i in where) for entry in listed]
    signatures = []
    for entry in listed:
        if type(entry) is not list or len(entry) != width:
            raise TypeError("a signature must list one value per field")
        if any(isinstance(v, list | dict) for v in entry):
            raise TypeError("signature values are scalars")
        signatures.append(canonical_key(None if i < 0 else entry[i] for i in where))
    return signatures
