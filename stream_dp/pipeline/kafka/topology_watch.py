"""The internal and input topics' partition counts, watched while the worker runs.

A change of the partials, ledger or continual topic's count is fatal (each window must keep
one owner and one ledger partition); a change of the input or repartition topic is loud
(log, metric) and makes the worker not ready until the windows open then are out.
"""

from __future__ import annotations

import logging

from stream_dp.errors import StreamDPError
from stream_dp.ops.health import Health
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.kafka.publisher import Publisher

log = logging.getLogger(__name__)


class TopologyError(StreamDPError):
    """A topic the release protocol depends on changed shape while the worker ran."""


class TopologyWatch:
    """Partition counts seen at start per topic, and when a change stops settling."""

    def __init__(
        self,
        publisher: Publisher,
        *,
        metrics: Metrics,
        health: Health,
        window_size_s: int,
    ) -> None:
        self._publisher = publisher
        self._metrics = metrics
        self._health = health
        self._window_size_s = window_size_s
        self.counts: dict[str, int] = {}
        #: topics whose count may never change (partials, ledger, continual)
        self.fixed: set[str] = set()
        self._unsettled_until_s: float | None = None

    def record(self, topic: str, count: int, *, fixed: bool) -> None:
        """The count seen at start."""
        self.counts[topic] = count
        if fixed:
            self.fixed.add(topic)

    async def partitions(self, topic: str, *, watermark_s: float | None) -> int:
        """The topic's partition count now; a change since start is loud (log, metric,
        readiness) — fatal for the partials, ledger and continual topics."""
        count = len(await self._publisher.partitions(topic, bounded=True))
        before = self.counts.setdefault(topic, count)
        if count != before:
            self._metrics.topology_changes.labels(topic=topic).inc()
            log.error(
                "topic %s changed from %d to %d partitions while the worker ran",
                topic,
                before,
                count,
            )
            self.counts[topic] = count
            if topic in self.fixed:
                raise TopologyError(
                    f"the partition count of {topic} changed from {before} to {count}: each "
                    "window must keep one owner and one ledger partition. Restore the count, "
                    "or start a new deployment (a new kafka.group_id) with window.start_at "
                    "after the last released window"
                )
            # A user may now sit on a partition of each layout: stage 2 merges one layout
            # per window, and the worker is not ready until the windows open now are out.
            self._health.set("topology_stable", False)
            self._unsettled_until_s = (watermark_s or 0.0) + 2 * self._window_size_s
        return count

    def settle(self, watermark_s: float) -> None:
        """Ready again once the release watermark passed the windows open at the change."""
        if self._unsettled_until_s is not None and watermark_s >= self._unsettled_until_s:
            self._unsettled_until_s = None
            self._health.set("topology_stable", True)
