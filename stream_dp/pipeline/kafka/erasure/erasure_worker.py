"""The worker's erasure duties (docs/erasure.md), with Kafka at the edges.

- **Requests** (``erasure.requests_topic``, read in the deployment's consumer group: one
  worker per partition): each request is validated, its user id normalised and
  pseudonymized at once — the raw id goes no further — and recorded in the erasure log
  (acknowledged: from then on it is *applied*); the worker then reads the ledger to fresh
  fences and answers on ``erasure.responses_topic`` (:mod:`~stream_dp.pipeline.stages.erasure_gate`
  says what the answer can promise). Offsets are committed once the response is
  acknowledged; a crash before that records and answers the request again (the log is
  keyed by pseudonym, responses by request id: the latest counts). An unreadable request is
  dead-lettered (``bad_erasure_request``, no payload unless enabled) and, when its
  request id can be read, answered ``rejected``.
- **The log** is read back at start (to a fence) and followed while running: new erasures
  go into the set and, at once, into stage 1's state (:meth:`IngestStage.apply_erasures`).
- **Stage 2** writes a window's ``cut`` to the ledger, reads the log to a fence, and draws
  the window only once its partials applied what the cut requires.
- **Memory**: an erasure is forgotten once every window it covers is known released; stage
  1 forgets a kept sealed window once its release is known — from its own releases, or from
  the ledger, which it polls (without fences) while it keeps windows others must release.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from stream_dp.config.model import Config
from stream_dp.errors import PrivacyError, StreamDPError
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.formats.erasure_records import (
    BAD_REQUEST,
    BadErasureRequest,
    ErasureRequest,
    WindowRanges,
    decode_request,
    encode_erasure,
    encode_rejection,
    encode_response,
)
from stream_dp.pipeline.kafka.erasure.erasure_log import LOG_PARTITION, ErasureLog
from stream_dp.pipeline.stages.erasure_gate import MIN_STALE_AFTER_S, ErasureGate, released_until
from stream_dp.pipeline.stages.ingest import DeadLetter, IngestStage
from stream_dp.pipeline.stages.offload import run_off_loop
from stream_dp.pipeline.stages.release_stage import ReleaseStage
from stream_dp.privacy.erasure import Erasure, ErasureSet, erasure_pseudonyms
from stream_dp.privacy.pseudonymize import KeyRing
from stream_dp.windows.tumbling import iso_utc

log = logging.getLogger(__name__)

#: (key, value, partition or None)
Outgoing = tuple[str | bytes | None, bytes, int | None]
SendMany = Callable[[str, Sequence[Outgoing]], Awaitable[None]]
#: The worker's retry: (what, operation, bounded) — bounded gives up after
#: kafka.give_up_after_s (the worker then stops without committing).
Retry = Callable[[str, Callable[[], Awaitable[Any]], bool], Awaitable[Any]]
#: How often stage 1 looks in the ledger for releases of the sealed windows it keeps.
LEDGER_POLL_INTERVAL_S = 1.0


class WorkerErasure:
    def __init__(
        self,
        config: Config,
        keyring: KeyRing,
        *,
        metrics: Metrics,
        client_options: dict[str, Any],
        send_many: SendMany,
        retry: Retry,
    ) -> None:
        self.config = config
        self.keyring = keyring
        self.metrics = metrics
        erasure = config.erasure
        self.requests_topic = erasure.requests_topic
        self._log_topic = erasure.log_topic
        self._responses_topic = erasure.responses_topic
        self.erasures = ErasureSet()
        self.gate = ErasureGate(
            self.erasures, stale_after_s=max(MIN_STALE_AFTER_S, config.window.life_s)
        )
        self._send_many = send_many
        self._retry = retry
        self.log = ErasureLog(
            erasure.log_topic,
            self.erasures,
            client_options=client_options,
            send=lambda k, v: send_many(erasure.log_topic, [(k, v, LOG_PARTITION)]),
        )
        #: Requests partition → the next offset to commit (its responses are acknowledged).
        self._positions: dict[int, int] = {}
        self._ledger_polled_mono = -float("inf")
        self._forgotten_before = -float("inf")
        self._ingest: IngestStage | None = None
        #: Called with the pseudonyms of the people just recorded in the log (acknowledged):
        #: the partner exports' erasure records (docs/exports.md).
        self.on_recorded: Callable[[list[dict[str, bytes]]], Awaitable[None]] | None = None

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self, ingest: IngestStage, release: ReleaseStage) -> None:
        """Read the whole log back (to a fence) before any record is processed."""
        await self._retry("start the erasure log reader", self.log.start, False)
        if ingest.erasures is not self.erasures or not ingest.keep_sealed:
            raise StreamDPError(
                "stage 1 must be built with this erasure log's erasures and keep_sealed "
                "(IngestSettings) before the log is followed"
            )
        self._ingest = ingest
        await self.catch_up(bounded=False)
        self.erasures.forget(_released_before(release))
        self.metrics.erasures_active.set(len(self.erasures))
        log.info("erasure log loaded: %d erasures in force", len(self.erasures))

    async def stop(self) -> None:
        await self.log.stop()

    # -- the log ------------------------------------------------------------------------------
    async def catch_up(self, *, bounded: bool = True) -> None:
        """Read the log to a fresh fence and apply what is new."""
        new = await self._retry("read the erasure log", self.log.catch_up, bounded)
        await self._apply(new)

    async def follow(self) -> None:
        """Apply whatever the log brought since the last read (each loop iteration)."""
        await self._apply(await self.log.poll())

    async def _apply(self, new: Sequence[Erasure]) -> None:
        assert self._ingest is not None
        # The set took them in as they were read, so both stages drop the users' new events
        # from now on; stage 1's state now, before anything else can be sealed (partials say
        # how far their state applied the log). A burst is one vectorised removal per window,
        # in a thread (issue #28: on the loop, heartbeats stopped and the group evicted every
        # worker); the caller holds the iteration lock and awaits it, so no other code
        # touches stage 1's state meanwhile, and events fetched meanwhile are ingested after.
        if new:
            await run_off_loop(self._ingest.apply_erasures, new, self.erasures.position)
        else:
            self._ingest.apply_erasures(new, self.erasures.position)
        self.metrics.erasures_active.set(len(self.erasures))

    # -- requests -----------------------------------------------------------------------------
    async def handle_requests(
        self,
        batches: Sequence[tuple[int, Sequence[tuple[int, bytes | None]]]],
        *,
        release: ReleaseStage,
        read_ledger: Callable[[], Awaitable[None]],
        include_payload: bool,
    ) -> list[DeadLetter]:
        """Record, then answer, one fetch of requests; returns their dead letters."""
        accepted: list[tuple[ErasureRequest, dict[str, bytes]]] = []
        dead: list[DeadLetter] = []
        answers: list[Outgoing] = []
        positions: dict[int, int] = {}
        normalization = self.config.input.user_id_normalization
        for partition, records in batches:
            for offset, value in records:
                request = decode_request(value)
                pseudonyms: dict[str, bytes] = {}
                if isinstance(request, ErasureRequest):
                    try:
                        pseudonyms = erasure_pseudonyms(
                            request.user_id, self.keyring, normalization
                        )
                    except PrivacyError as exc:
                        request = BadErasureRequest(str(exc), request.request_id)
                if isinstance(request, BadErasureRequest):
                    self.metrics.bad_records.labels(reason=BAD_REQUEST).inc()
                    payload = value if include_payload else None
                    dead.append(
                        DeadLetter(
                            BAD_REQUEST,
                            request.detail,
                            partition,
                            offset,
                            payload,
                            self.requests_topic,
                        )
                    )
                    rejection = encode_rejection(request)
                    if rejection is not None:
                        answers.append((rejection[0], rejection[1], None))
                    continue
                accepted.append((request, pseudonyms))
            if records:
                positions[partition] = records[-1][0] + 1
        if accepted:
            recorded_at = time.time()
            expires_at = recorded_at + self.config.erasure.retention_s
            await self._send_many(
                self._log_topic,
                [
                    (*encode_erasure(p, recorded_at_s=recorded_at, expires_at_s=expires_at), 0)
                    for _, p in accepted
                ],
            )
            if self.on_recorded is not None:
                await self.on_recorded([p for _, p in accepted])
            # Applied. Every window whose release begins after the fences of this read
            # excludes the users (erasure_gate): the responses may promise it.
            await read_ledger()
            release.adopt_ledger()
            until = released_until(release)
            first = release.coverage_start_s
            assert until is not None and first is not None
            size = self.config.window.size_s
            windows = WindowRanges.of(
                first_window_s=first,
                released_until_s=until,
                expires_at_s=expires_at,
                size_s=size,
            )
            for request, _ in accepted:
                key, value = encode_response(
                    request, applied_at_s=recorded_at, windows=windows, window_size_s=size
                )
                answers.append((key, value, None))
            log.info(
                "erasure requests applied: %d (windows from %s on are released without them)",
                len(accepted),
                iso_utc(windows.released_until_s),
            )
        if answers:
            await self._send_many(self._responses_topic, answers)
        self.metrics.erasure_requests_applied.inc(len(accepted))
        self._positions.update(positions)
        return dead

    def safe_offsets(self) -> dict[int, int]:
        return dict(self._positions)

    def revoke(self, partitions: Sequence[int]) -> None:
        for p in partitions:
            self._positions.pop(p, None)

    # -- stage 2 ------------------------------------------------------------------------------
    async def ready_to_draw(
        self,
        window_start_s: int,
        release: ReleaseStage,
        write_cut: Callable[[int], Awaitable[None]],
    ) -> bool:
        """Whether the window may be drawn now: its cut is in the ledger, the log was read
        after it, and every partial it merges applied the erasures that requires."""
        if not self.gate.has_cut(window_start_s):
            await write_cut(window_start_s)  # acknowledged before the log's fence is written
            await self.catch_up()
            required = self.gate.record_cut(window_start_s)
            if required:
                log.info(
                    "window cut for erasure: its partials must have applied the log to %d",
                    required,
                )
        return self.gate.ready(window_start_s, release, now_mono_s=time.monotonic())

    def released(self, window_start_s: int) -> None:
        self.gate.finish(window_start_s)

    # -- memory -------------------------------------------------------------------------------
    async def housekeeping(
        self,
        ingest: IngestStage,
        release: ReleaseStage,
        poll_ledger: Callable[[], Awaitable[Any]],
        now_mono_s: float,
    ) -> None:
        """Forget what no window needs any more: kept sealed windows once released (the
        ledger is polled for other workers' releases), cuts of released windows, erasures
        whose every window is released."""
        ingest.drop_released()
        if ingest.kept_windows and now_mono_s - self._ledger_polled_mono >= LEDGER_POLL_INTERVAL_S:
            self._ledger_polled_mono = now_mono_s
            await poll_ledger()
            release.adopt_ledger()
            ingest.drop_released()
        before = _released_before(release)
        if before > self._forgotten_before:
            self._forgotten_before = before
            self.gate.forget(release.released)
            self.erasures.forget(before)
            self.metrics.erasures_active.set(len(self.erasures))


def _released_before(release: ReleaseStage) -> float:
    """Every window starting before this is known released (-inf while none is)."""
    if release.coverage_start_s is None:
        return -float("inf")
    return float(min(release.cursor(r) for r in range(release.partials_partitions)))
