"""One fetched batch of output records, ready for one database transaction: pure, no I/O.

:func:`assemble` maps every record (:mod:`stream_dp.sink.rows`), keeps the first of several
records with the same primary key (a record republished after a crash is byte-identical;
one that is not is a *conflict*, kept out and counted), and notes the offsets to commit
once the transaction has committed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

from stream_dp.sink.rows import (
    BadRecord,
    ReleaseRow,
    WindowId,
    WindowRow,
    parse_output_record,
)

K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True)
class Consumed:
    """One record as read from the topic."""

    topic: str
    partition: int
    offset: int
    value: bytes | None


@dataclass(frozen=True)
class BadPosition:
    """A record that cannot be stored, where it was, and why."""

    topic: str
    partition: int
    offset: int
    bad: BadRecord


@dataclass
class Batch:
    releases: dict[tuple[str, datetime, str], ReleaseRow] = field(default_factory=dict)
    windows: dict[WindowId, WindowRow] = field(default_factory=dict)
    bad: list[BadPosition] = field(default_factory=list)
    #: Records equal to one already in this batch (republished duplicates).
    duplicates: int = 0
    #: Records with the key of one already in this batch but other content (kept out).
    conflicts: int = 0
    #: (topic, partition) → the next offset to read: what to commit after the transaction.
    next_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    records: int = 0
    #: The records as read, in order (to store them one by one if the database refuses
    #: the batch).
    consumed: list[Consumed] = field(default_factory=list)

    def split(self) -> list[Batch]:
        """One batch per record, in the order read."""
        return [assemble([record]) for record in self.consumed]

    @property
    def touched_windows(self) -> list[WindowId]:
        """Every (query, window start) the batch writes to, sorted (the lock order)."""
        ids = {r.window_id for r in self.releases.values()} | set(self.windows)
        return sorted(ids)

    @property
    def empty(self) -> bool:
        return not (self.releases or self.windows or self.bad)


def assemble(records: Iterable[Consumed]) -> Batch:
    batch = Batch()
    for rec in records:
        batch.records += 1
        batch.consumed.append(rec)
        position = (rec.topic, rec.partition)
        batch.next_offsets[position] = max(batch.next_offsets.get(position, 0), rec.offset + 1)
        row = parse_output_record(rec.value)
        if isinstance(row, BadRecord):
            batch.bad.append(BadPosition(rec.topic, rec.partition, rec.offset, row))
        elif isinstance(row, ReleaseRow):
            _keep_first(batch, batch.releases, row.primary_key, row)
        else:
            _keep_first(batch, batch.windows, row.window_id, row)
    return batch


def _keep_first(batch: Batch, rows: dict[K, V], key: K, row: V) -> None:
    earlier = rows.get(key)
    if earlier is None:
        rows[key] = row
    elif earlier == row:
        batch.duplicates += 1
    else:
        batch.conflicts += 1
