"""An erasure removes exactly one user from the samples, also beside users whose
pseudonyms share one of its two 64-bit words, and counts every event of the user it saw."""

from __future__ import annotations

import random

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
