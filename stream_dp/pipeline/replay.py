"""``stream-dp replay``: the whole pipeline offline, on a JSON-lines file, without Kafka.

The file plays one input partition; its line numbers are offsets. At the end of the file
every open window is closed (the input is complete, so waiting longer would change nothing)
and released once through the same engine, ledger format and budget as the worker.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stream_dp.config.model import Config
from stream_dp.errors import ConfigError
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.engine import DeadLetter, Engine
from stream_dp.pipeline.ledger import LedgerRelease
from stream_dp.pipeline.records import dead_letter_record
from stream_dp.privacy.pseudonymize import KeyRing

BATCH = 5000


def _batches(path: Path) -> Iterator[list[tuple[int, bytes | None]]]:
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise ConfigError(f"cannot read --input {path}: {exc.strerror}") from None
    with handle:
        batch: list[tuple[int, bytes | None]] = []
        for offset, line in enumerate(handle):
            stripped = line.rstrip(b"\r\n")
            if not stripped.strip():
                continue
            batch.append((offset, stripped))
            if len(batch) >= BATCH:
                yield batch
                batch = []
        if batch:
            yield batch


def replay_file(
    config: Config, keyring: KeyRing, path: Path, *, metrics: Metrics | None = None
) -> tuple[list[LedgerRelease], list[DeadLetter]]:
    """Run the pipeline over a file; returns the releases in order and the dead letters."""
    engine = Engine(config, keyring, metrics=metrics)
    engine.assign([0], time.monotonic())
    dead: list[DeadLetter] = []
    releases: list[LedgerRelease] = []
    # Event time drives the watermark; wall-clock idleness plays no part offline.
    now_mono = 0.0
    for batch in _batches(path):
        dead.extend(engine.ingest(0, batch, now_s=time.time(), now_mono_s=now_mono))
        for ws in engine.due_windows(now_mono):
            releases.extend(_release(engine, ws))
    for ws in engine.open_windows():
        releases.extend(_release(engine, ws))
    return releases, dead


def _release(engine: Engine, window_start_s: int) -> list[LedgerRelease]:
    now = time.time()
    rels = engine.compute_release(window_start_s, now_s=now)
    for rel in rels:
        engine.record_ledgered(rel)
    engine.finish_window(window_start_s, rels, now)
    return rels


def dead_letter_values(config: Config, dead: list[DeadLetter]) -> list[dict[str, Any]]:
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
