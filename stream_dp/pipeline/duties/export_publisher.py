"""Partner exports on the worker's transport (docs/exports.md#delivery).

The worker hands :class:`ExportPublisher` the input records of the partitions it owns (the
stage-1 partitions: exports need keyed input) next to stage 1; stage 1's seal of a
(partition, window) sends every export's records of that window and waits for their
acknowledgement *before* the window's partials are sent. The input offsets a window needs
are committed only after its partials are acknowledged, so a crash at any point sends the
window's records again, never loses them: delivery is **at least once**, and a window sent
twice is sent with the same records (the same pseudonyms, fields and k-anonymity decisions
from the same events). Partners deduplicate on the whole record.

Memory: the held events count in the worker's held state (:meth:`ExportPublisher.held_bytes`,
which the worker's hold guards add to stage 1's), so ``window.max_held_state_bytes`` pauses
fetching when the buffers grow past it (docs/exports.md#memory).

Erasure: the worker that records an erasure in the erasure log sends, once the log has it,
each partner its erasure record (:func:`~stream_dp.pipeline.duties.export_stage.erasure_records`);
every worker drops the erased person's events from the exports from then on.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence, Set

from stream_dp.config.model import Config
from stream_dp.kafka_client import ConsumerRecord, TopicPartition
from stream_dp.pipeline.duties.export_stage import ExportStage, erasure_records
from stream_dp.pipeline.kafka.erasure.erasure_worker import WorkerErasure
from stream_dp.pipeline.kafka.producing import Outgoing
from stream_dp.pipeline.kafka.publisher import Publisher
from stream_dp.privacy.pseudonymize import KeyRing


class ExportPublisher:
    """The export stage's input and sends (see the module docstring). Without exports
    configured every call does nothing."""

    def __init__(self, config: Config, keyring: KeyRing, publisher: Publisher) -> None:
        self.stage = ExportStage(config, keyring)
        self._input_topic = config.input.topic
        self._send_many = publisher.send_many
        self._metrics = publisher.metrics
        for export in config.exports:
            self._metrics.add_export(export.partner)

    def start(self, coverage_start_s: float, erasure: WorkerErasure | None) -> None:
        """The first covered window (earlier events are late) and the erasures in force;
        the erasure worker sends each partner its erasure records."""
        self.stage.coverage_start_s = coverage_start_s
        if erasure is not None and self.stage.exports:
            self.stage.erasures = erasure.erasures
            erasure.on_recorded = self.erased

    def observe(
        self, batch: Mapping[TopicPartition, Sequence[ConsumerRecord]], owned: Set[TopicPartition],
        now_s: float,
    ) -> None:  # fmt: skip
        """Hold the fetched input records of the partitions taken and owned here (exports
        need keyed input: the input partitions are stage 1's); forget the others'."""
        if not self.stage.exports:
            return
        self.stage.retain([tp.partition for tp in owned if tp.topic == self._input_topic])
        for tp, msgs in batch.items():
            if tp in owned and tp.topic == self._input_topic:
                self.stage.add(tp.partition, ((m.offset, m.value) for m in msgs), now_s)

    def held_bytes(self) -> int:
        """The export buffers' part of the worker's held state (``window.max_held_state_bytes``
        counts it: :meth:`ExportStage.held_bytes`); 0 without exports."""
        return self.stage.held_bytes()

    async def publish(self, sealed: Sequence[tuple[int, int]]) -> None:
        """Every export's records of the sealed (partition, window)s, acknowledged."""
        by_topic: dict[str, list[Outgoing]] = {}
        for partition, window_start_s in sealed:
            for batch in self.stage.close(partition, window_start_s):
                by_topic.setdefault(batch.topic, []).extend((k, v, None) for k, v in batch.records)
                self._metrics.export_records.labels(export=batch.export).inc(len(batch.records))
                if batch.suppressed:
                    suppressed = self._metrics.export_records_suppressed
                    suppressed.labels(export=batch.export).inc(batch.suppressed)
        for topic, items in by_topic.items():
            if items:
                await self._send_many(topic, items)

    async def erased(self, pseudonyms: Sequence[Mapping[str, bytes]]) -> None:
        """Each partner's erasure record of each person just recorded in the erasure log."""
        now = time.time()
        by_topic: dict[str, list[Outgoing]] = {}
        for person in pseudonyms:
            for topic, key, value in erasure_records(self.stage, person, now):
                by_topic.setdefault(topic, []).append((key, value, None))
        for topic, items in by_topic.items():
            await self._send_many(topic, items)
