"""Keyed pseudonyms (docs/privacy.md#invariant-1): HMAC-SHA256 of the user id under a secret key.

String ids are first normalised (``input.user_id_normalization``, default
``nfkc_casefold_strip``) so that spellings of one id — case, surrounding whitespace,
Unicode composition and compatibility forms — are one user, bounded once.

The raw id goes no further than the decoder: state, internal topics, outputs, the ledger,
logs and metrics only ever see the 16-byte pseudonym. Without the key a pseudonym cannot be
recomputed from a guessed id (unlike a plain hash). Keys rotate by window: while a rotation
is configured, windows that start before ``rotate_at`` use the previous key, so all
pseudonyms of one window come from one key and a user is never counted twice in a window.

A key id only *names* a key: a new secret under the old id would make every user of an
open window two pseudonyms. So each key also has a **key check value**
(:attr:`Pseudonymizer.key_check`), derived from the key's bytes, which the deployment
records in its ledger and stamps on every partial and repartitioned event; a worker, a
partial or an event under another secret for the same key id is refused
(docs/configuration.md#key-check).
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from stream_dp.errors import PrivacyError

#: ``input.user_id_normalization``.
UserIdNormalization = Literal["nfkc_casefold_strip", "none"]

#: Length of a pseudonym: 128 bits of HMAC-SHA256 (collisions are negligible below 2^40 users).
PSEUDONYM_BYTES = 16
#: Shortest secret key accepted (the key's entropy bounds the pseudonyms' resistance).
MIN_KEY_BYTES = 32
#: SHA-256's digest size.
_DIGEST_BYTES = 32
#: SHA-256's block size, and HMAC's inner/outer pads (RFC 2104).
_BLOCK = 64
#: Length of a key check value: 64 bits of HMAC-SHA256 (two keys agree by chance with
#: probability 2^-64).
KEY_CHECK_BYTES = 8
#: What the key check value is the HMAC of. It starts with 0xFF, a byte no UTF-8 text or
#: decimal integer holds, so no user id's canonical bytes (:func:`canonical_user_id`) equal
#: it: the check value is never the prefix of any user's pseudonym.
KEY_CHECK_MESSAGE = b"\xffstream-dp key check v1"
_IPAD = bytes(b ^ 0x36 for b in range(256))
_OPAD = bytes(b ^ 0x5C for b in range(256))


def nfkc_casefold_strip(user_id: str | int) -> str | int:
    """One spelling per id: Unicode NFKC, case folding, surrounding whitespace removed.

    NFKC merges composed and decomposed forms (é as one code point or e + accent) and
    compatibility forms (full-width ａ, ligatures, superscripts); case folding merges case
    (including ß/ss); NFKC runs again because folding can un-normalise a few characters;
    then leading and trailing whitespace goes. Integers are returned unchanged (42 and
    "42" already pseudonymize alike). Idempotent: normalising twice changes nothing.
    """
    if type(user_id) is not str:
        return user_id
    if user_id.isascii():  # NFKC is the identity on ASCII, and casefold is lower
        return user_id.lower().strip()
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", user_id).casefold())
    return folded.strip()


def nfkc_casefold_strip_all(user_ids: Sequence[str | int]) -> list[str | int]:
    """:func:`nfkc_casefold_strip` of each id, with one check for the usual batch: all
    strings of printable ASCII without space or upper case — ids the function returns
    unchanged (NFKC is the identity on ASCII, case folding on ASCII without upper case;
    ASCII whitespace is the space and control characters, so there is nothing to strip),
    checked on their joined text at once. Any other batch (an integer, a non-ASCII, upper
    case, space or control character anywhere in an id) is normalised id by id."""
    try:
        joined = "".join(user_ids)  # type: ignore[arg-type]
    except TypeError:  # an integer among them
        return list(map(nfkc_casefold_strip, user_ids))
    if joined.isascii() and joined.isprintable() and " " not in joined and joined.lower() == joined:
        return list(user_ids)
    return list(map(nfkc_casefold_strip, user_ids))


def _unchanged(user_id: str | int) -> str | int:
    return user_id


def normalized_user_ids(
    user_ids: Sequence[str | int], mode: UserIdNormalization
) -> list[str | int]:
    """The ids of a batch as :func:`user_id_normalizer` ``(mode)`` makes each of them."""
    return nfkc_casefold_strip_all(user_ids) if mode == "nfkc_casefold_strip" else list(user_ids)


def user_id_normalizer(mode: UserIdNormalization) -> Callable[[str | int], str | int]:
    """The function ``input.user_id_normalization`` names."""
    return nfkc_casefold_strip if mode == "nfkc_casefold_strip" else _unchanged


def canonical_user_id(user_id: str | int) -> bytes:
    """The bytes that are keyed: strings as UTF-8, integers in decimal (so 42 and "42" agree)."""
    if isinstance(user_id, bool):
        raise TypeError("a user id must be a string or an integer, not a boolean")
    if isinstance(user_id, int):
        return str(user_id).encode("ascii")
    return user_id.encode("utf-8")


def canonical_user_ids(user_ids: Iterable[str | int]) -> list[bytes]:
    """:func:`canonical_user_id` of each id (a batch of strings encoded in one pass)."""
    listed = user_ids if isinstance(user_ids, list) else list(user_ids)
    try:
        return list(map(str.encode, listed))  # UTF-8, as canonical_user_id
    except TypeError:  # an integer (or a boolean: canonical_user_id refuses it) among them
        return list(map(canonical_user_id, listed))


@dataclass(frozen=True, repr=False)
class Pseudonymizer:
    """HMAC-SHA256 under one secret key; ``key_id`` names the key (never the key itself),
    :attr:`key_check` tells keys apart without revealing them."""

    key: bytes
    key_id: str
    #: The key check value: HMAC-SHA256(key, :data:`KEY_CHECK_MESSAGE`), first
    #: :data:`KEY_CHECK_BYTES` bytes, in hex. A pseudorandom function of the key, like every
    #: pseudonym: it reveals nothing of the key, and testing a guessed key against it is as
    #: hard as against any pseudonym of a known id (keys are ≥ 32 random bytes, checked at
    #: start). Two secrets under one key id differ in it (but with probability 2^-64).
    key_check: str = field(init=False, compare=False)
    # HMAC's keyed inner and outer hash states, computed once (RFC 2104): hashing a user id
    # is then two SHA-256 state copies instead of re-deriving the pads on every call.
    _inner: Any = field(init=False, repr=False, compare=False)
    _outer: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.key) < MIN_KEY_BYTES:
            raise PrivacyError(
                f"the pseudonym key {self.key_id!r} has {len(self.key)} bytes; use at least "
                f"{MIN_KEY_BYTES} random bytes (e.g. `openssl rand -hex 32`)"
            )
        key = self.key if len(self.key) <= _BLOCK else hashlib.sha256(self.key).digest()
        key = key.ljust(_BLOCK, b"\0")
        object.__setattr__(self, "_inner", hashlib.sha256(key.translate(_IPAD)))
        object.__setattr__(self, "_outer", hashlib.sha256(key.translate(_OPAD)))
        check = self._hmac(KEY_CHECK_MESSAGE)[:KEY_CHECK_BYTES].hex()
        object.__setattr__(self, "key_check", check)

    def _hmac(self, message: bytes) -> bytes:
        inner = self._inner.copy()
        inner.update(message)
        outer = self._outer.copy()
        outer.update(inner.digest())
        digest: bytes = outer.digest()
        return digest

    def __repr__(self) -> str:  # never show the key
        return f"Pseudonymizer(key_id={self.key_id!r})"

    def pseudonym(self, user_id: str | int) -> bytes:
        """HMAC-SHA256(key, user id), truncated: identical to ``hmac.digest(key, id, "sha256")``."""
        inner = self._inner.copy()
        inner.update(canonical_user_id(user_id))
        outer = self._outer.copy()
        outer.update(inner.digest())
        digest: bytes = outer.digest()
        return digest[:PSEUDONYM_BYTES]

    def pseudonyms(self, user_ids: Iterable[str | int]) -> bytes:
        """:meth:`pseudonym` of each id, concatenated (16 bytes each, in order): the same
        HMAC, with the per-call lookups done once for a batch's distinct users."""
        return self.pseudonyms_of_canonical(canonical_user_ids(user_ids))

    def pseudonyms_of_canonical(self, canonical_ids: Iterable[bytes]) -> bytes:
        """:meth:`pseudonym` of each id given as its :func:`canonical_user_ids` bytes, the
        pseudonyms concatenated (a batch: the per-call lookups done once)."""
        inner_copy, outer_copy = self._inner.copy, self._outer.copy
        digests = []
        for raw in canonical_ids:
            inner = inner_copy()
            inner.update(raw)
            outer = outer_copy()
            outer.update(inner.digest())
            digests.append(outer.digest())
        # Each digest truncated to its first PSEUDONYM_BYTES, all at once.
        whole = np.frombuffer(b"".join(digests), dtype=np.uint8).reshape(-1, _DIGEST_BYTES)
        return whole[:, :PSEUDONYM_BYTES].tobytes()


@dataclass(frozen=True)
class KeyRing:
    """The current key and, during a rotation, the previous one with the switch-over instant."""

    current: Pseudonymizer
    previous: Pseudonymizer | None = None
    rotate_at_s: float | None = None

    def __post_init__(self) -> None:
        if (self.previous is None) != (self.rotate_at_s is None):
            raise PrivacyError("a key rotation needs both the previous key and rotate_at")

    def for_window(self, window_start_s: float) -> Pseudonymizer:
        """The key of a window: one key for all of its pseudonyms."""
        if (
            self.previous is not None
            and self.rotate_at_s is not None
            and (window_start_s < self.rotate_at_s)
        ):
            return self.previous
        return self.current

    @property
    def keys(self) -> list[Pseudonymizer]:
        """Every key held: the current one, then the previous one of a rotation."""
        return [self.current] if self.previous is None else [self.current, self.previous]
