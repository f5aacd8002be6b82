"""The fields a batch's events need, decoded by msgspec into a struct of just those fields.

:func:`stream_dp.pipeline.stages.columns.decode_columns` reads a batch's users, times and
query fields as columns. orjson builds each record's whole dict (every field, every
string); a msgspec struct of only the needed fields skips the others, about half the CPU.
Skipping is where the two differ, and the column path's contract is that a batch it
accepts gives exactly what orjson and the per-record path give. So :func:`struct_columns`
answers only for batches where msgspec's columns are orjson's, and None — decode the batch
with orjson — otherwise:

* **not UTF-8** anywhere (msgspec does not check skipped strings): an ASCII batch needs no
  check, any other is decoded strictly (which also refuses encoded surrogates, as orjson);
* **numbers orjson refuses**: one that overflows a float (``1e400``, 400 digits) is an
  error to orjson and skipped unread by msgspec. It has an exponent (a digit then ``e`` or
  ``E``) or 309 digits and more: records with either (found with numpy on the joined
  batch; the digit run only in records of :data:`LONG_RECORD_BYTES` or more) take their
  fields from orjson, which refuses them where it would. A batch with many such records
  (UUIDs and hex ids hold ``3e4``) is left to orjson whole;
* **integers beyond 64 bits** in a needed field: orjson gives a float, msgspec the exact
  int; the caller refuses a column with one (:func:`orjson_ints`). Floats are the same
  from both (correctly rounded; fuzzed with long and halfway decimals);
* **nesting** beyond orjson's depth limit needs a record of 2,048 bytes or more: such
  records take their fields from orjson too;
* **one document per record**: each record is decoded by a msgspec call of its own, which
  refuses an empty or whitespace-only value and one holding more than one document, as
  orjson does. (Decoding the joined batch as lines, once done, read it as documents
  separated by any whitespace: a record of two documents, ``{A} {B}``, next to a blank one
  gave as many documents as records, each in the wrong record. One call per record costs
  about the same.) The joined batch is only scanned. A record holding a newline leaves the
  batch to orjson, as it did when records were the joined batch's lines;
* anything msgspec refuses (bad JSON, a value that is not an object, its own depth limit).

Duplicate keys (the last one counts), escaped keys, lone surrogate escapes (refused),
a byte-order mark (refused) and ``1e-400`` (0.0) are the same in both.
``tests/pipeline/test_columns_msgspec.py`` checks the agreement differentially, with each
known difference as an example.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from typing import Any, Final

import msgspec
import numpy as np
import orjson

#: ``e`` and ``E`` (``| 0x20`` folds the case), and the digits, as bytes.
_LOWER_E: Final = ord("e")
_ZERO: Final = ord("0")
_NEWLINE: Final = ord("\n")
#: A record of this many bytes can hold a number of 300 digits: orjson refuses one of 309
#: or more (it overflows a float), msgspec skips it unread.
LONG_RECORD_BYTES: Final = 300
_DIGITS_AS_ZERO: Final = bytes.maketrans(b"123456789", b"000000000")
_LONG_NUMBER: Final = b"0" * LONG_RECORD_BYTES
#: Shortest record that can nest as deep as orjson's limit (1,024 levels, two bytes each).
DEEP_RECORD_BYTES: Final = 2048
#: A batch with more candidate records than one in this many is decoded by orjson whole.
MAX_CANDIDATE_SHARE: Final = 8
#: orjson's integers: beyond these it gives a float, msgspec an exact int.
_MIN_INT: Final = -(2**63)
_MAX_INT: Final = 2**64 - 1


@functools.lru_cache(maxsize=64)
def _struct_decoder(names: tuple[str, ...]) -> msgspec.json.Decoder[Any]:
    """A decoder of a struct with one field per name (any JSON value, None when missing,
    as ``dict.get``), built once per set of names."""
    attrs = [f"f{i}" for i in range(len(names))]
    struct = msgspec.defstruct(
        "NeededFields",
        [(a, Any, None) for a in attrs],
        rename=dict(zip(attrs, names, strict=True)),
        gc=False,  # holds decoded JSON only: no reference cycles
    )
    return msgspec.json.Decoder(struct)


def longest_line(joined: bytes, n: int) -> int | None:
    """The length of the longest of ``n`` values joined by newlines (``joined``), read from
    where its newlines are; None if a value holds a newline (more than ``n - 1`` of them)."""
    newlines = np.flatnonzero(np.frombuffer(joined, dtype=np.uint8) == _NEWLINE)
    if len(newlines) != n - 1:
        return None
    bounds = np.concatenate(([-1], newlines, [len(joined)]))
    return int(np.diff(bounds).max()) - 1


def struct_columns(
    names: tuple[str, ...], values: Sequence[bytes], longest: int, joined: bytes | None = None
) -> list[list[Any]] | None:
    """Per name (distinct), its column: each record's ``orjson.loads(value).get(name)``,
    except that an integer beyond 64 bits (alone or in a list or object) is exact where
    orjson gives a float — the caller takes scalars only and refuses those
    (:func:`orjson_ints`); or None if the batch must be decoded with orjson (see the
    module doc). ``longest``: the length of the longest value; ``joined``: the values joined
    by newlines, when the caller has them and found no value holding one
    (:func:`longest_line`)."""
    n = len(values)
    if joined is None:
        joined = b"\n".join(values)
        if np.count_nonzero(np.frombuffer(joined, dtype=np.uint8) == _NEWLINE) != n - 1:
            return None
    if not joined.isascii():
        try:
            joined.decode("utf-8")
        except UnicodeDecodeError:
            return None
    candidates = _candidates(joined, values, longest)
    if candidates is None:
        return None
    try:  # one call per record: one document each (never decode_lines, see the module doc)
        structs = list(map(_struct_decoder(names).decode, values))
    except (msgspec.DecodeError, RecursionError, ValueError):
        return None
    columns = [list(map(operator.attrgetter(f"f{i}"), structs)) for i in range(len(names))]
    for i in candidates:
        try:
            obj = orjson.loads(values[i])
        except orjson.JSONDecodeError:
            return None
        if type(obj) is not dict:
            return None
        for column, name in zip(columns, names, strict=True):
            column[i] = obj.get(name)
    return columns


def _candidates(joined: bytes, values: Sequence[bytes], longest: int) -> list[int] | None:
    """The records whose fields must come from orjson, or None if there are too many: those
    with an exponent (a digit then ``e`` or ``E``: ``1e400`` overflows), a run of
    :data:`LONG_RECORD_BYTES` digits, or :data:`DEEP_RECORD_BYTES` bytes."""
    limit = len(values) // MAX_CANDIDATE_SHARE + 1
    chars = np.frombuffer(joined, dtype=np.uint8)
    if b"E" in joined:  # positions of the char before each e or E
        after = np.flatnonzero((chars[1:] | 0x20) == _LOWER_E)
    else:
        after = np.flatnonzero(chars[1:] == _LOWER_E)
    hits = after[(chars[after] - _ZERO) < 10]
    if len(hits) > 4 * limit:
        return None
    at = hits.tolist()
    if longest >= LONG_RECORD_BYTES:
        shape = joined.translate(_DIGITS_AS_ZERO)
        found = shape.find(_LONG_NUMBER)
        while found != -1:
            if len(at) >= 4 * limit:
                return None
            at.append(found)
            found = shape.find(_LONG_NUMBER, found + LONG_RECORD_BYTES)
    records: set[int] = set()
    if at:
        starts = np.cumsum([len(v) + 1 for v in values])
        records.update(np.searchsorted(starts, at, side="right").tolist())
    if longest >= DEEP_RECORD_BYTES:
        records.update(i for i, v in enumerate(values) if len(v) >= DEEP_RECORD_BYTES)
    if len(records) > limit:
        return None
    return sorted(records)


def orjson_ints(column: Sequence[Any], types: set[type[Any]]) -> bool:
    """Whether the integers of a column (its value types given) are all ones orjson decodes
    as integers: within -2**63 .. 2**64 - 1 (beyond, it gives a float and msgspec an int)."""
    if int not in types:
        return True
    ints = column if len(types) == 1 else [v for v in column if type(v) is int]
    return bool(min(ints) >= _MIN_INT and max(ints) <= _MAX_INT)
