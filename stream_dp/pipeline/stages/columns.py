"""A fetched batch of input records as columns: one decode call per record, the rest per batch.

The per-record path (:meth:`Decoder.decode_parts`, then a loop over the events) checks and
routes each event with a few dozen interpreted steps. Most batches are all good events of
the common form — a JSON object with a string or integer user, an epoch-number or ISO-8601
time, scalar query fields — and for them :func:`decode_columns` checks whole columns at
once (the set of value types in a column, numpy range checks) and hands back the users,
times and query fields as columns. If anything in the batch is not of that form (one bad
record, a value of another type), it returns None and the caller takes the per-record path
for the batch, so results — dead letters and their reasons included — are identical.

:func:`intern_signatures` numbers the batch's signatures (the values of the fields queries
use), and :func:`pseudonym_columns` pseudonymizes each distinct user of the batch once; raw
ids live only in those batch-local tables, never in state.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from stream_dp.pipeline.formats import struct_decode
from stream_dp.pipeline.formats.decode import (
    EPOCH_MS_CUTOFF,
    MAX_USER_ID_CHARS,
    MIN_EVENT_TIME_S,
    Decoder,
    parse_event_time,
)
from stream_dp.pipeline.formats.iso_times import iso_epoch_seconds
from stream_dp.pipeline.formats.struct_decode import orjson_ints
from stream_dp.privacy.group_values import canonical_value
from stream_dp.privacy.pseudonymize import PSEUDONYM_BYTES, Pseudonymizer

_PLAIN_SCALARS = frozenset((str, int, type(None)))
_SCALARS = frozenset((str, int, type(None), bool, float))
_NUMBERS = frozenset((int, float, type(None)))
_TIME_VALUES = frozenset((int, float, str))
_STRINGS = frozenset((str,))


@dataclass(slots=True)
class EventColumns:
    """The events of a batch whose every record is a usable event."""

    #: The batch's distinct raw user ids, first seen first (batch-local only).
    distinct_users: list[str | int]
    #: Each event's user: its position in :attr:`distinct_users`.
    user_index: np.ndarray
    #: Event times, Unix seconds.
    times: np.ndarray
    #: Per field the queries use (in signature order), its values (scalars canonical).
    fields: list[list[Any]]

    @classmethod
    def of_users(
        cls, users: Sequence[str | int], times: np.ndarray, fields: list[list[Any]]
    ) -> EventColumns:
        """Columns from each event's raw user id."""
        return cls(*distinct_index(users), times, fields)

    @property
    def users(self) -> list[str | int]:
        """Each event's raw user id."""
        distinct = self.distinct_users
        return [distinct[i] for i in self.user_index.tolist()]


def decode_columns(
    decoder: Decoder, fields: Sequence[str], values: Sequence[bytes | None], now_s: float
) -> EventColumns | None:
    """The batch as columns, or None if any record needs the per-record path."""
    n = len(values)
    if n == 0:
        return None
    try:
        joined: bytes | None = b"\n".join(values)  # type: ignore[arg-type]
    except TypeError:  # a value is None (a tombstone)
        return None
    longest = struct_decode.longest_line(joined, n)  # type: ignore[arg-type]
    if longest is None:  # a value holds a newline: struct_columns checks the batch itself
        joined = None
        longest = max(map(len, values))  # type: ignore[arg-type]
    if longest > decoder.max_record_bytes:
        return None
    raw = _needed_columns(decoder, fields, values, longest, joined)  # type: ignore[arg-type]
    if raw is None:
        return None
    users, raw_times, field_of = raw
    user_types = set(map(type, users))
    if not user_types <= {str, int}:
        return None
    # Strings and integers: equal only to themselves (no True == 1 or 1.0 == 1 among them),
    # so the distinct ids are each id's value, and the checks of every id are theirs.
    distinct, user_index = distinct_index(users)
    if not orjson_ints(distinct, user_types):
        return None
    if str in user_types:
        lengths = [len(u) for u in distinct if type(u) is str]
        if min(lengths) < 1 or max(lengths) > MAX_USER_ID_CHARS:
            return None
    # An integer time beyond 64 bits (exact from msgspec, a float from orjson) is out of
    # range either way: the batch goes to the per-record path, which refuses it.
    times = _times(raw_times)
    if times is None:
        return None
    if times.min() < MIN_EVENT_TIME_S or times.max() > now_s + decoder.max_future_s:
        return None
    columns: list[list[Any]] = []
    scalar, numeric = set(decoder.scalar_fields), set(decoder.numeric_fields)
    for name in fields:
        column = field_of[name]
        types = set(map(type, column))
        if not orjson_ints(column, types):
            return None
        if name in numeric and not types <= _NUMBERS:
            return None
        if name in scalar:
            if not types <= _SCALARS:
                return None
            if not types <= _PLAIN_SCALARS:
                column = list(map(canonical_value, column))
        columns.append(column)
    return EventColumns(distinct, user_index, times, columns)


def _needed_columns(
    decoder: Decoder,
    fields: Sequence[str],
    values: Sequence[bytes],
    longest: int,
    joined: bytes | None,
) -> tuple[list[Any], list[Any], dict[str, list[Any]]] | None:
    """(users, raw times, each needed field's column) as ``dict.get`` on orjson's objects
    gives them, or None if a record is not a JSON object. msgspec decodes just these fields
    where its guards let it (:mod:`stream_dp.pipeline.formats.struct_decode`), orjson
    the rest."""
    names = tuple(dict.fromkeys((decoder.user_field, decoder.time_field, *fields)))
    columns = struct_decode.struct_columns(names, values, longest, joined)
    if columns is None:
        try:
            objs = list(map(orjson.loads, values))
        except orjson.JSONDecodeError:
            return None
        if set(map(type, objs)) != {dict}:
            return None
        columns = [list(map(operator.methodcaller("get", name), objs)) for name in names]
    field_of = dict(zip(names, columns, strict=True))
    return field_of[decoder.user_field], field_of[decoder.time_field], field_of


def _times(raw: list[Any]) -> np.ndarray | None:
    """Event times in seconds (epoch s/ms numbers, ISO-8601 strings with an offset), or
    None if one is missing or bad."""
    types = set(map(type, raw))
    if not types <= _TIME_VALUES:
        return None
    if types == _STRINGS:  # ISO-8601 text: the whole column at once where it can
        fast = iso_epoch_seconds(raw)
        if fast is not None:
            return fast
    if str in types:
        parsed = [parse_event_time(v) if type(v) is str else v for v in raw]
        if any(type(p) is str for p in parsed):  # "bad"
            return None
        numbers = np.array([type(v) is not str for v in raw])
        t = np.array(parsed, dtype=np.float64)
    else:
        numbers = None
        t = np.array(raw, dtype=np.float64)
    milliseconds = np.abs(t) >= EPOCH_MS_CUTOFF
    if numbers is not None:
        milliseconds &= numbers
    t[milliseconds] /= 1000.0
    return t


def intern_signatures(
    columns: Sequence[Sequence[Any]],
    signature_ids: dict[tuple[Any, ...], int],
    signatures: list[tuple[Any, ...]],
    *,
    n_events: int,
) -> np.ndarray:
    """The id of each of ``n_events`` events' signature (the tuple of its query fields: the
    empty tuple when the queries read no field), interning new ones into the shared table.
    The usual batch (every signature known) is one ``map`` of the table's ``get`` over
    ``zip`` of the columns, which builds the tuples in C."""
    n = n_events
    if not columns:
        return np.full(n, _intern_one((), signature_ids, signatures), dtype=np.int32)
    try:
        return np.fromiter(map(signature_ids.get, zip(*columns, strict=True)), np.int32, n)
    except TypeError:  # a signature not in the table yet (get gave None)
        pass
    sigs = list(zip(*columns, strict=True))
    ids = list(map(signature_ids.get, sigs))
    for i, sid in enumerate(ids):
        if sid is None:  # new: interned in first-seen order (a repeat finds it then)
            ids[i] = _intern_one(sigs[i], signature_ids, signatures)
    return np.array(ids, dtype=np.int32)


def _intern_one(
    signature: tuple[Any, ...],
    signature_ids: dict[tuple[Any, ...], int],
    signatures: list[tuple[Any, ...]],
) -> int:
    sid = signature_ids.get(signature)
    if sid is None:
        sid = signature_ids[signature] = len(signatures)
        signatures.append(signature)
    return sid


def distinct_index(values: Sequence[Any]) -> tuple[list[Any], np.ndarray]:
    """(distinct values in first-seen order, each value's position among them).

    One ``map`` of ``dict.setdefault`` in C gives each value the row of its first
    occurrence; those rows, in first-seen order, are the dict's values, and numbering them
    0, 1, … turns rows into positions."""
    first_rows: dict[Any, int] = {}
    first = np.fromiter(
        map(first_rows.setdefault, values, itertools.count()), np.int64, len(values)
    )
    position = np.empty(len(values), dtype=np.int64)
    position[np.fromiter(first_rows.values(), np.int64, len(first_rows))] = np.arange(
        len(first_rows)
    )
    return list(first_rows), position[first]


def pseudonym_columns(ids: Sequence[bytes], pseudonymizer: Pseudonymizer) -> bytes | None:
    """The pseudonyms of distinct (normalised) ids given as their canonical bytes
    (:func:`~stream_dp.privacy.pseudonymize.canonical_user_ids`), concatenated; None if one
    is empty."""
    out = pseudonymizer.pseudonyms_of_canonical(ids)
    if len(out) != PSEUDONYM_BYTES * len(ids):
        return None
    return out
