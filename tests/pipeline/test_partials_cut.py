"""A partial too large for one record is cut into parts by the size of its whole
``columns`` member; that size is computed from the columns when the group keys are plain
strings (:func:`encoded_length`), not by encoding the whole, and the parts are the ones
the whole's encoding gives, byte for byte."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from stream_dp.pipeline.formats import partials
from stream_dp.pipeline.formats.partials import columns_in_parts
from stream_dp.pipeline.formats.partials_columns import (
    columns_layout,
    encode_columns,
    encoded_length,
)
from stream_dp.privacy.key_totals import KeyTotals

I64 = np.iinfo(np.int64)


def _group(rng: random.Random, kind: str, i: int, width: int) -> tuple[Any, ...]:
    def one(j: int) -> Any:
        if kind == "plain":
            return f"site{i}-{j}.example/{rng.choice(['', ' %', '~!'])}"
        if kind == "escaped":
            return rng.choice(['"', "\\", "\n", "é", "\x7f", "a"]) + str(i)
        return rng.choice([i, None, f"s{i}"])

    return tuple(one(j) for j in range(width))


def _totals(rng: random.Random, n: int, kind: str, width: int) -> KeyTotals:
    def column() -> np.ndarray:
        big = rng.random() < 0.3
        return np.array(
            [
                rng.choice([I64.min, I64.max, -1, 0, 10**k]) if big else rng.randint(0, 10**k)
                for k in (rng.randint(0, 18) for _ in range(n))
            ],
            dtype=np.int64,
        )

    extra = rng.random() < 0.5
    bins = None
    if rng.random() < 0.3:
        bins = np.array([[rng.choice([0, 0, 1, 7]) for _ in range(4)] for _ in range(n)])
        bins = bins.reshape(n, 4)
    return KeyTotals(
        [_group(rng, kind, i, width) for i in range(n)],
        np.abs(column()),
        np.abs(column()),
        column(),
        column() if extra else None,
        np.abs(column()) if extra else None,
        bins,
    )


@pytest.mark.parametrize("seed", range(40))
def test_the_computed_size_is_the_encoded_size(seed: int) -> None:
    rng = random.Random(seed)
    kind = rng.choice(["plain", "plain", "escaped", "other"])
    width = rng.choice([1, 1, 2])
    for n in (0, 1, rng.randint(2, 50)):
        totals = _totals(rng, n, kind, width)
        layout = columns_layout(totals)
        size = encoded_length(totals, layout)
        assert size in (None, len(encode_columns(totals, 0, n, layout)))
        if kind == "plain" and n:
            assert size is not None  # computed, not left to the encoding
        strings = [x for g in totals.groups for x in g]
        if not n or any(type(x) is not str or x != x.strip('"\\\n\x7fé') for x in strings):
            assert size is None  # not every group value plain: encoded


@pytest.mark.parametrize("seed", range(20))
def test_the_parts_are_those_cut_by_the_whole_encoding(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(seed)
    totals = _totals(rng, rng.randint(1, 400), rng.choice(["plain", "escaped"]), 1)
    budget = rng.choice([400, 2_000, 10_000, 10**6])
    computed = columns_in_parts(totals, budget, what="a test partial")
    monkeypatch.setattr(partials, "encoded_length", lambda *args: None)
    assert computed == columns_in_parts(totals, budget, what="a test partial")
