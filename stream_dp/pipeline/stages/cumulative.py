"""Cumulative queries in the release stage: running totals per public key since the start of
a horizon, released at every window, restart-safe and across workers (issue #17).

The privacy core (:mod:`stream_dp.privacy.continual`) turns each window's exact totals into
noisy running totals; this module decides *which state a window continues* and what must be
durable before a value is ledgered. The transport (worker or :class:`LocalPipeline`) runs,
for a due window w and every cumulative query q the ledger has no release of:

1. read q's continual partition to a fresh fence (:mod:`.continual_state`);
2. :meth:`CumulativeReleases.prepare`: if the topic already has a winning draw for (q, w),
   nothing is drawn. Otherwise find the chain w continues — the winning draw P of the
   previous window (w − S) — and draw w's step on it, once, in memory. With no P:
   w starts a new chain when it is the first covered window of its horizon, or when w − S
   is known released (the query is new, or its state was lost); a P drawn under another
   plan, key list or horizon origin is not continued either (the running total restarts,
   ``horizon_start`` in the record says where); otherwise w *waits*: another worker has not
   made w − S durable yet, and w is not released this time (the transport first re-reads
   the ledger partition of w − S, which settles "released");
3. write the new draws, wait for the acknowledgement, and read the partition back to a
   fence: the first complete draw of (q, w) in log order is now final;
4. :meth:`values` — the running totals from the *winning* chain through w (ours, or one
   completed earlier by another owner) — become q's release of w, which is ledgered and
   published as any release (first complete ledger draw wins, see :mod:`.ledger`).

Why no (key, window) ever gets two values, and no noise is ever drawn twice for a window
that something published depends on — by cases (two owners A and B of w: a worker frozen past
its session and the one that took over; "crash" = kill -9 at any point):

- Crash before the draws are acknowledged: nothing of w was used. Incomplete parts are
  ignored by every reader; the restart draws w afresh (those parts were never published,
  the argument of the ledger's incomplete parts).
- Crash after the draws, before the ledger: the restart finds w's winning draw (step 2) and
  derives exactly those values; nothing is redrawn.
- Crash after the ledger: the ledger's release is republished unchanged (never recomputed).
- A and B both draw w: both write, both read back to their own fence, and both take the
  first complete draw in log order — the same one — so their ledger releases of (q, w)
  carry identical values, whichever of them the ledger keeps. The losing state draw is
  never used by anyone (it is counted, and it stays in the access-controlled topic).
- The owner of w + S (another worker) draws only after reading w's *winning* draw to a
  fence, and every later draw names the draw it extends (``after``), so a chain never mixes
  two draws of one window. Its read cannot see a state of w that is not final: a winner is
  only ever the first complete draw before some reader's fence.
- "w − S is released, yet has no draw of q" is only ever concluded from a ledger read
  followed by a continual read: the releaser of w − S wrote (and had acknowledged) its
  draws of every cumulative query before its first ledger record, so a draw it made is in
  the later read. A draw of w − S made after its release (a stale owner) is never used:
  nobody computes w − S again, and w + S continues w's winner.
- w waits while w − S is neither durable nor known released; it never guesses. Windows are
  released in order, each waiting only for its predecessor, and a horizon's first covered
  window waits for nothing, so the earliest unreleased window can always go (no deadlock).
- A window whose budget cannot be charged (never with a valid configuration) still writes
  its step, with zero totals (no data used) and is not published, so the chain continues.
  Whether it can is decided, and the charge made, before the step is drawn
  (:mod:`.window_charges`: ``may_spend``), never after its totals entered the state.

Every window is charged the query's (ε, δ) like a per-window query (the guarantee is in
:mod:`stream_dp.privacy.continual.planning`); only public keys are supported.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from stream_dp.config.model import QueryConfig
from stream_dp.pipeline.formats.continual_state import (
    ContinualStore,
    StateDraw,
    continual_partition,
    new_draw_id,
)
from stream_dp.pipeline.formats.ledger import (
    LedgerRelease,
    OutputRecord,
    close_release,
    new_release_id,
)
from stream_dp.pipeline.formats.partials import Partial, merge_totals
from stream_dp.pipeline.formats.records import (
    cumulative_release_fields,
    group_dict,
    output_key,
    release_record,
)
from stream_dp.privacy.continual.counter import (
    MAX_TOTAL,
    ContinualCounter,
    ContinualStateError,
    NoiseSource,
    make_counter,
)
from stream_dp.privacy.continual.planning import ContinualPlan
from stream_dp.privacy.planner import GroupKey, QueryPlan
from stream_dp.privacy.release import KeyAggregate
from stream_dp.privacy.statistics import statistic_of
from stream_dp.windows.horizon import HorizonPosition, horizon_position
from stream_dp.windows.tumbling import iso_utc

if TYPE_CHECKING:
    from stream_dp.pipeline.formats.ledger import LedgerIndex
    from stream_dp.pipeline.stages.partials_inbox import PartialsInbox, PendingWindow
    from stream_dp.pipeline.stages.queries import CompiledQuery
    from stream_dp.pipeline.stages.release_cursors import ReleaseCursors
    from stream_dp.privacy.adaptive_bounds import BoundsTriple

    #: (pending window, query, window start, bounds: auto — the window's bounds) → the
    #: query's partials taken for the window.
    TakenPartials = Callable[[PendingWindow | None, str, int, BoundsTriple | None], list[Partial]]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CumulativeQuery:
    """One ``release: cumulative`` query, as the release stage needs it."""

    config: QueryConfig
    plan: QueryPlan
    continual: ContinualPlan
    #: the public keys, in the configured order (the counter's key order)
    keys: tuple[GroupKey, ...]
    fingerprint: str

    @classmethod
    def of(cls, config: QueryConfig, plan: QueryPlan) -> CumulativeQuery:
        assert plan.continual is not None and plan.public_keys is not None
        keys = tuple(plan.public_keys)
        return cls(config, plan, plan.continual, keys, plan.continual.fingerprint(keys))

    @property
    def name(self) -> str:
        return self.config.name

    def position(self, window_start_s: int, window_size_s: int) -> HorizonPosition:
        return horizon_position(
            window_start_s,
            window_size_s=window_size_s,
            horizon_windows=self.continual.horizon_windows,
            origin_s=self.plan.horizon_origin_s,
        )

    def totals(self, aggregates: Mapping[GroupKey, KeyAggregate]) -> tuple[np.ndarray, int]:
        """The window's exact bounded totals, one per key (counts, or sums in units), and
        how many were clamped to ±:data:`MAX_TOTAL` (the counters' exact range).

        Clamping a total is a 1-Lipschitz map of it: no user moves it further than the
        bounded total, so the noise stays calibrated; only the value is low. A total this
        large must not stop the releases of every later window (``plan`` warns when the
        configured bounds can reach it)."""
        # a cumulative statistic with values is a sum (the others refuse release: cumulative)
        sums = statistic_of(self.config.statistic).needs_values
        raw = [0] * len(self.keys)
        for i, key in enumerate(self.keys):
            agg = aggregates.get(key)
            if agg is not None:
                raw[i] = int(agg.value_sum if sums else agg.events)
        clamped = sum(1 for v in raw if abs(v) > MAX_TOTAL)
        out = np.array([max(-MAX_TOTAL, min(MAX_TOTAL, v)) for v in raw], dtype=np.int64)
        return out, clamped


@dataclass
class _Chain:
    """A counter with the draws of one chain applied through ``last_id``."""

    chain_start_s: int
    counter: ContinualCounter
    last_id: str | None = None
    values: np.ndarray | None = None


@dataclass
class Preparation:
    """What :meth:`CumulativeReleases.prepare` found for one window."""

    #: new draws to write (acknowledged) and read back before the window is released
    to_write: list[StateDraw] = field(default_factory=list)
    #: queries whose previous window is neither durable nor known released: wait
    waiting: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class CumulativeValues:
    """The running totals of one (query, window), from the winning chain."""

    values: np.ndarray
    #: the chain's start and the window's step in it (what the record states)
    position: HorizonPosition
    draw_id: str
    #: the erasure-log position the window's totals had applied (the ledger records it)
    erasures_through: int = 0


class CumulativeReleases:
    def __init__(
        self,
        queries: Sequence[CumulativeQuery],
        *,
        window_size_s: int,
        partitions: int,
        store: ContinualStore,
        noise: NoiseSource | None = None,
    ) -> None:
        self.queries = {q.name: q for q in queries}
        self.window_size_s = window_size_s
        self.partitions = partitions
        self.store = store
        self._noise = noise
        #: per (query, horizon start): the counter of the chain last used
        self._chains: dict[tuple[str, int], _Chain] = {}

    def partition_of(self, name: str, window_start_s: int) -> int:
        q = self.queries[name]
        horizon = q.position(window_start_s, self.window_size_s).horizon_start_s
        return continual_partition(name, horizon, self.partitions)

    # -- before the release -------------------------------------------------------------------
    def prepare(
        self,
        window_start_s: int,
        names: Sequence[str],
        *,
        first_covered_s: int,
        totals_of: Callable[[str], Mapping[GroupKey, KeyAggregate]],
        may_spend: Callable[[str], bool],
        previous_released: bool,
        erasures_of: Callable[[str], int] = lambda name: 0,
    ) -> Preparation:
        """Draw the window's step of each query in ``names`` that has no winning draw yet,
        on the chain it continues (module docstring); nothing is written here."""
        out = Preparation()
        size = self.window_size_s
        previous_s = window_start_s - size
        todo: list[tuple[CumulativeQuery, int, StateDraw | None]] = []
        for name in names:
            q = self.queries[name]
            if self.store.winner(name, window_start_s) is not None:
                continue
            horizon_s = q.position(window_start_s, size).horizon_start_s
            before = self.store.winner(name, previous_s) if previous_s >= horizon_s else None
            covered = previous_s >= max(horizon_s, first_covered_s)
            if before is None and covered and not previous_released:
                out.waiting.append(name)
            todo.append((q, horizon_s, before))
        if out.waiting:
            return out  # the window is not released now: draw nothing
        for q, horizon_s, before in todo:
            name = q.name
            chain: _Chain | None = None
            if before is not None and self._continues(q, before, horizon_s):
                chain = self._chain_through(q, before)
            elif before is not None:
                log.warning(
                    "the plan, key list or horizon of a cumulative query changed: its running "
                    "total restarts at this window",
                    extra={"query": name, "window": iso_utc(window_start_s)},
                )
            elif previous_s >= max(horizon_s, first_covered_s):
                log.warning(
                    "the previous window of a cumulative query has no state (the query is "
                    "new, or its state was lost): its running total restarts at this window",
                    extra={"query": name, "window": iso_utc(window_start_s)},
                )
            if chain is None:
                chain = _Chain(window_start_s, make_counter(q.continual, q.keys, noise=self._noise))
            totals = np.zeros(len(q.keys), dtype=np.int64)
            if may_spend(name):
                totals, clamped = q.totals(totals_of(name))
                if clamped:
                    log.error(
                        "a running total's window total exceeds %d units and was clamped to "
                        "it (%d keys): this window's values are low; see `stream-dp plan`",
                        MAX_TOTAL,
                        clamped,
                        extra={"query": name, "window": iso_utc(window_start_s)},
                    )
            step = chain.counter.advance(totals)
            draw = StateDraw(
                query=name,
                window_start_s=window_start_s,
                horizon_start_s=horizon_s,
                chain_start_s=chain.chain_start_s,
                draw_id=new_draw_id(),
                after=chain.last_id,
                draws=step.draws,
                erasures_through=erasures_of(name),
            )
            # tentative: if this draw loses, the next use rebuilds the chain from the store
            chain.last_id, chain.values = draw.draw_id, step.values
            self._chains[(name, horizon_s)] = chain
            out.to_write.append(draw)
        return out

    @staticmethod
    def _continues(q: CumulativeQuery, before: StateDraw, horizon_s: int) -> bool:
        """Whether the previous window's draw can be continued: same plan and key list,
        same horizon (``horizon_origin`` unchanged) and room left in the counter."""
        return (
            before.fingerprint == q.fingerprint
            and before.horizon_start_s == horizon_s
            and before.step < q.continual.horizon_windows
        )

    def _chain_through(self, q: CumulativeQuery, last: StateDraw) -> _Chain | None:
        """The chain's counter with the winning draws through ``last`` applied: the cached
        one advanced by what other workers drew since, or rebuilt from the store. None when
        the stored chain has a gap (its records were lost): the caller starts a new one."""
        key = (q.name, last.horizon_start_s)
        cached = self._chains.get(key)
        if cached is not None and cached.last_id == last.draw_id:
            return cached
        try:
            if cached is not None and cached.chain_start_s == last.chain_start_s:
                path = self.store.chain(last, stop_at=cached.last_id)
                if path[0].after == cached.last_id and path[0].step == cached.counter.step + 1:
                    return self._apply(cached, path)
            fresh = _Chain(last.chain_start_s, make_counter(q.continual, q.keys, noise=self._noise))
            chain = self._apply(fresh, self.store.chain(last))
        except ContinualStateError as exc:
            log.error(
                "the stored state of a cumulative query cannot be continued (%s): its running "
                "total restarts",
                exc,
                extra={"query": q.name},
            )
            self._chains.pop(key, None)
            return None
        self._chains[key] = chain
        return chain

    @staticmethod
    def _apply(chain: _Chain, path: Sequence[StateDraw]) -> _Chain:
        for draw in path:
            chain.values = chain.counter.replay(draw.draws)  # never draws noise
            chain.last_id = draw.draw_id
        return chain

    # -- the release ------------------------------------------------------------------------
    def values(self, name: str, window_start_s: int) -> CumulativeValues | None:
        """The running totals of (query, window) from its winning draw's chain; None when
        there is no usable winner (none yet, or drawn under another plan: not published)."""
        q = self.queries[name]
        winner = self.store.winner(name, window_start_s)
        if winner is None:
            return None
        if winner.fingerprint != q.fingerprint:
            log.error(
                "the state of this window was drawn under another plan of the query (workers "
                "with different configurations): it is not released by this worker",
                extra={"query": name, "window": iso_utc(window_start_s)},
            )
            return None
        chain = self._chain_through(q, winner)
        if chain is None or chain.values is None:
            return None
        position = HorizonPosition(
            chain.chain_start_s, winner.step, q.continual.horizon_windows, self.window_size_s
        )
        return CumulativeValues(chain.values, position, winner.draw_id, winner.erasures_through)

    def forget(self, released_before_s: int) -> None:
        """Drop the state of horizons whose every window starts before ``released_before_s``
        (all released: never read again)."""

        def done(name: str, horizon_start_s: int) -> bool:
            q = self.queries.get(name)
            if q is None:
                return True
            span = q.continual.horizon_windows * self.window_size_s
            return horizon_start_s + span <= released_before_s

        self.store.forget(done)
        for key in [k for k in self._chains if done(*k)]:
            del self._chains[key]
        self.store.retain = lambda name, horizon_start_s: not done(name, horizon_start_s)


def cumulative_release(
    q: CumulativeQuery,
    found: CumulativeValues,
    *,
    window_start_s: int,
    window_end_s: int,
    horizon_epsilon_spent: float,
    sources: dict[int, str],
) -> LedgerRelease:
    """The ledger release of one (cumulative query, window): one record per public key with
    its running total, then the window record."""
    cfg, plan = q.config, q.continual
    release_id = new_release_id()
    step = found.position.step
    extra: dict[str, Any] = cumulative_release_fields(plan, found.position)
    records: list[OutputRecord] = []
    sums = statistic_of(cfg.statistic).needs_values  # a cumulative sum (see totals)
    for key, raw in zip(q.keys, found.values.tolist(), strict=True):
        value: int | float = float(raw) * plan.unit if sums else int(raw)
        clamped = cfg.clamp_negative and value < 0
        if clamped:
            value = 0.0 if sums else 0
        group = group_dict(cfg.group_by, key)
        records.append(
            OutputRecord(
                output_key(cfg.name, window_start_s, group),
                release_record(
                    release_id=release_id,
                    query=cfg.name,
                    window_start_s=window_start_s,
                    window_end_s=window_end_s,
                    group=group,
                    statistic=cfg.statistic,
                    value=value,
                    epsilon=cfg.epsilon,
                    delta=cfg.delta,
                    mechanism=cfg.mechanism,
                    noise_scale=plan.draw_scale,
                    ci95=plan.ci95(step),
                    selection=None,
                    clamped=clamped,
                    extra=extra,
                ),
            )
        )
    return close_release(
        records,
        release_id=release_id,
        query=cfg.name,
        window_start_s=window_start_s,
        window_end_s=window_end_s,
        released_keys=len(q.keys),
        epsilon_spent=cfg.epsilon,
        delta_spent=cfg.delta,
        horizon_epsilon_spent=horizon_epsilon_spent,
        sources=sources,
        # the values come from the window's state draw, whatever partials were taken since
        erasures_through=found.erasures_through,
    )


class ContinualSteps:
    """The cumulative-query steps of :class:`~stream_dp.pipeline.stages.release_stage.
    ReleaseStage`, over its state (the ledger, the inbox of partials, the release cursors)
    and its charges: which of a window's cumulative queries are pending, where their state
    lives, and each one's step drawn once charged (charges before state)."""

    def __init__(
        self,
        cumulative: CumulativeReleases,
        ledger: LedgerIndex,
        inbox: PartialsInbox,
        cursors: ReleaseCursors,
        queries: Sequence[CompiledQuery],
        *,
        charge: Callable[[int], frozenset[str]],
        taken: TakenPartials,
    ) -> None:
        self.cumulative = cumulative
        self.ledger = ledger
        self.inbox = inbox
        self.cursors = cursors
        self.windows = cursors.windows
        self.queries = queries
        #: Charge the window's draws not charged yet; the names of the charged queries.
        self._charge = charge
        #: A query's partials taken for the window.
        self._taken = taken

    @property
    def coverage_start_s(self) -> int | None:
        return self.cursors.coverage_start_s

    def released(self, window_start_s: int) -> bool:
        return self.cursors.released(window_start_s)

    def continual_pending(self, window_start_s: int) -> list[str]:
        """Cumulative queries of the window the ledger has no release of."""
        return [
            name
            for name in self.cumulative.queries
            if self.ledger.get(name, window_start_s) is None
        ]

    def continual_partitions(self, window_start_s: int) -> list[int]:
        """The continual partitions holding the state the window's pending cumulative
        queries continue (read them to a fence before :meth:`prepare_continual`)."""
        return sorted(
            {
                self.cumulative.partition_of(name, window_start_s)
                for name in self.continual_pending(window_start_s)
            }
        )

    def prepare_continual(self, window_start_s: int) -> Preparation:
        """Draw the window's step of every pending cumulative query that has no winning
        draw yet (in memory: the transport writes and reads back ``to_write`` before
        :meth:`compute_release`), or say which must wait for the previous window."""
        assert self.coverage_start_s is not None
        pending = self.inbox.pending(window_start_s)
        previous_s = window_start_s - self.windows.size_s
        previous_released = self.released(previous_s) or any(
            self.ledger.get(q.name, previous_s) is not None for q in self.queries
        )

        def totals_of(name: str) -> Mapping[tuple[Any, ...], KeyAggregate]:
            return merge_totals(self._taken(pending, name, window_start_s, None))

        # charges before state: the window's totals go into a running total only once its
        # release of the query is charged; a refused query's step takes zeros
        charged = self._charge(window_start_s)

        def may_spend(name: str) -> bool:
            return name in charged

        def erasures_of(name: str) -> int:
            taken = self._taken(pending, name, window_start_s, None)
            return min((p.erasures_through for p in taken), default=0)

        return self.cumulative.prepare(
            window_start_s,
            self.continual_pending(window_start_s),
            first_covered_s=self.coverage_start_s,
            totals_of=totals_of,
            may_spend=may_spend,
            previous_released=previous_released,
            erasures_of=erasures_of,
        )
