"""Stage 1 of the worker, without Kafka: decode, pseudonymize, window, bound → partials.

Whoever owns a partition of the stage-1 topic (the input topic when producers key by user
id, else the repartition topic) keeps, per open window, a :class:`Reservoirs` of pseudonym →
≤ k compact items (ids of interned event signatures) and the first offset the window needs.
A user's events all live in one partition, so bounding per partition bounds per user.

Each partition has its own watermark (largest event time − grace; by wall clock once the
partition is idle). When it passes a window's end the partition *seals* the window: its
exact bounded totals per query and key become one :class:`Partial` per query (a fresh
version id), and after they are published the window's state is dropped. Stage 2 merges
the partials of every source partition and adds noise once.

Offsets are committed only up to the earliest offset a window not yet sealed (published)
still needs; after a crash the replayed records rebuild the reservoirs.

Stage 0 (:meth:`IngestStage.route`), for input not keyed by user: decode and pseudonymize,
then re-key by pseudonym; the raw id goes no further. Repartitioned records carry their
source partition and offset, so a record re-sent after a crash is recognised and dropped.

String user ids are normalised (``input.user_id_normalization``) before they are
pseudonymized, in both stages: the batch-local pseudonym cache is keyed by the raw id, so
normalisation runs once per distinct id and batch, not per event. With keyed input the
record key must be the *normalised* id: two spellings of one user keyed by their raw ids
could sit on two partitions and be bounded twice.
"""

from __future__ import annotations

import logging
import math
import random  # only the type of the reservoir/L0 sampling PRNG (see new_sampling_rng)
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from stream_dp.config.model import Config
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.decode import BadRecord, Decoder
from stream_dp.pipeline.partials import Partial, SourceWatermark, new_version
from stream_dp.pipeline.queries import CompiledQuery, needed_fields
from stream_dp.privacy.bounding import (
    Reservoirs,
    aggregate_bounded,
    merge_reservoirs,
    new_sampling_rng,
)
from stream_dp.privacy.group_values import canonical_value, json_default
from stream_dp.privacy.pseudonymize import KeyRing, UserIdNormalization, user_id_normalizer
from stream_dp.privacy.release import KeyAggregate
from stream_dp.windows import TumblingWindows, WatermarkTracker

log = logging.getLogger(__name__)

#: What ingest does with an event, decided once per window: keep it, or count it as late
#: (its partition already sealed the window) or replayed (the window is already released).
_ACCEPT, _LATE, _REPLAYED = 0, 1, 2

#: (offset, Kafka record key, value)
InputRecord = tuple[int, bytes | None, bytes | None]


@dataclass(frozen=True, slots=True)
class DeadLetter:
    reason: str
    detail: str
    partition: int
    offset: int
    payload: bytes | None


@dataclass(slots=True)
class _WindowPart:
    reservoirs: Reservoirs
    first_offset: int


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


#: Pseudonym cache entry of a user id that normalises to nothing (dead-lettered).
_EMPTY_ID = b""


class IngestStage:
    def __init__(
        self,
        config: Config,
        keyring: KeyRing,
        *,
        released: Container[int] = frozenset(),
        released_earlier: Container[int] = frozenset(),
        metrics: Metrics | None = None,
        sampling_rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.keyring = keyring
        # Windows stage 2 has released (read from the ledger): replayed events of them are
        # dropped here rather than sealed into partials nobody will take.
        self._released = released
        # Of those, windows released before this process saw them (ledger): their events
        # are counted as replayed, those of windows it released itself as late.
        self._released_earlier = released_earlier
        self.metrics = metrics if metrics is not None else Metrics()
        self._rng = sampling_rng if sampling_rng is not None else new_sampling_rng()
        self.k = config.bounds.max_contributions_per_window
        self.windows = TumblingWindows(config.window.size_s, config.window.grace_s)
        #: Partitions of the stage-1 topic (what stage 2 waits for); set by the transport.
        self.source_partitions = 1
        #: Dead-letter raw records whose Kafka key is not their user id (a user's events
        #: must share a partition). Off where one partition holds everything (replay).
        self.enforce_user_keys = config.input.keyed_by_user
        #: Partitions of the input topic (the sources of each repartition partition).
        self.input_partitions = 1
        self._normalization: UserIdNormalization = config.input.user_id_normalization
        self._normalize = user_id_normalizer(self._normalization)
        self._empty_user = BadRecord(
            "bad_user",
            f"field {config.input.user_field!r} is empty once input.user_id_normalization "
            "removes its surrounding whitespace",
        )
        fields, scalar, numeric = needed_fields(config.queries)
        self._scalar_fields = tuple(scalar)
        self._fields = fields
        self.decoder = Decoder(
            user_field=config.input.user_field,
            time_field=config.input.time_field,
            max_record_bytes=config.input.max_record_bytes,
            max_future_s=config.input.max_future_s,
            scalar_fields=scalar,
            numeric_fields=numeric,
        )
        self._signatures: list[tuple[Any, ...]] = []
        self._signature_ids: dict[tuple[Any, ...], int] = {}
        self.queries = [CompiledQuery(q, config.bounds, fields) for q in config.queries]
        for q in self.queries:
            q.bind(self._signatures)
        self._state: dict[int, dict[int, _WindowPart]] = {}
        self._trackers: dict[int, WatermarkTracker] = {}
        self._sealed_s: dict[int, float] = {}
        self._positions: dict[int, int] = {}
        # Per repartition partition: source partition → largest source offset seen.
        self._routed_seen: dict[int, dict[int, int]] = {}
        # Stage 0, per input partition: largest event time routed, last record (monotonic).
        self._routed_max: dict[int, float] = {}
        self._routed_activity: dict[int, float] = {}

    # -- partitions ---------------------------------------------------------------------
    def assign(self, partitions: Iterable[int], now_mono_s: float, *, routed: bool) -> None:
        """Take partitions of the stage-1 topic; ``routed``: of the repartition topic.

        A partition's watermark tracks its sources: itself, or for a repartition partition
        every input partition (``input_partitions``), each of which must advance (or go
        idle) before a window is sealed.
        """
        for p in partitions:
            self._state.setdefault(p, {})
            if p not in self._trackers:
                tracker = WatermarkTracker(
                    grace_s=self.config.window.grace_s,
                    idle_timeout_s=self.config.window.idle_close_s,
                )
                if routed:
                    tracker.expect(range(self.input_partitions))
                else:
                    tracker.assign([p], now_mono_s)
                self._trackers[p] = tracker

    def revoke(self, partitions: Iterable[int]) -> None:
        """Drop the state of partitions that moved away; their new owner replays them."""
        for p in partitions:
            self._state.pop(p, None)
            self._trackers.pop(p, None)
            self._sealed_s.pop(p, None)
            self._positions.pop(p, None)
            self._routed_seen.pop(p, None)
        self._update_gauges()

    @property
    def partitions(self) -> list[int]:
        return sorted(self._trackers)

    def restart_idle_clocks(self, now_mono_s: float) -> None:
        for tracker in self._trackers.values():
            tracker.restart_idle_clocks(now_mono_s)
        for p in self._routed_activity:
            self._routed_activity[p] = now_mono_s

    # -- stage 0: repartition by pseudonym ----------------------------------------------
    def assign_routed(self, partitions: Iterable[int], now_mono_s: float) -> None:
        """Input partitions stage 0 now owns."""
        for p in partitions:
            self._routed_activity.setdefault(p, now_mono_s)

    def route(
        self, partition: int, records: Sequence[InputRecord], *, now_s: float, now_mono_s: float
    ) -> tuple[list[tuple[bytes, bytes]], list[DeadLetter]]:
        """Decode and pseudonymize raw input: (key, value) records keyed by pseudonym, and
        dead letters. Follow them with :meth:`progress_marks` to every repartition partition.
        """
        self._routed_activity[partition] = now_mono_s
        metrics = self.metrics
        metrics.events_consumed.inc(len(records))
        decode = self.decoder.decode_parts
        size = self.windows.size_s
        fields = self._fields
        include_payload = self.config.output.dead_letter_include_payload
        # Raw ids live only in this batch-local cache, per key id (never in state).
        pseudonyms: dict[str, dict[str | int, str]] = {}
        out: list[tuple[bytes, bytes]] = []
        dead: list[DeadLetter] = []
        batch_max = -math.inf
        current_ws: int | None = None
        cache: dict[str | int, str] = {}
        pseudonymize: Callable[[str | int], bytes] | None = None
        for offset, _key, value in records:
            parsed = decode(value, now_s)
            if isinstance(parsed, BadRecord):
                dead.append(self._dead(parsed, partition, offset, value, include_payload))
                continue
            user, t, obj = parsed
            ws = math.floor(t / size) * size
            if ws != current_ws:  # the key (rotation) is looked up once per window run
                current_ws = ws
                pseudonymizer = self.keyring.for_window(ws)
                cache = pseudonyms.setdefault(pseudonymizer.key_id, {})
                pseudonymize = pseudonymizer.pseudonym
            pseudonym = cache.get(user)
            if pseudonym is None:
                assert pseudonymize is not None
                pseudonym = cache[user] = self._pseudonym(user, pseudonymize).hex()
            if not pseudonym:
                dead.append(self._dead(self._empty_user, partition, offset, value, include_payload))
                continue
            body = {
                "u": pseudonym,
                "t": t,
                "e": {f: obj.get(f) for f in fields},
                "src": [partition, offset],
            }
            out.append((pseudonym.encode(), orjson.dumps(body, default=json_default)))
            if t > batch_max:
                batch_max = t
        if batch_max > self._routed_max.get(partition, -math.inf):
            self._routed_max[partition] = batch_max
        metrics.events_repartitioned.inc(len(out))
        return out, dead

    def progress_marks(self, now_mono_s: float) -> list[bytes]:
        """Per owned input partition: largest event time routed and how long it has been idle.

        Sent to every repartition partition after the records they cover, they let one that
        received none of a partition's users still see it advance, or go idle: idleness is
        judged here, where the input is read, never by silence downstream.
        """
        return [
            orjson.dumps(
                {
                    "t": self._routed_max.get(p),
                    "idle_s": max(0.0, now_mono_s - last),
                    "src": [p, -1],
                }
            )
            for p, last in sorted(self._routed_activity.items())
        ]

    def forget_routed(self, partitions: Iterable[int]) -> None:
        """Input partitions stage 0 no longer owns."""
        for p in partitions:
            self._routed_max.pop(p, None)
            self._routed_activity.pop(p, None)

    def _pseudonym(self, user: str | int, pseudonymize: Callable[[str | int], bytes]) -> bytes:
        """The pseudonym of a raw id (normalised first); ``_EMPTY_ID`` if nothing is left."""
        normal = self._normalize(user)
        if normal == "":
            return _EMPTY_ID
        return pseudonymize(normal)

    def _dead(
        self,
        bad: BadRecord,
        partition: int,
        offset: int,
        value: bytes | None,
        include_payload: bool,
    ) -> DeadLetter:
        self.metrics.bad_records.labels(reason=bad.reason).inc()
        return DeadLetter(
            bad.reason, bad.detail, partition, offset, value if include_payload else None
        )

    # -- stage 1: window and bound ------------------------------------------------------
    def ingest(
        self,
        partition: int,
        records: Sequence[InputRecord],
        *,
        now_s: float,
        now_mono_s: float,
        routed: bool = False,
    ) -> list[DeadLetter]:
        """Window and bound one partition's batch of (offset, key, value).

        ``routed``: the records come from the repartition topic (already pseudonymized and
        validated by :meth:`route`); otherwise they are raw input, decoded here.
        """
        if not records:
            return []
        metrics = self.metrics
        if not routed:
            metrics.events_consumed.inc(len(records))
        decode = self.decoder.decode_parts
        check_keys = self.enforce_user_keys and not routed
        # Batch-local, raw id → the record key it must carry (never kept in state).
        expected_keys: dict[str | int, bytes] = {}
        scalar_fields = self._scalar_fields
        size = self.windows.size_s
        sealed = self._sealed_s.get(partition)
        released = self._released
        fields = self._fields
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
        include_payload = self.config.output.dead_letter_include_payload
        dead: list[DeadLetter] = []
        late = skipped = duplicates = 0
        max_time: float | None = None
        # Events arrive mostly in event-time order, so the per-window lookups (lateness,
        # key, reservoirs) are redone only when the window changes, and a window's events
        # are handed to its reservoirs in runs, in arrival order (same draws as one by one).
        current_ws: int | None = None
        fate = _ACCEPT
        part: _WindowPart | None = None
        cache: dict[str | int, bytes] = {}
        pseudonymize: Callable[[str | int], bytes] | None = None
        run_pseudonyms: list[bytes] = []
        run_items: list[int] = []
        for offset, key, value in records:
            pseudonym: bytes | None
            if routed:
                body = orjson.loads(value or b"null")
                src_partition, src_offset = body["src"]
                if "u" not in body:  # a progress mark of one input partition
                    mark_t = body["t"]
                    marks.append(
                        (
                            src_partition,
                            None if mark_t is None else float(mark_t),
                            float(body["idle_s"]),
                        )
                    )
                    continue
                if src_offset <= seen.get(src_partition, -1):
                    duplicates += 1
                    continue
                seen[src_partition] = src_offset
                user: str | int = ""
                t = float(body["t"])
                obj = body["e"]
                for name in scalar_fields:  # JSON true/1.0 back to canonical form
                    tv = type(obj.get(name))
                    if tv is bool or tv is float:
                        obj[name] = canonical_value(obj[name])
                pseudonym = bytes.fromhex(body["u"])
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
                pseudonym = None
            if max_time is None or t > max_time:
                max_time = t
            ws = math.floor(t / size) * size
            if ws != current_ws:
                if run_items:
                    assert part is not None
                    part.reservoirs.add_many(run_pseudonyms, run_items)
                    run_pseudonyms, run_items = [], []
                current_ws = ws
                if sealed is not None and ws + size <= sealed:
                    fate = _LATE
                elif ws in released:
                    fate = _REPLAYED if ws in self._released_earlier else _LATE
                else:
                    fate = _ACCEPT
                    part = state.get(ws)
                    if part is None:
                        part = state[ws] = _WindowPart(Reservoirs(self.k, self._rng), offset)
                    pseudonymizer = self.keyring.for_window(ws)
                    cache = pseudonyms.setdefault(pseudonymizer.key_id, {})
                    pseudonymize = pseudonymizer.pseudonym
            if fate != _ACCEPT:
                if fate == _LATE:
                    late += 1
                else:
                    skipped += 1
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
                    pseudonym = cache[user] = self._pseudonym(user, pseudonymize)
                if not pseudonym:
                    dead.append(
                        self._dead(self._empty_user, partition, offset, value, include_payload)
                    )
                    continue
            run_pseudonyms.append(pseudonym)
            run_items.append(sid)
        if run_items:
            assert part is not None
            part.reservoirs.add_many(run_pseudonyms, run_items)
        self._positions[partition] = records[-1][0] + 1
        tracker = self._tracker(partition, now_mono_s, routed=routed)
        if routed:
            for source, t_max, idle_s in marks:
                tracker.report(source, t_max, idle_s, now_mono_s)
        elif max_time is not None:
            tracker.observe(partition, max_time, now_mono_s)
        else:
            tracker.touch(partition, now_mono_s)
        if late:
            metrics.late_events.inc(late)
        if skipped:
            metrics.replayed_events_skipped.inc(skipped)
        if duplicates:
            metrics.repartition_duplicates_skipped.inc(duplicates)
        self._update_gauges()
        return dead

    def _tracker(self, partition: int, now_mono_s: float, *, routed: bool) -> WatermarkTracker:
        if partition not in self._trackers:
            self.assign([partition], now_mono_s, routed=routed)
        return self._trackers[partition]

    # -- sealing --------------------------------------------------------------------------
    def open_windows(self) -> list[int]:
        return sorted({ws for parts in self._state.values() for ws in parts})

    def due(self, now_mono_s: float) -> list[tuple[int, int]]:
        """(partition, window) pairs whose partition watermark passed the window's end."""
        out: list[tuple[int, int]] = []
        for p, tracker in self._trackers.items():
            wm = tracker.watermark(now_mono_s)
            if wm is None:
                continue
            self._sealed_s[p] = wm
            out.extend((p, ws) for ws in self._state.get(p, {}) if self.windows.is_closed(ws, wm))
        return sorted(out, key=lambda pw: (pw[1], pw[0]))

    def all_open(self) -> list[tuple[int, int]]:
        """Every (partition, window) with state: sealed at the end of a finite input."""
        return sorted(
            ((p, ws) for p, parts in self._state.items() for ws in parts),
            key=lambda pw: (pw[1], pw[0]),
        )

    def seal(self, partition: int, window_start_s: int) -> list[Partial]:
        """The partition's exact bounded totals for the window, one partial per query."""
        part = self._state[partition][window_start_s]
        users = list(merge_reservoirs([part.reservoirs], self.k, self._rng).values())
        seen = part.reservoirs.events_seen
        retained = sum(len(items) for items in users)
        if seen > retained:
            self.metrics.events_dropped_by_bounding.inc(seen - retained)
        bounds = self.config.bounds
        version = new_version()
        out = []
        for q in self.queries:
            totals = aggregate_bounded(
                users,
                q.project,
                max_keys=bounds.max_keys_per_user,
                max_per_key=bounds.max_contributions_per_key,
                rng=self._rng,
            )
            out.append(
                Partial(
                    query=q.name,
                    window_start_s=window_start_s,
                    source_partition=partition,
                    version=version,
                    totals={
                        key: KeyAggregate(t.events, t.users, t.value_sum)
                        for key, t in totals.items()
                    },
                    events_seen=seen,
                    events_retained=retained,
                )
            )
        return out

    def drop(self, partition: int, window_start_s: int) -> None:
        """The window's partials are published: its state goes."""
        self._state.get(partition, {}).pop(window_start_s, None)
        self.metrics.partials_published.inc(len(self.queries))
        self._update_gauges()

    def watermarks(self, now_mono_s: float) -> list[SourceWatermark]:
        """What each assigned partition has sealed: written after its partials."""
        marks = []
        for p, tracker in sorted(self._trackers.items()):
            clock_idle = all(tracker.is_idle(s, now_mono_s) for s in tracker.partitions)
            marks.append(
                SourceWatermark(
                    source_partition=p,
                    source_partitions=self.source_partitions,
                    watermark_s=self._sealed_s.get(p),
                    idle=clock_idle,
                    open_windows=bool(self._state.get(p)),
                    idle_for_s=tracker.idle_for(now_mono_s) if clock_idle else 0.0,
                )
            )
        return marks

    # -- offsets --------------------------------------------------------------------------
    def safe_offsets(self) -> dict[int, int]:
        """Per partition, the next offset to commit: nothing an open window needs is skipped."""
        safe: dict[int, int] = {}
        for p, position in self._positions.items():
            firsts = [part.first_offset for part in self._state.get(p, {}).values()]
            safe[p] = min(firsts) if firsts else position
        return safe

    def _update_gauges(self) -> None:
        open_windows = self.open_windows()
        oldest_end = self.windows.end_of(open_windows[0]) if open_windows else None
        self.metrics.set_open_windows(len(open_windows), oldest_end)

    @property
    def signature_count(self) -> int:
        return len(self._signatures)
