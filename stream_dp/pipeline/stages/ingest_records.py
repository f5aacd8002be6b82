"""Stage 1 record by record: the per-record path of :class:`IngestStage`.

:class:`~stream_dp.pipeline.stages.ingest.IngestStage` (``ingest.py``) holds the state, sealing and
erasure; :class:`~stream_dp.pipeline.stages.ingest_columns.ColumnIngest` takes a fetched batch as
columns when it can. This mixin is :meth:`RecordIngest.ingest`, the entry point of stage 1:
it hands a batch of good raw events to the column path and packed repartition records to
:meth:`~stream_dp.pipeline.stages.ingest_columns.ColumnIngest._ingest_packed`, and takes every
other batch record by record — decoding, the placement and key checks of keyed input,
re-sent and misplaced repartitioned records, late and replayed windows — with the same
result the column paths give.

:meth:`RecordIngest.ingest` is the stage's tuned hot loop: one function, the per-window
lookups (lateness, key, samples) redone only when the window changes and a window's events
handed to its samples in runs (splitting it would add a call per event).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from stream_dp.pipeline.formats.decode import BadRecord
from stream_dp.pipeline.formats.packed import PACKED_KIND, decode_events
from stream_dp.pipeline.stages.ingest_columns import (
    ACCEPT,
    LATE,
    REPLAYED,
    ColumnIngest,
    DeadLetter,
    InputRecord,
    WindowPart,
    pseudonym_of,
)
from stream_dp.pipeline.stages.placement import pseudonym_partition
from stream_dp.privacy.group_values import canonical_value
from stream_dp.privacy.pseudonymize import UserIdNormalization, user_id_normalizer
from stream_dp.privacy.user_samples import UserSamples

__all__ = ["RecordIngest", "user_key"]

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


class RecordIngest(ColumnIngest):
    """Stage 1's entry point and per-record path;
    :class:`~stream_dp.pipeline.stages.ingest.IngestStage` provides the state."""

    # Provided by IngestStage.
    _partition_of_key: Callable[[bytes, int], int]
    _normalization: UserIdNormalization
    _scalar_fields: tuple[str, ...]
    _routed_seen: dict[int, dict[int, int]]

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
        if not routed and self._ingest_columns(partition, records, now_s, now_mono_s):
            return []
        metrics = self.metrics
        if not routed:
            metrics.events_consumed.inc(len(records))
        decode = self.decoder.decode_parts
        check_keys = self.enforce_user_keys and not routed
        partition_of_key = self._partition_of_key
        n_partitions = self.source_partitions
        # Batch-local, raw id → the record key it must carry (never kept in state).
        expected_keys: dict[str | int, bytes] = {}
        scalar_fields = self._scalar_fields
        size = self.windows.size_s
        sealed = self._sealed_s.get(partition)
        windows_released = self._windows_released
        coverage = windows_released.coverage_start_s
        fields = self._fields
        normalize = self._normalize
        single_field = fields[0] if len(fields) == 1 else None
        signatures = self._signatures
        signature_ids = self._signature_ids
        state = self._state.setdefault(partition, {})
        seen = self._routed_seen.setdefault(partition, {}) if routed else {}
        # Routed records interleave input partitions that progress at their own pace: the
        # partition's watermark is the slowest input partition's, as stage 0's progress
        # marks report it (each follows the records it covers).
        marks: list[tuple[int, float | None, float]] = []
        # Raw ids live only in this batch-local cache, per key id (never in state).
        pseudonyms: dict[str, dict[str | int, bytes]] = {}
        key_partitions: dict[bytes, int] = {}
        include_payload = self.config.output.dead_letter_include_payload
        dead: list[DeadLetter] = []
        late = skipped = duplicates = stale_key = 0
        max_time: float | None = None
        # Events arrive mostly in event-time order, so the per-window lookups (lateness,
        # key, samples) are redone only when the window changes, and a window's events are
        # handed to its samples in runs.
        current_ws: int | None = None
        fate = ACCEPT
        part: WindowPart | None = None
        cache: dict[str | int, bytes] = {}
        key_id = ""
        pseudonymize: Callable[[str | int], bytes] | None = None
        run_pseudonyms: list[bytes] = []
        run_items: list[int] = []
        erasures = self.erasures
        erased: frozenset[bytes] = _NONE_ERASED
        for offset, key, value in records:
            pseudonym: bytes | None
            record_key_id: str | None = None
            if routed:
                try:
                    body = orjson.loads(value or b"null")
                    if type(body) is dict and body.get("kind") == PACKED_KIND:
                        packed = decode_events(body, fields)
                        dead.extend(self._ingest_packed(partition, offset, packed, topic, seen))
                        continue
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
                        continue
                    t = float(body["t"])
                    obj = body["e"]
                    pseudonym = bytes.fromhex(body["u"])
                    stamped_key = body.get("k")  # absent in records of earlier versions
                    record_key_id = None if stamped_key is None else str(stamped_key)
                    if type(obj) is not dict or not math.isfinite(t) or type(src_offset) is not int:
                        raise TypeError("not a repartitioned event")
                except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
                    dead.append(
                        self._dead(
                            BadRecord(
                                "bad_internal_record",
                                "not a repartitioned event of this schema (a writer other "
                                "than stream-dp, or a format from another version)",
                            ),
                            partition,
                            offset,
                            value,
                            include_payload,
                            topic,
                        )
                    )
                    continue
                if pseudonym_partition(pseudonym, n_partitions) != partition:
                    dead.append(self._misplaced(partition, offset, value, include_payload, topic))
                    continue
                if src_offset <= seen.get(src_partition, -1):
                    duplicates += 1
                    continue
                seen[src_partition] = src_offset
                for name in scalar_fields:  # JSON true/1.0 back to canonical form
                    field_value = obj.get(name)
                    if isinstance(field_value, bool | float):
                        obj[name] = canonical_value(field_value)
                user: str | int = ""
            else:
                parsed = decode(value, now_s)
                if isinstance(parsed, BadRecord):
                    dead.append(self._dead(parsed, partition, offset, value, include_payload))
                    continue
                user, t, obj = parsed
                if check_keys:
                    expected = expected_keys.get(user)
                    if expected is None:
                        expected = expected_keys[user] = user_key(user, self._normalization)
                    if key != expected:
                        dead.append(
                            self._dead(
                                BadRecord(
                                    "not_keyed_by_user", _not_keyed_detail(self._normalization)
                                ),
                                partition,
                                offset,
                                value,
                                include_payload,
                            )
                        )
                        continue
                    assert key is not None
                    home = key_partitions.get(key)
                    if home is None:
                        home = key_partitions[key] = partition_of_key(key, n_partitions)
                    if home != partition:
                        dead.append(self._misplaced(partition, offset, value, include_payload))
                        continue
                pseudonym = None
            ws = math.floor(t / size) * size
            if ws != current_ws:
                if run_items:
                    assert part is not None
                    part.samples.add_many(run_pseudonyms, run_items)
                    run_pseudonyms, run_items = [], []
                current_ws = ws
                if (sealed is not None and ws + size <= sealed) or (
                    coverage is not None and ws < coverage
                ):
                    fate = LATE
                elif windows_released.released(ws):
                    fate = REPLAYED if windows_released.released_earlier(ws) else LATE
                else:
                    fate = ACCEPT
                    part = state.get(ws)
                    if part is None:
                        part = state[ws] = WindowPart(UserSamples(self.k, self._rng), offset)
                    pseudonymizer = self.keyring.for_window(ws)
                    key_id = pseudonymizer.key_id
                    cache = pseudonyms.setdefault(key_id, {})
                    pseudonymize = pseudonymizer.pseudonym
                    if erasures is not None:
                        erased = erasures.erased(key_id, ws)
            if fate != ACCEPT:
                if fate == LATE:
                    late += 1
                else:
                    skipped += 1
                continue
            if record_key_id is not None and record_key_id != key_id:
                # Pseudonymized under another key than this window's (a rotation changed
                # while it was open): one user must not appear under two pseudonyms.
                stale_key += 1
                continue
            sig = (
                (obj.get(single_field),)
                if single_field is not None
                else tuple(map(obj.get, fields))
            )
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
                        self._dead(self._empty_user, partition, offset, value, include_payload)
                    )
                    continue
            if erased and pseudonym in erased:
                continue  # erased: never enters a reservoir (and is no activity, no count)
            if max_time is None or t > max_time:
                max_time = t
            run_pseudonyms.append(pseudonym)
            run_items.append(sid)
        if run_items:
            assert part is not None
            part.samples.add_many(run_pseudonyms, run_items)
        self._positions[partition] = records[-1][0] + 1
        tracker = self._tracker(partition, now_mono_s, routed=routed)
        if routed:
            for source, t_max, idle_s in marks:
                tracker.report(source, t_max, idle_s, now_mono_s)
        elif max_time is not None:
            # Only accepted events are activity; one stamped ahead of the clock moves the
            # watermark no further than the clock (it may not close the current window).
            tracker.observe(partition, min(max_time, now_s), now_mono_s)
        if late:
            metrics.late_events.inc(late)
        if skipped:
            metrics.replayed_events_skipped.inc(skipped)
        if duplicates:
            metrics.repartition_duplicates_skipped.inc(duplicates)
        if stale_key:
            metrics.late_events.inc(stale_key)
            log.warning(
                "dropped %d repartitioned events pseudonymized under another key than their "
                "window's (pseudonymization.rotate_at changed while the window was open)",
                stale_key,
                extra={"partition": partition},
            )
        self._update_gauges()
        return dead

    def _misplaced(
        self,
        partition: int,
        offset: int,
        value: bytes | None,
        include_payload: bool,
        topic: str | None = None,
    ) -> DeadLetter:
        return self._dead(
            BadRecord("misplaced_key", self._misplaced_detail()),
            partition,
            offset,
            value,
            include_payload,
            topic,
        )

    def _misplaced_detail(self) -> str:
        return (
            f"the record's key maps to another of the topic's {self.source_partitions} "
            "partitions: a producer used another partitioner than input.partitioner, or "
            "partitions were added; its user would be bounded once per partition"
        )
