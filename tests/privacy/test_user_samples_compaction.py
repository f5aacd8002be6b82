"""When the per-user samples compact their buffer (module doc of user_samples): once the
buffer holds at least COMPACT_MIN_ROWS rows and as many as are kept — not earlier (wasted
sorting), not later (memory grows past the documented bound)."""

from __future__ import annotations

import random

import pytest

from stream_dp.privacy import user_samples
from stream_dp.privacy.pseudonymize import PSEUDONYM_BYTES
from stream_dp.privacy.user_samples import UserSamples, new_sampling_generator


def _user(i: int) -> bytes:
    return i.to_bytes(PSEUDONYM_BYTES, "big")


def _rows_held(samples: UserSamples) -> int:
    """Rows kept or buffered (item_ids holds one item per row)."""
    return len(samples.item_ids())


def test_the_buffer_is_compacted_exactly_when_it_reaches_the_minimum(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(user_samples, "COMPACT_MIN_ROWS", 8)
    samples = UserSamples(1, new_sampling_generator(random.Random(1)))
    held = []
    for item in range(8 + 8):
        samples.add_many([_user(0)], [item])
        held.append(_rows_held(samples))
    # rows 1..7 buffered, the 8th compacts to the 1 kept; then 1 kept + 1..7 buffered and
    # the 8th buffered row compacts again (a count that does not restart at 0 after a
    # compaction would compact one row early)
    assert held == [1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7, 8, 1]
    assert samples.events_seen == 16


def test_the_buffer_waits_for_as_many_rows_as_are_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(user_samples, "COMPACT_MIN_ROWS", 4)
    samples = UserSamples(1, new_sampling_generator(random.Random(2)))
    samples.add_many([_user(u) for u in range(10)], list(range(10)))
    assert _rows_held(samples) == 10  # 10 users, 1 event each: all kept
    held = []
    for item in range(10):
        samples.add_many([_user(0)], [item])
        held.append(_rows_held(samples))
    # 10 kept: the buffer grows to 10 rows (not COMPACT_MIN_ROWS = 4) before compacting
    assert held == [11, 12, 13, 14, 15, 16, 17, 18, 19, 10]
