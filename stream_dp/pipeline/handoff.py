"""The stage-1 hand-off, written once, against a small transport (beside the release driver).

Each turn (:meth:`Handoff.step`) stage 1 hands what it sealed to stage 2, in this order:

1. a source partition that last reported quiet (idle, nothing open) and has data again is
   announced first: its watermark goes out before any other partition's partials and
   watermarks can close a window without it;
2. the due windows' partner exports (docs/exports.md; the Kafka worker's ``export`` hook)
   are sent and acknowledged — before the partials, so before the input can be committed
   (at least once: a window resent after a crash has identical export records); then the
   due windows are sealed (:meth:`HandoffTransport.seal`: in a thread, or right here) and
   their partials written to each window's partials partition
   (:meth:`~stream_dp.pipeline.release_driver.ReleaseDriver.partials_partition_of`, the one
   place it is computed) by :meth:`HandoffTransport.send_partials`, which returns once the
   write is handed over, with its acknowledgement to await;
3. only once that write is acknowledged is each sealed window's state dropped — from then
   on its input offsets may be committed (they are no longer held by an open window). The
   turn does not wait for it: the write stays in flight while the worker fetches and reads
   its next batch, and the next turn (or the next write: one write in flight at a time)
   settles it first (:meth:`Handoff.settle`). Meanwhile the windows are closed to events
   (their partition's sealed time passed them when they fell due: later events are late),
   their state and input offsets are held, and an erasure reaching them re-seals them, as
   it would a window kept sealed for its release;
4. windows an erasure reached after they were sealed (and before they were released) go the
   same way, 2–3;
5. last, every source partition's watermark to every partials partition — those that hold
   windows back first, the quiet ones after them — whenever partials were sealed, and at
   least every ``watermark_interval_s`` otherwise. When partials were sealed the watermarks
   go in the same write as the last hand-off's partials, after them
   (:meth:`Handoff.send`'s ``marks_at``): one round trip to the broker instead of two.
   Each watermark is then what it would be once that hand-off's windows are dropped
   (:meth:`IngestStage.watermarks`' ``dropping``), and the windows are dropped (3) only once
   the whole write is acknowledged.

Why this order. A watermark past a window's end tells stage 2 that the source has nothing
more for it: were it durable before that source's partials, stage 2 could release the window
without them (an under-count published for ever). In one write, the partials come before the
watermarks on every partials partition (:meth:`HandoffTransport.send_partials` keeps each
partition's records in order, and a window's partials and the watermarks that close it are
on its one partials partition), so no reader sees a watermark before the partials it
follows; a write that fails leaves some partitions with both and others with neither, and
is redone whole (a failed write is found by the turn that settles it: the worker stops, its
windows held). Dropping the state (and so committing the input) before the partials are
acknowledged would lose the window's events on a crash in between. Leaving the write in
flight while the next batch is read changes none of this: what it carries was computed
before that batch (the watermarks included), and nothing it seals is dropped or committed
before its acknowledgement. Only one write is in flight, so the writes reach each partials
partition in the order they were made.

A quiet watermark lets stage 2 stop waiting for its partition — an advance — so the
partitions that hold windows back go first: no reader sees one partition advance without the
others' news from the same moment. For the same reason a quiet partition that has data again
says so (1) before anything else could close a window on its silence.

The transport is what differs: the Kafka worker hands the write to its producer (the request
goes out before the turn goes on) and gets a task that ends with the broker's acknowledgement
(:class:`stream_dp.pipeline.kafka.kafka_transport.KafkaTransport`); the in-memory pipeline
(replay, tests) feeds the same encoded records to its release stage at once and returns an
acknowledgement already given (:class:`stream_dp.pipeline.local.local.MemoryTransport`),
where :func:`run_now` steps the coroutine to its end.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import ParamSpec, Protocol, TypeVar

from stream_dp.pipeline.faults import NO_FAULTS, Faults
from stream_dp.pipeline.formats.partials import SourceWatermark, encode_watermark
from stream_dp.pipeline.release_driver import Placed, ReleaseDriver
from stream_dp.pipeline.stages.ingest import IngestStage
from stream_dp.pipeline.stages.offload import seal_windows

P = ParamSpec("P")
T = TypeVar("T")

#: Sends a sealed window's partner exports (docs/exports.md) and returns once acknowledged.
ExportHook = Callable[[Sequence[tuple[int, int]]], Awaitable[None]]

#: Source watermarks are re-sent at least this often (a restarted stage 2 needs fresh ones).
WATERMARK_INTERVAL_S = 1.0


def marks_interval_s(idle_close_s: float) -> float:
    """How often stage 0's progress marks are re-sent with nothing routed: at least every
    :data:`WATERMARK_INTERVAL_S`, and twice per ``idle_close_s``, so that an input partition
    going idle is seen soon after. An idle worker's loop turns this often
    (:mod:`stream_dp.pipeline.idle_fetch`)."""
    return min(WATERMARK_INTERVAL_S, idle_close_s / 2)


@dataclass(frozen=True, slots=True)
class InFlight:
    """A partials write sent and not yet settled: its acknowledgement, the windows it seals
    and the watermarks it carries (as of ``marks_at``; None: none)."""

    acknowledged: Awaitable[None]
    sealed: list[tuple[int, int]]
    marks: list[SourceWatermark]
    marks_at: float | None


class HandoffTransport(Protocol):
    """Where stage 1's records go: the partials topic, or stage 2 in memory."""

    async def send_partials(self, records: Sequence[Placed]) -> Awaitable[None]:
        """Hand records to be written to their partials partitions, in order; the awaitable
        returned completes once they are acknowledged (and raises if they could not be
        written)."""

    async def seal(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run the CPU-heavy sealing (in a thread, or right here)."""


class Handoff:
    """Stage 1's hand-off of an :class:`IngestStage` (see the module docstring)."""

    def __init__(
        self,
        ingest: IngestStage,
        transport: HandoffTransport,
        *,
        partials_partitions: Sequence[int],
        partials_partition_of: Callable[[int], int],
        max_bytes: int,
        watermark_interval_s: float = WATERMARK_INTERVAL_S,
        faults: Faults = NO_FAULTS,
        export: ExportHook | None = None,
    ) -> None:
        self.ingest = ingest
        self.transport = transport
        self.partials_partitions = list(partials_partitions)
        self.partials_partition_of = partials_partition_of
        self.max_bytes = max_bytes
        self.watermark_interval_s = watermark_interval_s
        self.faults = faults
        self.export = export
        self._marks_sent_mono = -math.inf
        #: The last write, sent and not yet settled (:meth:`send`, :meth:`settle`).
        self._in_flight: InFlight | None = None
        #: Source partitions whose last watermark said quiet.
        self._silent: set[int] = set()

    @classmethod
    def beside(
        cls,
        driver: ReleaseDriver,
        ingest: IngestStage,
        transport: HandoffTransport,
        *,
        watermark_interval_s: float = WATERMARK_INTERVAL_S,
        export: ExportHook | None = None,
    ) -> Handoff:
        """The hand-off to ``driver``'s stage: the driver's partials partitions and window
        placement (:meth:`ReleaseDriver.partials_partition_of`), record size and fault hooks."""
        return cls(
            ingest,
            transport,
            partials_partitions=driver.partials_partitions,
            partials_partition_of=driver.partials_partition_of,
            max_bytes=driver.max_bytes,
            watermark_interval_s=watermark_interval_s,
            faults=driver.faults,
            export=export,
        )

    async def step(self, now_mono: float) -> None:
        """Steps 1–5 of the module docstring; the last write is left in flight (settled by
        the next turn, :meth:`settle`)."""
        await self.settle()
        ingest = self.ingest
        if self._woke_up(now_mono):
            await self.announce(ingest.watermarks(now_mono), now_mono)
        sealed = ingest.due(now_mono)
        if sealed and self.export is not None:
            await self.export(sealed)  # partner exports, acknowledged before the partials
        marks_due = bool(sealed) or now_mono - self._marks_sent_mono >= self.watermark_interval_s
        # The watermarks ride on the last hand-off's write (step 5, module docstring).
        marked = False
        if sealed:
            marked = marks_due and not ingest.reseal_pending()
            await self.send(sealed, marks_at=now_mono if marked else None)
        resealed = ingest.reseal_due()  # erasures reached sealed, unreleased windows
        if resealed:
            await self.send(resealed, marks_at=now_mono if marks_due else None)
            marked = marks_due
        if marks_due and not marked:
            await self.announce(ingest.watermarks(now_mono), now_mono)

    async def hand_off(
        self, sealed: Sequence[tuple[int, int]], *, marks_at: float | None = None
    ) -> None:
        """Steps 2–3, awaited: :meth:`send`, then :meth:`settle`."""
        await self.send(sealed, marks_at=marks_at)
        await self.settle()

    async def send(
        self, sealed: Sequence[tuple[int, int]], *, marks_at: float | None = None
    ) -> None:
        """Step 2: each sealed (partition, window)'s partials to the window's partials
        partition, the write left in flight (step 3 is :meth:`settle`'s, once it is
        acknowledged). ``marks_at``: step 5 too, in the same write after the partials —
        every watermark as of that time, as it will be once these windows are dropped.

        The write before is settled first: one write in flight, so none overtakes another.
        Meanwhile the windows are closed to events (``due`` moved their partition's sealed
        time past them), their state and input offsets held, and an erasure reaching them
        marks them for a re-seal (:meth:`IngestStage.being_sealed`)."""
        await self.settle()
        self.ingest.being_sealed(sealed)
        try:
            encoded = await self.transport.seal(
                seal_windows,
                self.ingest,
                sealed,
                self.partials_partition_of,
                max_bytes=self.max_bytes,
            )
        except BaseException:
            self.ingest.not_sealed(sealed)
            raise
        items: list[Placed] = [(k, v, r) for r, records in encoded for k, v in records]
        marks: list[SourceWatermark] = []
        if marks_at is not None:
            marks = self._ordered(self.ingest.watermarks(marks_at, dropping=sealed))
            items.extend(self._placed(marks))
        acknowledged = await self.transport.send_partials(items)
        self._in_flight = InFlight(acknowledged, list(sealed), marks, marks_at)

    async def settle(self) -> None:
        """Step 3 for the write in flight, if any: once it is acknowledged, each of its
        windows' state is dropped (a window of a partition revoked meanwhile is its new
        owner's: left alone) and its watermarks count as sent. A write that failed drops
        nothing (the windows are due again) and raises."""
        flight, self._in_flight = self._in_flight, None
        if flight is None:
            return
        try:
            await flight.acknowledged
        except BaseException:
            self.ingest.not_sealed(flight.sealed)
            raise
        for p, ws in flight.sealed:
            if self.ingest.still_sealing(p, ws):
                self.ingest.drop(p, ws)
        if flight.marks_at is not None:
            self._announced(flight.marks, flight.marks_at)
        self.faults.reached("after_partials_write")

    def abandon(self) -> None:
        """The worker stops without settling: the write in flight is left to the producer
        (its windows stay held: their input is not committed past them)."""
        flight, self._in_flight = self._in_flight, None
        if flight is not None and isinstance(flight.acknowledged, asyncio.Future):
            flight.acknowledged.cancel()

    async def announce(self, marks: Sequence[SourceWatermark], now_mono: float) -> None:
        """Step 5: each watermark to every partials partition, the quiet ones last (after
        the write in flight is settled; this one is awaited)."""
        await self.settle()
        ordered = self._ordered(marks)
        items = self._placed(ordered)
        if items:
            await (await self.transport.send_partials(items))
        self._announced(ordered, now_mono)

    @staticmethod
    def _ordered(marks: Sequence[SourceWatermark]) -> list[SourceWatermark]:
        """The watermarks that hold windows back first, the quiet ones after them."""
        return sorted(marks, key=lambda m: m.quiet)

    def _placed(self, ordered: Sequence[SourceWatermark]) -> list[Placed]:
        """Each watermark to every partials partition, in the order given."""
        items: list[Placed] = []
        for mark in ordered:
            key, value = encode_watermark(mark)
            items.extend((key, value, r) for r in self.partials_partitions)
        return items

    def _announced(self, ordered: Sequence[SourceWatermark], now_mono: float) -> None:
        """The watermarks are acknowledged: the next are due an interval later."""
        self._marks_sent_mono = now_mono
        self._silent = {m.source_partition for m in ordered if m.quiet}

    def _woke_up(self, now_mono: float) -> bool:
        """Whether a partition last reported quiet has data now."""
        if not self._silent:
            return False
        return any(
            not m.quiet
            for m in self.ingest.watermarks(now_mono)
            if m.source_partition in self._silent
        )
