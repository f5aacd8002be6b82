"""Stage 2's inbox: the partials and source watermarks of the partials partitions it owns.

Per (query, source partition) of a window the first complete version of a partial is taken
and the others ignored (a version that applied more erasures supersedes it). A partial
stamped with another deployment fingerprint, bounded under another pseudonym key (another
key id, or another secret under the window's key id: its key check value differs, or it
has none), or bounded under another layout (stage-1 partition count, key id and user
placement) than the first partial the window took is never merged: a user's events are on
one partition under one pseudonym only within a layout, so mixing two would bound a user
twice.

Each source partition's :class:`SourceWatermark` says how far it has sealed; the inbox
answers how far every source of a partials partition has passed (:meth:`passed_through`):
a source has passed a window when its watermark is at or past the window's end, or when it
is idle with nothing open (confirmed, see :func:`_quiet_confirmed`); if every source is
idle, the furthest idle watermark (which advances by wall clock) bounds the range.
:class:`~stream_dp.pipeline.stages.release_stage.ReleaseStage` decides which windows to release.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.formats.partials import (
    Partial,
    PartialAssembler,
    PartialFormatError,
    PartialPart,
    SourceWatermark,
    decode,
)
from stream_dp.pipeline.gc_pause import gc_paused
from stream_dp.pipeline.key_check_gate import KEY_CHECK_FIX
from stream_dp.windows.tumbling import iso_utc
from stream_dp.windows.watermark import IDLE_CONFIRM_S

log = logging.getLogger(__name__)

#: What :meth:`PartialsInbox.erasures_applied` says of a window without partials: it holds
#: no one's events, so every erasure is applied.
NO_PARTIALS = 2**62

#: Why a partial of a window is not taken at all (a ``partials_ignored`` reason), or None.
Refusal = Callable[[PartialPart], "str | None"]


@dataclass
class PendingWindow:
    first_offset: int
    assemblers: dict[tuple[str, int], PartialAssembler] = field(default_factory=dict)
    #: (source partitions, key id, user placement) of the first partial taken; None before.
    layout: tuple[int, str, str] | None = None


class PartialsInbox:
    """Partials and source watermarks per owned partials partition, until released."""

    def __init__(
        self,
        metrics: Metrics,
        *,
        refusal: Refusal,
        key_id_of: Callable[[int], str],
        fingerprint: str | None,
        placement: str = "",
        key_check_of: Callable[[int], str] | None = None,
    ) -> None:
        self.metrics = metrics
        #: Why the stage takes no partial of a window (released, before coverage), or None.
        self._refusal = refusal
        #: The pseudonym key id of a window (the keyring's; by default the configuration's).
        self._key_id_of = key_id_of
        #: The deployment fingerprint's digest (:mod:`stream_dp.config.fingerprint`): only
        #: partials stamped with it are merged. The worker and replay always set it; None
        #: (unit tests of other rules) merges partials whatever their stamp.
        self.fingerprint = fingerprint
        #: This deployment's user placement, taken for a partial of a version that did not
        #: stamp one: it passed the fingerprint check, and the fingerprint holds the
        #: placement settings (stream_dp.config.classification).
        self.placement = placement
        #: The check value of a window's pseudonym key (the keyring's): only partials
        #: stamped with it are merged. The worker and replay always set it; None (unit tests
        #: of other rules) merges partials whatever their stamp.
        self._key_check_of = key_check_of
        self._windows: dict[int, dict[int, PendingWindow]] = {}
        self._marks: dict[int, dict[int, SourceWatermark]] = {}
        # Per partials partition, per source: idle_for_s of its first "idle, nothing open"
        # mark since another source last woke up (went from that to active or open).
        self._idle_base: dict[int, dict[int, float]] = {}
        self._positions: dict[int, int] = {}

    # -- partitions ---------------------------------------------------------------------
    def assign(self, partitions: Iterable[int]) -> None:
        for r in partitions:
            self._windows.setdefault(r, {})
            self._marks.setdefault(r, {})
            self._idle_base.setdefault(r, {})

    def revoke(self, partitions: Iterable[int]) -> None:
        for r in partitions:
            self._windows.pop(r, None)
            self._marks.pop(r, None)
            self._idle_base.pop(r, None)
            self._positions.pop(r, None)

    @property
    def partitions(self) -> list[int]:
        return sorted(self._windows)

    # -- ingest ---------------------------------------------------------------------------
    def ingest(self, partition: int, records: Sequence[tuple[int, bytes | None]]) -> None:
        """Take one partials partition's batch of (offset, value)."""
        if not records:
            return
        windows = self._windows.setdefault(partition, {})
        marks = self._marks.setdefault(partition, {})
        idle_base = self._idle_base.setdefault(partition, {})
        ignored = self.metrics.partials_ignored
        for offset, value in records:
            try:
                with gc_paused():  # a part decodes into ~100,000 lists: see gc_pause
                    item = decode(value)
            except PartialFormatError as exc:
                ignored.labels(reason="malformed").inc()
                log.error("partials topic: %s (partition %d offset %d)", exc, partition, offset)
                continue
            if isinstance(item, SourceWatermark):
                source = item.source_partition
                before = marks.get(source)
                marks[source] = _newer(before, item)
                if before is not None and before.quiet and not item.quiet:
                    # A source woke up (a burst?): every idle source must confirm again
                    # that the burst did not reach it too.
                    idle_base.clear()
                if item.quiet:
                    idle_base.setdefault(source, item.idle_for_s)
                else:
                    idle_base.pop(source, None)
                continue
            self._add_part(windows, offset, item)
        self._positions[partition] = records[-1][0] + 1

    def _add_part(self, windows: dict[int, PendingWindow], offset: int, part: PartialPart) -> None:
        ignored = self.metrics.partials_ignored
        ws = part.window_start_s
        refused = self._refusal(part)
        if refused is not None:
            ignored.labels(reason=refused).inc()
            return
        if self.fingerprint is not None and part.fingerprint != self.fingerprint:
            # Bounded under other meaning-bearing settings (another worker's bounds,
            # queries or window grid), or by a worker from before fingerprints: the noise
            # here is calibrated for this worker's settings, so it is never merged.
            ignored.labels(reason="fingerprint_mismatch").inc()
            log.error(
                "a partial stamped with another deployment fingerprint was left out",
                extra={"window": iso_utc(ws), "query": part.query},
            )
            return
        if part.key_id and part.key_id != self._key_id_of(ws):
            # Bounded under another pseudonym key (a rotation changed): never merged.
            ignored.labels(reason="key_mismatch").inc()
            return
        if self._key_check_of is not None and part.key_check != self._key_check_of(ws):
            # Bounded under another secret with the same key id (a regenerated or
            # re-mounted secret, pods holding two versions of it), or by a worker from
            # before key checks: its users' pseudonyms are not this window's, so merging it
            # would count one person as two users, bounded twice. Never merged.
            ignored.labels(reason="key_check_mismatch").inc()
            log.error(
                "a partial bounded under another pseudonym secret was left out: %s",
                KEY_CHECK_FIX,
                extra={"window": iso_utc(ws), "query": part.query},
            )
            return
        pending = windows.get(ws)
        if pending is None:
            pending = windows[ws] = PendingWindow(offset)
        ident = (part.query, part.source_partition)
        assembler = pending.assemblers.get(ident)
        if assembler is None:
            assembler = pending.assemblers[ident] = PartialAssembler()
        if assembler.taken is not None and not assembler.supersedes(part):
            if assembler.taken.version != part.version:
                ignored.labels(reason="duplicate_version").inc()
            return
        before = assembler.taken
        if assembler.add(part):
            taken = assembler.taken
            assert taken is not None
            if before is not None:
                # A version that applied more erasures replaces the one taken
                # (docs/erasure.md): still one version per source, never a sum of two.
                ignored.labels(reason="superseded").inc()
            placement = taken.placement or self.placement
            layout = (taken.source_partitions, taken.key_id, placement)
            if pending.layout is None:
                pending.layout = layout
            elif layout != pending.layout:
                # Bounded under another partition layout (partitions were added, or users
                # were placed by another partitioner): a user may be on a partition of
                # each layout, so only one layout is merged.
                assembler.taken = before
                assembler.left_out = before is None
                ignored.labels(reason="layout_changed").inc()
                log.error(
                    "a partial bounded under another partition layout was left out",
                    extra={"window": iso_utc(ws), "query": part.query},
                )

    # -- windows --------------------------------------------------------------------------
    def open_windows(self) -> list[int]:
        return sorted({ws for windows in self._windows.values() for ws in windows})

    def passed_through(self, r: int) -> float | None:
        """How far every source of partials partition ``r`` has passed (event time), or
        None while some source is unheard of or has sealed nothing and is not idle."""
        marks = self._marks.get(r, {})
        if not marks:
            return None
        idle_base = self._idle_base.get(r, {})
        n_sources = max(m.source_partitions for m in marks.values())
        active: list[float] = []
        quiet: list[float] = []
        for p in range(n_sources):
            mark = marks.get(p)
            if mark is None:
                return None
            if _quiet_confirmed(mark, idle_base.get(p)):
                if mark.watermark_s is not None:
                    quiet.append(mark.watermark_s)
            elif mark.watermark_s is None:
                return None
            else:
                active.append(mark.watermark_s)
        if active:
            return min(active)
        return max(quiet) if quiet else None

    def unheard_sources(self, r: int) -> tuple[int, ...]:
        """Source partitions partials partition ``r`` has no usable watermark of yet."""
        marks = self._marks.get(r, {})
        n_sources = max((m.source_partitions for m in marks.values()), default=0)
        idle_base = self._idle_base.get(r, {})
        return tuple(
            p
            for p in range(n_sources)
            if (mark := marks.get(p)) is None
            or (mark.watermark_s is None and not _quiet_confirmed(mark, idle_base.get(p)))
        )

    def pending(self, window_start_s: int) -> PendingWindow | None:
        for windows in self._windows.values():
            if window_start_s in windows:
                return windows[window_start_s]
        return None

    def taken(
        self,
        pending: PendingWindow | None,
        query: str,
        window_start_s: int,
        keep: Callable[[PartialAssembler], bool] | None = None,
    ) -> list[Partial]:
        """The partials of the query taken for the window, in source order (incomplete
        ones left out, and those ``keep`` refuses)."""
        if pending is None:
            return []
        taken = []
        for (name, source), assembler in sorted(pending.assemblers.items()):
            if name != query:
                continue
            if assembler.taken is None:
                log.warning(
                    "an incomplete partial was left out (its writer crashed mid-way)",
                    extra={"query": query, "window": iso_utc(window_start_s), "source": source},
                )
                continue
            if keep is not None and not keep(assembler):
                continue
            taken.append(assembler.taken)
        return taken

    def incomplete_sources(self, window_start_s: int) -> list[tuple[str, int]]:
        """(query, source partition) whose partial of the window was reported but is not
        complete: stage 2 must not take that source's share for "no events"."""
        pending = self.pending(window_start_s)
        if pending is None:
            return []
        return sorted(ident for ident, a in pending.assemblers.items() if a.incomplete)

    def erasures_applied(self, window_start_s: int) -> int:
        """The erasure-log position every partial the window would merge has applied: the
        least ``erasures_through`` of the versions taken (docs/erasure.md). A window whose
        partials have not applied an erasure it must exclude waits for newer versions."""
        pending = self.pending(window_start_s)
        if pending is None:
            return NO_PARTIALS
        taken = [a.taken for a in pending.assemblers.values() if a.taken is not None]
        return min((p.erasures_through for p in taken), default=NO_PARTIALS)

    def drop_stale_partials(self, window_start_s: int, required: int) -> int:
        """Leave out of the window every partial that did not apply the erasure log up to
        ``required`` (docs/erasure.md: when no newer version came in time). That source's
        data is missing from the window — never the erased user's. Returns how many."""
        pending = self.pending(window_start_s)
        dropped = 0
        for assembler in pending.assemblers.values() if pending is not None else ():
            if assembler.taken is not None and assembler.taken.erasures_through < required:
                assembler.taken = None
                assembler.left_out = True
                dropped += 1
        if dropped:
            self.metrics.partials_ignored.labels(reason="erasure_stale").inc(dropped)
        return dropped

    def drop(self, released: Callable[[int], bool]) -> None:
        """Forget the partials of windows now released."""
        for windows in self._windows.values():
            for ws in [w for w in windows if released(w)]:
                del windows[ws]

    def drop_window(self, window_start_s: int) -> None:
        for windows in self._windows.values():
            windows.pop(window_start_s, None)

    def watermark_s(self) -> float | None:
        """The slowest source watermark over assigned partials partitions (for /metrics)."""
        values = [
            m.watermark_s
            for marks in self._marks.values()
            for m in marks.values()
            if m.watermark_s is not None
        ]
        return min(values) if values else None

    # -- offsets --------------------------------------------------------------------------
    def safe_offsets(self) -> dict[int, int]:
        """Per partials partition, the next offset to commit."""
        safe: dict[int, int] = {}
        for r, position in self._positions.items():
            firsts = [w.first_offset for w in self._windows.get(r, {}).values()]
            safe[r] = min(firsts) if firsts else position
        return safe


def _newer(old: SourceWatermark | None, new: SourceWatermark) -> SourceWatermark:
    """The watermark never moves back: what an earlier writer sealed stays sealed."""
    if old is None or old.watermark_s is None:
        return new
    if new.watermark_s is None or new.watermark_s < old.watermark_s:
        return SourceWatermark(
            new.source_partition,
            new.source_partitions,
            old.watermark_s,
            new.idle,
            new.open_windows,
            new.idle_for_s,
        )
    return new


def _quiet_confirmed(mark: SourceWatermark, idle_base_s: float | None) -> bool:
    """Idle with nothing open, and *stayed* so for IDLE_CONFIRM_S since another source last
    woke up: an "idle" written just before a burst reached it must not let the others'
    share of the burst close the window."""
    return (
        mark.quiet and idle_base_s is not None and mark.idle_for_s - idle_base_s >= IDLE_CONFIRM_S
    )
