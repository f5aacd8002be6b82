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
   place it is computed); :meth:`HandoffTransport.write_partials` returns once they are
   acknowledged;
3. only then is each sealed window's state dropped — from then on its input offsets may be
   committed (they are no longer held by an open window);
4. windows an erasure reached after they were sealed (and before they were released) go the
   same way, 2–3;
5. last, every source partition's watermark to every partials partition — those that hold
   windows back first, the quiet ones after them — whenever partials were sealed, and at
   least every ``watermark_interval_s`` otherwise. When partials were sealed the watermarks
   go in the same write as the last hand-off's partials, after them
   (:meth:`Handoff.hand_off`'s ``marks_at``): one round trip to the broker instead of two.
   Each watermark is then what it would be once that hand-off's windows are dropped
   (:meth:`IngestStage.watermarks`' ``dropping``), and the windows are dropped (3) only once
   the whole write is acknowledged.

Why this order. A watermark past a window's end tells stage 2 that the source has nothing
more for it: were it durable before that source's partials, stage 2 could release the window
without them (an under-count published for ever). In one write, the partials come before the
watermarks on every partials partition (:meth:`HandoffTransport.write_partials` keeps each
partition's records in order, and a window's partials and the watermarks that close it are
on its one partials partition), so no reader sees a watermark before the partials it
follows; a write that fails leaves some partitions with both and others with neither, and
is redone whole. Dropping the state (and so committing the
input) before the partials are acknowledged would lose the window's events on a crash in
between. A quiet watermark lets stage 2 stop waiting for its partition — an advance — so the
partitions that hold windows back go first: no reader sees one partition advance without the
others' news from the same moment. For the same reason a quiet partition that has data again
says so (1) before anything else could close a window on its silence.

The transport is what differs: the Kafka worker writes the partials topic and waits for the
broker (:class:`stream_dp.pipeline.kafka.kafka_transport.KafkaTransport`); the in-memory
pipeline (replay, tests) feeds the same encoded records to its release stage
(:class:`stream_dp.pipeline.local.local.MemoryTransport`), where :func:`run_now` steps the
coroutine to its end.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
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


class HandoffTransport(Protocol):
    """Where stage 1's records go: the partials topic, or stage 2 in memory."""

    async def write_partials(self, records: Sequence[Placed]) -> None:
        """Write records to their partials partitions, in order; return once acknowledged."""

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
        """Steps 1–5 of the module docstring."""
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
            await self.hand_off(sealed, marks_at=now_mono if marked else None)
        resealed = ingest.reseal_due()  # erasures reached sealed, unreleased windows
        if resealed:
            await self.hand_off(resealed, marks_at=now_mono if marks_due else None)
            marked = marks_due
        if marks_due and not marked:
            await self.announce(ingest.watermarks(now_mono), now_mono)

    async def hand_off(
        self, sealed: Sequence[tuple[int, int]], *, marks_at: float | None = None
    ) -> None:
        """Steps 2–3: each sealed (partition, window)'s partials to the window's partials
        partition, acknowledged; then its state dropped. ``marks_at``: step 5 too, in the
        same write after the partials — every watermark as of that time, as it will be once
        these windows are dropped."""
        encoded = await self.transport.seal(
            seal_windows,
            self.ingest,
            sealed,
            self.partials_partition_of,
            max_bytes=self.max_bytes,
        )
        items: list[Placed] = [(k, v, r) for r, records in encoded for k, v in records]
        marks: list[SourceWatermark] = []
        if marks_at is not None:
            marks = self._ordered(self.ingest.watermarks(marks_at, dropping=sealed))
            items.extend(self._placed(marks))
        await self.transport.write_partials(items)
        for p, ws in sealed:
            self.ingest.drop(p, ws)
        if marks_at is not None:
            self._announced(marks, marks_at)
        self.faults.reached("after_partials_write")

    async def announce(self, marks: Sequence[SourceWatermark], now_mono: float) -> None:
        """Step 5: each watermark to every partials partition, the quiet ones last."""
        ordered = self._ordered(marks)
        items = self._placed(ordered)
        if items:
            await self.transport.write_partials(items)
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
