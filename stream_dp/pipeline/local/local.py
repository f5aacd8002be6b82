"""Both stages in one process, joined in memory: what ``stream-dp replay`` and tests run.

The worker joins :class:`IngestStage` and :class:`ReleaseStage` through the partials topic
and the ledger topic; here the same records (encoded and decoded exactly as on the topics)
go through lists, so replay and the worker share every step but the transport — the ledger
included: each window is released by the same :class:`~.release_driver.ReleaseDriver` as in
the worker, on :class:`MemoryTransport`, where a release is "ledgered" by feeding its
encoded records to the ledger index, and what is published is the index's winner. Stage 1's
partials and watermarks go the same way, by the worker's hand-off
(:class:`~stream_dp.pipeline.handoff.Handoff`), each record written fed to the release stage.
Cumulative queries' state goes the same way through the continual topic's records
(:mod:`.continual_state`).

With ``erasures`` (docs/erasure.md) both stages drop the erased users' events in the
windows each erasure covers; every erasure is known before the first event, so every partial
has applied them all, and each window's release writes its ``cut`` as the worker's does.
"""

from __future__ import annotations

import random  # only the type of the reservoir/L0 sampling PRNG (see new_sampling_rng)
from collections.abc import Awaitable, Callable, Sequence
from typing import ParamSpec, TypeVar

from stream_dp.config.fingerprint import Fingerprint, Topology, deployment_fingerprint
from stream_dp.config.model import Config
from stream_dp.errors import PrivacyError
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.formats.continual_state import ContinualStore
from stream_dp.pipeline.formats.ledger import LedgerIndex, LedgerRelease, encode_coverage
from stream_dp.pipeline.formats.partials import SourceWatermark
from stream_dp.pipeline.handoff import Handoff
from stream_dp.pipeline.release_driver import ACKNOWLEDGED, Placed, ReleaseDriver, run_now
from stream_dp.pipeline.stages.ingest import DeadLetter, IngestSettings, IngestStage, InputRecord
from stream_dp.pipeline.stages.release_stage import ExactTotalsObserver, ReleaseStage
from stream_dp.privacy.continual.counter import NoiseSource
from stream_dp.privacy.erasure import ErasureSet
from stream_dp.privacy.pseudonymize import KeyRing

P = ParamSpec("P")
T = TypeVar("T")

#: Receives every ledger record written, as (key, value), in log order.
LedgerSink = Callable[[str, bytes], None]
#: Takes the ledger's records, tombstones (None) included.
LedgerLogSink = Callable[[str, bytes | None], None]


def local_topology(config: Config, partials_partitions: int = 1) -> Topology:
    """The internal topics' shape in one process: one ledger partition, one continual
    partition when there are cumulative queries."""
    continual = 1 if any(q.cumulative for q in config.queries) else 0
    return Topology(
        partials_partitions=partials_partitions, ledger_partitions=1, continual_partitions=continual
    )


class LocalPipeline:
    def __init__(
        self,
        config: Config,
        keyring: KeyRing,
        *,
        partitions: int = 1,
        partials_partitions: int = 1,
        ledger: LedgerIndex | None = None,
        ledger_sink: LedgerLogSink | None = None,
        metrics: Metrics | None = None,
        sampling_rng: random.Random | None = None,
        exact_totals_observer: ExactTotalsObserver | None = None,
        retain_ledger: bool = False,
        continual_store: ContinualStore | None = None,
        continual_sink: LedgerSink | None = None,
        continual_noise: NoiseSource | None = None,
        erasures: ErasureSet | None = None,
        window_sync: Callable[[], None] | None = None,
        enforce_user_keys: bool | None = None,
    ) -> None:
        self.metrics = metrics if metrics is not None else Metrics()
        self._ledger_sink = ledger_sink
        #: Called once each window's ledger and continual records are written (replay makes
        #: them durable there, before the next window).
        self._window_sync = window_sync
        self._continual_sink = continual_sink
        #: What the partials and the ledger mean here (one ledger and continual partition).
        self.fingerprint: Fingerprint = deployment_fingerprint(
            config, local_topology(config, partials_partitions)
        )
        self.release = ReleaseStage(
            config,
            partials_partitions=partials_partitions,
            ledger=ledger,
            metrics=self.metrics,
            exact_totals_observer=exact_totals_observer,
            retain_ledger=retain_ledger,
            key_id_of=lambda ws: keyring.for_window(ws).key_id,
            key_check_of=lambda ws: keyring.for_window(ws).key_check,
            continual_store=continual_store,
            continual_noise=continual_noise,
            fingerprint=self.fingerprint.digest,
        )
        self.ingest_stage = IngestStage(
            config,
            keyring,
            released=self.release,
            metrics=self.metrics,
            sampling_rng=sampling_rng,
            settings=IngestSettings(
                fingerprint=self.fingerprint.digest,
                erasures=erasures,
                erasures_applied=erasures.position if erasures is not None else 0,
                # one partition holds everything: keys are checked only when asked (the
                # bench times the check as the worker reading keyed input runs it)
                enforce_user_keys=False
                if partitions == 1 and enforce_user_keys is None
                else enforce_user_keys,
                source_partitions=partitions,
            ),
        )
        self.erasures = erasures
        self._partitions = partitions
        self._assigned = False
        if self.release.coverage_start_s is not None:
            self._assign(0.0)
        self.release.assign(range(partials_partitions))
        self._n_partials = partials_partitions
        self._offsets = [0] * partials_partitions
        self._windows = self.release.windows
        self._max_bytes = config.kafka.max_message_bytes
        transport = MemoryTransport(self)
        self._driver = ReleaseDriver(
            self.release,
            transport,
            partials_partitions=range(partials_partitions),
            ledger_partitions=[0],
            continual_partitions=[0],
            max_bytes=self._max_bytes,
            metrics=self.metrics,
            erasure=LocalErasureGate(erasures) if erasures is not None else None,
            continual_wait_retry_s=0.0,
        )
        #: Stage 1's hand-off, the worker's; watermarks on every step.
        self._handoff = Handoff.beside(
            self._driver, self.ingest_stage, transport, watermark_interval_s=0.0
        )

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
            size = self._windows.size_s
            self._write_ledger([encode_coverage(coverage, size, self.fingerprint)])

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
        """Seal due windows into partials, pass them and the watermarks on
        (:meth:`Handoff.step`), release."""
        run_now(self._handoff.step(now_mono_s))
        # In memory the write is acknowledged already: its windows go now, not next turn.
        run_now(self._handoff.settle())
        return self._release_due(now_s)

    def finish(self, *, now_s: float) -> list[LedgerRelease]:
        """End of a finite input: seal and release every open window (and every empty one
        before the last). Under ``bounds: auto`` a window is sealed only once the window
        before it is released (its bounds come from there), so this goes window by window."""
        out: list[LedgerRelease] = []
        run_now(self._handoff.settle())  # the last turn's write: its windows dropped
        while True:
            pending = self.ingest_stage.all_open()
            held = [ws for _, ws in pending if self.release.bounds_for(ws) is None]
            first_held = min(held) if held else None
            due = [(p, ws) for p, ws in pending if first_held is None or ws < first_held]
            if due:
                run_now(self._handoff.hand_off(due))
            # Every partial is out: each partition has sealed everything up to the last
            # end (or up to the first window still waiting for its bounds).
            ends = [*self.release.open_windows(), *(ws for _, ws in pending)]
            if ends:
                last = max(ends) + self._windows.size_s
                sealed = float(last if first_held is None else first_held)
                marks = [
                    SourceWatermark(p, self._partitions, sealed, True, held != [])
                    for p in range(self._partitions)
                ]
                run_now(self._handoff.announce(marks, now_mono=0.0))
            before = self._progress()
            out.extend(self._release_due(now_s))
            # a window whose every query was refused for budget releases nothing, yet it
            # is released (its bounds decided): go on to the windows it held
            if first_held is None or self._progress() == before:
                return out

    def _progress(self) -> tuple[int | None, ...]:
        return tuple(self.release.last_released(r) for r in range(self._n_partials))

    def _deliver(self, records: Sequence[Placed]) -> None:
        """Partials-topic records to the release stage, each partition's in order."""
        i = 0
        while i < len(records):
            r = records[i][2]
            j = i
            while j < len(records) and records[j][2] == r:
                j += 1
            values = [v for _, v, _ in records[i:j] if v is not None]
            start = self._offsets[r]
            self._offsets[r] += len(values)
            self.release.ingest(r, [(start + n, v) for n, v in enumerate(values)])
            i = j

    def _write_ledger(self, records: Sequence[tuple[str, bytes | None]]) -> None:
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
        """The release protocol (:mod:`.release_driver`) on the in-memory transport: the
        winners published, or None when a cumulative query must wait for its previous
        window."""
        return run_now(self._driver.release_window(window_start_s, now_s=now_s))


class MemoryTransport:
    """:class:`~stream_dp.pipeline.release_driver.ReleaseTransport` and
    :class:`~stream_dp.pipeline.handoff.HandoffTransport` in memory: a record written is fed
    to its index (a partial or watermark: to the release stage) at once (and to the sinks),
    so every read is already at the fence; nothing is published here — the caller gets the
    winners. It never suspends."""

    def __init__(self, pipeline: LocalPipeline) -> None:
        self._pipeline = pipeline

    def owns(self, partials_partition: int) -> bool:
        return True

    async def write_ledger(self, records: Sequence[Placed]) -> None:
        self._pipeline._write_ledger([(k, v) for k, v, _ in records])

    async def read_ledger(self, partitions: Sequence[int]) -> None:
        return None

    async def write_continual(self, records: Sequence[Placed]) -> None:
        self._pipeline._write_continual([(k, v) for k, v, _ in records if v is not None])

    async def read_continual(self, partitions: Sequence[int]) -> None:
        return None

    async def publish_output(self, release: LedgerRelease) -> None:
        return None

    async def draw(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        return fn(*args, **kwargs)

    async def send_partials(self, records: Sequence[Placed]) -> Awaitable[None]:
        self._pipeline._deliver(records)
        return ACKNOWLEDGED

    async def seal(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        return fn(*args, **kwargs)

    def window_released(self, window_start_s: int) -> None:
        if self._pipeline._window_sync is not None:
            self._pipeline._window_sync()


class LocalErasureGate:
    """Every erasure is known before the first event here: the window's ``cut`` is written
    and every partial has applied what it requires (else a PrivacyError: cannot happen)."""

    def __init__(self, erasures: ErasureSet) -> None:
        self._erasures = erasures

    async def ready_to_draw(
        self,
        window_start_s: int,
        release: ReleaseStage,
        write_cut: Callable[[int], Awaitable[None]],
    ) -> bool:
        await write_cut(window_start_s)
        if release.erasures_applied(window_start_s) < self._erasures.required_position(
            window_start_s
        ):
            raise PrivacyError("a partial missed an erasure it must apply")
        return True

    def released(self, window_start_s: int) -> None:
        return None
