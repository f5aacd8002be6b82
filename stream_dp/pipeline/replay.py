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
from stream_dp.pipeline.ingest import DeadLetter, InputRecord
from stream_dp.pipeline.ledger import LedgerRelease
from stream_dp.pipeline.local import LocalPipeline
from stream_dp.pipeline.records import dead_letter_record
from stream_dp.privacy.pseudonymize import KeyRing

BATCH = 5000


def _batches(path: Path) -> Iterator[list[InputRecord]]:
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
            batch.append((offset, None, stripped))
            if len(batch) >= BATCH:
                yield batch
                batch = []
        if batch:
            yield batch


def replay_file(
    config: Config, keyring: KeyRing, path: Path, *, metrics: Metrics | None = None
) -> tuple[list[LedgerRelease], list[DeadLetter]]:
    """Run the pipeline over a file; returns the releases in order and the dead letters."""
    pipeline = LocalPipeline(config, keyring, metrics=metrics)
    dead: list[DeadLetter] = []
    releases: list[LedgerRelease] = []
    # Event time drives the watermark; wall-clock idleness plays no part offline.
    now_mono = 0.0
    for batch in _batches(path):
        dead.extend(pipeline.ingest(0, batch, now_s=time.time(), now_mono_s=now_mono))
        releases.extend(pipeline.step(now_mono, now_s=time.time()))
    releases.extend(pipeline.finish(now_s=time.time()))
    return releases, dead


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
