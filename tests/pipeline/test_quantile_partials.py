"""A quantile's histograms on the partials topic: sparse ``[bins, [indices], [counts]]``
items read back exactly, and every malformed one refused as a malformed record (never
merged: a negative, zero or misplaced count would move the exponential mechanism's scores
beyond what one user can)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from stream_dp.config import BoundsConfig, QueryConfig
from stream_dp.pipeline.formats.partials import (
    Partial,
    PartialFormatError,
    PartialPart,
    decode,
    encode_partial,
    new_version,
)
from stream_dp.privacy.key_totals import KeyTotals
from stream_dp.privacy.planner import plan_query
from stream_dp.privacy.release import release_query


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


def test_a_window_whose_partials_hold_no_key_releases_every_public_key() -> None:
    """A source whose events had none for the quantile query (a ``where`` filter, a missing
    value field) sends an empty part, without a seventh item: stage 2 used to refuse the
    window ("histograms of 0 bins"); every public key now gets the draw of an empty
    histogram, as a public key without data does."""
    query = QueryConfig(
        name="q",
        statistic="quantile",
        group_by=["slot"],
        value_field="x",
        lower=0.0,
        upper=10.0,
        quantiles=[0.5, 0.9],
        bins=10,
        epsilon=1.0,
        keys={"slot": [1, 2, 3]},
    )
    plan = plan_query(query.spec(), BoundsConfig(max_contributions_per_window=1).spec())
    empty = Partial(
        query="q",
        window_start_s=0,
        source_partition=0,
        version=new_version(),
        totals=KeyTotals.empty(),
        events_seen=4,
        events_retained=0,
    )
    ((_, value),) = encode_partial(empty, max_bytes=1 << 20)
    part = decode(value)
    assert isinstance(part, PartialPart)
    merged = KeyTotals.merge([KeyTotals.of(dict(part.totals)), KeyTotals.empty()])
    released = release_query(merged, plan).values
    assert [v.group for v in released] == [(1,), (2,), (3,)]
    for v in released:
        listed: list[dict[str, float]] = v.value  # type: ignore[assignment]
        assert [q["quantile"] for q in listed] == [0.5, 0.9]
        assert 0.0 <= listed[0]["value"] <= listed[1]["value"] <= 10.0
