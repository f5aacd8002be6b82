"""Both stages in one process, joined in memory: what ``stream-dp replay`` and tests run.

The worker joins :class:`IngestStage` and :class:`ReleaseStage` through the partials topic
and the ledger topic; here the same records (encoded and decoded exactly as on the topics)
go through lists, so replay and the worker share every step but the transport — the ledger
included: a release is "ledgered" by feeding its encoded records to the ledger index, and
what is published is the index's winner, as in the worker. Cumulative queries' state goes
the same way through the continual topic's records (:mod:`.continual_state`).

With ``erasures`` (docs/erasure.md) both stages drop the erased users' events in the
windows each erasure covers; every erasure is known before the first event, so every partial
has applied them all, and each window's release writes its ``cut`` as the worker's does.
"""

from __future__ import annotations

import random  # only the type of the reservoir/L0 sampling PRNG (see new_sampling_rng)
from collections.abc import Callable, Sequence

from stream_dp.config.model import Config
from stream_dp.errors import PrivacyError
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.continual_state import ContinualStore, encode_state
from stream_dp.pipeline.ingest import DeadLetter, IngestStage, InputRecord
from stream_dp.pipeline.ledger import (
    LedgerIndex,
    LedgerRelease,
    encode_coverage,
    encode_cut,
    encode_progress,
    encode_published,
    encode_release,
)
from stream_dp.pipeline.partials import SourceWatermark, encode_partial, encode_watermark
from stream_dp.pipeline.release_stage import ExactTotalsObserver, ReleaseStage
from stream_dp.privacy.continual.counter import NoiseSource
from stream_dp.privacy.erasure import ErasureSet
from stream_dp.privacy.pseudonymize import KeyRing

#: Receives every ledger record written, as (key, value), in log order.
LedgerSink = Callable[[str, bytes], None]


class LocalPipeline:
    def __init__(
        self,
        config: Config,
        keyring: KeyRing,
        *,
        partitions: int = 1,
        partials_partitions: int = 1,
        ledger: LedgerIndex | None = None,
        ledger_sink: LedgerSink | None = None,
        metrics: Metrics | None = None,
        sampling_rng: random.Random | None = None,
        exact_totals_observer: ExactTotalsObserver | None = None,
        retain_ledger: bool = False,
        continual_store: ContinualStore | None = None,
        continual_sink: LedgerSink | None = None,
        continual_noise: NoiseSource | None = None,
        erasures: ErasureSet | None = None,
    ) -> None:
        self.metrics = metrics if metrics is not None else Metrics()
        self._ledger_sink = ledger_sink
        self._continual_sink = continual_sink
        self.release = ReleaseStage(
            config,
            partials_partitions=partials_partitions,
            ledger=ledger,
            metrics=self.metrics,
            exact_totals_observer=exact_totals_observer,
            retain_ledger=retain_ledger,
            key_id_of=lambda ws: keyring.for_window(ws).key_id,
            continual_store=continual_store,
            continual_noise=continual_noise,
        )
        self.ingest_stage = IngestStage(
            config,
            keyring,
            released=self.release,
            metrics=self.metrics,
            sampling_rng=sampling_rng,
        )
        self.ingest_stage.source_partitions = partitions
        self.erasures = erasures
        if erasures is not None:
            self.ingest_stage.erasures = erasures
            self.ingest_stage.erasures_applied = erasures.position
        if partitions == 1:
            self.ingest_stage.enforce_user_keys = False
        self._partitions = partitions
        self._assigned = False
        if self.release.coverage_start_s is not None:
            self._assign(0.0)
        self.release.assign(range(partials_partitions))
        self._n_partials = partials_partitions
        self._offsets = [0] * partials_partitions
        self._windows = self.release.windows
        self._max_bytes = config.kafka.max_message_bytes

    @property
    def coverage_start_s(self) -> int | None:
        return self.release.coverage_start_s

    def start_coverage_at(self, first_window_start_s: int) -> None:
        """Set the first covered window when neither the configuration nor the ledger does
        (it is recorded in the ledger, as the worker records its own)."""
        if self.release.coverage_start_s is None:
            self.release.set_coverage(first_window_start_s)
            coverage = self.release.coverage_start_s
            assert coverage is not None
            self._write_ledger([encode_coverage(coverage, self._windows.size_s)])

    def ingest(
        self, partition: int, records: Sequence[InputRecord], *, now_s: float, now_mono_s: float
    ) -> list[DeadLetter]:
        if not self._assigned:
            self._assign(now_mono_s)
        return self.ingest_stage.ingest(partition, records, now_s=now_s, now_mono_s=now_mono_s)

    def _assign(self, now_mono_s: float) -> None:
        """Assign the partitions — once the coverage is known where it can be: it is where
        each partition's event time begins."""
        self.ingest_stage.assign(range(self._partitions), now_mono_s, routed=False)
        self._assigned = True

    def step(self, now_mono_s: float, *, now_s: float) -> list[LedgerRelease]:
        """Seal due windows into partials, pass them and the watermarks on, release."""
        stage = self.ingest_stage
        for p, ws in stage.due(now_mono_s):
            self._send_partials(p, ws)
        for mark in stage.watermarks(now_mono_s):
            self._send_mark(mark)
        return self._release_due(now_s)

    def finish(self, *, now_s: float) -> list[LedgerRelease]:
        """End of a finite input: seal and release every open window (and every empty one
        before the last). Under ``bounds: auto`` a window is sealed only once the window
        before it is released (its bounds come from there), so this goes window by window."""
        out: list[LedgerRelease] = []
        while True:
            pending = self.ingest_stage.all_open()
            held = [ws for _, ws in pending if self.release.bounds_for(ws) is None]
            first_held = min(held) if held else None
            for p, ws in pending:
                if first_held is None or ws < first_held:
                    self._send_partials(p, ws)
            # Every partial is out: each partition has sealed everything up to the last
            # end (or up to the first window still waiting for its bounds).
            ends = [*self.release.open_windows(), *(ws for _, ws in pending)]
            if ends:
                last = max(ends) + self._windows.size_s
                sealed = float(last if first_held is None else first_held)
                for p in range(self._partitions):
                    mark = SourceWatermark(p, self._partitions, sealed, True, held != [])
                    self._send_mark(mark)
            released = self._release_due(now_s)
            out.extend(released)
            if first_held is None or not released:
                return out

    def _send_partials(self, partition: int, window_start_s: int) -> None:
        r = self._windows.partition_of(window_start_s, self._n_partials)
        for partial in self.ingest_stage.seal(partition, window_start_s):
            values = [v for _, v in encode_partial(partial, max_bytes=self._max_bytes)]
            self._deliver(r, values)
        self.ingest_stage.drop(partition, window_start_s)

    def _send_mark(self, mark: SourceWatermark) -> None:
        _, value = encode_watermark(mark)
        for r in range(self._n_partials):
            self._deliver(r, [value])

    def _deliver(self, r: int, values: list[bytes]) -> None:
        start = self._offsets[r]
        self._offsets[r] += len(values)
        self.release.ingest(r, [(start + i, v) for i, v in enumerate(values)])

    def _write_ledger(self, records: Sequence[tuple[str, bytes]]) -> None:
        for key, value in records:
            self.release.ledger.feed(key, value)
            if self._ledger_sink is not None:
                self._ledger_sink(key, value)

    def _write_continual(self, records: Sequence[tuple[str, bytes]]) -> None:
        for key, value in records:
            self.release.continual_store.feed(key, value)
            if self._continual_sink is not None:
                self._continual_sink(key, value)

    def _release_due(self, now_s: float) -> list[LedgerRelease]:
        out: list[LedgerRelease] = []
        for ws in self.release.due_windows():
            released = self.release_window(ws, now_s=now_s)
            if released is None:
                break  # waits for its previous window's state (never here: in order)
            out.extend(released)
        return out

    def release_window(self, window_start_s: int, *, now_s: float) -> list[LedgerRelease] | None:
        """What the worker does with a due window: cumulative queries' state first (drawn,
        written, read back), then draw, ledger, publish the ledger's winners, record
        progress. None when a cumulative query must wait for its previous window."""
        stage = self.release
        if self.erasures is not None:
            self._write_ledger([encode_cut(window_start_s)])
            if stage.erasures_applied(window_start_s) < self.erasures.required_position(
                window_start_s
            ):  # every erasure was known before the first event: cannot happen
                raise PrivacyError("a partial missed an erasure it must apply")
        if stage.continual_pending(window_start_s):
            prepared = stage.prepare_continual(window_start_s)
            if prepared.waiting:
                return None
            for draw in prepared.to_write:
                self._write_continual(encode_state(draw, max_bytes=self._max_bytes))
        for rel in stage.compute_release(window_start_s, now_s=now_s):
            self._write_ledger(encode_release(rel, now_s=now_s, max_bytes=self._max_bytes))
        winners = stage.winners(window_start_s)
        decision = stage.bounds_decision(window_start_s)
        if decision is not None:  # bounds: auto — the next window's bounds
            self._write_ledger([decision])
        for rel in winners:
            if not rel.published:
                self._write_ledger([encode_published(rel)])
        cursor = stage.finish_window(window_start_s, winners, now_s)
        r = self._windows.partition_of(window_start_s, self._n_partials)
        self._write_ledger([encode_progress(r, self._n_partials, cursor)])
        return winners
