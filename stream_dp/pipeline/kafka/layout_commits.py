"""The keyed input's per-window partition counts kept with the committed offsets.

A worker that saw partitions added to keyed input keeps each window begun before under the
count before (:class:`~stream_dp.pipeline.stages.placement.SourceLayout`). That knowledge
lived only in its memory: a worker restarted while such a window was open replayed its
records from the committed offsets and checked them against the count it found at start,
dead-lettering correctly placed records as ``misplaced_key`` (most of them, for a 4 → 6
change). So the layout is the metadata of every commit of a stage-1 partition, and a worker
taking those partitions reads it back (the group's committed offsets, as aiokafka's own
``committed`` reads them, metadata included) before it reads a record.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from aiokafka import TopicPartition

from stream_dp.pipeline.stages.ingest import IngestStage
from stream_dp.windows.tumbling import iso_utc

log = logging.getLogger(__name__)


def with_layout(
    offsets: dict[TopicPartition, int], stage1_topic: str, ingest: IngestStage
) -> dict[TopicPartition, Any]:
    """``offsets`` to commit, those of ``stage1_topic`` as (offset, the layout)."""
    metadata = ingest.layout.to_metadata(ingest.source_partitions)
    return {tp: (off, metadata) if tp.topic == stage1_topic else off for tp, off in offsets.items()}


async def restore_layout(
    consumer: Any, partitions: Iterable[TopicPartition], ingest: IngestStage
) -> None:
    """Before any record of ``partitions`` (stage-1 partitions just taken) is checked: the
    layout committed with their offsets, merged into ``ingest``'s."""
    taken = sorted(partitions)
    if not taken:
        return
    # aiokafka's consumer.committed() drops the metadata; this is the call it makes.
    committed = await consumer._coordinator.fetch_committed_offsets(taken)
    added = ingest.layout.restore(
        (meta.metadata for meta in committed.values() if meta.offset >= 0),
        ingest.source_partitions,
    )
    for until, count in added:
        log.warning(
            "keyed input: windows before %s are checked against the %d partitions they "
            "began under (the layout committed with the offsets replayed from)",
            iso_utc(until),
            count,
        )
