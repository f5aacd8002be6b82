"""The records stream-dp writes: output releases and window summaries, dead letters, ledger.

Every value is canonical JSON (sorted keys, orjson), so the same record is always the same
bytes: a duplicate after a crash is byte-identical and consumers can deduplicate by key.
JSON Schemas of all of them live in ``topics/``.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from itertools import repeat
from operator import itemgetter
from typing import Any, Final, NamedTuple

import numpy as np
import orjson

from stream_dp.privacy.continual.planning import ContinualPlan
from stream_dp.privacy.group_values import json_value
from stream_dp.privacy.release import GroupKey, ReleasedValue, ReleasedValues
from stream_dp.privacy.statistics import stated_mechanism, statistic_of
from stream_dp.windows.horizon import HorizonPosition
from stream_dp.windows.tumbling import iso_utc

SCHEMA_VERSION: Final = 1
#: The headers on every output record (Kafka headers: name, bytes): the value's media type and
#: its ``schema_version``, so a consumer in any language can route a record, or refuse a
#: version it does not know, before parsing it (docs/topics.md, "The output contract").
CONTENT_TYPE_HEADER: Final = "content-type"
SCHEMA_VERSION_HEADER: Final = "stream-dp-schema-version"
OUTPUT_HEADERS: Final[tuple[tuple[str, bytes], ...]] = (
    (CONTENT_TYPE_HEADER, b"application/json"),
    (SCHEMA_VERSION_HEADER, str(SCHEMA_VERSION).encode()),
)
WINDOW_GROUP: Final = "#window"

#: A column of :meth:`ReleaseTemplate._formats`: fields as JSON bytes, or integers (Python
#: integers, or an int64 array as the values were drawn) whose JSON is made when written.
Column = list[bytes] | list[int] | np.ndarray


def dumps(value: Mapping[str, Any]) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def canonical_group(group: Mapping[str, Any]) -> str:
    return dumps(group).decode("utf-8")


def output_partition(query: str, window_start_s: int, partitions: int) -> int:
    """The output partition of every record of one (query, window): a plain consumer of one
    partition sees a window's releases, then its window record, in that order — republished
    copies land there too. CRC-32 of ``<query>|<window_start>``, stable across versions."""
    return zlib.crc32(f"{query}|{iso_utc(window_start_s)}".encode()) % partitions


def output_key(query: str, window_start_s: int, group: Mapping[str, Any] | None) -> str:
    """``<query>|<window_start>|<group as canonical JSON>``; the window summary uses ``#window``."""
    tail = WINDOW_GROUP if group is None else canonical_group(group)
    return f"{query}|{iso_utc(window_start_s)}|{tail}"


def statistic_fields(statistic: str, mechanism: str) -> dict[str, Any]:
    """The ``mechanism`` a release record of ``statistic`` names (its own mechanism, for a
    quantile ``exponential``; else the query's ``mechanism``) and, when its ``noise_scale``
    and ``ci95`` are not in the value's units, their unit as ``ci95_unit`` (a quantile's
    ``ranks``). The records of the other statistics have no ``ci95_unit``."""
    unit = statistic_of(statistic).error_unit
    fields: dict[str, Any] = {"mechanism": stated_mechanism(statistic, mechanism)}
    if unit is not None:
        fields["ci95_unit"] = unit
    return fields


def release_record(
    *,
    release_id: str,
    query: str,
    window_start_s: int,
    window_end_s: int,
    group: Mapping[str, Any],
    statistic: str,
    value: int | float,
    epsilon: float,
    delta: float,
    mechanism: str,
    noise_scale: float,
    ci95: float,
    selection: Mapping[str, Any] | None,
    clamped: bool,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One release record; ``extra`` adds fields (e.g. :func:`cumulative_release_fields`).
    ``mechanism``: the query's; the record names the statistic's own when it has one
    (:func:`statistic_fields`)."""
    record: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "kind": "release",
        "release_id": release_id,
        "query": query,
        "window_start": iso_utc(window_start_s),
        "window_end": iso_utc(window_end_s),
        "group": dict(group),
        "statistic": statistic,
        "value": value,
        "epsilon": epsilon,
        "delta": delta,
        **statistic_fields(statistic, mechanism),
        "noise_scale": noise_scale,
        "ci95": ci95,
        "selection": None if selection is None else dict(selection),
    }
    if clamped:
        record["clamped"] = True
    if extra:
        record.update(extra)
    return record


def release_records(
    *,
    release_id: str,
    query: str,
    window_start_s: int,
    window_end_s: int,
    group_by: Sequence[str],
    statistic: str,
    epsilon: float,
    delta: float,
    mechanism: str,
    selection: Mapping[str, Any] | None,
    values: Sequence[ReleasedValue],
) -> list[tuple[str, dict[str, Any]]]:
    """(:func:`output_key`, :func:`release_record`) of every released value of one query and
    window — the same keys and records, built from one :class:`ReleaseTemplate`."""
    template = ReleaseTemplate(
        release_id=release_id,
        query=query,
        window_start_s=window_start_s,
        window_end_s=window_end_s,
        group_by=group_by,
        statistic=statistic,
        epsilon=epsilon,
        delta=delta,
        mechanism=mechanism,
        selection=selection,
    )
    keys, _ = template.encode(values)
    return [(key, template.record(v)) for key, v in zip(keys, values, strict=True)]


class ColumnKinds(NamedTuple):
    """What a release's columns hold, found once over all its keys (:meth:`of`) and given
    with each chunk encoded from them (the ledger's entry sizes and parts, the output
    records: three passes over 1,000,000 keys), so that no chunk checks its keys' and
    values' types again: a chunk holds what the whole release does."""

    #: One group field, each value a string (its JSON made by :func:`escaped_strings`).
    strings: bool
    #: ... and JSON escapes nothing in them (printable ASCII without ``"`` or ``\\``): each
    #: field's JSON is its UTF-8 bytes, in a key's JSON once more too.
    plain: bool
    #: Every value a Python ``int`` (not a bool).
    integers: bool

    @classmethod
    def of(cls, group_by: Sequence[str], cols: ReleasedValues) -> ColumnKinds:
        strings = plain = False
        if not cols.groups:  # as the checks below find for no values
            return cls(len(group_by) == 1, len(group_by) == 1, False)
        if len(group_by) == 1:
            try:  # a value that is not a string stops the join: the types checked in it
                joined = "".join(map(itemgetter(0), cols.groups))
                strings = True
            except TypeError:
                pass
        if strings and joined.isascii():  # then printable and no " or \\: delete them all
            plain = not joined.encode("ascii").translate(None, _PLAIN_ASCII)
        return cls(strings, plain, _integers(cols.held_values))


#: The characters JSON writes as themselves in a string: printable ASCII but ``"`` and ``\\``.
_PLAIN_ASCII: Final = bytes(c for c in range(0x20, 0x7F) if c not in b'"\\')


class ReleaseTemplate:
    """What the release records of one query and window share, to build each from.

    A window may release 1,000,000 keys. :meth:`encode` gives every key's output key and
    value bytes (:func:`dumps` of :meth:`record`, byte for byte) without a Python object per
    field: the constant parts are encoded once, the numbers of every key in one orjson call
    per field, the group values in one call when they are strings. :meth:`record` builds a
    record's fields as a dict, for the readers that want them (the worker does not)."""

    __slots__ = ("_fields", "_group_by", "_marked", "_prefix", "_selection")

    def __init__(
        self,
        *,
        release_id: str,
        query: str,
        window_start_s: int,
        window_end_s: int,
        group_by: Sequence[str],
        statistic: str,
        epsilon: float,
        delta: float,
        mechanism: str,
        selection: Mapping[str, Any] | None,
    ) -> None:
        start, end = iso_utc(window_start_s), iso_utc(window_end_s)
        self._fields: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "kind": "release",
            "release_id": release_id,
            "query": query,
            "window_start": start,
            "window_end": end,
            "statistic": statistic,
            "epsilon": epsilon,
            "delta": delta,
            **statistic_fields(statistic, mechanism),  # the query's, or the statistic's own
            "selection": None,
        }
        self._selection = None if selection is None else dict(selection)
        self._group_by = list(group_by)
        self._prefix = f"{query}|{start}|"
        self._marked = _marked_templates({**self._fields, "selection": self._selection})

    def record(self, v: ReleasedValue) -> dict[str, Any]:
        """The record of one released value (as :func:`release_record` builds it)."""
        record = self._fields.copy()
        record["group"] = group_dict(self._group_by, v.group)
        record["value"] = v.value
        record["noise_scale"] = v.noise_scale
        record["ci95"] = v.ci95
        if self._selection is not None:
            record["selection"] = dict(self._selection)
        if v.clamped:
            record["clamped"] = True
        return record

    def key(self, v: ReleasedValue) -> str:
        """The :func:`output_key` of one released value (as :meth:`encode` gives it)."""
        return self._prefix + canonical_group(group_dict(self._group_by, v.group))

    def kinds(self, values: Sequence[ReleasedValue]) -> ColumnKinds:
        """What the values' columns hold (:class:`ColumnKinds`), for their chunks."""
        return ColumnKinds.of(self._group_by, ReleasedValues.of(values))

    def encode(
        self, values: Sequence[ReleasedValue], kinds: ColumnKinds | None = None
    ) -> tuple[list[str], list[bytes]]:
        """Each value's :func:`output_key` and record bytes, in order. From the columns
        (:class:`ReleasedValues`): the constant fields (and a one-field group's JSON around
        its value) written into the record's template once, then per key one ``join`` of
        its constant pieces and the fields that vary, in a C-level ``map``
        (:func:`_records`); the keys in one ``join`` over all, cut apart at newlines (a
        group's JSON from orjson has none). ``kinds``: what the columns hold, when known
        for the whole release (:class:`ColumnKinds`); else found from these values."""
        cols = ReleasedValues.of(values)
        n = len(cols.groups)
        if self._marked is None or n == 0:
            groups = self._encoded_groups(cols.groups)
            keys = list(map(self._prefix.__add__, map(bytes.decode, groups)))
            if self._marked is None:
                return keys, [dumps(self.record(v)) for v in cols]
            return keys, []
        group_slot, group_fields, varying, templates = self._formats(cols, kinds)
        records = _records(templates, cols.clamped, varying)
        return self._keys(group_slot, group_fields), records

    def encode_escaped(
        self, values: Sequence[ReleasedValue], kinds: ColumnKinds | None = None
    ) -> tuple[list[bytes], list[bytes]]:
        """Each value's output key as JSON without its quotes (:func:`escaped_strings` of
        :meth:`encode`'s keys, what a ledger part holds) and its record bytes. With one
        string group field the key's JSON is made from the field itself: the key with an
        empty field, escaped once, around the field with a backslash before each quote or
        backslash (the field is JSON already: it holds no other character JSON escapes)."""
        cols = ReleasedValues.of(values)
        made = self._formats(cols, kinds) if self._marked is not None and cols.groups else None
        fmt = None if made is None else self._key_format(made[0])
        if made is None or fmt is None:
            keys, records = self.encode(cols, kinds)
            return escaped_strings(keys), records
        _, group_fields, varying, templates = made
        records = _records(templates, cols.clamped, varying)
        return list(map(fmt.__mod__, _escaped_again(group_fields))), records

    def entry_formats(
        self, values: Sequence[ReleasedValue], entry: bytes, kinds: ColumnKinds | None = None
    ) -> tuple[tuple[bytes, ...], list[bool], list[list[bytes]]] | None:
        """The ledger entries of the values (``entry``, a ``bytes %`` format of the key's
        JSON without quotes and the record: ``{"key":"%b","value":%b}``) as formats to
        fill, without and with ``clamped``, each key's choice of them and the fields that
        fill them, a column per slot: the key's group field escaped once more
        (:meth:`encode_escaped`), then the record's varying fields. A ledger part is then
        one ``join`` over all its entries' pieces, with no bytes object made per key or
        record. None where :meth:`encode_escaped` escapes each key itself."""
        cols = ReleasedValues.of(values)
        kinds = kinds or self.kinds(cols)
        made = self._formats(cols, kinds) if self._marked is not None and cols.groups else None
        fmt = None if made is None else self._key_format(made[0])
        if made is None or fmt is None:
            return None
        _, group_fields, varying, templates = made
        entries = tuple(entry % (fmt, template) for template in _used(templates, cols.clamped))
        again = group_fields if kinds.plain else _escaped_again(group_fields)
        return entries, cols.clamped, [again, *map(_as_bytes, varying)]

    def _key_format(self, group_slot: bytes) -> bytes | None:
        """With one string group field, the ``bytes %`` format of a key's JSON without
        its quotes around its group field escaped once more (:meth:`encode_escaped`): the
        key with an empty field, escaped once; else None."""
        empty = orjson.dumps((self._prefix.encode() + group_slot % (b"",)).decode())[1:-1]
        if not group_slot.endswith(b'"%b"}') or not empty.endswith(b'\\"}'):
            return None
        return empty[:-3].replace(b"%", b"%%") + b'%b\\"}'

    def entry_sizes(
        self, values: Sequence[ReleasedValue], kinds: ColumnKinds | None = None
    ) -> np.ndarray:
        """Per value, the bytes of its output key's JSON without its quotes
        (:func:`escaped_strings`) plus those of its record (:meth:`encode`), without making
        either: what cuts a release's ledger parts. The record is its template's bytes
        plus the fields that vary; the key's JSON, that of the key with an empty group
        field plus the field's bytes and one backslash per quote or backslash in them
        (a JSON escape is made character by character, and a field — itself JSON — holds
        no other character that JSON escapes)."""
        cols = ReleasedValues.of(values)
        n = len(cols.groups)
        if self._marked is None or n == 0:
            keys, records = self.encode(cols, kinds)
            sizes = np.fromiter(map(len, escaped_strings(keys)), np.int64, n)
            return sizes + np.fromiter(map(len, records), np.int64, n)
        kinds = kinds or self.kinds(cols)
        plain = self._plain_strings(cols, kinds)
        if plain is not None:
            return self._plain_sizes(cols, plain)
        group_slot, group_fields, varying, templates = self._formats(cols, kinds)
        empty_key = (self._prefix.encode() + group_slot % (b"",)).decode()
        key_base = len(orjson.dumps(empty_key)) - 2
        bases = np.array([len(t % ((b"",) * len(varying))) + key_base for t in templates])
        sizes = _chosen(bases, cols.clamped)
        for column in (group_fields, *varying):  # the group field: in the key and the record
            if _is_integers(column):
                sizes += decimal_lengths(_int64(column))
            else:
                sizes += np.fromiter(map(len, column), np.int64, n)
        joined = b"".join(group_fields)
        for escaped in (b'"', b"\\"):
            if escaped in joined:
                sizes += np.fromiter(map(bytes.count, group_fields, repeat(escaped)), np.int64, n)
        return sizes

    def _plain_strings(self, cols: ReleasedValues, kinds: ColumnKinds) -> list[str] | None:
        """The group values, when the sizes can be had from them alone: one string group
        field whose values JSON escapes nothing (:attr:`ColumnKinds.plain`), integer
        values and one noise scale and interval for every key."""
        if not (kinds.plain and kinds.integers) or isinstance(cols.noise_scale, list):
            return None
        if isinstance(cols.ci95, list):
            return None
        return list(map(itemgetter(0), cols.groups))

    def _plain_sizes(self, cols: ReleasedValues, plain: list[str]) -> np.ndarray:
        """:meth:`entry_sizes` from the columns alone (:meth:`_plain_strings`): each
        template's bytes around empty fields, twice each group value's length (in the
        key and the record) and the values' decimal digits; no field encoded."""
        n = len(plain)
        one = ReleasedValues([("",)], [0], cols.noise_scale, cols.ci95, [False])
        group_slot, _, varying, templates = self._formats(one, ColumnKinds(True, True, True))
        empty_key = (self._prefix.encode() + group_slot % (b"",)).decode()
        key_base = len(orjson.dumps(empty_key)) - 2
        bases = np.array([len(t % ((b"",) * len(varying))) + key_base for t in templates])
        sizes = _chosen(bases, cols.clamped)
        sizes += 2 * np.fromiter(map(len, plain), np.int64, n)
        sizes += decimal_lengths(_int64(cols.held_values))
        return sizes

    def _formats(
        self, cols: ReleasedValues, kinds: ColumnKinds | None = None
    ) -> tuple[bytes, list[bytes], list[Column], tuple[bytes, ...]]:
        """The group slot's format and fields, the varying fields' columns in slot order
        and the record's ``bytes %`` formats (without and with ``clamped``). A value
        column of integers stays one, as held (an int64 array or Python integers:
        :func:`_as_bytes` makes its JSON where it is written; the ledger's cut only
        measures it, :func:`decimal_lengths`), any other column's fields are bytes."""
        assert self._marked is not None
        kinds = kinds or self.kinds(cols)
        group_slot, group_fields = self._group_fields(cols.groups, kinds)
        slots = {"group": group_slot, "value": b"%b"}
        columns: dict[str, Column] = {"group": group_fields}
        if kinds.integers:  # its JSON made when written (_as_bytes), or only measured
            columns["value"] = cols.held_values  # type: ignore[assignment]
        else:
            columns["value"] = _encoded_numbers(cols.value)
        for name, column in (("ci95", cols.ci95), ("noise_scale", cols.noise_scale)):
            if isinstance(column, list):
                slots[name] = b"%b"
                columns[name] = _encoded_numbers(column)
            else:
                slots[name] = _encoded_numbers([column])[0]  # a number's JSON has no %
        varying = [columns[f] for f in _SLOTS if f in columns]
        templates = tuple(_filled(marked, slots) for marked in self._marked)
        return group_slot, group_fields, varying, templates

    def _encoded_groups(self, groups: list[GroupKey]) -> list[bytes]:
        """Each group as canonical JSON (:func:`canonical_group`'s bytes)."""
        if len(self._group_by) != 1:
            return [dumps(group_dict(self._group_by, g)) for g in groups]
        # {"<field>": <value>}: one field, so no key order to sort
        head = b"{" + orjson.dumps(self._group_by[0]) + b":"
        plain = [g[0] for g in groups]
        if set(map(type, plain)) <= {str}:
            return list(map((head.replace(b"%", b"%%") + b"%b}").__mod__, encoded_strings(plain)))
        return [head + orjson.dumps(json_value(x)) + b"}" for x in plain]

    def _group_fields(
        self, groups: list[GroupKey], kinds: ColumnKinds
    ) -> tuple[bytes, list[bytes]]:
        """The group slot's ``bytes %`` format and its field per key: with one string
        field ``{"<field>":"%b"}`` and each value's escaped JSON (its UTF-8 bytes when
        :attr:`ColumnKinds.plain`), else the group's JSON."""
        if kinds.strings:
            head = b"{" + orjson.dumps(self._group_by[0]) + b':"'
            if not kinds.plain:
                fields = escaped_strings(list(map(itemgetter(0), groups)))
            else:  # each its ASCII bytes (faster than one encode of them all, cut)
                fields = list(map(str.encode, map(itemgetter(0), groups)))
            return head.replace(b"%", b"%%") + b'%b"}', fields
        return b"%b", self._encoded_groups(groups)

    def _keys(self, group_slot: bytes, group_fields: list[bytes]) -> list[str]:
        """Each key's :func:`output_key` from its group's field: one ``join`` of the fields
        around the key's constant pieces, cut at newlines (a group's JSON has none)."""
        prefix = self._prefix.encode()
        if b"\n" in prefix:  # a query name holding a newline: one key at a time
            return [(prefix + group_slot % (f,)).decode() for f in group_fields]
        if not group_fields:
            return []
        head, tail = format_pieces(group_slot)
        head = prefix + head
        return (head + (tail + b"\n" + head).join(group_fields) + tail).decode().split("\n")


def _chosen(bases: np.ndarray, clamped: list[bool]) -> np.ndarray:
    """Per key its template's size: ``bases[clamped]`` (the first for all when none is)."""
    if not any(clamped):
        return np.full(len(clamped), bases[0], dtype=np.int64)
    chosen: np.ndarray = bases[np.fromiter(clamped, np.int64, len(clamped))]
    return chosen


def _integers(numbers: list[Any] | np.ndarray) -> bool:
    """Whether every number is an integer: an int64 array's (:class:`ReleasedValues`
    holds no other), or a Python ``int`` each (not a bool, whose JSON is a word)."""
    if isinstance(numbers, np.ndarray):
        return numbers.size > 0
    return bool(numbers) and set(map(type, numbers)) == {int}


def _is_integers(column: Column) -> bool:
    """Whether a column of :meth:`ReleaseTemplate._formats` holds integers, not JSON."""
    if isinstance(column, np.ndarray):
        return True
    return bool(column) and type(column[0]) is int


def _int64(column: list[Any] | np.ndarray) -> np.ndarray:
    """Integers as an int64 array (an array as it is)."""
    if isinstance(column, np.ndarray):
        return column
    return np.fromiter(column, np.int64, len(column))


def _as_bytes(column: Column) -> list[bytes]:
    """A column's fields as JSON bytes (integers encoded, from one orjson call)."""
    return _encoded_numbers(column) if _is_integers(column) else column  # type: ignore[return-value]


_POWERS_OF_TEN: Final = np.array([10**k for k in range(1, 20)], dtype=np.uint64)


def decimal_lengths(values: np.ndarray) -> np.ndarray:
    """The length of each int64's decimal digits with its minus sign (``len(str(v))``)."""
    negative = values < 0
    magnitude = values.astype(np.uint64)
    magnitude[negative] = (~values[negative]).astype(np.uint64) + np.uint64(1)  # |−2⁶³| too
    lengths: np.ndarray = np.searchsorted(_POWERS_OF_TEN, magnitude, side="right") + 1
    return lengths + negative


def _records(
    templates: tuple[bytes, ...], clamped: list[bool], varying: list[Column]
) -> list[bytes]:
    """Per key one ``bytes.join`` of its template's constant pieces (without or with
    ``clamped``: :func:`format_pieces`) and the fields that vary, in a C-level ``map``:
    the bytes ``template % fields`` gives, in one allocation of the exact size (``%``
    over-allocates and shrinks, past the small-object allocator for a ~400-byte record:
    about 1.5 times the time). (One ``join`` of every record cut at newlines is slower:
    the cut makes the same objects and copies once more.)"""
    pieces = _interleaved(_used(templates, clamped), clamped, map(_as_bytes, varying))
    return list(map(b"".join, zip(*pieces, strict=False)))  # the constants repeat forever


def _used(templates: tuple[bytes, ...], clamped: list[bool]) -> tuple[bytes, ...]:
    """The templates some key takes: the first alone when no key is clamped (nearly
    always). Then every constant piece is one for all keys (:func:`_interleaved`), not
    each key's choice between two that differ (``"clamped"`` sorts among the first
    fields, so even the first piece differs): one lookup per key less, about half of
    the time of a record's ``join``."""
    return templates if any(clamped) else templates[:1]


def _interleaved(
    formats: Sequence[bytes], which: Iterable[int] | Iterable[bool], columns: Iterable[Any]
) -> list[Iterable[bytes]]:
    """The iterables to ``zip`` into each item's pieces in order: each constant piece of
    ``formats`` (:func:`format_pieces`; the same for every item where the formats agree on
    it, else each item's format's, by ``which``), then the next column's field."""
    pieces = list(zip(*map(format_pieces, formats), strict=True))
    cols = list(columns)
    if len(pieces) != len(cols) + 1:
        raise ValueError(f"{len(pieces) - 1} slots in the formats for {len(cols)} columns")
    out: list[Iterable[bytes]] = []
    for constant, column in zip(pieces, [*cols, None], strict=True):
        if len(set(constant)) == 1:
            out.append(repeat(constant[0]))
        else:
            out.append(map(constant.__getitem__, which))
        if column is not None:
            out.append(column)
    return out


def format_pieces(fmt: bytes) -> list[bytes]:
    """A ``bytes %`` format of ``%b`` slots (and ``%%``) as its constant pieces, one more
    than its slots: ``fmt % fields`` is the pieces and the fields interleaved, joined."""
    if fmt.count(b"%") == fmt.count(b"%b") and b"%%" not in fmt:  # %b slots alone
        return fmt.split(b"%b")
    pieces = [b""]
    for i, run in enumerate(fmt.split(b"%%")):  # read left to right, as % reads them
        if i:
            pieces[-1] += b"%"
        first, *rest = run.split(b"%b")
        if b"%" in first or any(b"%" in r for r in rest):
            raise ValueError(f"a format with other conversions than %b: {fmt!r}")
        pieces[-1] += first
        pieces.extend(rest)
    return pieces


def _escaped_again(fields: list[bytes]) -> list[bytes]:
    """Group fields (JSON string contents) as they read inside another JSON string: a
    backslash before each quote and backslash (the list itself when there are none)."""
    joined = b"".join(fields)
    if b'"' in joined or b"\\" in joined:
        return [f.replace(b"\\", b"\\\\").replace(b'"', b'\\"') for f in fields]
    return fields


def encoded_strings(strings: list[str]) -> list[bytes]:
    """Each string's JSON as orjson writes it alone, from one orjson call over the list
    (:func:`escaped_strings`)."""
    return list(map(b'"%b"'.__mod__, escaped_strings(strings)))


def escaped_strings(strings: list[str]) -> list[bytes]:
    """Each string's JSON as orjson writes it alone, without its two quotes (what goes
    between the quotes of a ``bytes %`` template), from one orjson call over the list."""
    if not strings:
        return []
    blob = orjson.dumps(strings)[2:-2]
    # The list's JSON is cut at ``","``. Inside a string every quote is escaped (``\"``),
    # so a ``","`` that is not between two strings has a backslash before it (a string
    # holding ``",``): then, or if the count is off, each string is encoded by itself.
    parts = blob.split(b'","')
    if b'\\","' in blob or len(parts) != len(strings):
        return [orjson.dumps(x)[1:-1] for x in strings]
    return parts


#: The per-key fields of a release record, in the order of :func:`_marked_templates`' slots.
_SLOTS: Final = ("ci95", "group", "noise_scale", "value")
_MARKS: Final = tuple(orjson.dumps(f"\x00{f}\x00") for f in _SLOTS)


def _marked_templates(constant: Mapping[str, Any]) -> tuple[bytes, bytes] | None:
    """The canonical JSON of a release record with ``constant`` fields, without and with
    ``"clamped": true``, each :data:`_SLOTS` field a mark for :func:`_filled` and every
    other ``%`` doubled (a ``bytes %`` format once filled). Made by encoding the record with
    the marks as strings, so the constant parts are orjson's own bytes; None if that
    cannot be done (a constant that holds a mark: the records are then encoded one by one)."""
    out = []
    for extra in ({}, {"clamped": True}):
        marked = {**constant, **extra, **{f: f"\x00{f}\x00" for f in _SLOTS}}
        blob = dumps(marked).replace(b"%", b"%%")
        at = [blob.find(m) for m in _MARKS]
        if any(blob.count(m) != 1 for m in _MARKS) or at != sorted(at):
            return None
        out.append(blob)
    return out[0], out[1]


def _filled(marked: bytes, slots: Mapping[str, bytes]) -> bytes:
    """A marked template with each :data:`_SLOTS` field's mark replaced by its bytes."""
    for field, mark in zip(_SLOTS, _MARKS, strict=True):
        marked = marked.replace(mark, slots[field])
    return marked


def _encoded_numbers(numbers: list[Any] | np.ndarray) -> list[bytes]:
    """Each number's JSON as orjson writes it alone, from one orjson call over the list,
    or over an int64 array (its integers' digits as orjson writes a Python ``int``'s:
    tests/pipeline/test_release_drawn_bytes.py); a number's JSON has no comma, anything
    else is encoded one by one."""
    if len(numbers) == 0:
        return []
    if isinstance(numbers, np.ndarray):
        array = np.ascontiguousarray(numbers, dtype=np.int64)
        return orjson.dumps(array, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1].split(b",")
    parts = orjson.dumps(numbers)[1:-1].split(b",")
    if len(parts) != len(numbers):  # pragma: no cover - a value that is not a number
        return [orjson.dumps(x) for x in numbers]
    return parts


def cumulative_release_fields(plan: ContinualPlan, position: HorizonPosition) -> dict[str, Any]:
    """What a cumulative query's release record adds (release.schema.json).

    The record's ``value`` is the running total from ``horizon_start`` to ``window_end``;
    ``epsilon``/``delta`` stay what this window was charged; ``noise_scale`` should be
    ``plan.draw_scale`` and ``ci95`` ``plan.ci95(position.step)``.
    """
    step = position.step
    return {
        "release": "cumulative",
        "horizon_start": iso_utc(position.horizon_start_s),
        "horizon_windows": position.horizon_windows,
        "horizon_step": step,
        "continual_mechanism": plan.option,
        "noise_sd": plan.sd(step),
        "cumulative_epsilon": plan.epsilon * step,
        "cumulative_delta": plan.delta * step,
    }


def window_record(
    *,
    release_id: str,
    query: str,
    window_start_s: int,
    window_end_s: int,
    released_keys: int,
    epsilon_spent: float,
    delta_spent: float,
    horizon_epsilon_spent: float,
    bounds: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``bounds`` (``bounds: auto`` only): the bounds the window used and their cost."""
    record: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "kind": "window",
        "release_id": release_id,
        "query": query,
        "window_start": iso_utc(window_start_s),
        "window_end": iso_utc(window_end_s),
        "released_keys": released_keys,
        "epsilon_spent": epsilon_spent,
        "delta_spent": delta_spent,
        "horizon_epsilon_spent": horizon_epsilon_spent,
    }
    if bounds is not None:
        record["bounds"] = dict(bounds)
    return record


def dead_letter_record(
    *,
    reason: str,
    detail: str,
    source_topic: str,
    source_partition: int,
    source_offset: int,
    payload: bytes | None = None,
    now_s: float,
) -> dict[str, Any]:
    """Reason and source position; the payload only when explicitly enabled (it may hold ids)."""
    record: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "kind": "dead_letter",
        "reason": reason,
        "detail": detail,
        "source_topic": source_topic,
        "source_partition": source_partition,
        "source_offset": source_offset,
        "received_at": datetime.fromtimestamp(now_s, tz=UTC).isoformat().replace("+00:00", "Z"),
    }
    if payload is not None:
        record["payload"] = payload.decode("utf-8", errors="replace")
    return record


def group_dict(group_by: Sequence[str], key: Sequence[Any]) -> dict[str, Any]:
    """A canonical group key as the record's ``group`` object (booleans as JSON booleans)."""
    return dict(zip(group_by, map(json_value, key), strict=True))
