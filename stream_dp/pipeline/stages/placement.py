"""Which partition a record belongs on: the checks that make keyed input safe, not trusted.

A user's events must all sit on one partition of the stage-1 topic, or bounding per
partition bounds the user once per partition (docs/privacy.md#invariant-2). Producers that key
by user id put them there only if every producer uses the same partitioner and the topic's
partition count does not change; nothing guarantees either. So stage 1 recomputes, for
every keyed record, the partition its key maps to under the configured partitioner and the
partition count of the record's window, and dead-letters a record found elsewhere
(``misplaced_key``). Repartitioned records are placed by stage 0 with
:func:`pseudonym_partition` and checked the same way.

Partitions added to keyed input (:class:`SourceLayout`): producers place a user's events
under the partition count *they* last read. When partitions are added, records of the
windows already begun were mostly placed under the old count, and records of later windows,
once the producers refreshed their metadata, under the new one. A window checked against
the new count would dead-letter its correctly placed records; one that accepted either count
would hold a user on two partitions — the old home and the new — bounded once on each.

So each window has one count: windows begun (by event time) when the worker saw the change
keep the count before it, later windows take the new one. A record is accepted only on the
partition its key maps to under its window's count, and every partial carries that count
(its layout): stage 2 merges one layout per window, so a worker that drew the line
elsewhere (it started after the change, or saw it later) has its partials of the window left
out (``partials_ignored{reason="layout_changed"}``), never added to the other layout's.

A restarted worker replays the records of the windows still open from the committed
offsets: it must check them under the count in force for their window, not the count it
finds at start. So the layout travels with the committed offsets of the stage-1 topic
(:meth:`SourceLayout.to_metadata`, a commit's metadata) and a worker taking those
partitions restores it (:meth:`SourceLayout.restore`) before it reads a record: the line
stays where the worker that saw the change drew it. A count that changed while no worker
ran (the committed count is not the one found) keeps the windows the last commit had met
under the committed count.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Literal

import numpy as np
import orjson

from stream_dp.kafka_client.partitioner import murmur2

Partitioner = Literal["murmur2", "crc32"]


def murmur2_partition(key: bytes, partitions: int) -> int:
    """Kafka's Java client (and aiokafka, librdkafka's ``murmur2_random``): positive
    murmur2 of the key modulo the partition count."""
    digest: int = murmur2(key)
    return (digest & 0x7FFFFFFF) % partitions


def crc32_partition(key: bytes, partitions: int) -> int:
    """librdkafka's default ``consistent_random`` (and ``consistent``) for non-empty keys:
    CRC-32 of the key modulo the partition count."""
    return zlib.crc32(key) % partitions


def partition_function(name: Partitioner) -> Callable[[bytes, int], int]:
    return murmur2_partition if name == "murmur2" else crc32_partition


def pseudonym_partition(pseudonym: bytes, partitions: int) -> int:
    """The repartition topic's partition of a pseudonym: its first 8 bytes, which are
    uniform (HMAC output), modulo the partition count."""
    return int.from_bytes(pseudonym[:8], "big") % partitions


_M = np.uint32(0x5BD1E995)
_SEED = 0x9747B28C


def murmur2_partitions(keys: Sequence[bytes], partitions: int) -> np.ndarray:
    """:func:`murmur2_partition` of many keys at once (numpy, 32-bit words; keys of one
    length hashed together): the same values, without a Python loop per byte."""
    out = np.empty(len(keys), dtype=np.int64)
    if not keys:
        return out
    lengths = np.fromiter(map(len, keys), np.int64, len(keys))
    one_length = bool(lengths.min() == lengths.max())
    for length in [int(lengths[0])] if one_length else np.unique(lengths).tolist():
        where = np.arange(len(keys)) if one_length else np.flatnonzero(lengths == length)
        group = keys if one_length else [keys[i] for i in where.tolist()]
        raw = np.frombuffer(b"".join(group), dtype=np.uint8).reshape(len(where), length)
        # The key's 4-byte words, little-endian (murmur2's reads), one column each.
        words = raw[:, : length & ~3].copy().view("<u4")
        with np.errstate(over="ignore"):
            h = np.full(len(where), (_SEED ^ length) & 0xFFFFFFFF, dtype=np.uint32)
            for i in range(length // 4):
                k = words[:, i].astype(np.uint32)
                k = k * _M
                k ^= k >> 24
                k = k * _M
                h = h * _M
                h ^= k
            tail = length & ~3
            extra = length % 4
            data = raw[:, tail:].astype(np.uint32)  # the last length % 4 bytes
            if extra >= 3:
                h ^= data[:, 2] << 16
            if extra >= 2:
                h ^= data[:, 1] << 8
            if extra >= 1:
                h ^= data[:, 0]
                h = h * _M
            h ^= h >> 13
            h = h * _M
            h ^= h >> 15
        out[where] = (h & np.uint32(0x7FFFFFFF)).astype(np.int64) % partitions
    return out


def crc32_partitions(keys: Sequence[bytes], partitions: int) -> np.ndarray:
    """:func:`crc32_partition` of many keys (zlib per key: already C)."""
    return np.fromiter((zlib.crc32(k) % partitions for k in keys), np.int64, len(keys))


def partitions_function(name: Partitioner) -> Callable[[Sequence[bytes], int], np.ndarray]:
    return murmur2_partitions if name == "murmur2" else crc32_partitions


def pseudonym_partitions(pseudonyms: bytes, partitions: int) -> np.ndarray:
    """:func:`pseudonym_partition` of concatenated 16-byte pseudonyms."""
    first = np.frombuffer(pseudonyms, dtype=">u8")[::2]
    return (first % np.uint64(partitions)).astype(np.int64)


#: How many earlier counts a commit's metadata carries (the latest ones).
KEPT_LAYOUTS = 8


class SourceLayout:
    """Per window, the partition count its keyed records are checked and sealed under."""

    def __init__(self, window_size_s: int) -> None:
        self.window_size_s = window_size_s
        #: (first window start *not* under it, count), oldest first: windows starting before
        #: the first ``until`` take its count, and so on; later ones the current count.
        self.earlier: list[tuple[int, int]] = []
        #: The latest window start this worker's stage 1 met (event time), or None.
        self.latest_window_s: int | None = None

    def saw(self, window_start_s: int) -> None:
        """A window met by stage 1 (begun, in event time)."""
        if self.latest_window_s is None or window_start_s > self.latest_window_s:
            self.latest_window_s = window_start_s

    def grow(self, before: int, now_s: float) -> int:
        """The count grew from ``before``: windows begun so far (the latest one met, else
        the wall clock's) keep it. Returns the first window start under the new count."""
        size = self.window_size_s
        latest = self.latest_window_s
        if latest is None:
            latest = math.floor(now_s / size) * size
        until = latest + size
        if not self.earlier or until > self.earlier[-1][0]:
            self.earlier.append((until, before))
        return until

    def count_for(self, window_start_s: int, current: int) -> int:
        """The partition count the window is checked and sealed under."""
        for until, count in self.earlier:
            if window_start_s < until:
                return count
        return current

    def to_metadata(self, current: int) -> str:
        """The layout as a commit's metadata (JSON, well under Kafka's 4096-byte default
        ``offset.metadata.max.bytes``): ``current``, the count of the windows after the
        earlier ones, the earlier counts (the latest :data:`KEPT_LAYOUTS`) and the latest
        window met."""
        return orjson.dumps(
            {
                "layout": 1,
                "count": current,
                "earlier": self.earlier[-KEPT_LAYOUTS:],
                "latest": self.latest_window_s,
            }
        ).decode()

    def restore(self, committed: Iterable[str], current: int) -> list[tuple[int, int]]:
        """Take the layout committed with the offsets a restarted worker replays from
        (``committed``: the metadata of each partition's commit; those of other writers or
        versions are skipped) before it checks any record, ``current`` being the count
        found now. Returns the (until, count) entries that were not known here."""
        added: list[tuple[int, int]] = []
        for text in committed:
            try:
                saved = orjson.loads(text) if text else None
                if not isinstance(saved, dict) or saved.get("layout") != 1:
                    continue
                entries = [(int(u), int(n)) for u, n in saved["earlier"]]
                count, latest = int(saved["count"]), saved["latest"]
                if count != current and latest is not None:
                    # changed while no worker ran: the windows met keep the committed count
                    entries.append((int(latest) + self.window_size_s, count))
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                continue
            for entry in entries:
                if entry not in self.earlier and entry not in added and entry[0] > 0:
                    added.append(entry)
        if added:
            merged = sorted(set(self.earlier) | set(added))
            # one count per window: where two entries overlap, the earlier `until` rules
            self.earlier = [e for i, e in enumerate(merged) if i == 0 or e[0] > merged[i - 1][0]]
        return added

    @property
    def changed(self) -> bool:
        """Whether some window is under another count than the current one."""
        return bool(self.earlier)
