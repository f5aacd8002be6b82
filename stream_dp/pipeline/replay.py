"""``stream-dp replay``: the whole pipeline offline, on a JSON-lines file, without Kafka.

The file plays one input partition; its line numbers are offsets. At the end of the file
every open window is closed (the input is complete, so waiting longer would change nothing)
and released once through the same engine, ledger format and budget as the worker.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Replay:
    """What a replay of a file produced."""

    releases: list[LedgerRelease]  #: in order
    dead: list[DeadLetter]  #: the bad lines, with their reasons
    records: int  #: non-empty lines read

    @property
    def usable(self) -> int:
        """Lines that were events (not dead-lettered)."""
        return self.records - len(self.dead)


def replay_file(
    config: Config, keyring: KeyRing, path: Path, *, metrics: Metrics | None = None
) -> Replay:
    """Run the pipeline over a file: the releases in order, the dead letters, the count."""
    pipeline = LocalPipeline(config, keyring, metrics=metrics)
    dead: list[DeadLetter] = []
    releases: list[LedgerRelease] = []
    records = 0
    # Event time drives the watermark; wall-clock idleness plays no part offline.
    now_mono = 0.0
    for batch in _batches(path):
        records += len(batch)
        dead.extend(pipeline.ingest(0, batch, now_s=time.time(), now_mono_s=now_mono))
        releases.extend(pipeline.step(now_mono, now_s=time.time()))
    releases.extend(pipeline.finish(now_s=time.time()))
    return Replay(releases, dead, records)


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
