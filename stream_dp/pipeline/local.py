"""Both stages in one process, joined in memory: what ``stream-dp replay`` and tests run.

The worker joins :class:`IngestStage` and :class:`ReleaseStage` through the partials topic;
here the same records (encoded and decoded exactly as on the topic) go through a list, so
replay and the worker share every step but the transport.
"""

from __future__ import annotations

import random  # only the type of the reservoir/L0 sampling PRNG (see new_sampling_rng)
from collections.abc import Sequence

from stream_dp.config.model import Config
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.ingest import DeadLetter, IngestStage, InputRecord
from stream_dp.pipeline.ledger import LedgerIndex, LedgerRelease
from stream_dp.pipeline.partials import (
    SourceWatermark,
    encode_partial,
    encode_watermark,
    partials_partition,
)
from stream_dp.pipeline.release_stage import ExactTotalsObserver, ReleaseStage
from stream_dp.privacy.pseudonymize import KeyRing


class LocalPipeline:
    def __init__(
        self,
        config: Config,
        keyring: KeyRing,
        *,
        partitions: int = 1,
        partials_partitions: int = 1,
        ledger: LedgerIndex | None = None,
        metrics: Metrics | None = None,
        sampling_rng: random.Random | None = None,
        exact_totals_observer: ExactTotalsObserver | None = None,
    ) -> None:
        self.metrics = metrics if metrics is not None else Metrics()
        self.release = ReleaseStage(
            config,
            ledger=ledger,
            metrics=self.metrics,
            exact_totals_observer=exact_totals_observer,
        )
        self.ingest_stage = IngestStage(
            config,
            keyring,
            released=self.release.released,
            released_earlier=self.release.released_earlier,
            metrics=self.metrics,
            sampling_rng=sampling_rng,
        )
        self.ingest_stage.source_partitions = partitions
        if partitions == 1:
            self.ingest_stage.enforce_user_keys = False
        self.ingest_stage.assign(range(partitions), 0.0, routed=False)
        self.release.assign(range(partials_partitions))
        self._n_partials = partials_partitions
        self._offsets = [0] * partials_partitions
        self._size_s = config.window.size_s

    def ingest(
        self, partition: int, records: Sequence[InputRecord], *, now_s: float, now_mono_s: float
    ) -> list[DeadLetter]:
        return self.ingest_stage.ingest(partition, records, now_s=now_s, now_mono_s=now_mono_s)

    def step(self, now_mono_s: float, *, now_s: float) -> list[LedgerRelease]:
        """Seal due windows into partials, pass them and the watermarks on, release."""
        stage = self.ingest_stage
        for p, ws in stage.due(now_mono_s):
            self._send_partials(p, ws)
        for mark in stage.watermarks(now_mono_s):
            self._send_mark(mark)
        return self._release_due(now_s)

    def finish(self, *, now_s: float) -> list[LedgerRelease]:
        """End of a finite input: seal and release every open window."""
        stage = self.ingest_stage
        pending = stage.all_open()
        for p, ws in pending:
            self._send_partials(p, ws)
        # Every partial is out: each partition has sealed everything up to the last end.
        ends = [*self.release.open_windows(), *(ws for _, ws in pending)]
        if ends:
            sealed = float(max(ends) + self._size_s)
            for p in stage.partitions:
                self._send_mark(SourceWatermark(p, stage.source_partitions, sealed, True, False))
        return self._release_due(now_s)

    def _send_partials(self, partition: int, window_start_s: int) -> None:
        r = partials_partition(window_start_s, self._size_s, self._n_partials)
        for partial in self.ingest_stage.seal(partition, window_start_s):
            self._deliver(r, [v for _, v in encode_partial(partial)])
        self.ingest_stage.drop(partition, window_start_s)

    def _send_mark(self, mark: SourceWatermark) -> None:
        _, value = encode_watermark(mark)
        for r in range(self._n_partials):
            self._deliver(r, [value])

    def _deliver(self, r: int, values: list[bytes]) -> None:
        start = self._offsets[r]
        self._offsets[r] += len(values)
        self.release.ingest(r, [(start + i, v) for i, v in enumerate(values)])

    def _release_due(self, now_s: float) -> list[LedgerRelease]:
        out: list[LedgerRelease] = []
        for ws in self.release.due_windows():
            releases = self.release.compute_release(ws, now_s=now_s)
            for rel in releases:
                if self.release.ledger.get(rel.query, rel.window_start_s) is not rel:
                    self.release.record_ledgered(rel)
            self.release.finish_window(ws, releases, now_s)
            out.extend(releases)
        return out
