"""The way out a refused worker suggests: a new deployment starting with the first window
after the last one released — not the largest progress cursor, which lies up to
``partials partitions - 1`` windows further (following it lost those windows)."""

from __future__ import annotations

from stream_dp.pipeline.fingerprint_gate import end_of_last_release, worker_refusal
from stream_dp.pipeline.formats.ledger import (
    LedgerIndex,
    LedgerRelease,
    encode_coverage,
    encode_progress,
    encode_published,
    encode_release,
)
from stream_dp.windows.tumbling import iso_utc
from tests.pipeline.support import T0, config

SIZE_S = 60


def _ledger(released: int, partitions: int, *, drawn_after: bool = False) -> LedgerIndex:
    """A ledger as the release driver writes it: ``released`` consecutive windows from T0,
    round robin over ``partitions`` partials partitions, each followed by its partition's
    progress record (cursor = window start + partitions windows); with ``drawn_after`` one
    more window drawn and published whose progress record was not written yet."""
    index = LedgerIndex()
    index.feed(*encode_coverage(T0, SIZE_S))
    for i in range(released):
        ws = T0 + i * SIZE_S
        index.feed(*encode_progress(i % partitions, partitions, ws + partitions * SIZE_S, ws))
    if drawn_after:
        ws = T0 + released * SIZE_S
        rel = LedgerRelease(
            release_id="r-late",
            query="visits",
            window_start_s=ws,
            window_end_s=ws + SIZE_S,
            epsilon_spent=1.0,
            delta_spent=0.0,
            records=[],
            sources={},
            published=True,
        )
        for key, value in encode_release(rel, now_s=ws + SIZE_S, max_bytes=1_000_000):
            index.feed(key, value)
        index.feed(*encode_published(rel))
    return index


def test_the_suggested_start_is_the_end_of_the_last_released_window() -> None:
    # 6 partials partitions, 8 windows released: the last one (T0 + 7 windows) ends at
    # T0 + 8 windows; partition 1's cursor says T0 + 13 windows (7 + 6).
    index = _ledger(8, 6)
    assert max(index.progress.values()) == T0 + 13 * SIZE_S
    assert end_of_last_release(index) == T0 + 8 * SIZE_S
    _, way_out = worker_refusal(config(), index, "ledger-topic")
    assert f"window.start_at at or after {iso_utc(T0 + 8 * SIZE_S)} (after" in way_out
    assert iso_utc(T0 + 13 * SIZE_S) not in way_out


def test_a_window_published_before_its_progress_record_counts_as_released() -> None:
    index = _ledger(8, 6, drawn_after=True)
    assert end_of_last_release(index) == T0 + 9 * SIZE_S


def test_one_partials_partition_suggests_its_cursor() -> None:
    index = _ledger(3, 1)
    assert end_of_last_release(index) == T0 + 3 * SIZE_S == max(index.progress.values())


def test_nothing_released_suggests_no_time() -> None:
    index = LedgerIndex()
    index.feed(*encode_coverage(T0, SIZE_S))
    assert end_of_last_release(index) is None
    _, way_out = worker_refusal(config(), index, "ledger-topic")
    assert "window.start_at (after the last window this one released)" in way_out
