"""Stage 2 of the worker, without Kafka: merge partials, release once through the privacy core.

The owner of a partials partition sees every partial of the windows mapped to it, plus a
:class:`SourceWatermark` from each source partition. A window is due when, on *its* partials
partition, every source partition has either sealed it (watermark at or past its end) or is
idle with nothing left open. Per (query, source partition) the first complete version of a
partial is taken and the others ignored; the merged exact totals go through the privacy core
once — noise, τ-threshold, budget — and the versions taken are recorded in the ledger.

Offsets of the partials topic are committed only up to the earliest partial an unreleased
window still needs; a restarted owner re-reads them and waits for fresh watermarks (stage 1
writes them periodically).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stream_dp.config.model import Config
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.ledger import LedgerIndex, LedgerRelease, OutputRecord, new_release_id
from stream_dp.pipeline.partials import (
    Partial,
    PartialAssembler,
    PartialFormatError,
    PartialPart,
    SourceWatermark,
    decode,
    merge_totals,
)
from stream_dp.pipeline.queries import CompiledQuery, needed_fields
from stream_dp.pipeline.records import group_dict, output_key, release_record, window_record
from stream_dp.privacy.budget import BudgetAccountant
from stream_dp.privacy.release import KeyAggregate, release_query
from stream_dp.windows import TumblingWindows
from stream_dp.windows.tumbling import iso_utc
from stream_dp.windows.watermark import IDLE_CONFIRM_S

log = logging.getLogger(__name__)

#: (query, window start, exact bounded aggregates per group key) — see ReleaseStage.__init__.
ExactTotalsObserver = Callable[[str, int, Mapping[tuple[Any, ...], KeyAggregate]], None]


@dataclass
class _PendingWindow:
    first_offset: int
    assemblers: dict[tuple[str, int], PartialAssembler] = field(default_factory=dict)


class ReleaseStage:
    def __init__(
        self,
        config: Config,
        *,
        ledger: LedgerIndex | None = None,
        metrics: Metrics | None = None,
        exact_totals_observer: ExactTotalsObserver | None = None,
    ) -> None:
        self.config = config
        # Sees the exact bounded totals before noise. Only the demo passes one (its data is
        # synthetic, so showing true values beside private ones is the point); the worker
        # and replay never do, and nothing exact is ever published.
        self._observe_exact = exact_totals_observer
        self.ledger = ledger if ledger is not None else LedgerIndex()
        self.metrics = metrics if metrics is not None else Metrics()
        self.windows = TumblingWindows(config.window.size_s, config.window.grace_s)
        fields, _, _ = needed_fields(config.queries)
        self.queries = [CompiledQuery(q, config.bounds, fields) for q in config.queries]
        self._query_names = [q.name for q in self.queries]
        self.accountant = BudgetAccountant(
            window_size_s=config.window.size_s,
            epsilon_per_window=config.privacy.epsilon_per_window,
            delta_per_window=config.privacy.delta_per_window,
            horizon_windows=config.privacy.horizon_windows,
            max_epsilon_per_horizon=config.privacy.max_epsilon_per_horizon,
        )
        #: Windows whose every query is ledgered (shared with stage 1, which drops replays).
        self.released: set[int] = set()
        #: Of those, the ones read from the ledger (released by an earlier run or another
        #: worker): their events are replays, the others' are late.
        self.released_earlier: set[int] = set()
        self._charged: set[tuple[str, int]] = set()
        self._windows: dict[int, dict[int, _PendingWindow]] = {}
        self._marks: dict[int, dict[int, SourceWatermark]] = {}
        # Per partials partition, per source: idle_for_s of its first "idle, nothing open"
        # mark since another source last woke up (went from that to active or open).
        self._idle_base: dict[int, dict[int, float]] = {}
        self._positions: dict[int, int] = {}
        self.adopt_ledger(self.ledger)

    # -- ledger -------------------------------------------------------------------------
    def adopt_ledger(self, ledger: LedgerIndex) -> None:
        """Take in ledgered releases (at start, and re-read when partitions move here)."""
        for rel in ledger.releases():
            if self.ledger is not ledger and self.ledger.get(rel.query, rel.window_start_s):
                continue
            if self.ledger is not ledger:
                self.ledger.add(rel)
            ident = (rel.query, rel.window_start_s)
            if ident not in self._charged:
                self._charged.add(ident)
                self.accountant.record(
                    rel.window_start_s, rel.query, rel.epsilon_spent, rel.delta_spent
                )
            if self.ledger.window_complete(rel.window_start_s, self._query_names):
                if rel.window_start_s not in self.released:
                    self.released_earlier.add(rel.window_start_s)
                self.released.add(rel.window_start_s)
                for windows in self._windows.values():
                    windows.pop(rel.window_start_s, None)

    def is_released(self, window_start_s: int) -> bool:
        return window_start_s in self.released

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

    def _add_part(self, windows: dict[int, _PendingWindow], offset: int, part: PartialPart) -> None:
        ignored = self.metrics.partials_ignored
        ws = part.window_start_s
        if ws in self.released or self.ledger.get(part.query, ws) is not None:
            ignored.labels(reason="window_released").inc()
            return
        pending = windows.get(ws)
        if pending is None:
            pending = windows[ws] = _PendingWindow(offset)
        ident = (part.query, part.source_partition)
        assembler = pending.assemblers.get(ident)
        if assembler is None:
            assembler = pending.assemblers[ident] = PartialAssembler()
        if assembler.taken is not None and assembler.taken.version != part.version:
            ignored.labels(reason="duplicate_version").inc()
            return
        assembler.add(part)

    # -- closing --------------------------------------------------------------------------
    def open_windows(self) -> list[int]:
        return sorted({ws for windows in self._windows.values() for ws in windows})

    def due_windows(self) -> list[int]:
        """Windows every source partition has sealed or has nothing left for (invariant 7)."""
        due: list[int] = []
        for r, windows in self._windows.items():
            marks = self._marks.get(r, {})
            if not marks:
                continue
            idle_base = self._idle_base.get(r, {})
            n_sources = max(m.source_partitions for m in marks.values())
            for ws in windows:
                end = self.windows.end_of(ws)
                if all(_clears(marks.get(p), idle_base.get(p), end) for p in range(n_sources)):
                    due.append(ws)
        # In window order: a later window waits while an earlier one here is still pending
        # (usually its partition has not yet read the same watermarks), so the horizon
        # totals in window records count every earlier window.
        pending = self.open_windows()
        first_waiting = next((ws for ws in pending if ws not in due), None)
        return sorted(ws for ws in due if first_waiting is None or ws < first_waiting)

    def compute_release(self, window_start_s: int, *, now_s: float) -> list[LedgerRelease]:
        """The releases of one due window: ledgered ones as they are, the rest drawn now.

        Every query not yet in the ledger is charged to the budget first (so the window
        records show the full horizon total), then released once through the privacy core.
        """
        window_end_s = self.windows.end_of(window_start_s)
        pending = self._pending(window_start_s)
        out: list[LedgerRelease] = []
        to_draw: list[CompiledQuery] = []
        for q in self.queries:
            existing = self.ledger.get(q.name, window_start_s)
            if existing is not None:
                out.append(existing)
                continue
            cfg = q.config
            if not self.accountant.can_charge(window_start_s, q.name, cfg.epsilon, cfg.delta):
                self.metrics.budget_exhausted.labels(query=q.name).inc()
                log.error(
                    "budget exhausted: release suppressed",
                    extra={"query": q.name, "window": iso_utc(window_start_s)},
                )
                continue
            self.accountant.charge(window_start_s, q.name, cfg.epsilon, cfg.delta)
            self._charged.add((q.name, window_start_s))
            to_draw.append(q)
        horizon = self.accountant.horizon_spent(window_start_s)
        for q in to_draw:
            taken = self._taken(pending, q.name, window_start_s)
            aggregates = merge_totals(taken)
            sources = {p.source_partition: p.version for p in taken}
            out.append(self._release(q, window_start_s, window_end_s, aggregates, sources, horizon))
        return out

    def _pending(self, window_start_s: int) -> _PendingWindow | None:
        for windows in self._windows.values():
            if window_start_s in windows:
                return windows[window_start_s]
        return None

    def _taken(
        self, pending: _PendingWindow | None, query: str, window_start_s: int
    ) -> list[Partial]:
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
            taken.append(assembler.taken)
        return taken

    def _release(
        self,
        q: CompiledQuery,
        window_start_s: int,
        window_end_s: int,
        aggregates: Mapping[tuple[Any, ...], KeyAggregate],
        sources: dict[int, str],
        horizon: float,
    ) -> LedgerRelease:
        cfg = q.config
        if self._observe_exact is not None:
            self._observe_exact(q.name, window_start_s, aggregates)
        result = release_query(aggregates, q.plan)
        release_id = new_release_id()
        selection = q.plan.selection.describe() if q.plan.selection is not None else None
        groups = [group_dict(cfg.group_by, v.group) for v in result.values]
        records = [
            OutputRecord(
                output_key(q.name, window_start_s, group),
                release_record(
                    release_id=release_id,
                    query=q.name,
                    window_start_s=window_start_s,
                    window_end_s=window_end_s,
                    group=group,
                    statistic=cfg.statistic,
                    value=v.value,
                    epsilon=cfg.epsilon,
                    delta=cfg.delta,
                    mechanism=cfg.mechanism,
                    noise_scale=v.noise_scale,
                    ci95=v.ci95,
                    selection=selection,
                    clamped=v.clamped,
                ),
            )
            for v, group in zip(result.values, groups, strict=True)
        ]
        records.append(
            OutputRecord(
                output_key(q.name, window_start_s, None),
                window_record(
                    release_id=release_id,
                    query=q.name,
                    window_start_s=window_start_s,
                    window_end_s=window_end_s,
                    released_keys=len(result.values),
                    epsilon_spent=cfg.epsilon,
                    delta_spent=cfg.delta,
                    horizon_epsilon_spent=horizon,
                ),
            )
        )
        self.metrics.keys_released.labels(query=q.name).inc(len(result.values))
        self.metrics.keys_suppressed.labels(query=q.name).inc(result.suppressed)
        return LedgerRelease(
            release_id=release_id,
            query=q.name,
            window_start_s=window_start_s,
            window_end_s=window_end_s,
            epsilon_spent=cfg.epsilon,
            delta_spent=cfg.delta,
            records=records,
            sources=sources,
        )

    def record_ledgered(self, release: LedgerRelease) -> None:
        self.ledger.add(release)

    def finish_window(
        self, window_start_s: int, releases: Sequence[LedgerRelease], now_s: float
    ) -> None:
        """The window's releases are ledgered and published: drop its state, note metrics."""
        for windows in self._windows.values():
            windows.pop(window_start_s, None)
        self.released.add(window_start_s)
        end = self.windows.end_of(window_start_s)
        for rel in releases:
            self.metrics.windows_released.labels(query=rel.query).inc()
            self.metrics.releases_published.labels(query=rel.query).inc(len(rel.records) - 1)
            self.metrics.epsilon_spent.labels(query=rel.query).set(rel.epsilon_spent)
        spent = self.accountant.window_spent(window_start_s)[0]
        self.metrics.epsilon_remaining.set(max(0.0, self.config.privacy.epsilon_per_window - spent))
        horizon = self.accountant.horizon_spent(window_start_s)
        self.metrics.horizon_epsilon_spent.set(horizon)
        self.metrics.horizon_epsilon_remaining.set(
            max(0.0, self.config.privacy.max_epsilon_per_horizon - horizon)
        )
        self.metrics.release_delay.observe(max(0.0, now_s - end))
        self.metrics.last_release.set(now_s)

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
        )
    return new


def _clears(mark: SourceWatermark | None, idle_base_s: float | None, window_end_s: int) -> bool:
    """Whether a source partition no longer holds back a window ending at ``window_end_s``.

    Either it sealed the window, or it has nothing open and has *stayed* idle for
    IDLE_CONFIRM_S since another source last woke up: an "idle" written just before a burst
    reached it must not let the others' share of the burst close the window.
    """
    if mark is None:
        return False
    if mark.watermark_s is not None and mark.watermark_s >= window_end_s:
        return True
    return (
        mark.idle
        and not mark.open_windows
        and idle_base_s is not None
        and mark.idle_for_s - idle_base_s >= IDLE_CONFIRM_S
    )
