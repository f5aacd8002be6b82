"""The worker's readers of its compacted internal topics: the ledger and the continual topic.

Each read goes to a *fresh fence*: a marker written behind the partition's end and read back
(:class:`stream_dp.pipeline.kafka.ledger_log.LedgerLog`), so that everything written before the
read began — by any worker — is in the index afterwards. Reads are retried under the
publisher's policy: at start until they succeed, during the loop for at most
``kafka.give_up_after_s``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

from stream_dp.errors import StreamDPError
from stream_dp.pipeline.formats.continual_state import ContinualStore
from stream_dp.pipeline.formats.ledger import LedgerIndex
from stream_dp.pipeline.kafka.ledger_log import LedgerLog
from stream_dp.pipeline.kafka.publisher import Publisher
from stream_dp.pipeline.stages.ingest import IngestStage
from stream_dp.pipeline.stages.release_stage import ReleaseStage

log = logging.getLogger(__name__)

#: bounds: auto — how often the ledger is read again for bounds still awaited (the same set)
BOUNDS_READ_INTERVAL_S = 1.0


class LedgerReader:
    """Reads the ledger (and the continual topic) into their indexes, to fresh fences."""

    def __init__(
        self,
        ledger_topic: str,
        ledger: LedgerIndex,
        *,
        publisher: Publisher,
        client_options: dict[str, Any],
    ) -> None:
        self.ledger = ledger
        self._publisher = publisher
        self._options = client_options
        self.ledger_log = LedgerLog(
            ledger_topic,
            ledger,
            client_options=client_options,
            send=lambda k, v, p: publisher.send(ledger_topic, k, v, partition=p),
            note_legacy_fences=True,
        )
        self.continual_log: LedgerLog | None = None
        #: bounds: auto — the windows last read for, and when (see read_awaited_bounds)
        self._bounds_read: tuple[frozenset[int], float] = (frozenset(), -math.inf)

    async def start_ledger(self, partitions: Sequence[int]) -> None:
        """Open the ledger reader and read the whole ledger (retried until it succeeds)."""
        ledger_log = self.ledger_log
        await self._publisher.retry(
            "start ledger reader", lambda: ledger_log.start(partitions), bounded=False
        )
        await self.catch_up_ledger(None, bounded=False)

    async def sweep(self, window_size_s: int) -> int:
        """Tombstone what the start-up read found behind the progress records (released
        windows' parts and published markers) and earlier versions' fences: none of it is
        needed again (docs/exactly-once.md#compaction-a-bounded-ledger), and compaction then
        removes it. Returns the number of tombstones written; a failure only leaves them for
        the next start (logged)."""
        parts = self.ledger_log.partitions
        items: list[tuple[str, bytes | None, int | None]] = [
            (key, None, parts[(ws // window_size_s) % len(parts)]) for ws, key in self.ledger.sweep
        ]
        items += [(key, None, p) for p, key in self.ledger_log.legacy_fences]
        self.ledger.sweep = []
        self.ledger_log.legacy_fences = []
        if not items:
            return 0
        try:
            await self._publisher.send_many(self.ledger_log.topic, items)
        except StreamDPError as exc:
            log.warning("ledger: tombstones of released windows not written (%s)", exc)
            return 0
        log.info("ledger: %d records of released windows tombstoned", len(items))
        return len(items)

    async def start_continual(
        self, topic: str, store: ContinualStore, partitions: Sequence[int]
    ) -> None:
        """Open the continual topic's reader and read it all (retried until it succeeds)."""
        publisher = self._publisher
        reader = self.continual_log = LedgerLog(
            topic,
            store,
            client_options=self._options,
            send=lambda k, v, p: publisher.send(topic, k, v, partition=p),
        )
        await publisher.retry(
            "start continual reader", lambda: reader.start(partitions), bounded=False
        )
        await self.catch_up_continual(None, bounded=False)

    async def catch_up_ledger(self, partitions: Sequence[int] | None, *, bounded: bool) -> None:
        """Read the ledger to fresh fences on ``partitions`` (None: all)."""
        ledger_log = self.ledger_log
        await self._publisher.retry(
            "read the ledger", lambda: ledger_log.catch_up(partitions), bounded=bounded
        )

    async def catch_up_continual(
        self, partitions: Sequence[int] | None, *, bounded: bool = True
    ) -> None:
        """Read the continual topic to fresh fences on ``partitions`` (None: all)."""
        assert self.continual_log is not None
        reader = self.continual_log
        await self._publisher.retry(
            "read the continual topic", lambda: reader.catch_up(partitions), bounded=bounded
        )

    async def poll(self) -> int:
        """What the ledger holds now, without a fence (housekeeping)."""
        return await self.ledger_log.poll()

    async def read_awaited_bounds(
        self,
        ingest: IngestStage,
        release: ReleaseStage,
        ledger_partition_of: Callable[[int], int],
        now_mono: float,
    ) -> None:
        """bounds: auto — windows due in either stage wait for their bounds, which the
        releaser of the window before writes to that window's ledger partition: read those
        partitions (when the set of awaited windows changed, else at most once a second)."""
        awaited = ingest.awaiting_bounds | release.awaiting_bounds
        awaited = {ws for ws in awaited if release.bounds_for(ws) is None}
        if not awaited:
            self._bounds_read = (frozenset(), -math.inf)
            return
        last_set, last_mono = self._bounds_read
        if awaited == last_set and now_mono - last_mono < BOUNDS_READ_INTERVAL_S:
            return
        self._bounds_read = (frozenset(awaited), now_mono)
        size = release.windows.size_s
        partitions = sorted({ledger_partition_of(ws - size) for ws in awaited})
        await self.catch_up_ledger(partitions, bounded=True)

    def readers(self) -> list[LedgerLog]:
        """The open readers (to stop)."""
        return [r for r in (self.ledger_log, self.continual_log) if r is not None]
