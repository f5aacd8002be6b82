"""A quantile's histograms on the partials topic: sparse ``[bins, [indices], [counts]]``
items read back exactly, and every malformed one refused as a malformed record (never
merged: a negative, zero or misplaced count would move the exponential mechanism's scores
beyond what one user can)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from stream_dp.pipeline.formats.partials import PartialFormatError, PartialPart, decode


def _record(*histograms: Any) -> bytes:
    return orjson.dumps(
        {
            "schema_version": 1,
            "kind": "partial",
            "query": "q",
            "window_start": "2020-08-01T00:00:00Z",
            "source_partition": 0,
            "version": "v",
            "part": 0,
            "parts": 1,
            "events_seen": 9,
            "events_retained": 9,
            "totals": [[[f"k{i}"], 3, 3, 0, 0, 0, h] for i, h in enumerate(histograms)],
        }
    )


def test_sparse_histograms_read_back_as_their_dense_rows() -> None:
    part = decode(_record([4, [0, 3], [1, 2]], [4, [], []], [4, [1], [5]]))
    assert isinstance(part, PartialPart)
    hist = part.totals.columns.value_bins  # type: ignore[attr-defined]
    assert hist.tolist() == [[1, 0, 0, 2], [0, 0, 0, 0], [0, 5, 0, 0]]


@pytest.mark.parametrize(
    "histograms",
    [
        ([4, [0, 3], [1, 0]],),  # a listed bin with no value
        ([4, [0, 3], [1, -2]],),  # a negative count
        ([4, [3, 0], [1, 2]],),  # indices not increasing
        ([4, [1, 1], [1, 2]],),  # a bin twice
        ([4, [0, 4], [1, 2]],),  # an index past the bins
        ([4, [-1], [1]],),  # a negative index
        ([4, [0, 1], [1]],),  # a count missing
        ([4, [0], [1]], [5, [0], [1]]),  # two numbers of bins in one part
        ([0, [], []],),  # no bins
        ([65_537, [0], [1]],),  # more bins than a query may have
        ([4, [0.0], [1]],),  # an index that is not an integer
        ([4, [0], [True]],),  # a count that is not an integer
        ([1, 0, 2, 0],),  # the dense form
        ([4, [0], [1], 9],),  # a fourth item
    ],
)
def test_a_malformed_histogram_is_refused(histograms: tuple[Any, ...]) -> None:
    with pytest.raises(PartialFormatError, match="malformed partials record"):
        decode(_record(*histograms))


def test_a_later_row_may_start_below_the_previous_rows_last_bin() -> None:
    part = decode(_record([8, [6, 7], [1, 1]], [8, [0], [2]], [8, [], []], [8, [2, 5], [1, 1]]))
    assert isinstance(part, PartialPart)
    hist = part.totals.columns.value_bins  # type: ignore[attr-defined]
    assert hist.starts.tolist() == [0, 2, 3, 3, 5]
