"""When the per-user samples compact their buffer (module doc of user_samples): once the
buffer holds at least COMPACT_MIN_ROWS rows and as many as are kept — not earlier (wasted
sorting), not later (memory grows past the documented bound)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from scipy.stats import chisquare

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


def test_users_sharing_half_their_pseudonym_keep_at_most_k_each() -> None:
    """Two pseudonyms with the same first (or second) 64-bit word are two users, each
    bounded to k on its own (the rare collision path of the compaction)."""
    a = b"A" * 8 + b"B" * 8
    b = b"A" * 8 + b"C" * 8
    c = b"D" * 8 + b"B" * 8
    for seed in range(20):
        samples = UserSamples(2, new_sampling_generator(random.Random(seed)))
        for p in (a, b, c):
            samples.add_many([p] * 5, list(range(5)))
        users, items = samples.sample()
        assert sorted(np.bincount(users).tolist()) == [2, 2, 2]
        assert len(items) == 6


def test_events_offered_in_many_batches_are_kept_uniformly() -> None:
    """k = 1 of a user's 4 events, each offered in its own batch: every event is the kept
    one about equally often (the kept event is the one of smallest random priority, never
    the smallest item or the first)."""
    kept = [0] * 4
    for seed in range(800):
        samples = UserSamples(1, new_sampling_generator(random.Random(seed)))
        for item in range(4):
            samples.add_many([_user(7)], [item])
        kept[int(samples.sample()[1][0])] += 1
    assert chisquare(kept).pvalue > 1e-7, kept


def _old_compaction(
    words: np.ndarray, priorities: np.ndarray, items: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Compaction as it was written before the two unstable sorts (issue 43): by priority,
    then stably by first word (by both words and priority when two pseudonyms share the
    first), the first k rows of each user kept."""
    hi, lo = words[:, 0], words[:, 1]
    order = np.argsort(priorities)
    order = order[np.argsort(hi[order], kind="stable")]
    shi, slo = hi[order], lo[order]
    same_hi = shi[1:] == shi[:-1]
    if not np.array_equal(slo[1:][same_hi], slo[:-1][same_hi]):
        order = np.lexsort((priorities, lo, hi))
        shi, slo = hi[order], lo[order]
        same_hi = (shi[1:] == shi[:-1]) & (slo[1:] == slo[:-1])
    starts = np.flatnonzero(np.concatenate(([True], ~same_hi)))
    run = np.cumsum(np.concatenate(([True], ~same_hi))) - 1
    order = order[np.arange(len(items)) - starts[run] < k]
    return words[order], priorities[order], items[order]


def test_compaction_keeps_the_rows_and_order_of_the_sort_by_priority_then_user() -> None:
    """The seal's compaction sorts by user then priority with two unstable (vectorised)
    sorts and a tie check: the kept rows and their order are those of the stable sort it
    replaced, for many users and few, heavy users, pseudonyms sharing their first word,
    and priorities that tie in full or in the high bits the fast sort compares (where it
    falls back to the stable sort)."""
    rng = np.random.default_rng(43)
    for trial in range(400):
        n = int(rng.choice([1, 2, 3, 50, 2000, 20_000]))
        users = int(rng.integers(1, n + 1))
        first = rng.integers(0, 2**64, users, dtype=np.uint64)
        if trial % 5 == 1:
            first[: users // 2] = first[0]  # half the users share their first word
        pool = np.stack([first, rng.integers(0, 2**64, users, dtype=np.uint64)], axis=1)
        heavy = trial % 4 == 2  # one user holds about half the rows
        who = np.where(rng.random(n) < 0.5, 0, rng.integers(0, users, n)) if heavy else None
        words = pool[who if who is not None else rng.integers(0, users, n)]
        priorities = rng.integers(0, 2**64, n, dtype=np.uint64)
        if trial % 3 == 0:  # ties: in full, or in the high bits only
            priorities = (rng.integers(0, 4, n, dtype=np.uint64) << np.uint64(62)) | (
                rng.integers(0, 2, n, dtype=np.uint64) if trial % 2 else np.uint64(0)
            )
        items = rng.integers(0, 1000, n).astype(np.int32)
        k = int(rng.choice([1, 3, 40]))
        samples = UserSamples(k, np.random.default_rng(0))
        samples._buffer = [(words, priorities, items)]
        samples._buffered = n
        samples._compact()
        assert samples._kept is not None
        expected = _old_compaction(words, priorities, items, k)
        for got, want in zip(samples._kept, expected, strict=True):
            assert np.array_equal(got, want), trial
