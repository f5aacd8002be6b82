"""Per (window, source partition): at most k events per user, a uniform sample — as columns.

Contribution bounding (docs/privacy.md#bounding) keeps, per
(window, user), at most ``k`` of the user's events, chosen uniformly at random among all of
them. This is the bottom-k form of reservoir sampling: every event gets an independent
uniform random 64-bit *priority*, and a user keeps the k events of smallest priority. The
kept set is a uniformly random k-subset of the user's events (all orders of the priorities
are equally likely; two equal priorities, probability below n²/2⁶⁵ for a user's n events,
fall back to arrival order), never "the first k". Bottom-k samples merge exactly: the
bottom k of the union of two samples is the bottom k of all the events (so one user's
events arriving in many batches, or from several partitions, are bounded once).

Columns, not objects: a row is (pseudonym as two 64-bit words, priority, item) — 28 bytes,
against a Python list per user before. New rows are appended to a buffer; the buffer and the
kept rows are *compacted* (sorted by user, then priority; the first k of each user kept)
when the buffer has grown as large as what is kept (at least :data:`COMPACT_MIN_ROWS`), and
at :meth:`UserSamples.sample`. Sorting is numpy's: the per-event interpreted work is nil.

Which events are kept may come from a fast PRNG (numpy's Generator) seeded from the OS: any
choice of at most k of a user's own events bounds the sensitivity, so the sampler affects
accuracy, never the privacy guarantee. Noise and partition selection use a CSPRNG elsewhere.

Erasure (issue #18) removes pseudonyms' rows with :meth:`UserSamples.remove_many`: a batch
of erased users in one mask per part, without sorting again (issue #28: a re-sort per user
took 199 s for 200 erasures on a 2M-row window).
"""

from __future__ import annotations

import os
import random  # only the type of a seed for the sampling generator (see new_sampling_generator)
from collections.abc import Sequence

import numpy as np

from stream_dp.privacy.pseudonymize import PSEUDONYM_BYTES

#: The buffer is compacted once it holds at least this many rows and as many as are kept.
COMPACT_MIN_ROWS = 1 << 18

_I32 = np.int32

#: The type of the sampling PRNG (which kept events, which L0 keys — never a DP draw).
SamplingGenerator = np.random.Generator  # a type only, so noqa: S311


def new_sampling_generator(seed_from: random.Random | None = None) -> SamplingGenerator:
    """The fast PRNG that picks kept events (priorities, L0 keys): seeded from the OS, or,
    for reproducible tests, from ``seed_from``."""
    seed = os.urandom(16) if seed_from is None else seed_from.getrandbits(128).to_bytes(16)
    # Not a DP draw: any choice of a user's own events bounds the sensitivity (module doc).
    return np.random.default_rng(int.from_bytes(seed))  # not DP, so noqa: S311


def pseudonym_words(pseudonyms: bytes, n: int) -> np.ndarray:
    """n concatenated 16-byte pseudonyms as an (n, 2) array of 64-bit words."""
    if len(pseudonyms) != n * PSEUDONYM_BYTES:
        raise ValueError(f"expected {n} pseudonyms of {PSEUDONYM_BYTES} bytes")
    return np.frombuffer(pseudonyms, dtype=np.uint64).reshape(n, 2)


def _by_user_then_priority(hi: np.ndarray, priorities: np.ndarray) -> np.ndarray | None:
    """The rows' order by first word, then priority — what a sort by priority then a stable
    sort by first word give — from two unstable sorts (numpy's vectorised quicksort: a
    stable sort of 2,000,000 words took 3.5 times as long): by first word, then by one
    64-bit key per row, the word's rank in its high bits and the priority's high bits below.
    None when two rows of one word share their key (their priorities' high bits; about
    m² / 2^(65 - b) for a word's m rows, b the bits of the rank): the caller sorts as before."""
    by_word = np.argsort(hi)
    sorted_hi = hi[by_word]
    new_word = np.empty(len(hi), dtype=bool)
    new_word[0] = True
    np.not_equal(sorted_hi[1:], sorted_hi[:-1], out=new_word[1:])
    rank = np.cumsum(new_word, dtype=np.uint64) - np.uint64(1)
    bits = int(rank[-1]).bit_length()
    if bits >= 32:
        return None
    key = priorities[by_word]
    if bits:
        key = (rank << np.uint64(64 - bits)) | (key >> np.uint64(bits))
    within = np.argsort(key)
    sorted_key = key[within]
    if (sorted_key[1:] == sorted_key[:-1]).any():
        return None
    order: np.ndarray = by_word[within]
    return order


class UserSamples:
    """At most k events per user of one window and source partition, as columns."""

    __slots__ = ("_buffer", "_buffered", "_dropped", "_kept", "_rng", "events_seen", "k")

    def __init__(self, k: int, rng: SamplingGenerator | None = None) -> None:
        if k < 1:
            raise ValueError("max_contributions_per_window must be at least 1")
        self.k = k
        self._rng = rng if rng is not None else new_sampling_generator()
        #: Compacted rows: (words (n, 2), priorities, items), sorted by user then priority.
        self._kept: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._buffer: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._buffered = 0
        #: Per user whose events compaction left out: (words (m, 2), how many), so that an
        #: erasure knows how many of the user's events were seen.
        self._dropped: tuple[np.ndarray, np.ndarray] | None = None
        self.events_seen = 0

    # -- adding ---------------------------------------------------------------------------
    def add_many(self, pseudonyms: Sequence[bytes], items: Sequence[int]) -> None:
        """Offer events (pseudonym, item), one per position."""
        if len(pseudonyms) != len(items):
            raise ValueError("one item per pseudonym")
        if not items:
            return
        words = pseudonym_words(b"".join(pseudonyms), len(items))
        self.add_columns(words, np.asarray(items, dtype=_I32))

    def add_columns(self, words: np.ndarray, items: np.ndarray) -> None:
        """Offer events as columns: pseudonyms (n, 2) uint64 and items (n,) int32."""
        n = len(items)
        if n == 0:
            return
        priorities = self._rng.bit_generator.random_raw(n)
        self._buffer.append((words, priorities, items.astype(_I32, copy=False)))
        self._buffered += n
        self.events_seen += n
        kept = 0 if self._kept is None else len(self._kept[2])
        if self._buffered >= max(COMPACT_MIN_ROWS, kept):
            self._compact()

    # -- compaction -----------------------------------------------------------------------
    def _rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        parts = ([self._kept] if self._kept is not None else []) + self._buffer
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return np.zeros((0, 2), np.uint64), np.zeros(0, np.uint64), np.zeros(0, _I32)
        return (
            np.concatenate([p[0] for p in parts]),
            np.concatenate([p[1] for p in parts]),
            np.concatenate([p[2] for p in parts]),
        )

    def _compact(self) -> None:
        """Keep the k smallest priorities of each user; rows sorted by user, priority."""
        words, priorities, items = self._rows()
        self._buffer = []
        self._buffered = 0
        n = len(items)
        if n == 0:
            self._kept = (words, priorities, items)
            return
        hi, lo = words[:, 0], words[:, 1]
        order = _by_user_then_priority(hi, priorities)
        if order is None:
            # By priority, then stably by the first word: runs of one word in priority order.
            order = np.argsort(priorities)
            order = order[np.argsort(hi[order], kind="stable")]
        shi, slo = hi[order], lo[order]
        same_hi = shi[1:] == shi[:-1]
        if not np.array_equal(slo[1:][same_hi], slo[:-1][same_hi]):
            # Two pseudonyms share their first 8 bytes (about 2⁻⁶⁴ per pair): sort by both.
            order = np.lexsort((priorities, lo, hi))
            shi, slo = hi[order], lo[order]
            same_hi = (shi[1:] == shi[:-1]) & (slo[1:] == slo[:-1])
        starts = np.flatnonzero(np.concatenate(([True], ~same_hi)))
        run = np.cumsum(np.concatenate(([True], ~same_hi))) - 1
        rank = np.arange(n) - starts[run]
        over = rank >= self.k
        if over.any():
            self._note_dropped(words[order[over]])
        order = order[~over]
        self._kept = (words[order], priorities[order], items[order])

    def _note_dropped(self, words: np.ndarray) -> None:
        """Count, per user, events compaction left out (their rows are gone). ``words``
        come from :meth:`_compact`, grouped by user and sorted by (first, second) word: the
        counts are the lengths of its runs, users in np.unique's order. Merging them with
        the counts of an earlier compaction takes np.unique."""
        n = len(words)
        new_user = np.empty(n, dtype=bool)
        new_user[0] = True
        np.not_equal(words[1:, 0], words[:-1, 0], out=new_user[1:])
        new_user[1:] |= words[1:, 1] != words[:-1, 1]
        firsts = np.flatnonzero(new_user)
        users, counts = words[firsts], np.diff(firsts, append=n).astype(np.int64)
        if self._dropped is not None:
            both, inverse = np.unique(
                np.concatenate([self._dropped[0], users]), axis=0, return_inverse=True
            )
            weights = np.concatenate([self._dropped[1], counts])
            users = both
            counts = np.bincount(inverse.reshape(-1), weights=weights).astype(np.int64)
        self._dropped = (users, counts)

    def sample(self) -> tuple[np.ndarray, np.ndarray]:
        """(user index, item) per kept event: users numbered 0, 1, … and grouped, each
        user's events in uniformly random order. Sealing does not consume the sample."""
        if self._buffer or self._kept is None:
            self._compact()
        assert self._kept is not None
        words = self._kept[0]
        n = len(words)
        if n == 0:
            return np.zeros(0, np.int64), np.zeros(0, _I32)
        new_user = np.empty(n, dtype=bool)
        new_user[0] = True
        np.not_equal(words[1:, 0], words[:-1, 0], out=new_user[1:])
        new_user[1:] |= words[1:, 1] != words[:-1, 1]
        return np.cumsum(new_user) - 1, self._kept[2]

    # -- state ----------------------------------------------------------------------------
    @property
    def users(self) -> int:
        words = self._rows()[0]
        return 0 if len(words) == 0 else len(np.unique(words, axis=0))

    @property
    def events_retained(self) -> int:
        return len(self.sample()[1])

    def item_ids(self) -> np.ndarray:
        """Every item held (kept or buffered, with repeats)."""
        return self._rows()[2]

    def remap(self, mapping: np.ndarray) -> None:
        """Renumber items: ``mapping[old]`` is the new id (the caller compacted its table)."""
        if self._kept is not None:
            w, p, i = self._kept
            self._kept = (w, p, mapping[i].astype(_I32))
        self._buffer = [(w, p, mapping[i].astype(_I32)) for w, p, i in self._buffer]

    def remove(self, pseudonym: bytes) -> int:
        """Forget one user entirely (an erasure): :meth:`remove_many` of one pseudonym."""
        return self.remove_many(pseudonym_words(pseudonym, 1))

    def remove_many(self, erased: np.ndarray) -> int:
        """Forget every user of ``erased`` (pseudonyms as an (m, 2) array of 64-bit words)
        entirely — a batch of erasures: the samples are then what they would be had those
        users sent nothing; every other user's sample is their own. One mask over the user
        column, one compaction of each part: kept rows stay sorted (a subset of a sorted
        run is sorted), so nothing is sorted again. Returns how many of the users' events
        had been seen in all (0: none)."""
        if len(erased) == 0:
            return 0
        erased = np.unique(np.ascontiguousarray(erased, dtype=np.uint64).reshape(-1, 2), axis=0)
        seen = 0
        if self._kept is not None:
            words, priorities, items = self._kept
            mine = _rows_of(words, erased)
            if mine.any():
                seen += int(mine.sum())
                keep = ~mine
                self._kept = (words[keep], priorities[keep], items[keep])
        buffer = []
        for words, priorities, items in self._buffer:
            mine = _rows_of(words, erased)
            if mine.any():
                seen += int(mine.sum())
                keep = ~mine
                words, priorities, items = words[keep], priorities[keep], items[keep]
            if len(items):
                buffer.append((words, priorities, items))
        self._buffer = buffer
        self._buffered = sum(len(part[2]) for part in buffer)
        if self._dropped is not None:
            users, counts = self._dropped
            theirs = _rows_of(users, erased)
            if theirs.any():
                seen += int(counts[theirs].sum())
                self._dropped = (users[~theirs], counts[~theirs])
        self.events_seen -= seen
        return seen

    def nbytes(self) -> int:
        """Bytes held by the columns."""
        parts = ([self._kept] if self._kept is not None else []) + self._buffer
        dropped = 0 if self._dropped is None else sum(a.nbytes for a in self._dropped)
        return sum(a.nbytes for part in parts for a in part) + dropped


def _rows_of(words: np.ndarray, erased: np.ndarray) -> np.ndarray:
    """Mask of the rows of ``words`` (n, 2) whose pseudonym is one of ``erased`` (m, 2).

    First by the first word alone (numpy's sorted membership test on 64-bit integers,
    which runs without the GIL); only the few rows it finds are compared on both words
    (two pseudonyms sharing their first word are distinct users)."""
    mask = np.isin(words[:, 0], erased[:, 0])
    found = np.flatnonzero(mask)
    if len(found):
        mask[found] = np.isin(_as_void(words[found]), _as_void(erased))
    return mask


def _as_void(words: np.ndarray) -> np.ndarray:
    """(n, 2) 64-bit words as n opaque 16-byte values (compared whole)."""
    return np.ascontiguousarray(words, dtype=np.uint64).view(np.dtype((np.void, 16))).ravel()


def per_user_items(users: np.ndarray, items: np.ndarray) -> list[list[int]]:
    """A sample's columns (users numbered 0, 1, … and grouped) as one item list per user."""
    if len(users) == 0:
        return []
    starts = np.flatnonzero(np.diff(users)) + 1
    return [part.tolist() for part in np.split(items, starts)]


def first_k_per_user(users: np.ndarray, items: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """At most k events per user of a sample (:meth:`UserSamples.sample`): each user's
    events come in uniformly random order, so their first k are a uniform k-subset (a
    uniform subsample of a uniform sample of the cap is a uniform sample of all)."""
    if len(users) == 0:
        return users, items
    first = np.concatenate(([0], np.flatnonzero(np.diff(users)) + 1))
    rank = np.arange(len(users)) - first[users]
    keep = rank < k
    return users[keep], items[keep]
