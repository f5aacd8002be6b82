"""Stage 1 record by record: the per-record path of :class:`IngestStage`.

:class:`~stream_dp.pipeline.stages.ingest.IngestStage` (``ingest.py``) holds the collaborators,
sealing and erasure; :class:`~stream_dp.pipeline.stages.ingest_columns.ColumnPath` takes a fetched
batch as columns when it can. :meth:`RecordPath.ingest` is the entry point of stage 1:
it hands a batch of good raw events to the column path and packed repartition records to
:meth:`~stream_dp.pipeline.stages.ingest_columns.ColumnPath.ingest_packed`, and takes every
other batch record by record — decoding, the placement and key checks of keyed input,
re-sent and misplaced repartitioned records, late and replayed windows — with the same
result the column paths give.

:meth:`RecordPath._ingest_records` is the stage's tuned hot loop: the per-window lookups
(:meth:`~stream_dp.pipeline.stages.ingest_columns.ColumnPath.fate`,
:meth:`RecordPath._open_window`) redone only when the window changes, a window's events handed
to its samples in runs, and a keyed record's key compared with its user's key as checked once per
user and batch (:meth:`RecordPath._check_key`). Its other pieces run once per batch
(:meth:`RecordPath._finish_batch`: the watermark and the drop counters), per bad record (the
dead letters), or per record of the repartition topic (:meth:`RecordPath._decode_routed`:
stage 0 writes packed records of many events each; one JSON record per event comes only from
earlier versions and :meth:`route`, which costs that format a call per event).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import orjson

from stream_dp.pipeline.formats.decode import BadRecord
from stream_dp.pipeline.formats.packed import PACKED_KIND, decode_binary, decode_events, is_binary
from stream_dp.pipeline.stages.ingest_columns import (
    ACCEPT,
    LATE,
    REPLAYED,
    ColumnPath,
    DeadLetter,
    InputRecord,
    WindowPart,
    pseudonym_of,
)
from stream_dp.pipeline.stages.placement import pseudonym_partition
from stream_dp.privacy.group_values import canonical_value
from stream_dp.privacy.pseudonymize import UserIdNormalization, user_id_normalizer

__all__ = ["RecordPath", "user_key"]

log = logging.getLogger(__name__)


def user_key(user: str | int, normalization: UserIdNormalization = "none") -> bytes:
    """The Kafka record key a producer keying by user id writes for this user: the id as
    normalised by ``input.user_id_normalization`` (pass it), integers in decimal."""
    normal = user_id_normalizer(normalization)(user)
    return (normal if isinstance(normal, str) else str(normal)).encode()


def _not_keyed_detail(normalization: UserIdNormalization) -> str:
    if normalization == "none":
        expected = "its user id"
    else:
        expected = (
            f"its user id as input.user_id_normalization ({normalization}) normalises it "
            "(Unicode NFKC, case-folded, surrounding whitespace removed)"
        )
    return (
        f"input.keyed_by_user is true but the record key is not {expected}: key records by "
        "the normalised user id, or set input.keyed_by_user: false to repartition"
    )


#: No erased pseudonyms (erasure off, or none covers the window).
_NONE_ERASED: frozenset[Any] = frozenset()
#: Not in a batch's cache of checked record keys (compares unequal to every key, None too).
_UNCHECKED: Final = object()

#: One repartitioned event: source partition and offset, time, event, pseudonym, and its
#: key: key id (None in records from before key ids) and check value ("": before those).
_RoutedEvent = tuple[int, int, float, dict[str, Any], bytes, tuple[str | None, str]]


def _offer(
    part: WindowPart | None, pseudonyms: list[bytes], items: list[int], arrived: int
) -> None:
    """A run of one window's events: all that arrived counted (erased users' included:
    :meth:`~stream_dp.pipeline.stages.ingest_columns.WindowStore.held_bytes`), the others
    offered to the samples."""
    if arrived:
        assert part is not None
        part.events_arrived += arrived
        part.samples.add_many(pseudonyms, items)


@dataclass(slots=True)
class _BatchOutcome:
    """What :meth:`RecordPath._ingest_records` leaves for the metrics and the watermark."""

    dead: list[DeadLetter]
    marks: list[tuple[int, float | None, float]]
    max_time: float | None
    late: int
    skipped: int
    duplicates: int
    stale_key: int
    #: Every event of an accepted window, erased users' too, as its signature id: what the
    #: queries' drop counters count (before the erasure filter and the bounds).
    window_items: list[int]


class RecordPath:
    """Stage 1's entry point and per-record path, over the column paths (:class:`ColumnPath`:
    the window fates, drop counters and dead letters they share) and the stage's
    collaborators they hold."""

    def __init__(self, columns: ColumnPath) -> None:
        self.columns = columns
        self.keyring = columns.keyring
        self.metrics = columns.metrics
        self.form = columns.form
        self.store = columns.store
        self.sources = columns.sources
        self.windows = columns.windows
        self.erasures = columns.erasures
        self.enforce_user_keys = columns.enforce_user_keys
        self._dead = columns.dead

    def ingest(
        self,
        partition: int,
        records: Sequence[InputRecord],
        *,
        now_s: float,
        now_mono_s: float,
        routed: bool = False,
        topic: str | None = None,
    ) -> list[DeadLetter]:
        """Window and bound one partition's batch of (offset, key, value).

        ``routed``: the records come from the repartition topic (``topic``; pseudonymized
        and validated by :meth:`route`); otherwise they are raw input, decoded here.
        """
        if not records:
            return []
        if not routed and self.columns.ingest_columns(partition, records, now_s, now_mono_s):
            return []
        if not routed:
            self.metrics.events_consumed.inc(len(records))
        outcome = self._ingest_records(partition, records, now_s, routed, topic)
        self.store.positions[partition] = records[-1][0] + 1
        self._finish_batch(partition, outcome, now_s, now_mono_s, routed)
        return outcome.dead

    def _ingest_records(
        self,
        partition: int,
        records: Sequence[InputRecord],
        now_s: float,
        routed: bool,
        topic: str | None,
    ) -> _BatchOutcome:
        """Decode (raw) or check (routed), drop late or replayed, offer to the samples."""
        decode = self.form.decoder.decode_parts
        check_keys = self.enforce_user_keys and not routed
        n_partitions = self.sources.source_partitions
        size = self.windows.size_s
        fields = self.form.fields
        normalize = self.form.normalize
        only_field = fields[0] if len(fields) == 1 else None
        signatures = self.store.signatures
        signature_ids = self.store.signature_ids
        state = self.store.parts.setdefault(partition, {})
        seen = self.store.routed_seen.setdefault(partition, {}) if routed else {}
        # Routed records interleave input partitions, each at its own pace: the watermark is
        # the slowest one's, as stage 0's progress marks (each after its records) report it.
        marks: list[tuple[int, float | None, float]] = []
        # Raw ids live only in these batch-local caches (never in state): per key id, the
        # pseudonyms; the record key of a user once checked (keyed input).
        pseudonyms: dict[str, dict[str | int, bytes]] = {}
        checked_keys: dict[tuple[str | int, int], bytes | None] = {}
        count_for = self.sources.layout.count_for
        include_payload = self.form.include_payload
        dead: list[DeadLetter] = []
        dropped = [0, 0, 0]  # by fate: LATE, REPLAYED (ACCEPT unused)
        duplicates = stale_key = 0
        max_time: float | None = None
        # Events arrive mostly in event-time order: the per-window lookups (fate, _open_window)
        # are redone only when the window changes; a window's events go to its samples in runs.
        current_ws: int | None = None
        fate = ACCEPT
        part: WindowPart | None = None
        cache: dict[str | int, bytes] = {}
        window_key = ("", "")
        pseudonymize: Callable[[str | int], bytes] | None = None
        run_pseudonyms: list[bytes] = []
        run_items: list[int] = []
        sids: list[int] = []  # accepted windows' events, erased too (see _BatchOutcome)
        run_start = 0  # a run's arrivals (WindowPart.events_arrived): len(sids) - run_start
        erased: frozenset[bytes] = _NONE_ERASED
        for offset, key, value in records:
            pseudonym: bytes | None
            record_key: tuple[str | None, str] | None = None
            if routed:
                event = self._decode_routed(partition, offset, value, topic, seen, marks, dead)
                if event is None:
                    continue
                src_partition, src_offset, t, obj, pseudonym, record_key = event
                if pseudonym_partition(pseudonym, n_partitions) != partition:
                    dead.append(self._misplaced(partition, offset, value, include_payload, topic))
                    continue
                if src_offset <= seen.get(src_partition, -1):
                    duplicates += 1
                    continue
                seen[src_partition] = src_offset
                user: str | int = ""
            else:
                parsed = decode(value, now_s)
                if isinstance(parsed, BadRecord):
                    dead.append(self._dead(parsed, partition, offset, value, include_payload))
                    continue
                user, t, obj = parsed
                if check_keys:  # placed under the partition count of the record's window
                    place = (partition, count_for(math.floor(t / size) * size, n_partitions))
                    if key != checked_keys.get((user, place[1]), _UNCHECKED):
                        letter = self._check_key(user, key, place, offset, value, include_payload)
                        if letter is not None:
                            dead.append(letter)
                            continue
                        checked_keys[user, place[1]] = key
                pseudonym = None
            ws = math.floor(t / size) * size
            if ws != current_ws:
                _offer(part, run_pseudonyms, run_items, len(sids) - run_start)
                run_pseudonyms, run_items, run_start = [], [], len(sids)
                current_ws = ws
                fate = self.columns.fate(partition, ws)
                if fate == ACCEPT:
                    part, window_key, cache, pseudonymize, erased = self._open_window(
                        state, ws, offset, pseudonyms
                    )
            if fate != ACCEPT:
                dropped[fate] += 1
                continue
            if record_key is not None and record_key != window_key:
                # Another key id than the window's (a rotation moved while it was open), or
                # another secret under it (or none: a worker before key checks): never taken.
                stale_key += self._stale(record_key, window_key, partition, offset, topic, dead)
                continue
            sig = (obj.get(only_field),) if only_field is not None else tuple(map(obj.get, fields))
            sid = signature_ids.get(sig)
            if sid is None:
                sid = signature_ids[sig] = len(signatures)
                signatures.append(sig)
            if pseudonym is None:
                pseudonym = cache.get(user)
                if pseudonym is None:
                    assert pseudonymize is not None
                    pseudonym = cache[user] = pseudonym_of(user, normalize, pseudonymize)
                if not pseudonym:
                    dead.append(
                        self._dead(self.form.empty_user, partition, offset, value, include_payload)
                    )
                    continue
            sids.append(sid)  # before the erasure filter: arrivals and drops count the erased too
            if max_time is None or t > max_time:
                max_time = t
            if erased and pseudonym in erased:
                continue  # erased: never enters a reservoir (no count)
            run_pseudonyms.append(pseudonym)
            run_items.append(sid)
        _offer(part, run_pseudonyms, run_items, len(sids) - run_start)
        late, skipped = dropped[LATE], dropped[REPLAYED]
        return _BatchOutcome(dead, marks, max_time, late, skipped, duplicates, stale_key, sids)

    def _decode_routed(
        self,
        partition: int,
        offset: int,
        value: bytes | None,
        topic: str | None,
        seen: dict[int, int],
        marks: list[tuple[int, float | None, float]],
        dead: list[DeadLetter],
    ) -> _RoutedEvent | None:
        """One record of the repartition topic: an event, or None for a packed record
        (ingested whole), a progress mark (added to ``marks``) or a malformed record
        (dead-lettered)."""
        try:
            if is_binary(value):  # what stage 0 writes
                packed = decode_binary(value, self.form.fields)
                dead.extend(self.columns.ingest_packed(partition, offset, packed, topic, seen))
                return None
            body = orjson.loads(value or b"null")
            if type(body) is dict and body.get("kind") == PACKED_KIND:  # earlier versions
                packed = decode_events(body, self.form.fields)
                dead.extend(self.columns.ingest_packed(partition, offset, packed, topic, seen))
                return None
            src_partition, src_offset = body["src"]
            if "u" not in body:  # a progress mark of one input partition
                mark_t = body["t"]
                marks.append(
                    (
                        int(src_partition),
                        None if mark_t is None else float(mark_t),
                        float(body["idle_s"]),
                    )
                )
                return None
            t = float(body["t"])
            obj = body["e"]
            pseudonym = bytes.fromhex(body["u"])
            stamped_key = body.get("k")  # absent in records of earlier versions
            record_key_id = None if stamped_key is None else str(stamped_key)
            record_key_check = str(body.get("c", ""))  # "": from before key checks
            if type(obj) is not dict or not math.isfinite(t) or type(src_offset) is not int:
                raise TypeError("not a repartitioned event")
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            bad = BadRecord(
                "bad_internal_record",
                "not a repartitioned event of this schema (a writer other than stream-dp, "
                "or a format from another version)",
            )
            include_payload = self.form.include_payload
            dead.append(self._dead(bad, partition, offset, value, include_payload, topic))
            return None
        for name in self.form.scalar_fields:  # JSON true/1.0 back to canonical form
            field_value = obj.get(name)
            if isinstance(field_value, bool | float):
                obj[name] = canonical_value(field_value)
        return src_partition, src_offset, t, obj, pseudonym, (record_key_id, record_key_check)

    def _check_key(
        self,
        user: str | int,
        key: bytes | None,
        place: tuple[int, int],
        offset: int,
        value: bytes | None,
        include_payload: bool,
    ) -> DeadLetter | None:
        """Keyed input: the dead letter of a record whose key is not its user's (as
        normalised) or maps to another partition under ``input.partitioner`` and its
        window's partition count (``place``: the record's partition, that count); None if
        it is keyed and placed right."""
        partition, partitions = place
        if key != user_key(user, self.form.normalization):
            bad = BadRecord("not_keyed_by_user", _not_keyed_detail(self.form.normalization))
            return self._dead(bad, partition, offset, value, include_payload)
        assert key is not None
        home = self.form.partition_of_key(key, partitions)
        if home != partition:
            return self._misplaced(partition, offset, value, include_payload, None, partitions)
        return None

    def _stale(
        self,
        record_key: tuple[str | None, str],
        window_key: tuple[str, str],
        partition: int,
        offset: int,
        topic: str | None,
        dead: list[DeadLetter],
    ) -> int:
        """A repartitioned event under another key than its window's: 1 if under another
        key id (a rotation moved while the window was open: dropped as stale); else 0, and
        its dead letter (another secret under the key id, or none: one user must not
        appear under two pseudonyms)."""
        if record_key[0] is not None and record_key[0] != window_key[0]:
            return 1
        dead.append(self.columns.key_check_dead(partition, offset, topic))
        return 0

    def _open_window(
        self,
        state: dict[int, WindowPart],
        window_start_s: int,
        offset: int,
        pseudonyms: dict[str, dict[str | int, bytes]],
    ) -> tuple[
        WindowPart,
        tuple[str, str],
        dict[str | int, bytes],
        Callable[[str | int], bytes],
        frozenset[bytes],
    ]:
        """An accepted window's part (created at ``offset`` if new), its pseudonym key id
        and key check value, the batch's pseudonym cache for that key, the pseudonymizer
        and the erased pseudonyms."""
        part = self.store.part(state, window_start_s, offset)
        pseudonymizer = self.keyring.for_window(window_start_s)
        key_id = pseudonymizer.key_id
        cache = pseudonyms.setdefault(key_id, {})
        erasures = self.erasures
        erased = _NONE_ERASED if erasures is None else erasures.erased(key_id, window_start_s)
        return part, (key_id, pseudonymizer.key_check), cache, pseudonymizer.pseudonym, erased

    def _finish_batch(
        self,
        partition: int,
        outcome: _BatchOutcome,
        now_s: float,
        now_mono_s: float,
        routed: bool,
    ) -> None:
        """The watermark, the drop counters and the gauges after a per-record batch."""
        tracker = self.columns.tracker_of(partition, now_mono_s, routed)
        max_time = outcome.max_time
        if routed:
            for source, t_max, idle_s in outcome.marks:
                tracker.report(source, t_max, idle_s, now_mono_s)
        elif max_time is not None:
            # Only accepted events are activity; one stamped ahead of the clock moves the
            # watermark no further than the clock (it may not close the current window).
            tracker.observe(partition, min(max_time, now_s), now_mono_s)
        metrics = self.metrics
        self.columns.count_drops(np.array(outcome.window_items, dtype=np.int64))
        if outcome.late:
            metrics.late_events.inc(outcome.late)
        if outcome.skipped:
            metrics.replayed_events_skipped.inc(outcome.skipped)
        if outcome.duplicates:
            metrics.repartition_duplicates_skipped.inc(outcome.duplicates)
        other_secret = sum(d.reason == "key_check_mismatch" for d in outcome.dead)
        if other_secret:
            self.columns.log_key_check_mismatch(other_secret, partition)
        if outcome.stale_key:
            metrics.late_events.inc(outcome.stale_key)
            log.warning(
                "dropped %d repartitioned events pseudonymized under another key than their "
                "window's (pseudonymization.rotate_at changed while the window was open)",
                outcome.stale_key,
                extra={"partition": partition},
            )
        self.store.update_gauges()

    def _misplaced(
        self,
        partition: int,
        offset: int,
        value: bytes | None,
        include_payload: bool,
        topic: str | None = None,
        partitions: int | None = None,
    ) -> DeadLetter:
        return self._dead(
            BadRecord("misplaced_key", self.columns.misplaced_detail(partitions)),
            partition,
            offset,
            value,
            include_payload,
            topic,
        )
