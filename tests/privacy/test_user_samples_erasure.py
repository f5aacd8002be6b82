"""An erasure removes exactly one user from the samples, also beside users whose
pseudonyms share one of its two 64-bit words, and counts every event of the user it saw; a
batch of erasures removes exactly its users in one vectorised pass."""

from __future__ import annotations

import copy
import random
from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_dp.privacy import user_samples
from stream_dp.privacy.user_samples import UserSamples, new_sampling_generator

# a and b share their first word, a and c their second: only whole pseudonyms are users.
A = b"A" * 8 + b"B" * 8
B = b"A" * 8 + b"C" * 8
C = b"D" * 8 + b"B" * 8


def _samples() -> UserSamples:
    samples = UserSamples(2, new_sampling_generator(random.Random(5)))
    for p in (A, B, C):
        samples.add_many([p] * 5, list(range(5)))
    samples.sample()  # compaction: 2 kept and 3 left out per user
    return samples


def test_removing_one_user_leaves_users_sharing_half_its_pseudonym() -> None:
    samples = _samples()
    assert samples.remove(A) == 5
    assert (samples.users, samples.events_retained, samples.events_seen) == (2, 4, 10)
    assert samples.remove(A) == 0


def test_the_left_out_events_of_the_others_are_still_counted_after_a_removal() -> None:
    samples = _samples()
    samples.remove(A)
    samples.add_many([B] * 3, [7, 8, 9])
    assert samples.remove(B) == 8
    assert samples.remove(C) == 5
    assert (samples.users, samples.events_retained, samples.events_seen) == (0, 0, 0)


def test_events_left_out_by_two_compactions_are_all_counted() -> None:
    samples = UserSamples(1, new_sampling_generator(random.Random(6)))
    samples.add_many([A] * 3, [0, 1, 2])
    samples.sample()  # 1 kept, 2 left out
    samples.add_many([A] * 4 + [B] * 2, [3, 4, 5, 6, 7, 8])
    samples.sample()  # still 1 kept of A: 3 + 2 more left out; 1 of B kept, 1 left out
    assert samples.remove(A) == 7
    assert samples.remove(B) == 2
    assert samples.events_seen == 0


def test_an_empty_sample_is_empty_and_takes_events_afterwards() -> None:
    samples = UserSamples(2, new_sampling_generator(random.Random(7)))
    users, items = samples.sample()
    assert (len(users), len(items), samples.users) == (0, 0, 0)
    assert samples.remove(A) == 0
    samples.add_many([A] * 3, [1, 2, 3])
    assert (samples.users, samples.events_retained) == (1, 2)


# -- a batch of erasures in one vectorised removal (issue #28) ------------------------------

# Pseudonyms of a small pool, some sharing one of their two words with another.
POOL = [A, B, C] + [bytes([i]) * 8 + bytes([i + 1]) * 8 for i in range(20, 29)]


def _rows_by_user(samples: UserSamples) -> dict[bytes, list[tuple[int, int]]]:
    """Each user's kept rows (priority, item) once compacted: what the window holds."""
    samples.sample()
    kept = samples._kept  # the columns themselves: the model compares rows, not counts
    assert kept is not None
    words, priorities, items = kept
    out: dict[bytes, list[tuple[int, int]]] = {}
    for w, p, i in zip(words, priorities.tolist(), items.tolist(), strict=True):
        out.setdefault(w.tobytes(), []).append((p, i))
    return out


@settings(max_examples=200, deadline=None)
@given(
    k=st.integers(1, 3),
    batches=st.lists(
        st.lists(st.integers(0, len(POOL) - 1), min_size=0, max_size=12), min_size=1, max_size=8
    ),
    erased_at=st.sets(st.integers(0, len(POOL) - 1), max_size=len(POOL)),
    seed=st.integers(0, 2**32),
    compact_from=st.integers(1, 16),
)
def test_a_batch_removal_equals_removing_each_user_from_a_sample_in_any_state(
    k: int, batches: list[list[int]], erased_at: set[int], seed: int, compact_from: int
) -> None:
    """Kept rows, buffered rows and left-out counts all at once (compaction made to run
    early and often): after one batch removal, every other user's kept rows are exactly
    their rows before, no erased user has a row, and every event of an erased user is
    counted as seen — the same as one user after another (:meth:`UserSamples.remove`)."""
    with mock.patch.object(user_samples, "COMPACT_MIN_ROWS", compact_from):
        samples = UserSamples(k, new_sampling_generator(random.Random(seed)))
        for batch in batches:
            samples.add_many([POOL[u] for u in batch], list(range(len(batch))))
    erased = [POOL[u] for u in sorted(erased_at)]
    offered = {p: sum(POOL[u] == p for b in batches for u in b) for p in POOL}
    one_by_one = copy.deepcopy(samples)
    before = _rows_by_user(copy.deepcopy(samples))
    seen_before = samples.events_seen

    words = np.frombuffer(b"".join(erased), dtype=np.uint64).reshape(-1, 2)
    seen = samples.remove_many(words)

    expected = {u: rows for u, rows in before.items() if u not in erased}
    assert _rows_by_user(samples) == expected
    assert seen == sum(offered[p] for p in erased)
    assert samples.events_seen == seen_before - seen
    assert [one_by_one.remove(p) for p in erased] == [offered[p] for p in erased]
    assert _rows_by_user(one_by_one) == expected
    assert one_by_one.events_seen == samples.events_seen


@settings(max_examples=150, deadline=None)
@given(
    k=st.integers(1, 3),
    batches=st.lists(
        st.lists(st.integers(0, len(POOL) - 1), min_size=0, max_size=12), min_size=1, max_size=8
    ),
    seed=st.integers(0, 2**32),
    compact_from=st.integers(1, 16),
)
def test_the_left_out_counts_are_each_users_events_beyond_the_kept(
    k: int, batches: list[list[int]], seed: int, compact_from: int
) -> None:
    """What an erasure counts as seen: per user (whole pseudonyms, also those sharing a
    word), every event compaction left out, over any number of compactions; users in
    (first word, second word) order, as np.unique gives them."""
    with mock.patch.object(user_samples, "COMPACT_MIN_ROWS", compact_from):
        samples = UserSamples(k, new_sampling_generator(random.Random(seed)))
        for batch in batches:
            samples.add_many([POOL[u] for u in batch], list(range(len(batch))))
        samples.sample()
    offered = {p: sum(POOL[u] == p for b in batches for u in b) for p in POOL}
    expected = {p: n - min(n, k) for p, n in offered.items() if n > k}
    if samples._dropped is None:
        assert expected == {}
        return
    users, counts = samples._dropped
    assert {w.tobytes(): c for w, c in zip(users, counts.tolist(), strict=True)} == expected
    assert users.tolist() == sorted(users.tolist())
