"""The CPU-heavy steps of a window, run off the event loop.

Sealing a window (bounding, exact totals per key, the partials' encoding) and drawing its
release (merge of partials, selection, noise, records, the ledger's encoding) take time in
proportion to the window's users and keys: 100,000 keys used to hold the event loop for
6 s, during which nothing was fetched and no other task ran. The worker now runs each in a
thread (:func:`run_off_loop`); the loop meanwhile keeps fetching, serving /metrics and
answering the group coordinator. The worker's iteration lock is held while a step runs, so
no other code touches the stages' state at the same time (the state is not shared with the
loop's other tasks), and each step still runs exactly where it ran before in the release
protocol (the ownership check right before the draw, the ledger write after it). A batch of
erasures read from the erasure log is removed from stage 1's windows the same way
(:meth:`~stream_dp.pipeline.kafka.erasure.erasure_worker.WorkerErasure.follow`, issue 28). Each step
reports the chunks it finishes (:func:`~stream_dp.ops.progress.report_progress`): a long
draw keeps ``/health/live`` up while it moves, and only a hang fails it.

Each step runs with the garbage collector paused: it creates hundreds of thousands of
short-lived, acyclic objects (records, keys), and collections triggered by them traversed
everything the process holds, doubling the time. Reference counting frees them as usual.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from typing import ParamSpec, TypeVar

from stream_dp.ops.progress import report_progress
from stream_dp.pipeline.formats.ledger import LedgerParts, LedgerRelease
from stream_dp.pipeline.formats.partials import encode_partial
from stream_dp.pipeline.gc_pause import gc_paused as gc_paused
from stream_dp.pipeline.stages.ingest import IngestStage
from stream_dp.pipeline.stages.release_stage import ReleaseStage

P = ParamSpec("P")
T = TypeVar("T")


async def run_off_loop(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` in a worker thread with the garbage collector paused."""

    def call() -> T:
        with gc_paused():
            return fn(*args, **kwargs)

    return await asyncio.to_thread(call)


#: (key, value) records for one partials partition.
PartitionRecords = tuple[int, list[tuple[str, bytes]]]


def seal_windows(
    ingest: IngestStage,
    sealed: Sequence[tuple[int, int]],
    partials_partition_of: Callable[[int], int],
    *,
    max_bytes: int,
) -> list[PartitionRecords]:
    """Stage 1: the partials of each sealed (partition, window), encoded, per partials
    partition. The windows' state stays until the caller drops it (after publishing)."""
    out: list[PartitionRecords] = []
    for p, ws in sealed:
        records = [
            kv
            for partial in ingest.seal(p, ws)
            for kv in encode_partial(partial, max_bytes=max_bytes)
        ]
        out.append((partials_partition_of(ws), records))
        report_progress("seal")
    return out


def draw_window(
    release: ReleaseStage, window_start_s: int, *, now_s: float, max_bytes: int
) -> list[tuple[LedgerRelease, LedgerParts]]:
    """Stage 2: fresh draws of a due window (:meth:`ReleaseStage.compute_release`) with
    the cut of their ledger parts, the first ones made (the rest are made a few at a time
    when written: :class:`LedgerParts`)."""
    drawn = release.compute_release(window_start_s, now_s=now_s)
    report_progress("draw")
    out = []
    for rel in drawn:
        parts = LedgerParts(rel, now_s=now_s, max_bytes=max_bytes)
        parts.prepare()
        out.append((rel, parts))
        report_progress("draw")  # each query's ledger parts cut, its first ones made
    return out


def output_values(release: LedgerRelease) -> list[tuple[str, bytes]]:
    """The output topic's (key, value) records of a release, in order (all at once: the
    worker publishes :meth:`LedgerRelease.output_chunks` instead)."""
    return list(zip(release.output_keys(), release.output_values(), strict=True))


def output_chunks(release: LedgerRelease) -> Iterator[list[tuple[str, bytes]]]:
    """The output topic's (key, value) records of a release, in order, a chunk at a time
    (:data:`~stream_dp.pipeline.formats.ledger.RECORDS_PER_CHUNK`)."""
    return release.output_chunks()
