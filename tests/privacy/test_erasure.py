"""The erasure set (docs/erasure.md): pseudonyms of a request, which windows an erasure
covers, what a window's partials must have applied, and the memory bound."""

from __future__ import annotations

import random

import pytest

from stream_dp.errors import PrivacyError
from stream_dp.privacy.bounding import Reservoirs
from stream_dp.privacy.erasure import Erasure, ErasureSet, erasure_pseudonyms
from stream_dp.privacy.pseudonymize import KeyRing, Pseudonymizer

KEY = b"46ff7a6a76f3f1bb5f61b59a35707d642e1743dc6ce5b5f4a64d992cbb5899bc"
OLD_KEY = b"9b0f8d7c2a4e6b1d3f5a7c9e0b2d4f6a8c1e3b5d7f9a0c2e4b6d8f1a3c5e7b9d"
ROTATING = KeyRing(Pseudonymizer(KEY, "k2"), Pseudonymizer(OLD_KEY, "k1"), rotate_at_s=1000.0)


def test_a_request_is_pseudonymized_as_events_are_normalised() -> None:
    ring = KeyRing(Pseudonymizer(KEY, "k1"))
    alice = erasure_pseudonyms(" Alice ", ring, "nfkc_casefold_strip")
    assert alice == {"k1": ring.current.pseudonym("alice")}
    assert erasure_pseudonyms("ALICE", ring, "nfkc_casefold_strip") == alice
    # without normalisation the spelling is the id
    assert erasure_pseudonyms(" Alice ", ring, "none") == {"k1": ring.current.pseudonym(" Alice ")}
    # integers as the decimal string, as events
    assert erasure_pseudonyms(42, ring, "nfkc_casefold_strip") == erasure_pseudonyms(
        "42", ring, "nfkc_casefold_strip"
    )


def test_during_a_rotation_a_request_carries_both_keys_pseudonyms() -> None:
    both = erasure_pseudonyms("bob", ROTATING, "nfkc_casefold_strip")
    assert both == {
        "k2": ROTATING.current.pseudonym("bob"),
        "k1": ROTATING.previous.pseudonym("bob"),
    }  # type: ignore[union-attr]
    assert both["k1"] != both["k2"]


@pytest.mark.parametrize("user", ["   ", "\t\n", True, 1.5, None])
def test_an_empty_or_mistyped_id_is_refused(user: object) -> None:
    with pytest.raises(PrivacyError):
        erasure_pseudonyms(user, ROTATING, "nfkc_casefold_strip")  # type: ignore[arg-type]


def test_an_erasure_covers_windows_by_key_and_time() -> None:
    erasures = ErasureSet()
    alice_k1, alice_k2 = b"a" * 16, b"A" * 16
    erasures.add(Erasure(4, {"k1": alice_k1, "k2": alice_k2}, expires_at_s=100.0))
    assert erasures.erased("k1", 0) == {alice_k1}
    assert erasures.erased("k2", 90) == {alice_k2}
    assert erasures.erased("k3", 0) == frozenset()  # a key the request never saw
    assert erasures.erased("k1", 100) == frozenset()  # expired for windows from 100 on
    assert erasures.erased_hex("k1", 0) == {alice_k1.hex()}
    assert erasures.position == 5
    replayed = Erasure(0, {"k1": alice_k1}, expires_at_s=100.0, applies_from_s=30.0)
    assert not replayed.covers(20) and replayed.covers(30) and not replayed.covers(100)


def test_a_window_must_apply_every_erasure_that_covers_it() -> None:
    erasures = ErasureSet()
    assert erasures.required_position(0) == 0
    erasures.add(Erasure(2, {"k1": b"a" * 16}, expires_at_s=50.0))
    erasures.add(Erasure(7, {"k1": b"b" * 16}, expires_at_s=20.0))
    erasures.advance(9)  # fences after them
    assert erasures.required_position(10) == 8
    assert erasures.required_position(30) == 3  # only the first covers it
    assert erasures.required_position(60) == 0
    assert erasures.position == 9


def test_erasures_are_forgotten_once_every_window_they_cover_is_released() -> None:
    erasures = ErasureSet()
    erasures.add(Erasure(0, {"k1": b"a" * 16}, expires_at_s=50.0))
    erasures.add(Erasure(1, {"k1": b"b" * 16}, expires_at_s=80.0))
    assert erasures.erased("k1", 40) == {b"a" * 16, b"b" * 16}
    assert erasures.forget(40) == 0  # window 40 (covered by both) is not released yet
    assert erasures.forget(50) == 1  # every window before 50 is: the first can go
    assert len(erasures) == 1
    assert erasures.erased("k1", 40) == {b"b" * 16}  # no stale cache


def test_removing_a_user_forgets_all_of_their_events_and_only_theirs() -> None:
    """Reservoirs are per user: removing one leaves every other user's sample as it was."""
    events = [(bytes([u]) * 16, i) for i in range(60) for u in range(5)]
    reservoirs = Reservoirs(3, random.Random(1))
    reservoirs.add_many([p for p, _ in events], [i for _, i in events])
    erased = bytes([2]) * 16
    others = {p: (seen, items) for p, seen, items in reservoirs.items() if p != erased}
    assert reservoirs.remove(erased) == 60
    assert reservoirs.remove(erased) == 0
    assert {p: (seen, items) for p, seen, items in reservoirs.items()} == others
    assert reservoirs.events_seen == 4 * 60
    assert reservoirs.users == 4
