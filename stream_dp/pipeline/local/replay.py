"""``stream-dp replay``: the whole pipeline offline, on a JSON-lines file, without Kafka.

The file plays one input partition; its line numbers are offsets. At the end of the file
every open window is closed (the input is complete, so waiting longer would change nothing)
and released once through the same engine, ledger format and budget as the worker.

**Every release spends budget.** Without a ledger, each run is a fresh, independent release
that draws new noise and spends its own budget: two runs over one file, both shared, cost
twice the ε (and averaging them halves the noise). With ``ledger_path`` the run keeps a
ledger file (the ledger topic's records as JSON lines): windows already in it are reprinted
with their recorded values and never drawn again, and new draws are appended to it. The
running-total state of cumulative queries goes into the same file (lines marked
``"topic": "continual"``; they hold exact per-window totals: keep the file as private as
the input), so a later run continues their horizons without drawing any window again. The
file is locked for the whole run (a second run on it waits, then reprints), each window is
fsync-ed before the next, and a torn last line is left out (:mod:`.replay_ledger`).

The first covered window is ``window.start_at``, else the ledger's, else the window of the
first event read — which depends on the data: set ``window.start_at`` for output you share.

With ``erasures_path`` the run applies erasure requests
(:mod:`~stream_dp.pipeline.local.erasure_replay`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stream_dp.config.model import Config
from stream_dp.errors import ConfigError
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.fingerprint_gate import replay_ledger_fingerprint
from stream_dp.pipeline.formats.continual_state import ContinualStore
from stream_dp.pipeline.formats.ledger import LedgerIndex, LedgerRelease
from stream_dp.pipeline.formats.records import dead_letter_record
from stream_dp.pipeline.local.erasure_replay import read_erasure_file
from stream_dp.pipeline.local.local import LocalPipeline
from stream_dp.pipeline.local.replay_ledger import (
    ReplayLedgerFile,
    complete_part,
    parse_ledger_lines,
)
from stream_dp.pipeline.stages.ingest import DeadLetter, InputRecord
from stream_dp.pipeline.stages.late_events import DroppedEventsNotice, LateEventsNotice
from stream_dp.privacy.budget import BOUNDS_CHARGE
from stream_dp.privacy.pseudonymize import KeyRing

log = logging.getLogger(__name__)

BATCH = 5000


@dataclass
class ReplayResult:
    #: Every release of the windows this run covered, in window order: recorded ones (from
    #: the ledger file) and fresh draws.
    releases: list[LedgerRelease]
    dead: list[DeadLetter]
    #: (query, window) releases drawn by this run (each spent its ε).
    drawn: int = 0
    #: (query, window) releases reprinted from the ledger file (no new spend).
    from_ledger: int = 0
    ledger_path: Path | None = None
    coverage_start_s: int | None = None
    lines_read: int = 0
    notes: list[str] = field(default_factory=list)
    #: The response record of each erasure request (``--erasures``), as the worker's.
    erasure_responses: list[dict[str, Any]] = field(default_factory=list)
    #: ``bounds: auto``: each window's ledgered histograms (``#bounds``, never published;
    #: their ε is charged to the window like a query's).
    bounds_releases: list[LedgerRelease] = field(default_factory=list)

    @property
    def usable(self) -> int:
        """Lines that were events (not dead-lettered)."""
        return self.lines_read - len(self.dead)


def _batches(path: Path, result: ReplayResult) -> Iterator[list[InputRecord]]:
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise ConfigError(f"cannot read --input {path}: {exc.strerror}") from None
    with handle:
        batch: list[InputRecord] = []
        for offset, line in enumerate(handle):
            stripped = line.rstrip(b"\r\n")
            if not stripped.strip():
                continue
            result.lines_read += 1
            batch.append((offset, None, stripped))
            if len(batch) >= BATCH:
                yield batch
                batch = []
        if batch:
            yield batch


def read_ledger_file(path: Path, continual: ContinualStore | None = None) -> LedgerIndex:
    """A ledger file's records in order, read without the lock (inspection only: a run
    reads its file through :class:`~.replay_ledger.ReplayLedgerFile`); a torn last line is
    left out, lines marked ``"topic": "continual"`` go to ``continual``."""
    if not path.exists():
        return LedgerIndex()
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read --ledger {path}: {exc.strerror}") from None
    return parse_ledger_lines(path, complete_part(data)[0], continual)


def replay_file(
    config: Config,
    keyring: KeyRing,
    path: Path,
    *,
    metrics: Metrics | None = None,
    ledger_path: Path | None = None,
    erasures_path: Path | None = None,
) -> ReplayResult:
    """Run the pipeline over a file (see the module docstring for what it spends)."""
    result = ReplayResult(releases=[], dead=[], ledger_path=ledger_path)
    erasures = (
        read_erasure_file(erasures_path, config, keyring) if erasures_path is not None else None
    )
    continual = ContinualStore()
    # locked for the whole run: a second run on the file waits, then reprints our windows
    sink = ReplayLedgerFile.open(ledger_path) if ledger_path is not None else None
    try:
        ledger = sink.read(continual) if sink is not None else None
        recorded = {(r.query, r.window_start_s) for r in ledger.releases()} if ledger else set()
        fingerprint = (
            replay_ledger_fingerprint(ledger, config, ledger_path)
            if ledger is not None and ledger_path is not None
            else None
        )
        if fingerprint is not None:  # a new ledger file, or one from before fingerprints
            assert sink is not None and ledger is not None
            sink.append(*fingerprint)
            sink.sync()
            ledger.feed(*fingerprint)
        pipeline = LocalPipeline(
            config,
            keyring,
            metrics=metrics,
            ledger=ledger,
            ledger_sink=_kept_records(sink.append) if sink is not None else None,
            continual_store=continual,
            continual_sink=sink.append_continual if sink is not None else None,
            retain_ledger=True,
            erasures=None if erasures is None else erasures.erasures,
            window_sync=sink.sync if sink is not None else None,
        )
        covered = _run(pipeline, path, result)
        result.releases = [r for r in covered if r.query != BOUNDS_CHARGE]
        result.bounds_releases = [r for r in covered if r.query == BOUNDS_CHARGE]
    finally:
        if sink is not None:
            sink.close()
    result.coverage_start_s = pipeline.coverage_start_s
    late = LateEventsNotice(pipeline.metrics, config.window.start_at).observe(
        pipeline.coverage_start_s, now_mono_s=0.0
    )
    if late is not None:
        result.notes.append(late)
    result.notes += DroppedEventsNotice(pipeline.metrics, config.queries).observe(0.0)
    if erasures is not None:
        result.erasure_responses = erasures.responses(config, pipeline.coverage_start_s)
    if ledger is not None:
        result.from_ledger = sum(
            1 for r in result.releases if (r.query, r.window_start_s) in recorded
        )
    result.drawn = len(result.releases) - result.from_ledger
    if ledger_path is None and result.drawn:
        result.notes.append(
            "no --ledger: every release above is a fresh, independent draw that spends its own "
            "budget; running again draws new noise (pass --ledger FILE to keep one value per "
            "window)"
        )
    if config.window.start_at is None and ledger is None:
        result.notes.append(
            "window.start_at is not set: the first covered window is the first event's, which "
            "depends on the data; set window.start_at before sharing these numbers"
        )
    return result


def _run(pipeline: LocalPipeline, path: Path, result: ReplayResult) -> list[LedgerRelease]:
    # Event time drives the watermark; wall-clock idleness plays no part offline.
    now_mono = 0.0
    size = pipeline.release.windows.size_s
    for batch in _batches(path, result):
        if pipeline.coverage_start_s is None:
            first = _earliest_event_s(pipeline, batch)
            if first is not None:
                pipeline.start_coverage_at(math.floor(first / size) * size)
        result.dead.extend(pipeline.ingest(0, batch, now_s=time.time(), now_mono_s=now_mono))
        pipeline.step(now_mono, now_s=time.time())
    pipeline.finish(now_s=time.time())
    coverage = pipeline.coverage_start_s
    if coverage is None:
        return []
    stage = pipeline.release
    last = max(stage.cursor(r) for r in stage.partitions)
    return [
        rel for rel in pipeline.release.ledger.releases() if coverage <= rel.window_start_s < last
    ]


def _earliest_event_s(pipeline: LocalPipeline, batch: list[InputRecord]) -> float | None:
    decode = pipeline.ingest_stage.decoder.decode_parts
    now = time.time()
    times = [p[1] for p in (decode(v, now) for _, _, v in batch) if isinstance(p, tuple)]
    return min(times) if times else None


def dead_letter_values(dead: list[DeadLetter]) -> list[dict[str, Any]]:
    """The dead-letter records the worker would publish; the source is the file, its line
    numbers (from 0) the offsets."""
    now = time.time()
    return [
        dead_letter_record(
            reason=d.reason,
            detail=d.detail,
            source_topic="file",
            source_partition=d.partition,
            source_offset=d.offset,
            payload=d.payload,
            now_s=now,
        )
        for d in dead
    ]


def _kept_records(append: Callable[[str, bytes], None]) -> Callable[[str, bytes | None], None]:
    """The replay's ledger file keeps every record (it is never compacted): tombstones of
    released windows' records are not written to it."""

    def sink(key: str, value: bytes | None) -> None:
        if value is not None:
            append(key, value)

    return sink
