"""What stages 0 and 1 send on: routed events with progress marks, partials, watermarks.

* Stage 0 (input not keyed by user) re-keys events by pseudonym to the repartition topic;
  its progress marks follow the records they cover on every partition, at least every
  second and twice per ``window.idle_close_s``.
* Stage 1 seals due windows (off the event loop), sends their partner exports' records
  (docs/exports.md) and then their partials to the window's
  partials partition, then every assigned partition's watermark to every partials
  partition — at least every second, since a restarted stage 2 needs fresh ones. A
  partition that reported idle and has data again is announced first, before any other
  partition's partials and watermarks can close a window.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from stream_dp.config.model import Config
from stream_dp.pipeline.duties.export_publisher import ExportPublisher
from stream_dp.pipeline.faults import NO_FAULTS, Faults
from stream_dp.pipeline.formats.partials import encode_watermark
from stream_dp.pipeline.kafka.producing import Outgoing
from stream_dp.pipeline.kafka.publisher import Publisher
from stream_dp.pipeline.stages.ingest import IngestStage
from stream_dp.pipeline.stages.offload import run_off_loop, seal_windows
from stream_dp.privacy.pseudonymize import KeyRing
from stream_dp.windows import TumblingWindows

#: Source watermarks are re-sent at least this often (a restarted stage 2 needs fresh ones).
WATERMARK_INTERVAL_S = 1.0
#: Key of stage 0's progress marks on the repartition topic (events are keyed by pseudonym).
ROUTED_MARK_KEY = "__progress__"


class StageOutput:
    """Stage 0's and stage 1's sends (see the module docstring)."""

    def __init__(
        self,
        config: Config,
        publisher: Publisher,
        *,
        keyring: KeyRing,
        faults: Faults = NO_FAULTS,
    ) -> None:
        self._publisher = publisher
        self._faults = faults
        self._keyed = config.input.keyed_by_user
        out = config.output
        self._partials_topic = out.partials_topic
        self._routed_topic = out.repartition_topic
        self._max_bytes = config.kafka.max_message_bytes
        self.windows = TumblingWindows(config.window.size_s, config.window.grace_s)
        #: The partials topic's and the repartition topic's partitions (set at start).
        self.partials_partitions: list[int] = []
        self.routed_to: list[int] = []
        #: Stage 0's progress marks are re-sent this often: at least every second, and twice
        #: per idle_close_s, so that an input partition going idle is seen soon after.
        self._marks_interval_s = min(WATERMARK_INTERVAL_S, config.window.idle_close_s / 2)
        self._marks_sent_mono = -math.inf
        self._progress_sent_mono = -math.inf
        self._silent: set[int] = set()
        #: Partner exports (docs/exports.md; a no-op without them): a sealed window's records
        #: are sent, and acknowledged, before its partials (so before its offsets are committed).
        self.exports = ExportPublisher(config, keyring, publisher)

    def partials_partition_of(self, window_start_s: int) -> int:
        """The partials partition that receives every partial of the window."""
        parts = self.partials_partitions
        return parts[self.windows.partition_of(window_start_s, len(parts))]

    async def route(
        self, ingest: IngestStage, routed: list[Outgoing], moved: bool, now_mono: float
    ) -> None:
        """Stage 0: the routed events (``moved``: input positions advanced) and progress
        marks, acknowledged when this returns (only then may their input be committed)."""
        if self._keyed:
            return
        if routed or moved or now_mono - self._progress_sent_mono >= self._marks_interval_s:
            # Progress marks follow the records they cover on every partition.
            routed.extend(
                (ROUTED_MARK_KEY, mark, r)
                for mark in ingest.progress_marks(now_mono)
                for r in self.routed_to
            )
            await self._publisher.send_many(self._routed_topic, routed)
            self._progress_sent_mono = now_mono

    async def seal(self, ingest: IngestStage, now_mono: float) -> None:
        """Stage 1: due windows' partials, resealed windows' partials, watermarks."""
        if self._woke_up(ingest, now_mono):
            # A partition stage 2 may think idle has data again: say so before any
            # other partition's partials and watermarks can close a window.
            await self._publish_watermarks(ingest, now_mono)
        sealed = ingest.due(now_mono)
        if sealed:
            await self.exports.publish(sealed)
        if sealed:
            await self._publish_partials(ingest, sealed)
        resealed = ingest.reseal_due()  # erasures reached sealed, unreleased windows
        if resealed:
            await self._publish_partials(ingest, resealed)
        if sealed or now_mono - self._marks_sent_mono >= WATERMARK_INTERVAL_S:
            await self._publish_watermarks(ingest, now_mono)

    async def _publish_partials(
        self, ingest: IngestStage, sealed: Sequence[tuple[int, int]]
    ) -> None:
        """Each sealed (partition, window)'s partials to the window's partition (sealed and
        encoded off the event loop)."""
        encoded = await run_off_loop(
            seal_windows,
            ingest,
            sealed,
            self.partials_partition_of,
            max_bytes=self._max_bytes,
        )
        items: list[Outgoing] = [(k, v, r) for r, records in encoded for k, v in records]
        await self._publisher.send_many(self._partials_topic, items)
        for p, ws in sealed:
            ingest.drop(p, ws)
        self._faults.reached("after_partials_write")

    async def _publish_watermarks(self, ingest: IngestStage, now_mono: float) -> None:
        """Each assigned partition's watermark to every partials partition."""
        items: list[Outgoing] = []
        # Partitions that hold windows back go first, so that no reader sees one partition
        # advance without the others' news from the same moment.
        marks = sorted(ingest.watermarks(now_mono), key=lambda m: m.quiet)
        for mark in marks:
            key, value = encode_watermark(mark)
            items.extend((key, value, r) for r in self.partials_partitions)
        if items:
            await self._publisher.send_many(self._partials_topic, items)
        self._marks_sent_mono = now_mono
        self._silent = {m.source_partition for m in marks if m.quiet}

    def _woke_up(self, ingest: IngestStage, now_mono: float) -> bool:
        """Whether a partition last reported idle with nothing open now has data."""
        if not self._silent:
            return False
        return any(
            not m.quiet for m in ingest.watermarks(now_mono) if m.source_partition in self._silent
        )
