"""What the ledger says was published: a release completed after its published marker is
read as published (a restart does not publish it again); the bounds histograms' record is
never to be published, so it reads as published from the start."""

from __future__ import annotations

import pytest

from stream_dp.pipeline.formats.ledger import (
    LedgerIndex,
    LedgerRelease,
    OutputRecord,
    encode_published,
    encode_release,
)
from stream_dp.privacy.budget import BOUNDS_CHARGE


def _release(query: str) -> LedgerRelease:
    records = [OutputRecord(f"{query}|w|{i}", {"kind": "release", "value": i}) for i in range(3)]
    return LedgerRelease("r1", query, 3600, 7200, 0.5, 0.0, records)


@pytest.mark.parametrize("marked", [True, False])
def test_a_release_reads_as_published_exactly_when_marked(marked: bool) -> None:
    release = _release("visits")
    index = LedgerIndex()
    if marked:
        index.feed(*encode_published(release))
    for key, value in encode_release(release, now_s=0, max_bytes=65_536):
        index.feed(key, value)
    found = index.get("visits", 3600)
    assert found is not None and found.published is marked


def test_the_bounds_histograms_record_reads_as_published_without_a_marker() -> None:
    index = LedgerIndex()
    for key, value in encode_release(_release(BOUNDS_CHARGE), now_s=0, max_bytes=65_536):
        index.feed(key, value)
    found = index.get(BOUNDS_CHARGE, 3600)
    assert found is not None and found.published is True
