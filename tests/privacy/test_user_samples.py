"""The per-user samples' contract (module doc of user_samples): at most k events per user,
users numbered and grouped, each user's kept events a uniform k-subset in uniformly random
order (so the first k of a larger sample are a uniform k-subset too); bad input refused;
the sampler reproducible only when seeded; items renumbered in every part; the memory
figure (28 bytes a row) the ingest reports."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
from scipy.stats import chisquare

from stream_dp.privacy.pseudonymize import PSEUDONYM_BYTES
from stream_dp.privacy.user_samples import (
    UserSamples,
    first_k_per_user,
    new_sampling_generator,
    per_user_items,
    pseudonym_words,
)


def _user(i: int) -> bytes:
    return (i * 0x9E3779B97F4A7C15 % 2**128).to_bytes(PSEUDONYM_BYTES, "big")


def test_k_below_one_is_refused_and_one_is_allowed() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        UserSamples(0)
    samples = UserSamples(1)
    samples.add_many([_user(1)] * 3, [4, 5, 6])
    assert samples.events_retained == 1


def test_mismatched_or_malformed_input_is_refused() -> None:
    samples = UserSamples(2)
    with pytest.raises(ValueError, match="one item per pseudonym"):
        samples.add_many([_user(1), _user(2)], [1])
    with pytest.raises(ValueError, match="expected 2 pseudonyms of 16 bytes"):
        pseudonym_words(b"x" * 31, 2)
    samples.add_many([], [])
    assert samples.events_seen == 0 and samples.users == 0


def test_pseudonym_words_are_the_two_native_64_bit_halves() -> None:
    raw = b"".join(_user(i) for i in range(5))
    words = pseudonym_words(raw, 5)
    assert words.shape == (5, 2) and words.dtype == np.uint64
    assert words.tobytes() == raw


def test_each_user_keeps_at_most_k_grouped_and_numbered_from_zero() -> None:
    rng = random.Random(3)
    k = 3
    offered: Counter[int] = Counter()
    samples = UserSamples(k, new_sampling_generator(random.Random(4)))
    items_of: dict[int, set[int]] = {}
    for batch in range(30):
        users = [rng.randrange(12) for _ in range(rng.randrange(1, 9))]
        items = [100 * batch + j for j in range(len(users))]
        samples.add_many([_user(u) for u in users], items)
        for u, item in zip(users, items, strict=True):
            offered[u] += 1
            items_of.setdefault(u, set()).add(item)
    numbers, kept = samples.sample()
    assert numbers.dtype == np.int64 and kept.dtype == np.int32
    # grouped: numbered 0, 1, … in runs; one run per user
    assert numbers.tolist() == sorted(numbers.tolist())
    assert sorted(set(numbers.tolist())) == list(range(len(offered)))
    runs = per_user_items(numbers, kept)
    assert len(runs) == len(offered) == samples.users
    # each run is min(k, offered) of one user's own items
    owners = []
    for run in runs:
        owner = next(u for u, its in items_of.items() if run[0] in its)
        assert set(run) <= items_of[owner] and len(run) == len(set(run))
        assert len(run) == min(k, offered[owner])
        owners.append(owner)
    assert len(set(owners)) == len(owners)
    assert samples.events_seen == sum(offered.values())
    assert samples.events_retained == sum(min(k, c) for c in offered.values())
    assert sorted(samples.item_ids().tolist()) == sorted(kept.tolist())
    # sealing does not consume the sample
    again_numbers, again_kept = samples.sample()
    assert again_numbers.tolist() == numbers.tolist() and again_kept.tolist() == kept.tolist()


def test_the_first_k_of_a_sample_are_a_uniform_k_subset_in_random_order() -> None:
    """One user's 5 events, k = 3 kept, then the first 1 of those (first_k_per_user): each
    event is that one equally often (1/5), and the kept order is not the arrival order.
    2,000 draws, chi-square over 5 cells: a false failure has probability 1e-7."""
    firsts: Counter[int] = Counter()
    for seed in range(2000):
        samples = UserSamples(3, new_sampling_generator(random.Random(seed)))
        samples.add_many([_user(9)] * 5, [0, 1, 2, 3, 4])
        numbers, kept = samples.sample()
        first_numbers, first_items = first_k_per_user(numbers, kept, 1)
        assert first_numbers.tolist() == [0] and len(first_items) == 1
        firsts[int(first_items[0])] += 1
    assert chisquare([firsts[i] for i in range(5)]).pvalue > 1e-7, firsts


def test_first_k_per_user_keeps_the_first_k_of_every_user() -> None:
    numbers = np.array([0, 0, 0, 1, 2, 2, 2, 2, 3, 3], dtype=np.int64)
    items = np.arange(10, dtype=np.int32) * 7
    users, kept = first_k_per_user(numbers, items, 2)
    assert users.tolist() == [0, 0, 1, 2, 2, 3, 3]
    assert kept.tolist() == [0, 7, 21, 28, 35, 56, 63]
    users, kept = first_k_per_user(numbers, items, 4)
    assert users.tolist() == numbers.tolist() and kept.tolist() == items.tolist()
    empty = np.zeros(0, np.int64)
    assert [len(a) for a in first_k_per_user(empty, empty.astype(np.int32), 3)] == [0, 0]
    assert per_user_items(empty, empty.astype(np.int32)) == []
    assert per_user_items(numbers, items) == [[0, 7, 14], [21], [28, 35, 42, 49], [56, 63]]


def test_the_sampler_is_reproducible_only_when_seeded() -> None:
    def draw(rng: np.random.Generator) -> list[int]:
        return rng.bit_generator.random_raw(4).tolist()

    assert draw(new_sampling_generator(random.Random(1))) == draw(
        new_sampling_generator(random.Random(1))
    )
    assert draw(new_sampling_generator(random.Random(1))) != draw(
        new_sampling_generator(random.Random(2))
    )
    assert draw(new_sampling_generator()) != draw(new_sampling_generator())
    # the seed carries all 128 bits drawn from the seeding generator
    seeded = [draw(new_sampling_generator(random.Random(s))) for s in range(50)]
    assert len({tuple(d) for d in seeded}) == 50


def test_remap_renumbers_kept_and_buffered_items() -> None:
    samples = UserSamples(2, new_sampling_generator(random.Random(8)))
    samples.add_many([_user(1)] * 3 + [_user(2)], [0, 1, 2, 3])
    samples.sample()  # compacted: kept rows
    samples.add_many([_user(3), _user(4)], [1, 3])  # buffered rows
    before = sorted(samples.item_ids().tolist())
    mapping = np.array([40, 41, 42, 43], dtype=np.int64)
    samples.remap(mapping)
    after = samples.item_ids()
    assert after.dtype == np.int32
    assert sorted(after.tolist()) == sorted(40 + i for i in before)
    assert sorted(samples.sample()[1].tolist()) == sorted(40 + i for i in before)


def test_memory_is_28_bytes_a_row_plus_the_left_out_counts() -> None:
    samples = UserSamples(1, new_sampling_generator(random.Random(2)))
    assert samples.nbytes() == 0
    samples.add_many([_user(u) for u in range(10)], list(range(10)))
    assert samples.nbytes() == 28 * 10  # buffered
    samples.add_many([_user(0)] * 5, list(range(5)))
    samples.sample()  # 10 kept; user 0's 5 left out events counted once (pseudonym, count)
    assert samples.nbytes() == 28 * 10 + (16 + 8)
    samples.add_many([_user(1)] * 2, [1, 2])
    assert samples.nbytes() == 28 * 12 + (16 + 8)


def test_an_erasure_counts_the_users_events_in_every_buffered_batch() -> None:
    """Kept rows, rows left out by compaction and rows in several not yet compacted
    batches: the erasure reports every one of the user's events it saw."""
    a, b = _user(1), _user(2)
    samples = UserSamples(2, new_sampling_generator(random.Random(6)))
    samples.add_many([a] * 3 + [b], [0, 1, 2, 3])
    samples.sample()  # a: 2 kept, 1 left out; b: 1 kept
    samples.add_many([a] * 2 + [b], [4, 5, 6])  # buffered batch 1
    samples.add_many([b], [7])  # buffered batch 2, none of a's
    samples.add_many([a] * 4, [8, 9, 10, 11])  # buffered batch 3
    assert samples.remove_many(pseudonym_words(a, 1)) == 3 + 2 + 4
    assert samples.events_seen == 3
    assert samples.remove_many(pseudonym_words(b + a, 2)) == 3
    assert samples.events_seen == 0 and samples.users == 0


def test_a_sample_sealed_empty_still_tells_users_apart_and_erases_them() -> None:
    """Sealed before any event (an empty window), then filled: pseudonyms stay exact
    64-bit words and items int32 ids. Two users whose words differ only in their lowest
    bits (below a float64's precision) are two users, each bounded on its own, and erasing
    one removes exactly its events."""
    hi, lo = 2**64 - 2**12, 2**63 + 2**12
    a = hi.to_bytes(8, "little") + lo.to_bytes(8, "little")
    b = hi.to_bytes(8, "little") + (lo + 1).to_bytes(8, "little")
    c = (hi + 1).to_bytes(8, "little") + lo.to_bytes(8, "little")
    samples = UserSamples(2, new_sampling_generator(random.Random(12)))
    assert len(samples.sample()[1]) == 0
    samples.add_many([a] * 3 + [b] * 3 + [c] * 3, list(range(9)))
    numbers, items = samples.sample()
    assert np.bincount(numbers).tolist() == [2, 2, 2]
    # the items stay integer ids that index the caller's table
    assert items.dtype == np.int32 and samples.item_ids().dtype == np.int32
    assert set(np.array([f"event {i}" for i in range(9)])[items].tolist()) <= {
        f"event {i}" for i in range(9)
    }
    assert samples.users == 3
    assert samples.remove(b) == 3
    assert samples.users == 2 and samples.events_retained == 4 and samples.events_seen == 6


def test_an_empty_sample_counts_and_indexes_like_a_filled_one() -> None:
    """A window whose every user was erased seals an empty sample: its columns are still
    integer (users counted with bincount, items indexing the caller's table), not floats
    numpy refuses as indices."""
    samples = UserSamples(2, new_sampling_generator(random.Random(13)))
    samples.add_many([_user(1)] * 2, [0, 1])
    samples.remove(_user(1))
    users, items = samples.sample()
    assert (users.dtype, items.dtype) == (np.int64, np.int32)
    assert np.bincount(users, minlength=1).tolist() == [0]
    assert np.array(["a", "b"])[items].tolist() == []
