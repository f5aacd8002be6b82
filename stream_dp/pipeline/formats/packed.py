"""Packed records of the repartition topic: many pseudonymized events in one Kafka record.

Stage 0 used to write one repartition record per input event (a JSON object, one producer
``send`` each), which stage 1 then fetched and decoded one by one: that was most of the cost
of input not keyed by user. Now stage 0 writes, per fetched batch of an input partition and
per repartition partition, one *packed* record (more when it would exceed
``kafka.max_message_bytes``) holding only what stage 1 needs, as columns::

    {"kind": "events", "src": [input partition, first offset], "k": key id,
     "c": key check value, "n": events,
     "fields": [query fields], "sig": [[values of one signature], …],
     "u": base64(n × 16-byte pseudonyms), "t": base64(n × float64 event times, little-endian),
     "o": base64(n × uint32 offsets after the first), "s": base64(n × uint32 index into "sig")}

Every event still carries its pseudonym, event time, query fields (through the record's
dictionary of distinct signatures), input offset, key id and key check value (which secret
the key id named: :mod:`stream_dp.pipeline.key_check_gate`): the same as a per-event record,
so stage 1 checks each event's placement, drops re-sent ones and stale keys as before,
with numpy instead of a loop, and never takes a record under another secret (or without a
key check value: a worker from before key checks). No raw id is in it. Per-event records
of earlier versions on the topic are still read (:meth:`IngestStage.ingest`).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any, Final

import numpy as np
import orjson

from stream_dp.pipeline.formats.partials import RECORD_OVERHEAD_BYTES, RecordTooLargeError
from stream_dp.privacy.group_values import canonical_key, json_default
from stream_dp.privacy.pseudonymize import PSEUDONYM_BYTES

PACKED_KIND: Final = "events"
#: Record key of packed records: ``__events__|<input partition>``.
PACKED_KEY_PREFIX: Final = "__events__|"
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


def _b64(array: np.ndarray, dtype: str) -> str:
    return base64.b64encode(np.ascontiguousarray(array, dtype=dtype).tobytes()).decode("ascii")


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
    body = {
        "kind": PACKED_KIND,
        "src": [src_partition, first],
        "k": key[0],
        "c": key[1],
        "n": len(offsets),
        "fields": list(fields),
        "sig": [list(signatures[i]) for i in used.tolist()],
        "u": base64.b64encode(pseudonyms).decode("ascii"),
        "t": _b64(times, "<f8"),
        "o": _b64(offsets - first, "<u4"),
        "s": _b64(local, "<u4"),
    }
    return orjson.dumps(body, default=json_default)


def _column(body: dict[str, Any], name: str, dtype: str, n: int) -> np.ndarray:
    raw = base64.b64decode(body[name], validate=True)
    array = np.frombuffer(raw, dtype=dtype)
    if len(array) != n:
        raise ValueError(f"column {name} holds {len(array)} values, not {n}")
    return array


def decode_events(body: dict[str, Any], fields: Sequence[str]) -> PackedEvents:
    """A packed record's events, with signatures in the order of ``fields`` (fields the
    record does not carry are None); ValueError/TypeError/KeyError if it is malformed."""
    n = body["n"]
    src_partition, first = body["src"]
    if type(n) is not int or n < 1 or type(src_partition) is not int or type(first) is not int:
        raise TypeError("a packed record needs integer n, src partition and first offset")
    if src_partition < 0 or first < 0:
        raise ValueError("negative source position")
    key_id = body["k"]
    key_check = body.get("c", "")  # absent in records of earlier versions
    carried = body["fields"]
    if type(key_id) is not str or type(key_check) is not str or type(carried) is not list:
        raise TypeError("a packed record needs a key id, a key check and its field names")
    pseudonyms = base64.b64decode(body["u"], validate=True)
    if len(pseudonyms) != PSEUDONYM_BYTES * n:
        raise ValueError("pseudonyms do not match the event count")
    times = _column(body, "t", "<f8", n).astype(np.float64)
    if not np.isfinite(times).all():
        raise ValueError("an event time is not finite")
    offsets = _column(body, "o", "<u4", n).astype(np.int64) + first
    index = _column(body, "s", "<u4", n).astype(np.int64)
    where = [carried.index(f) if f in carried else -1 for f in fields]
    signatures = _signatures(body["sig"], len(carried), where)
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
