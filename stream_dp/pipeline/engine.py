"""Every step of the worker that does not touch Kafka: the worker and replay share it.

State: per source partition, per open window, a :class:`Reservoirs` of pseudonym → ≤ k
compact items (ids of interned event signatures), plus the first input offset the window
needs. Offsets are committed only up to the earliest offset an unreleased window still
needs; after a crash the replayed records rebuild the reservoirs, and records of windows
already in the ledger are dropped.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stream_dp.config.model import Config
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.decode import BadRecord, Decoder
from stream_dp.pipeline.ledger import LedgerIndex, LedgerRelease, OutputRecord, new_release_id
from stream_dp.pipeline.queries import CompiledQuery, needed_fields
from stream_dp.pipeline.records import group_dict, output_key, release_record, window_record
from stream_dp.privacy.bounding import (
    Reservoirs,
    aggregate_bounded,
    merge_reservoirs,
    new_sampling_rng,
)
from stream_dp.privacy.budget import BudgetAccountant
from stream_dp.privacy.pseudonymize import KeyRing
from stream_dp.privacy.release import KeyAggregate, release_query
from stream_dp.windows import TumblingWindows, WatermarkTracker
from stream_dp.windows.tumbling import iso_utc

log = logging.getLogger(__name__)

#: (query, window start, exact bounded aggregates per group key) — see Engine.__init__.
ExactTotalsObserver = Callable[[str, int, Mapping[tuple[Any, ...], KeyAggregate]], None]


#: What ingest does with an event, decided once per window: keep it, or count it as late
#: (its window has closed) or replayed (its window is already in the ledger).
_ACCEPT, _LATE, _REPLAYED = 0, 1, 2


@dataclass(frozen=True, slots=True)
class DeadLetter:
    reason: str
    detail: str
    partition: int
    offset: int
    payload: bytes | None


@dataclass(slots=True)
class _WindowPart:
    reservoirs: Reservoirs
    first_offset: int


class Engine:
    def __init__(
        self,
        config: Config,
        keyring: KeyRing,
        *,
        ledger: LedgerIndex | None = None,
        metrics: Metrics | None = None,
        sampling_rng: random.Random | None = None,
        exact_totals_observer: ExactTotalsObserver | None = None,
    ) -> None:
        self.config = config
        # Sees the exact bounded totals before noise. Only the demo passes one (its data is
        # synthetic, so showing true values beside private ones is the point); the worker
        # and replay never do, and nothing exact is ever published.
        self._observe_exact = exact_totals_observer
        self.keyring = keyring
        self.ledger = ledger if ledger is not None else LedgerIndex()
        self.metrics = metrics if metrics is not None else Metrics()
        self._rng = sampling_rng if sampling_rng is not None else new_sampling_rng()
        self.k = config.bounds.max_contributions_per_window
        self.windows = TumblingWindows(config.window.size_s, config.window.grace_s)
        self.tracker = WatermarkTracker(
            grace_s=config.window.grace_s, idle_timeout_s=config.window.idle_close_s
        )
        fields, scalar, numeric = needed_fields(config.queries)
        self._fields = fields
        self.decoder = Decoder(
            user_field=config.input.user_field,
            time_field=config.input.time_field,
            max_record_bytes=config.input.max_record_bytes,
            max_future_s=config.input.max_future_s,
            scalar_fields=scalar,
            numeric_fields=numeric,
        )
        self._signatures: list[tuple[Any, ...]] = []
        self._signature_ids: dict[tuple[Any, ...], int] = {}
        self.queries = [CompiledQuery(q, config.bounds, fields) for q in config.queries]
        for q in self.queries:
            q.bind(self._signatures)
        self._query_names = [q.name for q in self.queries]
        self.accountant = BudgetAccountant(
            window_size_s=config.window.size_s,
            epsilon_per_window=config.privacy.epsilon_per_window,
            delta_per_window=config.privacy.delta_per_window,
            horizon_windows=config.privacy.horizon_windows,
            max_epsilon_per_horizon=config.privacy.max_epsilon_per_horizon,
        )
        self._released: set[int] = set()
        self._state: dict[int, dict[int, _WindowPart]] = {}
        self._positions: dict[int, int] = {}
        self._closed_watermark_s: float | None = None
        self.adopt_ledger()

    # -- ledger -------------------------------------------------------------------------
    def adopt_ledger(self) -> None:
        """Restore budget charges and released windows from the ledger index."""
        for rel in self.ledger.releases():
            self.accountant.record(
                rel.window_start_s, rel.query, rel.epsilon_spent, rel.delta_spent
            )
            if self.ledger.window_complete(rel.window_start_s, self._query_names):
                self._released.add(rel.window_start_s)

    def is_released(self, window_start_s: int) -> bool:
        return window_start_s in self._released

    # -- partitions ---------------------------------------------------------------------
    def assign(self, partitions: Iterable[int], now_mono_s: float) -> None:
        parts = list(partitions)
        self.tracker.assign(parts, now_mono_s)
        for p in parts:
            self._state.setdefault(p, {})

    def revoke(self, partitions: Iterable[int]) -> None:
        """Drop the state of partitions that moved away; their new owner replays them."""
        parts = list(partitions)
        self.tracker.revoke(parts)
        for p in parts:
            self._state.pop(p, None)
            self._positions.pop(p, None)
        self._update_gauges()

    # -- ingest ---------------------------------------------------------------------------
    def ingest(
        self,
        partition: int,
        records: Sequence[tuple[int, bytes | None]],
        *,
        now_s: float,
        now_mono_s: float,
    ) -> list[DeadLetter]:
        """Decode, pseudonymize, window and bound one partition's batch of (offset, value)."""
        if not records:
            return []
        metrics = self.metrics
        metrics.events_consumed.inc(len(records))
        decode = self.decoder.decode_parts
        size = self.windows.size_s
        closed = self._closed_watermark_s
        released = self._released
        fields = self._fields
        single_field = fields[0] if len(fields) == 1 else None
        signatures = self._signatures
        signature_ids = self._signature_ids
        state = self._state.setdefault(partition, {})
        # Raw ids live only in this batch-local cache, per key id (never in state).
        pseudonyms: dict[str, dict[str | int, bytes]] = {}
        include_payload = self.config.output.dead_letter_include_payload
        dead: list[DeadLetter] = []
        late = skipped = 0
        max_time: float | None = None
        # Events arrive mostly in event-time order, so the per-window lookups (lateness,
        # key, reservoirs) are redone only when the window changes, and a window's events
        # are handed to its reservoirs in runs, in arrival order (same draws as one by one).
        current_ws: int | None = None
        fate = _ACCEPT
        part: _WindowPart | None = None
        cache: dict[str | int, bytes] = {}
        pseudonymize: Callable[[str | int], bytes] | None = None
        run_pseudonyms: list[bytes] = []
        run_items: list[int] = []
        for offset, value in records:
            parsed = decode(value, now_s)
            if isinstance(parsed, BadRecord):
                dead.append(
                    DeadLetter(
                        parsed.reason,
                        parsed.detail,
                        partition,
                        offset,
                        value if include_payload else None,
                    )
                )
                metrics.bad_records.labels(reason=parsed.reason).inc()
                continue
            user, t, obj = parsed
            if max_time is None or t > max_time:
                max_time = t
            ws = math.floor(t / size) * size
            if ws != current_ws:
                if run_items:
                    assert part is not None
                    part.reservoirs.add_many(run_pseudonyms, run_items)
                    run_pseudonyms, run_items = [], []
                current_ws = ws
                if closed is not None and ws + size <= closed:
                    fate = _LATE
                elif ws in released:
                    fate = _REPLAYED
                else:
                    fate = _ACCEPT
                    part = state.get(ws)
                    if part is None:
                        part = state[ws] = _WindowPart(Reservoirs(self.k, self._rng), offset)
                    pseudonymizer = self.keyring.for_window(ws)
                    cache = pseudonyms.setdefault(pseudonymizer.key_id, {})
                    pseudonymize = pseudonymizer.pseudonym
            if fate != _ACCEPT:
                if fate == _LATE:
                    late += 1
                else:
                    skipped += 1
                continue
            sig = (
                (obj.get(single_field),)
                if single_field is not None
                else tuple(map(obj.get, fields))
            )
            sid = signature_ids.get(sig)
            if sid is None:
                sid = signature_ids[sig] = len(signatures)
                signatures.append(sig)
            pseudonym = cache.get(user)
            if pseudonym is None:
                assert pseudonymize is not None
                pseudonym = cache[user] = pseudonymize(user)
            run_pseudonyms.append(pseudonym)
            run_items.append(sid)
        if run_items:
            assert part is not None
            part.reservoirs.add_many(run_pseudonyms, run_items)
        self._positions[partition] = records[-1][0] + 1
        if max_time is not None:
            self.tracker.observe(partition, max_time, now_mono_s)
        else:
            self.tracker.touch(partition, now_mono_s)
        if late:
            metrics.late_events.inc(late)
        if skipped:
            metrics.replayed_events_skipped.inc(skipped)
        self._update_gauges()
        return dead

    # -- closing --------------------------------------------------------------------------
    def open_windows(self) -> list[int]:
        return sorted({ws for parts in self._state.values() for ws in parts})

    def due_windows(self, now_mono_s: float) -> list[int]:
        """Windows whose end the watermark has passed (never early: invariant 7)."""
        wm = self.tracker.watermark(now_mono_s)
        if wm is not None:
            self._closed_watermark_s = wm
            self.metrics.watermark.set(wm)
        return [ws for ws in self.open_windows() if self.windows.is_closed(ws, wm)]

    def compute_release(self, window_start_s: int, *, now_s: float) -> list[LedgerRelease]:
        """The releases of one closed window: ledgered ones as they are, the rest drawn now.

        Every query not yet in the ledger is charged to the budget first (so the window
        records show the full horizon total), then released once through the privacy core.
        """
        window_end_s = self.windows.end_of(window_start_s)
        parts = [s[window_start_s] for s in self._state.values() if window_start_s in s]
        merged = merge_reservoirs([p.reservoirs for p in parts], self.k, self._rng)
        seen = sum(p.reservoirs.events_seen for p in parts)
        retained = sum(len(items) for items in merged.values())
        if seen > retained:
            self.metrics.events_dropped_by_bounding.inc(seen - retained)
        users = list(merged.values())
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
            to_draw.append(q)
        horizon = self.accountant.horizon_spent(window_start_s)
        bounds = self.config.bounds
        for q in to_draw:
            cfg = q.config
            totals = aggregate_bounded(
                users,
                q.project,
                max_keys=bounds.max_keys_per_user,
                max_per_key=bounds.max_contributions_per_key,
                rng=self._rng,
            )
            aggregates = {
                key: KeyAggregate(t.events, t.users, t.value_sum) for key, t in totals.items()
            }
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
            out.append(
                LedgerRelease(
                    release_id=release_id,
                    query=q.name,
                    window_start_s=window_start_s,
                    window_end_s=window_end_s,
                    epsilon_spent=cfg.epsilon,
                    delta_spent=cfg.delta,
                    records=records,
                )
            )
        return out

    def record_ledgered(self, release: LedgerRelease) -> None:
        self.ledger.add(release)

    def finish_window(
        self, window_start_s: int, releases: Sequence[LedgerRelease], now_s: float
    ) -> None:
        """The window's releases are ledgered and published: drop its state, note metrics."""
        for s in self._state.values():
            s.pop(window_start_s, None)
        self._released.add(window_start_s)
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
        self._update_gauges()

    # -- offsets --------------------------------------------------------------------------
    def safe_offsets(self) -> dict[int, int]:
        """Per partition, the next offset to commit: nothing an open window needs is skipped."""
        safe: dict[int, int] = {}
        for p, position in self._positions.items():
            firsts = [part.first_offset for part in self._state.get(p, {}).values()]
            safe[p] = min(firsts) if firsts else position
        return safe

    def _update_gauges(self) -> None:
        open_windows = self.open_windows()
        oldest_end = self.windows.end_of(open_windows[0]) if open_windows else None
        self.metrics.set_open_windows(len(open_windows), oldest_end)

    @property
    def signature_count(self) -> int:
        return len(self._signatures)
