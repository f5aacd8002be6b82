"""A partial's totals written as columns: the partials record's ``columns`` member.

Until this format a part carried its totals as one entry per key, ``[[group values],
events, users, value sum, …]`` (the ``totals`` member, still read: records of earlier
versions). Stage 1 made a tuple per key to write them and stage 2 a tuple per key and a
number object per item to read them back: about 1 CPU s per 1,000,000 keys both ways, a
third of a 1,000,000-key window's release. A part now carries the same numbers as columns,
each a JSON array of integers written straight from the int64 arrays the seal made, and the
group keys as one array of arrays::

    "columns": {"groups": [["a.com"], ["b.com"]], "events": [3, 1], "users": [2, 1],
                "value_sums": [0, 0]}

with ``selection_weights`` (``selection: weighted_gaussian``) and ``value_squares``
(``statistic: variance``) only where the query has them, and for ``statistic: quantile``
each key's sparse histogram as ``bins`` (the number of bins), ``bin_sizes`` (per key, how
many nonzero bins it has), ``bin_index`` and ``bin_counts`` (those bins and their counts,
key after key, indices strictly increasing within a key). The record stays JSON:
``stream-dp records`` and a person reading the topic see the same numbers.

``columns`` is the record's last member. Stage 2 reads it in two steps where it can: the
header before it with orjson, the member with a typed msgspec decoder that checks every
type while it parses and gives the group keys as tuples (:func:`columns_partial`; the
argument that the result is orjson's is :mod:`.partials_plain`'s, for this member).
Anything else — booleans or floats among the group values, which take a canonical form, a
record not laid out as stage 1 writes it — is read by orjson and
:func:`decode_columns_member`, which checks the same and refuses with its own message.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Annotated, Any, Final

import msgspec
import numpy as np
import orjson

from stream_dp.pipeline.formats.partials_plain import split_last_member
from stream_dp.privacy.exponential.bin_counts import BinCounts
from stream_dp.privacy.exponential.quantiles import MAX_BINS
from stream_dp.privacy.group_values import canonical_key, json_default
from stream_dp.privacy.key_totals import KeyTotals

#: What stage 1 writes right before a part's columns (its last member).
COLUMNS_MEMBER: Final = b',"columns":'

_NUMBER_COLUMNS: Final = ("events", "users", "value_sums")
_OPTIONAL_COLUMNS: Final = ("selection_weights", "value_squares")
_BIN_COLUMNS: Final = ("bin_sizes", "bin_index", "bin_counts")
_MEMBERS: Final = frozenset(("groups", *_NUMBER_COLUMNS, *_OPTIONAL_COLUMNS, "bins", *_BIN_COLUMNS))
_PLAIN_VALUE_TYPES: Final = frozenset((str, int, type(None)))

_Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
_Ints = list[_Int64]


class _PlainColumns(msgspec.Struct, forbid_unknown_fields=True):
    """The member as stage 1 writes it, with group values that need no canonical form."""

    groups: list[tuple[str | _Int64 | None, ...]]
    events: _Ints
    users: _Ints
    value_sums: _Ints
    selection_weights: _Ints | msgspec.UnsetType = msgspec.UNSET
    value_squares: _Ints | msgspec.UnsetType = msgspec.UNSET
    bins: _Int64 | msgspec.UnsetType = msgspec.UNSET
    bin_sizes: _Ints | msgspec.UnsetType = msgspec.UNSET
    bin_index: _Ints | msgspec.UnsetType = msgspec.UNSET
    bin_counts: _Ints | msgspec.UnsetType = msgspec.UNSET


_PLAIN_DECODER: Final = msgspec.json.Decoder(_PlainColumns)
_DECODE_ERRORS: Final = (msgspec.DecodeError, TypeError, ValueError, OverflowError)


def columns_layout(totals: KeyTotals) -> tuple[bool, bool]:
    """Whether the parts of ``totals`` carry (selection weights, value squares): only a
    query that computes them has any that are not 0."""
    return bool(totals.selection_weights.any()), bool(totals.value_squares.any())


def encode_columns(totals: KeyTotals, lo: int, hi: int, layout: tuple[bool, bool]) -> bytes:
    """The ``columns`` member of keys ``[lo, hi)`` of ``totals``: one orjson call, the
    numbers written from their int64 arrays (no Python object per key)."""
    member: dict[str, Any] = {"groups": totals.groups[lo:hi]}
    for name in _NUMBER_COLUMNS:
        member[name] = getattr(totals, name)[lo:hi]
    weights, squares = layout
    if weights:
        member["selection_weights"] = totals.selection_weights[lo:hi]
    if squares:  # statistic: variance (only then a column of squares)
        member["value_squares"] = totals.value_squares[lo:hi]
    hist = totals.value_bins
    if hist.bins:  # statistic: quantile (only then the histograms' columns)
        starts = hist.starts[lo : hi + 1]
        first, last = int(starts[0]), int(starts[-1])
        member["bins"] = hist.bins
        member["bin_sizes"] = np.diff(starts)
        member["bin_index"] = hist.index[first:last]
        member["bin_counts"] = hist.counts[first:last]
    return orjson.dumps(member, default=json_default, option=orjson.OPT_SERIALIZE_NUMPY)


def columns_partial(value: bytes) -> tuple[dict[str, Any], KeyTotals] | None:
    """(header, totals) of a partials record whose ``columns`` member is its last and
    holds plain group values (see the module docstring), the header holding every other
    member; None to leave the record to orjson and :func:`decode_columns_member`."""
    split = split_last_member(value, COLUMNS_MEMBER)
    if split is None:
        return None
    header, member = split
    try:
        plain = _PLAIN_DECODER.decode(member)
    except _DECODE_ERRORS:
        return None
    try:
        totals = _totals(
            list(plain.groups),
            {
                name: getattr(plain, name)
                for name in (*_NUMBER_COLUMNS, *_OPTIONAL_COLUMNS, "bins", *_BIN_COLUMNS)
                if getattr(plain, name) is not msgspec.UNSET
            },
        )
    except (TypeError, ValueError, OverflowError):
        return None  # refused by the general path, with its own message
    return header, totals


def decode_columns_member(member: Any) -> KeyTotals:
    """A ``columns`` member as orjson read it into the part's totals, group keys in
    canonical form; TypeError or ValueError naming what is wrong."""
    if type(member) is not dict:
        raise TypeError("columns must be an object")
    unknown = set(member) - _MEMBERS
    if unknown:
        raise ValueError(f"unknown columns {sorted(unknown)}")
    groups = member.get("groups")
    if type(groups) is not list or set(map(type, groups)) - {list}:
        raise TypeError("columns.groups must be a list of group keys, each a list")
    keys = canonical_group_keys(groups)
    numbers: dict[str, Any] = {}
    for name, value in member.items():
        if name == "groups":
            continue
        if name == "bins":
            if type(value) is not int:
                raise TypeError("columns.bins must be an integer")
        elif type(value) is not list or set(map(type, value)) - {int}:
            raise TypeError(f"columns.{name} must be a list of integers")
        numbers[name] = value
    return _totals(keys, numbers)


def canonical_group_keys(groups: list[list[Any]]) -> list[tuple[Any, ...]]:
    """A part's group keys, each read as a JSON array, as tuples in canonical form (both
    forms of a part's totals)."""
    if set(map(type, itertools.chain.from_iterable(groups))) <= _PLAIN_VALUE_TYPES:
        return list(map(tuple, groups))  # already canonical
    return list(map(canonical_key, groups))


def check_distinct(keys: list[Any]) -> None:
    """ValueError when a group key appears twice in one part (both forms)."""
    if len(set(keys)) != len(keys):
        raise ValueError("a group key appears twice in one part")


def _totals(keys: list[Any], numbers: dict[str, Any]) -> KeyTotals:
    """The part's totals from its group keys (canonical tuples) and its number members
    (lists of integers, ``bins`` an integer), after the checks both readers share."""
    n = len(keys)
    missing = [name for name in _NUMBER_COLUMNS if name not in numbers]
    if missing:
        raise ValueError(f"columns {missing} missing")
    columns = {}
    for name in (*_NUMBER_COLUMNS, *_OPTIONAL_COLUMNS):
        values = numbers.get(name)
        if values is None:
            continue
        if len(values) != n:
            raise ValueError(f"columns.{name} has {len(values)} items for {n} group keys")
        columns[name] = np.fromiter(values, np.int64, n)
    for name in ("events", "users", *_OPTIONAL_COLUMNS):
        if name in columns and (columns[name] < 0).any():
            raise ValueError(f"columns.{name} holds a negative number")
    check_distinct(keys)
    return KeyTotals(
        keys,
        columns["events"],
        columns["users"],
        columns["value_sums"],
        columns.get("selection_weights"),
        columns.get("value_squares"),
        _histograms(numbers, n),
    )


def _histograms(numbers: dict[str, Any], n: int) -> BinCounts | None:
    """A quantile's sparse histograms from ``bins`` and the three bin columns (all four
    or none)."""
    present = [name for name in ("bins", *_BIN_COLUMNS) if name in numbers]
    if not present:
        return None
    if len(present) != 4:
        raise ValueError("columns.bins, bin_sizes, bin_index and bin_counts go together")
    sizes = np.array(numbers["bin_sizes"], dtype=np.int64)
    if len(sizes) != n or (sizes < 0).any():
        raise ValueError("columns.bin_sizes needs one size of at least 0 per group key")
    return checked_bin_counts(numbers["bins"], sizes, numbers["bin_index"], numbers["bin_counts"])


def checked_bin_counts(
    width: int, sizes: np.ndarray, flat_index: Sequence[int], flat_counts: Sequence[int]
) -> BinCounts:
    """Sparse histograms of ``width`` bins, key i holding ``sizes[i]`` of the entries
    (``flat_index``, ``flat_counts``, key after key), refused unless every index is in
    [0, width) and strictly increasing within its key and every count at least 1."""
    if len(flat_index) != int(sizes.sum()) or len(flat_counts) != len(flat_index):
        raise ValueError("a histogram needs one count per bin index")
    index = np.array(flat_index, dtype=np.int64)
    count = np.array(flat_counts, dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    if not 1 <= width <= MAX_BINS or ((index < 0) | (index >= width)).any():
        raise ValueError(f"a histogram needs 1 to {MAX_BINS} bins and indices below them")
    if (count < 1).any():
        raise ValueError("a histogram lists only bins with a count of at least 1")
    rising = np.diff(index) > 0
    follows = starts[1:-1]  # a row's first index may follow another row's last one
    rising[follows[(sizes[1:] > 0) & (follows > 0)] - 1] = True
    if not rising.all():
        raise ValueError("a histogram's bin indices must be strictly increasing")
    return BinCounts(width, starts, index, count)
