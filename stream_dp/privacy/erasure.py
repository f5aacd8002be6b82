"""The right of erasure for windows not yet released (docs/erasure.md).

An erasure names one user by pseudonym only: the raw id of a request is normalised
(``input.user_id_normalization``) and pseudonymized at once under every key a window it can
affect may use — the current key and, during a rotation, the previous one — and goes no
further. From then on that user's events are removed from every open window and dropped on
arrival, until the erasure expires.

Which windows an erasure affects:

- windows whose release had not begun when the erasure was recorded (the cut-off is exact
  and lives in the release protocol, :mod:`stream_dp.pipeline.stages.erasure_gate`); a released
  window is never recomputed — redrawing its noise would let an observer average the two
  draws (docs/privacy.md#invariant-3), and its values are already differentially private for
  the user;
- windows starting before ``expires_at_s`` (the time it was recorded plus
  ``erasure.retention_s``): the user is counted again in later windows if their events keep
  coming — send a new request then, or stop them at the producer;
- offline (``stream-dp replay``), only windows not yet released when the request was made
  (``applies_from_s``: the first window whose end + grace is after ``requested_at``).

The set in memory is bounded by design: an erasure is forgotten once every window it can
affect is released (:meth:`ErasureSet.forget`), so it holds the requests of about one
``retention_s``, one entry of a few dozen bytes each.

Pure: no Kafka, no asyncio. The worker and replay feed it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from stream_dp.errors import PrivacyError
from stream_dp.privacy.pseudonymize import KeyRing, UserIdNormalization, user_id_normalizer

#: Windows whose erased-pseudonym sets are cached at most (a few are open at a time).
CACHE_WINDOWS = 256


@dataclass(frozen=True, slots=True)
class Erasure:
    """One applied erasure: the user's pseudonym per key id, and the windows it covers."""

    #: Its place in the erasure log (an offset): everything before it is applied first.
    position: int
    #: Pseudonym key id → the user's pseudonym under that key.
    pseudonyms: Mapping[str, bytes]
    #: Windows starting at or after this instant are not affected.
    expires_at_s: float
    #: Windows starting before this instant are not affected (replay; -inf in the worker,
    #: where released windows are simply never recomputed).
    applies_from_s: float = -math.inf

    def covers(self, window_start_s: float) -> bool:
        return self.applies_from_s <= window_start_s < self.expires_at_s


def erasure_pseudonyms(
    user_id: str | int, keyring: KeyRing, normalization: UserIdNormalization
) -> dict[str, bytes]:
    """The pseudonyms of a requested user id under every key of ``keyring``, normalised as
    events are (``" Alice "`` is ``alice``). PrivacyError if nothing is left of the id."""
    if isinstance(user_id, bool) or not isinstance(user_id, str | int):
        raise PrivacyError("an erasure request's user id must be a string or an integer")
    normal = user_id_normalizer(normalization)(user_id)
    if normal == "":
        raise PrivacyError("the erasure request's user id is empty once normalised")
    keys = [keyring.current] + ([keyring.previous] if keyring.previous is not None else [])
    return {key.key_id: key.pseudonym(normal) for key in keys}


@dataclass
class ErasureSet:
    """The erasures in force, by pseudonym key id; ``position`` is how far the erasure log
    has been applied (the next position to read)."""

    position: int = 0
    _erasures: list[Erasure] = field(default_factory=list)
    _cache: dict[tuple[str, int], frozenset[bytes]] = field(default_factory=dict)
    _hex_cache: dict[tuple[str, int], frozenset[str]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self._erasures)

    def add(self, erasure: Erasure) -> None:
        """Take in one erasure read at ``erasure.position`` (in log order)."""
        self._erasures.append(erasure)
        self.advance(erasure.position + 1)
        self._cache.clear()
        self._hex_cache.clear()

    def advance(self, position: int) -> None:
        """Everything before ``position`` has been read (fences included)."""
        self.position = max(self.position, position)

    def erased(self, key_id: str, window_start_s: int) -> frozenset[bytes]:
        """Pseudonyms (under ``key_id``) whose events the window must not hold."""
        ident = (key_id, window_start_s)
        found = self._cache.get(ident)
        if found is None:
            if len(self._cache) >= CACHE_WINDOWS:  # windows pass: keep the cache small
                self._cache.clear()
                self._hex_cache.clear()
            found = self._cache[ident] = frozenset(
                p
                for e in self._erasures
                if e.covers(window_start_s) and (p := e.pseudonyms.get(key_id)) is not None
            )
        return found

    def erased_hex(self, key_id: str, window_start_s: int) -> frozenset[str]:
        """:meth:`erased` as hex strings (stage 0 keys records by hex pseudonyms)."""
        ident = (key_id, window_start_s)
        found = self._hex_cache.get(ident)
        if found is None:
            found = self._hex_cache[ident] = frozenset(
                p.hex() for p in self.erased(key_id, window_start_s)
            )
        return found

    def required_position(self, window_start_s: int) -> int:
        """The erasure-log position a window's partials must have applied to be released:
        one past the last erasure that covers the window (0 when none does)."""
        positions = [e.position for e in self._erasures if e.covers(window_start_s)]
        return max(positions) + 1 if positions else 0

    def forget(self, released_before_s: float) -> int:
        """Forget erasures whose every window is released (every window starting before
        ``released_before_s`` is): they can never matter again. Returns how many went."""
        kept = [e for e in self._erasures if e.expires_at_s > released_before_s]
        gone = len(self._erasures) - len(kept)
        if gone:
            self._erasures = kept
            self._cache.clear()
            self._hex_cache.clear()
        return gone
