from __future__ import annotations

import hashlib
import hmac
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_dp.errors import PrivacyError
from stream_dp.privacy.generalize import bucket_number, generalize_date
from stream_dp.privacy.pseudonymize import (
    PSEUDONYM_BYTES,
    KeyRing,
    Pseudonymizer,
    canonical_user_id,
    canonical_user_ids,
    nfkc_casefold_strip,
    nfkc_casefold_strip_all,
    normalized_user_ids,
)

#: Fixed test keys made by ``stream-dp keygen`` (the bytes of the configured hex string).
KEY = b"e90e4f2b300eb123c8e15addb45d963d597bea6702f4a23ac9f124ebf33b5467"
OTHER_KEY = b"d3daad918064673af7f0b2ab538d603ba0ac65bb6fc27791c5bc3db0824c929d"


def test_pseudonym_is_truncated_hmac_sha256() -> None:
    p = Pseudonymizer(KEY, "k1")
    expected = hmac.new(KEY, b"alice", hashlib.sha256).digest()[:PSEUDONYM_BYTES]
    assert p.pseudonym("alice") == expected
    assert len(p.pseudonym(12345)) == PSEUDONYM_BYTES


def test_integer_and_string_ids_agree_and_keys_differ() -> None:
    a = Pseudonymizer(KEY, "k1")
    b = Pseudonymizer(OTHER_KEY, "k2")
    assert a.pseudonym(42) == a.pseudonym("42")
    assert a.pseudonym("alice") != b.pseudonym("alice")
    assert a.pseudonym("alice") != a.pseudonym("bob")


def test_short_key_refused_with_fix() -> None:
    with pytest.raises(PrivacyError, match="at least 32 random bytes"):
        Pseudonymizer(b"short", "k1")


def test_key_never_in_repr() -> None:
    assert KEY.decode()[:8] not in repr(Pseudonymizer(KEY, "k1"))


def test_rotation_one_key_per_window() -> None:
    old = Pseudonymizer(OTHER_KEY, "old")
    new = Pseudonymizer(KEY, "new")
    ring = KeyRing(new, old, rotate_at_s=7200)
    assert ring.for_window(3600) is old
    assert ring.for_window(7200) is new
    assert KeyRing(new).for_window(0) is new
    with pytest.raises(PrivacyError):
        KeyRing(new, old, None)


def test_generalization_helpers() -> None:
    assert generalize_date("1984-07-21", "year") == "1984"
    assert generalize_date("1984-07-21T10:00:00+02:00", "month") == "1984-07"
    assert bucket_number(37, 10) == "30-40"
    assert bucket_number(-1, 5) == "-5-0"
    assert bucket_number(2.3, 0.5) == "2-2.5"  # any positive width, also below 1
    for width in (0, -1, math.inf, math.nan):
        with pytest.raises(ValueError, match="bucket width"):
            bucket_number(1, width)


@pytest.mark.parametrize("key_len", [32, 63, 64, 65, 200])
def test_precomputed_pads_equal_hmac_for_any_key_length(key_len: int) -> None:
    key = bytes(range(256))[:key_len]
    p = Pseudonymizer(key, "k1")
    for user in ("alice", "é-ü", "x" * 300, 0, 10**18):
        expected = hmac.digest(key, str(user).encode("utf-8"), "sha256")[:PSEUDONYM_BYTES]
        assert p.pseudonym(user) == expected


def test_a_batch_of_pseudonyms_is_each_ids_hmac_in_order() -> None:
    """:meth:`Pseudonymizer.pseudonyms` (stage 0's batch call) is the standard HMAC of each
    id, concatenated in order; booleans are refused as one at a time."""
    p = Pseudonymizer(KEY, "k1")
    users: list[str | int] = ["alice", "é-ü", "x" * 300, 0, 10**18, "42", 42, "alice"]
    expected = b"".join(
        hmac.digest(KEY, str(u).encode("utf-8"), "sha256")[:PSEUDONYM_BYTES] for u in users
    )
    assert p.pseudonyms(users) == expected
    assert p.pseudonyms([]) == b""
    with pytest.raises(TypeError, match="not a boolean"):
        p.pseudonyms(["alice", True])


#: Ids that NFKC or case folding change (or strip, with non-ASCII whitespace): the batch
#: normalisation must never take them for already normal.
CHANGED_BY_NFKC_OR_CASEFOLD = [
    "ß",  # folds to ss
    "ﬁ",  # ligature: NFKC gives fi
    "Ａｌｉｃｅ",  # full-width
    "e\u0301",  # e + combining acute: NFKC composes é
    "İ",  # dotted capital I: folds to i + combining dot
    "K",  # Kelvin sign: NFKC gives K, then k
    "Ω",  # ohm sign
    "ǅ",  # title-case digraph
    "x²",  # superscript
    "\u00a0alice",  # no-break space, stripped
    "alice\u3000",  # ideographic space, stripped
    "\u2028bob",  # line separator, stripped
    "Ǆ\u0301",
]


def _per_id(ids: list[str | int]) -> list[str | int]:
    return [nfkc_casefold_strip(u) for u in ids]


def test_batch_normalization_equals_per_id_for_every_ascii_character() -> None:
    """The batch check (printable ASCII, no space, no upper case) against the per-id
    function, for every ASCII character alone, at an id's start, end and middle, in a batch
    of plain ids (first, middle and last of it)."""
    for code in range(128):
        c = chr(code)
        for odd in (c, c + "a", "a" + c, "a" + c + "b", c + c):
            for batch in ([odd], [odd, "u1"], ["u1", odd, "u2"], ["u1", odd]):
                assert nfkc_casefold_strip_all(batch) == _per_id(batch), (code, batch)


@pytest.mark.parametrize("odd", CHANGED_BY_NFKC_OR_CASEFOLD)
def test_batch_normalization_equals_per_id_where_nfkc_or_casefold_change_the_id(
    odd: str,
) -> None:
    for batch in ([odd], ["u1", odd, "u2"], [odd, 42, "Bob"], ["bob", odd.upper(), odd]):
        normal = nfkc_casefold_strip_all(batch)
        assert normal == _per_id(batch)
        assert normal[batch.index(odd)] != odd


def test_batch_normalization_of_integers_nuls_and_the_none_mode() -> None:
    for batch in (
        [42, 7],
        ["alice", 42],
        ["a\x00 b", "c"],  # a NUL and a space inside one id: nothing to strip
        ["john smith", "x"],
        ["\x00", " \x00"],
        [],
    ):
        assert nfkc_casefold_strip_all(batch) == _per_id(batch), batch
    assert normalized_user_ids([" Alice ", 42], "none") == [" Alice ", 42]
    assert normalized_user_ids([" Alice ", 42], "nfkc_casefold_strip") == ["alice", 42]


@given(st.lists(st.one_of(st.text(max_size=12), st.integers()), max_size=8))
def test_batch_normalization_equals_per_id(batch: list[str | int]) -> None:
    assert nfkc_casefold_strip_all(batch) == _per_id(batch)


def test_batch_pseudonyms_equal_one_by_one() -> None:
    p = Pseudonymizer(KEY, "k1")
    ids: list[str | int] = ["alice", 42, "é", "ß" * 40, "", -7, "x" * 200]
    canonical = canonical_user_ids(ids)
    assert canonical == [canonical_user_id(u) for u in ids]
    assert canonical_user_ids(iter(["a", "b"])) == [b"a", b"b"]
    assert p.pseudonyms_of_canonical(canonical) == b"".join(p.pseudonym(u) for u in ids)
    assert p.pseudonyms_of_canonical([]) == b""
    with pytest.raises(TypeError, match="boolean"):
        canonical_user_ids(["a", True])  # type: ignore[list-item]
