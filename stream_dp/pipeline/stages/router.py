"""Stage 0 of the worker, without Kafka: route raw input by pseudonym to the repartition topic.

For input not keyed by user (``input.keyed_by_user: false``) a user's events may sit on any
input partition, so bounding per partition would not bound per user. Stage 0 decodes and
pseudonymizes each raw record, then re-keys it by pseudonym onto :func:`pseudonym_partition`
of the repartition topic, where stage 1 (:class:`~stream_dp.pipeline.stages.ingest.IngestStage`)
finds all of a user's events in one partition. The raw id goes no further: it lives only in
a batch-local cache.

Repartitioned records carry their source partition and offset (a record re-sent after a
crash is recognised and dropped by stage 1) and their pseudonym key id (stage 1 keeps only
those of the window's key: a user is never split over two pseudonyms in one window).
:meth:`RoutingStage.route` writes one JSON record per event;
:meth:`RoutingStage.route_packed` one packed record (:mod:`stream_dp.pipeline.formats.packed`) per
repartition partition and batch.

After a batch's records, :meth:`RoutingStage.progress_marks` go to every repartition
partition: per owned input partition the largest event time routed and how long it has been
idle. Only valid events are activity: a partition delivering only bad records is idle, and
an event stamped ahead of the clock moves its progress no further than the clock. Idleness
is judged here, where the input is read, never by silence downstream.

String user ids are normalised (``input.user_id_normalization``) before they are
pseudonymized. Erased users' events are repartitioned like anyone's: stage 1 drops them on
arrival (docs/erasure.md), so that what a worker holds, and so ``/metrics``, is the same
whoever an erasure names (docs/attack-model.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import orjson

from stream_dp.config.model import Config
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.formats.decode import BadRecord
from stream_dp.pipeline.formats.packed import PACKED_KEY_PREFIX, encode_events
from stream_dp.pipeline.stages.columns import EventColumns, decode_columns, distinct_index
from stream_dp.pipeline.stages.ingest_columns import (
    DeadLetter,
    FetchedRecords,
    InputRecord,
    dead_letter,
    empty_user_record,
    input_decoder,
    pseudonym_of,
    window_starts,
)
from stream_dp.pipeline.stages.placement import pseudonym_partition, pseudonym_partitions
from stream_dp.privacy.group_values import json_default
from stream_dp.privacy.pseudonymize import PSEUDONYM_BYTES, KeyRing, user_id_normalizer

__all__ = ["RoutingStage"]


def _values(records: Sequence[InputRecord]) -> list[bytes | None]:
    if isinstance(records, FetchedRecords):
        return records.values()
    return [v for _, _, v in records]


def _offsets(records: Sequence[InputRecord]) -> list[int]:
    if isinstance(records, FetchedRecords):
        return records.offsets()
    return [o for o, _, _ in records]


class RoutingStage:
    """Stage 0: the input partitions this worker reads, routed to the repartition topic."""

    def __init__(
        self,
        config: Config,
        keyring: KeyRing,
        *,
        metrics: Metrics,
    ) -> None:
        self.config = config
        self.keyring = keyring
        self.metrics = metrics
        self.window_size_s = config.window.size_s
        self.decoder, self._fields, _ = input_decoder(config)
        self._normalize = user_id_normalizer(config.input.user_id_normalization)
        self._empty_user = empty_user_record(config)
        #: Partitions of the repartition topic (where stage 0 routes); set by the transport.
        self.routed_partitions = 1
        #: Idleness counts only as far as :meth:`read_to_end` proves it (the worker, which
        #: reads Kafka); otherwise silence up to now is idleness (offline use, unit tests).
        self.require_read_proof = False
        # Per input partition: largest event time routed, last record (monotonic), and
        # when its reader was last at the log's end.
        self._routed_max: dict[int, float] = {}
        self._routed_activity: dict[int, float] = {}
        self._routed_read_through: dict[int, float] = {}
        #: Per input partition: the wall clock when this stage took it (assign_routed).
        self._routed_wall_start: dict[int, float] = {}

    def read_to_end(self, partition: int, at_mono_s: float) -> None:
        """A fetch answer at ``at_mono_s`` found this worker's reader at the end of the input
        partition: silence before it is the partition's own, so it may count as idle."""
        if at_mono_s > self._routed_read_through.get(partition, -math.inf):
            self._routed_read_through[partition] = at_mono_s

    def restart_idle_clocks(self, now_mono_s: float) -> None:
        for p in self._routed_activity:
            self._routed_activity[p] = now_mono_s

    def _dead(
        self,
        bad: BadRecord,
        partition: int,
        offset: int,
        value: bytes | None,
        include_payload: bool,
    ) -> DeadLetter:
        return dead_letter(self.metrics, bad, partition, offset, value, include_payload)

    # -- one JSON record per event -------------------------------------------------------
    def assign_routed(
        self, partitions: Iterable[int], now_mono_s: float, *, now_s: float | None = None
    ) -> None:
        """Input partitions stage 0 now owns. ``now_s``, the wall clock at ``now_mono_s``
        (the worker): a partition proven quiet for ``window.idle_close_s`` since then reports
        its progress from there, not from the largest event time routed since (none, after
        a restart while the input is idle: its repartition partitions would otherwise
        advance from the last window released at one second per second)."""
        for p in partitions:
            if p not in self._routed_activity:
                self._routed_activity[p] = now_mono_s
                if now_s is not None:
                    self._routed_wall_start[p] = now_s

    def route(
        self, partition: int, records: Sequence[InputRecord], *, now_s: float, now_mono_s: float
    ) -> tuple[list[tuple[bytes, bytes, int]], list[DeadLetter]]:
        """Decode and pseudonymize raw input: (key, value, repartition partition) records
        keyed by pseudonym, and dead letters. Follow them with :meth:`progress_marks` to
        every repartition partition. Only valid events count as the partition's activity.
        """
        metrics = self.metrics
        n_routed = self.routed_partitions
        metrics.events_consumed.inc(len(records))
        decode = self.decoder.decode_parts
        size = self.window_size_s
        fields = self._fields
        include_payload = self.config.output.dead_letter_include_payload
        # Raw ids live only in this batch-local cache, per key id (never in state).
        pseudonyms: dict[str, dict[str | int, str]] = {}
        out: list[tuple[bytes, bytes, int]] = []
        dead: list[DeadLetter] = []
        batch_max = -math.inf
        current_ws: int | None = None
        cache: dict[str | int, str] = {}
        key_id = key_check = ""
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
                key_id, key_check = pseudonymizer.key_id, pseudonymizer.key_check
                cache = pseudonyms.setdefault(key_id, {})
                pseudonymize = pseudonymizer.pseudonym
            pseudonym = cache.get(user)
            if pseudonym is None:
                assert pseudonymize is not None
                pseudonym = cache[user] = pseudonym_of(user, self._normalize, pseudonymize).hex()
            if not pseudonym:
                dead.append(self._dead(self._empty_user, partition, offset, value, include_payload))
                continue
            body = {
                "u": pseudonym,
                "t": t,
                "e": {f: obj.get(f) for f in fields},
                "src": [partition, offset],
                "k": key_id,
                "c": key_check,
            }
            target = pseudonym_partition(bytes.fromhex(pseudonym[:16]), n_routed)
            out.append((pseudonym.encode(), orjson.dumps(body, default=json_default), target))
            if t > batch_max:
                batch_max = t
        if out:
            # Valid events only: a partition delivering only bad records is idle, and a
            # time stamped ahead of the clock moves its progress no further than the clock.
            self._routed_activity[partition] = now_mono_s
            batch_max = min(batch_max, now_s)
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
        marks = []
        for p, last in sorted(self._routed_activity.items()):
            t = self._routed_max.get(p)
            idle_s = self._routed_quiet_s(p, last, now_mono_s)
            wall_start = self._routed_wall_start.get(p)
            if wall_start is not None and idle_s >= self.config.window.idle_close_s:
                # Proven idle: progress from the wall clock at the take. Every event routed
                # was stamped at most the clock then (t ≤ wall_start + time since), so
                # t + idle_s stays at most the wall clock of the last proof.
                t = wall_start if t is None else max(t, wall_start)
            marks.append(orjson.dumps({"t": t, "idle_s": idle_s, "src": [p, -1]}))
        return marks

    def _routed_quiet_s(self, partition: int, last_activity_s: float, now_mono_s: float) -> float:
        """How long stage 0 knows an input partition to have been quiet: until now, or
        with :attr:`require_read_proof` until the last fetch that found its reader at the
        log's end — a reader that cannot fetch must not call its input idle."""
        known = now_mono_s
        if self.require_read_proof:
            known = min(now_mono_s, self._routed_read_through.get(partition, -math.inf))
        return max(0.0, known - last_activity_s)

    def forget_routed(self, partitions: Iterable[int]) -> None:
        """Input partitions stage 0 no longer owns."""
        for p in partitions:
            self._routed_max.pop(p, None)
            self._routed_activity.pop(p, None)
            self._routed_read_through.pop(p, None)
            self._routed_wall_start.pop(p, None)

    # -- packed records, a batch as columns ----------------------------------------------
    def route_packed(
        self, partition: int, records: Sequence[InputRecord], *, now_s: float, now_mono_s: float
    ) -> tuple[list[tuple[bytes, bytes, int]], list[DeadLetter]]:
        """:meth:`route` with packed output (:mod:`stream_dp.pipeline.formats.packed`): per
        repartition partition (and pseudonym key id) one record holding the batch's events
        that go there, as columns. The validation is :meth:`route`'s, a batch of good events
        being checked column-wise; dead letters are the same."""
        metrics = self.metrics
        metrics.events_consumed.inc(len(records))
        dead: list[DeadLetter] = []
        cols = decode_columns(self.decoder, self._fields, _values(records), now_s)
        if cols is not None:
            offsets = np.array(_offsets(records), dtype=np.int64)
        else:
            cols, offsets = self._decode_each(partition, records, now_s, dead)
        out: list[tuple[bytes, bytes, int]] = []
        routed = 0
        sent = np.zeros(len(offsets), dtype=bool)
        if len(offsets):
            starts = window_starts(cols.times, self.window_size_s)
            first_ws, last_ws = int(starts.min()), int(starts.max())
            # Most batches lie in one window: no sort to find it.
            window_list = [first_ws] if first_ws == last_ws else np.unique(starts).tolist()
            key_of = {ws: self.keyring.for_window(ws) for ws in window_list}
            users, index = cols.distinct_users, cols.user_index
            normal = list(map(self._normalize, users))
            empty = np.array([n == "" for n in normal], dtype=bool)[index]
            if empty.any():  # ids that normalise to nothing: dead letters, in place
                include_payload = self.config.output.dead_letter_include_payload
                payloads = {o: v for o, _, v in records}
                for o in offsets[empty].tolist():
                    dead.append(
                        self._dead(self._empty_user, partition, o, payloads[o], include_payload)
                    )
                dead.sort(key=lambda d: d.offset)
            signatures, sig_index = _signature_index(cols.fields, len(offsets))
            for pseudonymizer in {p.key_id: p for p in key_of.values()}.values():
                rows = ~empty
                if len(key_of) > 1:
                    ids = [ws for ws, p in key_of.items() if p.key_id == pseudonymizer.key_id]
                    rows &= np.isin(starts, ids)
                if not rows.any():
                    continue
                if rows.all():  # every distinct user of the batch is in these rows
                    present_ids = normal
                    local = np.arange(len(users))
                else:
                    present = np.unique(index[rows])
                    local = np.full(len(users), -1, dtype=np.int64)
                    local[present] = np.arange(len(present))
                    present_ids = [normal[i] for i in present.tolist()]
                pseudonyms = pseudonymizer.pseudonyms(present_ids)
                sent |= rows
                chosen = np.flatnonzero(rows)
                for target, here, listed in _by_target(
                    chosen, local[index[chosen]], pseudonyms, self.routed_partitions
                ):
                    for value in encode_events(
                        src_partition=partition,
                        offsets=offsets[here],
                        key_id=pseudonymizer.key_id,
                        fields=self._fields,
                        pseudonyms=listed,
                        times=cols.times[here],
                        signatures=signatures,
                        signature_index=sig_index[here],
                        max_bytes=self.config.kafka.max_message_bytes,
                        key_check=pseudonymizer.key_check,
                    ):
                        out.append(((PACKED_KEY_PREFIX + str(partition)).encode(), value, target))
                    routed += len(here)
            if routed:
                # Valid events only: a partition delivering only bad records is idle, and a
                # time stamped ahead of the clock moves its progress no further than the clock.
                self._routed_activity[partition] = now_mono_s
                batch_max = min(float(cols.times[sent].max()), now_s)
                if batch_max > self._routed_max.get(partition, -math.inf):
                    self._routed_max[partition] = batch_max
        metrics.events_repartitioned.inc(routed)
        return out, dead

    def _decode_each(
        self,
        partition: int,
        records: Sequence[InputRecord],
        now_s: float,
        dead: list[DeadLetter],
    ) -> tuple[EventColumns, np.ndarray]:
        """The per-record decoder over a batch: its good events as columns, the others as
        dead letters (appended to ``dead``)."""
        include_payload = self.config.output.dead_letter_include_payload
        decode = self.decoder.decode_parts
        users: list[str | int] = []
        times: list[float] = []
        offsets: list[int] = []
        objs: list[dict[str, Any]] = []
        for offset, _key, value in records:
            parsed = decode(value, now_s)
            if isinstance(parsed, BadRecord):
                dead.append(self._dead(parsed, partition, offset, value, include_payload))
                continue
            user, t, obj = parsed
            users.append(user)
            times.append(t)
            offsets.append(offset)
            objs.append(obj)
        fields = [[obj.get(f) for obj in objs] for f in self._fields]
        return (
            EventColumns.of_users(users, np.array(times, dtype=np.float64), fields),
            np.array(offsets, dtype=np.int64),
        )


def _signature_index(fields: list[list[Any]], n: int) -> tuple[list[tuple[Any, ...]], np.ndarray]:
    """The batch's distinct signatures (tuples of its query fields' values, first seen
    first) and each event's index among them. One field, the common case, is numbered by
    its values and only the distinct ones become tuples: a 1-tuple is equal to another
    exactly when their values are, so the numbering is the same."""
    if len(fields) == 1:
        values, index = distinct_index(fields[0])
        return [(v,) for v in values], index
    return distinct_index(list(zip(*fields, strict=True)) if fields else [()] * n)


def _by_target(
    chosen: np.ndarray, user_of: np.ndarray, pseudonyms: bytes, partitions: int
) -> Iterator[tuple[int, np.ndarray, bytes]]:
    """Per repartition partition (ascending) that receives any of the events ``chosen``
    (rows of the batch, ascending; ``user_of`` each one's user in ``pseudonyms``, 16 bytes
    each): (partition, its rows in order, their pseudonyms concatenated). One stable sort
    by target instead of a mask per target."""
    per_user = np.frombuffer(pseudonyms, dtype=np.uint8).reshape(-1, PSEUDONYM_BYTES)
    targets = pseudonym_partitions(pseudonyms, partitions)[user_of]
    if len(targets) == 0:
        return
    first, last = int(targets.min()), int(targets.max())
    if first == last:
        yield first, chosen, per_user[user_of].tobytes()
        return
    order = np.argsort(targets, kind="stable")
    counts = np.bincount(targets, minlength=partitions)
    ends = np.cumsum(counts)
    for target in np.flatnonzero(counts).tolist():
        span = order[ends[target] - counts[target] : ends[target]]
        yield target, chosen[span], per_user[user_of[span]].tobytes()
