"""What the differential tests of stage 2's fast partials readers share
(tests/pipeline/test_partials_plain.py, test_partials_columns.py): a comparable outcome of
decoding, the outcome with a fast path switched off, plain group values and random byte
edits."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

from stream_dp.pipeline.formats import partials as partials_format
from stream_dp.pipeline.formats.partials import PartialFormatError, PartialPart, decode

#: Bytes a random edit writes: JSON's structure, digits, literals, control and non-ASCII.
EDIT_ALPHABET = b'[]{},:"\\ -0123456789.eEtrufalsn\x00\x1f\x7f\xc3\xa9\xff'


def outcome(value: bytes) -> tuple[str, Any]:
    """What decoding gives, comparable across paths: the part's fields and its totals'
    keys (with their values' types), number columns and histograms, or the error."""
    try:
        part = decode(value)
    except PartialFormatError as exc:
        return "error", str(exc)
    if not isinstance(part, PartialPart):
        return "other", repr(part)
    columns = part.totals.columns  # type: ignore[attr-defined]
    keys = [tuple((type(v).__name__, repr(v)) for v in key) for key in columns.groups]
    numbers = [
        getattr(columns, name).tolist()
        for name in ("events", "users", "value_sums", "selection_weights", "value_squares")
    ]
    hist = columns.value_bins
    bins = (hist.bins, hist.starts.tolist(), hist.index.tolist(), hist.counts.tolist())
    fields = {f.name: getattr(part, f.name) for f in dataclasses.fields(part)}
    del fields["totals"]
    return "part", (fields, keys, numbers, bins)


def both(value: bytes, monkeypatch: pytest.MonkeyPatch, fast_path: str) -> tuple[Any, Any]:
    """(the outcome with every path, the outcome with ``fast_path`` — a reader that
    :func:`decode` tries first — answering None: orjson and the general reader)."""
    fast = outcome(value)
    with monkeypatch.context() as m:
        m.setattr(partials_format, fast_path, lambda value: None)
        return fast, outcome(value)


def plain_value(rng: random.Random) -> Any:
    """A group value the fast paths read: null, an int64 (extremes too) or a string with
    escapes, control and non-ASCII characters."""
    return rng.choice(
        [
            None,
            rng.randrange(-(2**63), 2**63),
            rng.choice([-(2**63), 2**63 - 1, 0, -1]),
            "".join(rng.choice('ab"\\\n\x01\x7fé€😀/') for _ in range(rng.randrange(6))),
        ]
    )


def byte_edited(rng: random.Random, value: bytes) -> bytes:
    """``value`` with one random byte replaced, deleted or inserted."""
    edited = bytearray(value)
    at = rng.randrange(len(edited))
    byte = bytes([rng.choice(EDIT_ALPHABET)])
    how = rng.randrange(3)
    if how == 0:
        edited[at : at + 1] = byte
    elif how == 1:
        del edited[at]
    else:
        edited[at:at] = byte
    return bytes(edited)
