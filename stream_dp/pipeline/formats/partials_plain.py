"""A partials record's plain totals, in the per-key form of earlier versions, decoded by
msgspec straight into tuples (this version writes columns: :mod:`.partials_columns`).

Stage 2 decodes a 1,000,000-key window's partials (about 30 records of 1 MB) on its loop.
orjson builds each entry as a list of a list and three numbers, which
:func:`~stream_dp.pipeline.formats.partials.decode` then checks type by type, transposes
and turns into tuples and int64 columns: about 1 CPU s per 1,000,000 keys. A typed msgspec
decoder checks the same while parsing and gives each entry as a tuple holding its group key
as a tuple: about half of that.

It answers only where its result is exactly orjson's and the general path's, and None
(decode with orjson) otherwise:

* **the record's shape**: the totals are its last member, written ``,"totals":`` right
  before them and closed by the record's ``}`` (as stage 1 writes them). The header before
  them is parsed by orjson as an object of its own; when that object is valid and not
  empty and the totals are a valid array, the whole record is the header's members then
  the totals (JSON's grammar reads a text one way only), so orjson would read the same
  header and the same totals — the last ``totals`` member counts, as in orjson.
* **plain entries only**: four items each, ``[[group values], events, users, value
  sum]``, every group value a string, ``null`` or an integer, every number an integer.
  Weights, squares and histograms (five to seven items), booleans and floats (which take
  a canonical form) are left to orjson.
* **integers within int64**: orjson reads integers beyond −2⁶³ … 2⁶⁴−1 as floats (a group
  value would become a float key, a total would be truncated), msgspec as exact ints; a
  number outside int64 is refused here and read by orjson.
* strings: both refuse invalid UTF-8, encoded and escaped lone surrogates and raw control
  characters, and read every escape alike; both refuse trailing text.
* anything else wrong (a key twice in the part, a header field of the wrong type) is left
  to the general path, which refuses it with its own message.

``tests/pipeline/test_partials_plain.py`` checks the agreement differentially.
"""

from __future__ import annotations

from typing import Annotated, Any, Final

import msgspec
import numpy as np
import orjson

from stream_dp.privacy.key_totals import KeyTotals

#: What stage 1 writes right before a part's totals (its last member).
TOTALS_MEMBER: Final = b',"totals":'

_Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
_PLAIN_ENTRIES: Final = msgspec.json.Decoder(
    list[tuple[tuple[str | _Int64 | None, ...], _Int64, _Int64, _Int64]]
)
_DECODE_ERRORS: Final = (orjson.JSONDecodeError, msgspec.DecodeError, TypeError, ValueError)


def split_last_member(value: bytes, member: bytes) -> tuple[dict[str, Any], memoryview] | None:
    """(header, the member's value) of a partials record whose last member is written
    ``member`` (``,"name":``) as stage 1 writes it, the header parsed by orjson as an object
    of its own (every member before); None when the record is not laid out so, or its
    header is not a valid, non-empty partial's or holds a form of the totals too (see the
    module docstring)."""
    at = value.rfind(member)
    if at < 0 or not value.endswith(b"}"):
        return None
    try:
        header = orjson.loads(value[:at] + b"}")
    except orjson.JSONDecodeError:
        return None
    if type(header) is not dict or header.get("kind") != "partial":
        return None  # (an empty header would make the record's comma invalid)
    if "totals" in header or "columns" in header:
        return None  # refused by the general path: two forms of one part's totals
    return header, memoryview(value)[at + len(member) : -1]


def plain_partial(value: bytes) -> tuple[dict[str, Any], KeyTotals] | None:
    """(header, totals) of a partials record whose totals are plain (see the module
    docstring), the header holding every member but the totals; None otherwise."""
    split = split_last_member(value, TOTALS_MEMBER)
    if split is None:
        return None
    header, member = split
    try:
        entries = _PLAIN_ENTRIES.decode(member)
    except _DECODE_ERRORS:
        return None
    if not entries:
        return header, KeyTotals.empty()
    groups, events, users, sums = zip(*entries, strict=True)
    keys = list(groups)  # tuples of strings, ints and None: canonical already
    if len(set(keys)) != len(keys):
        return None  # refused by the general path
    columns = (np.array(c, dtype=np.int64) for c in (events, users, sums))
    return header, KeyTotals(keys, *columns)
