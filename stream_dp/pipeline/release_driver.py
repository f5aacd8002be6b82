"""The release protocol, written once, against a small transport.

Every due window is released by :meth:`ReleaseDriver.release_window`, in this order:

1. the window's partials partition is still ours (:meth:`ReleaseTransport.owns`); with
   erasure on, its ``cut`` is in the ledger and every partial applied the erasures it must
   (:class:`ErasureGate`);
2. cumulative queries' running totals: their state is read to a fence, the window's step is
   drawn once, written and read back — or the window waits while the previous window's
   state is not durable (:mod:`stream_dp.pipeline.stages.cumulative`);
3. the draw (noise, budget charged — in memory only) with the cut of its ledger parts;
4. every ledger part is written and acknowledged (made a few at a time: the records of a
   large window are encoded chunk by chunk, never all held), then the window's ledger
   partition is read back to a fresh fence: the ledger's *winners* — the first complete
   draw of each (query, window) in log order, ours or an earlier owner's — are what counts;
5. ``bounds: auto`` — the next window's bounds, decided from the winners, go to the ledger;
6. each unpublished winner is published (output records, then its ``published`` marker);
7. the window's state is dropped and the partials partition's ``progress`` written;
8. once that is acknowledged, the window's ledger records are tombstoned (its parts, losing
   draws' too, its published markers, its cut and bounds decision, the progress record it
   replaced on that partition): compaction then bounds the ledger by the open windows.

A progress record read back in step 4 that covers the window means another owner released
and published it: nothing is published, our parts are tombstoned (docs/exactly-once.md).

The transport is what differs: the Kafka worker writes to topics and reads them back
(:class:`stream_dp.pipeline.kafka.kafka_transport.KafkaTransport`); the in-memory pipeline
(replay, tests) feeds the same encoded records to its indexes
(:class:`stream_dp.pipeline.local.local.MemoryTransport`). PipelineDP's ``DPEngine`` over a
``PipelineBackend`` is the model.

The driver is a coroutine. The worker awaits it on its event loop (writes wait for the
broker, the draw runs in a thread). The in-memory transport never suspends — its methods are
coroutines that return at once — so :func:`run_now` steps the driver's coroutine to its end
without an event loop: replay and tests stay synchronous and can run inside a running loop,
and a transport that did suspend is an error, never a silent partial release.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable, Coroutine, Generator, Sequence
from typing import Any, ParamSpec, Protocol, TypeVar

from stream_dp.errors import StreamDPError
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.faults import NO_FAULTS, Faults
from stream_dp.pipeline.formats.continual_state import encode_state
from stream_dp.pipeline.formats.ledger import (
    BOUNDS_PREFIX,
    CUT_PREFIX,
    LedgerParts,
    LedgerRelease,
    encode_cut,
    encode_progress,
    encode_published,
    progress_key,
    published_key,
)
from stream_dp.pipeline.stages.offload import draw_window
from stream_dp.pipeline.stages.release_stage import ReleaseStage
from stream_dp.windows import TumblingWindows
from stream_dp.windows.tumbling import iso_utc

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

#: (key, value, partition) — a record bound for one partition of a topic (None: a tombstone).
Placed = tuple[str, bytes | None, int]

#: A window waiting for its predecessor's running-total state is looked at again after
#: this long (each look writes fences to the continual and ledger topics).
CONTINUAL_WAIT_RETRY_S = 0.5


class ReleaseTransport(Protocol):
    """Where the release protocol's records go and are read back from."""

    def owns(self, partials_partition: int) -> bool:
        """Whether this process still owns that partials partition (a window's)."""

    async def write_ledger(self, records: Sequence[Placed]) -> None:
        """Write ledger records; return once they are acknowledged (durable)."""

    async def read_ledger(self, partitions: Sequence[int]) -> None:
        """Read these ledger partitions to a fresh fence into the ledger index."""

    async def write_continual(self, records: Sequence[Placed]) -> None:
        """Write running-total state records; return once acknowledged."""

    async def read_continual(self, partitions: Sequence[int]) -> None:
        """Read these continual partitions to a fresh fence into the continual store."""

    async def publish_output(self, release: LedgerRelease) -> None:
        """Write a release's output records (all on its partition, the window record last)."""

    async def draw(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a CPU-heavy step of the release (in a thread, or right here)."""

    def window_released(self, window_start_s: int) -> None:
        """Called once a window's progress record is written."""


class ErasureGate(Protocol):
    """erasure.enabled — whether a window may be drawn now, and its end."""

    async def ready_to_draw(
        self,
        window_start_s: int,
        release: ReleaseStage,
        write_cut: Callable[[int], Awaitable[None]],
    ) -> bool: ...

    def released(self, window_start_s: int) -> None: ...


def window_partition(
    windows: TumblingWindows, partitions: Sequence[int], window_start_s: int
) -> int:
    """The partition of a topic spread by window (partials, ledger) that holds every record
    of the window: consecutive windows go round-robin over ``partitions`` (the topic's
    partitions, sorted). The one place the partials and ledger partitions are computed:
    the worker's and replay's :class:`ReleaseDriver` and ``ledger rebuild`` ask it."""
    return partitions[windows.partition_of(window_start_s, len(partitions))]


class ReleaseDriver:
    """Releases due windows of a :class:`ReleaseStage` through a :class:`ReleaseTransport`."""

    def __init__(
        self,
        stage: ReleaseStage,
        transport: ReleaseTransport,
        *,
        partials_partitions: Sequence[int],
        ledger_partitions: Sequence[int],
        continual_partitions: Sequence[int],
        max_bytes: int,
        metrics: Metrics,
        erasure: ErasureGate | None = None,
        faults: Faults = NO_FAULTS,
        continual_wait_retry_s: float = CONTINUAL_WAIT_RETRY_S,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stage = stage
        self.transport = transport
        self.windows: TumblingWindows = stage.windows
        self.partials_partitions = list(partials_partitions)
        self.ledger_partitions = list(ledger_partitions)
        self.continual_partitions = list(continual_partitions)
        self.continual_store = stage.continual_store
        self.max_bytes = max_bytes
        self.metrics = metrics
        self.erasure = erasure
        self.faults = faults
        self.continual_wait_retry_s = continual_wait_retry_s
        self.clock = clock
        self.monotonic = monotonic
        #: window start → monotonic time before which a waiting window is not looked at again
        self._continual_retry_at: dict[int, float] = {}

    def partials_partition_of(self, window_start_s: int) -> int:
        """The partials partition that receives every partial of the window (stage 1's
        hand-off, :mod:`stream_dp.pipeline.handoff`, sends them there;
        :func:`window_partition` computes it, for ``ledger rebuild`` too)."""
        return window_partition(self.windows, self.partials_partitions, window_start_s)

    def ledger_partition_of(self, window_start_s: int) -> int:
        """The ledger partition that holds every record of the window's releases."""
        return window_partition(self.windows, self.ledger_partitions, window_start_s)

    async def release_window(
        self, window_start_s: int, *, now_s: float | None = None
    ) -> list[LedgerRelease] | None:
        """Release one due window (see the module docstring): its winners, or None when it
        is not released now (no longer owned; an erasure or the previous window's
        running-total state still awaited). ``now_s``: the release time (default: the
        clock at the draw and at the end)."""
        stage = self.stage
        if not self.transport.owns(self.partials_partition_of(window_start_s)):
            return None
        if stage.ledger.covered(window_start_s, self.windows.size_s):
            stage.adopt_ledger()  # read released meanwhile: the cursors move past it
            return None
        if self.erasure is not None and not await self.erasure.ready_to_draw(
            window_start_s, stage, self.write_cut
        ):
            return None  # a partial must first apply an erasure (stage 1 re-seals it)
        self.faults.reached("before_draw")
        if not await self._continue_running_totals(window_start_s):
            return None
        drawn_records = await self.transport.draw(
            self._draw, window_start_s, now_s=self.clock() if now_s is None else now_s
        )
        drawn = [rel for rel, _ in drawn_records]
        ledger_partition = self.ledger_partition_of(window_start_s)
        for rel, parts in drawn_records:
            # read back, our parts are known as ours: their records are not decoded again
            stage.ledger.expect_own(rel, parts.keys)
            await self._write_parts(parts, ledger_partition)
            self.faults.reached("after_ledger_write")
        # Everything before our fence on that partition is now known: if another owner's
        # draw completed earlier, it is the one that counts (and ours is never shown).
        await self.transport.read_ledger([ledger_partition])
        self.faults.reached("after_ledger_readback")
        if stage.ledger.covered(window_start_s, self.windows.size_s):
            await self._released_elsewhere(window_start_s, drawn_records, ledger_partition)
            return None
        winners = stage.winners(window_start_s)
        decision = stage.bounds_decision(window_start_s)
        if decision is not None:  # bounds: auto — the next window's bounds, from the winners
            key, value = decision
            await self.transport.write_ledger([(key, value, ledger_partition)])
        won = {w.release_id for w in winners}
        lost = [rel for rel in drawn if rel.release_id not in won]
        if lost:
            self.metrics.ledger_draws_discarded.inc(len(lost))
            log.warning(
                "another owner ledgered this window first: publishing its values, not ours",
                extra={"window": iso_utc(window_start_s)},
            )
        for rel in winners:
            if not rel.published:
                await self.publish(rel)
        tombstones = self.tombstones(window_start_s, winners)
        cursor = stage.finish_window(
            window_start_s, winners, self.clock() if now_s is None else now_s
        )
        if self.erasure is not None:
            self.erasure.released(window_start_s)
        r = self.partials_partition_of(window_start_s)
        key, value = encode_progress(r, len(self.partials_partitions), cursor, window_start_s)
        await self.transport.write_ledger([(key, value, ledger_partition)])
        self.faults.reached("after_progress")
        # Only now, behind the durable progress record, is the window's history not needed.
        await self.transport.write_ledger(tombstones)
        self.transport.window_released(window_start_s)
        log.info(
            "window released",
            extra={
                "window": iso_utc(window_start_s),
                "query": ",".join(w.query for w in winners),
                "drawn_here": any(rel.release_id in won for rel in drawn),
            },
        )
        return winners

    async def _write_parts(self, parts: LedgerParts, ledger_partition: int) -> None:
        """A release's ledger parts, a few at a time (:meth:`LedgerParts.groups`): the
        first made with the draw, each next one in the transport's thread once the one
        before is acknowledged, so that the bytes of a large release are never all held
        (docs/operations.md#memory-at-release)."""
        for first, last in parts.groups():
            records = parts.take(first, last)
            if records is None:
                records = await self.transport.draw(parts.encode, first, last)
            await self.transport.write_ledger([(k, v, ledger_partition) for k, v in records])
            del records

    def tombstones(self, window_start_s: int, winners: Sequence[LedgerRelease]) -> list[Placed]:
        """The window's ledger records no reader needs once its progress record is durable
        (docs/exactly-once.md#compaction-a-bounded-ledger): every part read of it (the
        winners' and any losing or incomplete draw's), its published markers and cut on its
        ledger partition; its bounds decision (written on the previous window's partition); the
        progress record of partials partition ``r`` this window's replaces on its ledger
        partition (the previous window of ``r`` mapped to it)."""
        stage = self.stage
        size = self.windows.size_s
        here = self.ledger_partition_of(window_start_s)
        keys = set(stage.ledger.keys_of_window(window_start_s))
        keys.update(published_key(w.query, window_start_s) for w in winners)
        if self.erasure is not None:
            keys.add(CUT_PREFIX + iso_utc(window_start_s))
        out: list[Placed] = [(k, None, here) for k in sorted(keys)]
        if stage.schedule.auto:
            key = BOUNDS_PREFIX + iso_utc(window_start_s)
            out.append((key, None, self.ledger_partition_of(window_start_s - size)))
        n, ledger_n = len(self.partials_partitions), len(self.ledger_partitions)
        previous = window_start_s - math.lcm(n, ledger_n) * size
        first = stage.coverage_start_s
        if first is not None and previous >= first:
            r = self.partials_partition_of(window_start_s)
            out.append((progress_key(r, previous), None, here))
        return out

    async def _released_elsewhere(
        self,
        window_start_s: int,
        drawn_records: Sequence[tuple[LedgerRelease, LedgerParts]],
        ledger_partition: int,
    ) -> None:
        """The read-back found a progress record covering the window: another owner
        released and published it (its parts may be compacted away). Ours never count:
        nothing is published, they are tombstoned, the cursors move on."""
        stage = self.stage
        if drawn_records:
            self.metrics.ledger_draws_discarded.inc(len(drawn_records))
            log.warning(
                "another owner released this window meanwhile: our draw is discarded",
                extra={"window": iso_utc(window_start_s)},
            )
        ours = [(k, None, ledger_partition) for _, parts in drawn_records for k in parts.keys]
        stage.adopt_ledger()
        if ours:
            await self.transport.write_ledger(ours)

    def _draw(
        self, window_start_s: int, *, now_s: float
    ) -> list[tuple[LedgerRelease, LedgerParts]]:
        """The draw with the cut of its ledger parts (in the transport's thread), after the test
        fault hook (a long draw: :data:`~stream_dp.pipeline.faults.LONG_DRAW_ENV`)."""
        self.faults.in_draw()
        return draw_window(self.stage, window_start_s, now_s=now_s, max_bytes=self.max_bytes)

    async def publish(self, rel: LedgerRelease) -> None:
        """Output records, then the ``published`` marker in the ledger."""
        await self.transport.publish_output(rel)
        self.faults.reached("after_output_write")
        key, value = encode_published(rel)
        await self.transport.write_ledger(
            [(key, value, self.ledger_partition_of(rel.window_start_s))]
        )
        rel.published = True

    async def write_cut(self, window_start_s: int) -> None:
        """The window's ``cut`` (erasure on): acknowledged before the erasure log is read."""
        key, value = encode_cut(window_start_s)
        await self.transport.write_ledger([(key, value, self.ledger_partition_of(window_start_s))])

    async def _continue_running_totals(self, window_start_s: int) -> bool:
        """Cumulative queries of a due window: read their state to a fence, draw the
        window's step on the previous window's winning draw, write it and read it back —
        so that compute_release takes the winning draw (stream_dp.pipeline.stages.cumulative).
        False when the previous window's state is not durable yet: the window waits."""
        stage = self.stage
        if not stage.continual.continual_pending(window_start_s):
            return True
        if self.monotonic() < self._continual_retry_at.get(window_start_s, -math.inf):
            return False
        parts = self.continual_partitions
        targets = [parts[i] for i in stage.continual.continual_partitions(window_start_s)]
        await self.transport.read_continual(targets)
        prepared = stage.continual.prepare_continual(window_start_s)
        if prepared.waiting:
            # Released meanwhile by its owner? Its ledger partition says (its state, if
            # any, was written before its ledger records and is read again after them).
            previous = window_start_s - self.windows.size_s
            await self.transport.read_ledger([self.ledger_partition_of(previous)])
            stage.adopt_ledger()
            await self.transport.read_continual(targets)
            prepared = stage.continual.prepare_continual(window_start_s)
            if prepared.waiting:
                if self.continual_wait_retry_s > 0:
                    retry_at = self.monotonic() + self.continual_wait_retry_s
                    self._continual_retry_at = {window_start_s: retry_at}
                return False
        self._continual_retry_at.pop(window_start_s, None)
        if prepared.to_write:
            items: list[Placed] = []
            for draw in prepared.to_write:
                target = parts[stage.cumulative.partition_of(draw.query, draw.window_start_s)]
                items.extend(
                    (k, v, target) for k, v in encode_state(draw, max_bytes=self.max_bytes)
                )
            await self.transport.write_continual(items)
            self.faults.reached("after_continual_write")
            # The first complete draw in log order is now final: ours, or an earlier one.
            await self.transport.read_continual(targets)
            lost = [
                d
                for d in prepared.to_write
                if getattr(self.continual_store.winner(d.query, d.window_start_s), "draw_id", None)
                != d.draw_id
            ]
            if lost:
                self.metrics.ledger_draws_discarded.inc(len(lost))
                log.warning(
                    "another owner wrote this window's running-total state first: its draw "
                    "is used, not ours",
                    extra={"window": iso_utc(window_start_s)},
                )
        return True


class Acknowledged:
    """An acknowledgement already given (an in-memory write): awaiting it never suspends,
    and it may be awaited any number of times, or never."""

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield  # a generator that ends at once


#: What an in-memory transport's writes return.
ACKNOWLEDGED = Acknowledged()


class SuspendedError(StreamDPError):
    """A coroutine run with :func:`run_now` waited for something: its transport is not an
    in-memory one."""


def run_now(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends to its end, without an event loop."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coroutine.close()
    raise SuspendedError(
        "the release protocol waited on an in-memory transport: run it on an event loop "
        "with the Kafka transport instead"
    )
