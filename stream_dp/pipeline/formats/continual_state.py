"""The continual topic: where the running-total state of cumulative queries lives.

A cumulative query's release of window w depends on every earlier window of its horizon:
the binary tree needs the exact sums of its open dyadic blocks and the noisy nodes drawn so
far, the √-factorisation every earlier exact total and encoded value. After a crash, or when
the next window belongs to another worker (windows map to partials partitions round-robin),
that state must be read back, never drawn again. So each window's new draws
(:class:`~stream_dp.privacy.continual.counter.WindowDraws`) are written here, acknowledged
and read back *before* any value derived from them is ledgered.

Why a topic of its own, not the ledger: the draws hold the window's exact bounded totals
per public key (``exact_totals``), as sensitive as the partials topic, while the ledger holds
only what the output topic may hold (docs/architecture.md#where-each-number-goes). The topic is
internal and access-controlled (docs/attack-model.md; docs/THREAT_MODEL.md).

Records, keyed ``<query>|<window_start>|<draw id>|part-<i>``: one *draw* of one (query,
window) in parts (large key lists are split by encoded size), each part carrying the draw id,
the part count, the horizon and chain it belongs to and ``after`` — the draw id of the
previous window's winning draw it extends (None for the first window of a chain). Every
record of one (query, horizon) goes to one partition (:func:`continual_partition`), so the
draws of a horizon have one log order.

**One draw per (query, window), decided by the log** (as in the ledger): a draw counts once
all its parts are present, and of several complete draws of one (query, window) the *first
complete in log order* wins, for every reader, whenever it reads. A writer uses a window's
values only after a fence written behind its parts has come back, so the winner it sees is
final. Later draws are counted (``losing_draws``) and never used.
"""

from __future__ import annotations

import logging
import math
import uuid
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from stream_dp.pipeline.formats.ledger import FENCE_PREFIX
from stream_dp.pipeline.formats.partials import RECORD_OVERHEAD_BYTES, RecordTooLargeError
from stream_dp.pipeline.formats.records import SCHEMA_VERSION
from stream_dp.privacy.continual.counter import (
    ContinualStateError,
    WindowDraws,
    merge_draws,
    split_draws,
)
from stream_dp.windows.tumbling import epoch_of_iso, iso_utc

log = logging.getLogger(__name__)

KIND: Final = "continual_state"


@dataclass(frozen=True, eq=False)
class StateDraw:
    """One complete draw of one (query, window): what the window added to its chain."""

    query: str
    window_start_s: int
    #: the horizon (origin + n·T windows) the window belongs to
    horizon_start_s: int
    #: the window the running total starts at (step 1 of the chain)
    chain_start_s: int
    draw_id: str
    #: the previous window's winning draw this one extends (None: the chain's first window)
    after: str | None
    draws: WindowDraws
    #: the erasure-log position every partial of the window's totals had applied
    #: (docs/erasure.md); 0 when erasure is off
    erasures_through: int = 0

    @property
    def step(self) -> int:
        return self.draws.step

    @property
    def fingerprint(self) -> str:
        return self.draws.fingerprint


def new_draw_id() -> str:
    return uuid.uuid4().hex


def continual_partition(query: str, horizon_start_s: int, partitions: int) -> int:
    """The continual partition of every record of one (query, horizon): CRC-32 of
    ``<query>|<horizon_start>`` modulo the partition count (stable across versions)."""
    return zlib.crc32(f"{query}|{iso_utc(horizon_start_s)}".encode()) % partitions


def _header(draw: StateDraw) -> dict[str, Any]:
    header: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "kind": KIND,
        "query": draw.query,
        "window_start": iso_utc(draw.window_start_s),
        "horizon_start": iso_utc(draw.horizon_start_s),
        "chain_start": iso_utc(draw.chain_start_s),
        "draw_id": draw.draw_id,
        "after": draw.after,
    }
    if draw.erasures_through:
        header["erasures_through"] = draw.erasures_through
    return header


def encode_state(draw: StateDraw, *, max_bytes: int) -> list[tuple[str, bytes]]:
    """The records (key, value bytes) of one draw, parts in order, each under ``max_bytes``
    (cut by key ranges: every key's values are integers, so a part's size is predictable)."""
    base = f"{draw.query}|{iso_utc(draw.window_start_s)}|{draw.draw_id}"
    budget = max_bytes - RECORD_OVERHEAD_BYTES - len(base) - 32
    header = _header(draw)
    keys = draw.draws.key_count
    n_parts = 1
    while True:
        per_part = max(1, math.ceil(keys / n_parts))
        pieces = split_draws(draw.draws, per_part)
        encoded = [
            orjson.dumps({**header, "part": i, "parts": len(pieces), "draws": p.to_json()})
            for i, p in enumerate(pieces)
        ]
        if all(len(e) <= budget for e in encoded):
            return [(f"{base}|part-{i}", e) for i, e in enumerate(encoded)]
        if per_part == 1:
            raise RecordTooLargeError(
                f"the continual state of one key of query {draw.query} does not fit in one "
                "record of kafka.max_message_bytes; raise it (and the brokers' "
                "message.max.bytes)"
            )
        n_parts = min(keys, n_parts * 2)


@dataclass
class _Draft:
    parts: int
    header: dict[str, Any]
    received: dict[int, WindowDraws] = field(default_factory=dict)


class ContinualStore:
    """What the continual topic says, fed record by record in log order (per partition).

    Per (query, window) the first draw whose parts are all present wins. Records of
    different partitions may interleave (a horizon lives on one partition). ``retain`` says
    which (query, horizon start) are still needed: records of others are skipped as they are
    read (a horizon whose every window is released is never read again).
    """

    def __init__(self) -> None:
        self._drafts: dict[tuple[str, int, str], _Draft] = {}
        self._winners: dict[tuple[str, int], StateDraw] = {}
        self._by_id: dict[str, StateDraw] = {}
        #: Complete draws that lost to an earlier complete draw of the same (query, window).
        self.losing_draws = 0
        #: Records that are not continual-state records of this schema (ignored).
        self.malformed = 0
        self.records_read = 0
        self.retain: Callable[[str, int], bool] = lambda query, horizon_start_s: True

    def __len__(self) -> int:
        return len(self._winners)

    def load(self, records: Iterable[tuple[str, bytes | None]]) -> None:
        for key, value in records:
            self.feed(key, value)

    def feed(self, key: str, value: bytes | None) -> None:
        """One record, in log order. Fences, tombstones and unknown kinds are ignored."""
        if value is None or key.startswith(FENCE_PREFIX):
            return
        self.records_read += 1
        try:
            obj = orjson.loads(value)
            if not isinstance(obj, dict) or obj.get("kind") != KIND:
                return
            self._feed_part(obj)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            self.malformed += 1
            log.error("continual topic: a record that is not valid state was ignored (%s)", exc)
        except ContinualStateError as exc:  # parts of one draw that do not fit together
            self.malformed += 1
            log.error("continual topic: a record that is not valid state was ignored (%s)", exc)

    def _feed_part(self, obj: dict[str, Any]) -> None:
        query = str(obj["query"])
        horizon_s = epoch_of_iso(str(obj["horizon_start"]))
        if not self.retain(query, horizon_s):
            return
        window_s = epoch_of_iso(str(obj["window_start"]))
        draw_id = str(obj["draw_id"])
        part, parts = int(obj["part"]), int(obj["parts"])
        if not 0 <= part < parts:
            raise ValueError(f"part {part} of {parts}")
        piece = WindowDraws.from_json(obj["draws"])
        ident = (query, window_s, draw_id)
        draft = self._drafts.get(ident)
        if draft is None:
            header = {k: obj[k] for k in ("horizon_start", "chain_start", "after")}
            header["erasures_through"] = int(obj.get("erasures_through", 0))
            draft = self._drafts[ident] = _Draft(parts, header)
        draft.received[part] = piece
        if len(draft.received) < draft.parts:
            return
        del self._drafts[ident]
        merged = merge_draws(draft.received.values())
        after = draft.header["after"]
        draw = StateDraw(
            query=query,
            window_start_s=window_s,
            horizon_start_s=horizon_s,
            chain_start_s=epoch_of_iso(str(draft.header["chain_start"])),
            draw_id=draw_id,
            after=None if after is None else str(after),
            draws=merged,
            erasures_through=int(draft.header["erasures_through"]),
        )
        if (query, window_s) in self._winners:
            if self._winners[(query, window_s)].draw_id != draw_id:
                self.losing_draws += 1
            return
        self._winners[(query, window_s)] = draw
        self._by_id[draw_id] = draw

    def winner(self, query: str, window_start_s: int) -> StateDraw | None:
        """The (query, window)'s draw that counts, if one is complete in what was read."""
        return self._winners.get((query, window_start_s))

    def by_id(self, draw_id: str) -> StateDraw | None:
        """A winning draw by its id (``after`` always names a winner)."""
        return self._by_id.get(draw_id)

    def chain(self, last: StateDraw, *, stop_at: str | None = None) -> list[StateDraw]:
        """The winning draws from ``last`` back to its chain's first window — or to the draw
        ``stop_at`` (excluded) — in step order. :class:`ContinualStateError` when a link is
        missing (the topic lost records, e.g. to a too-short retention)."""
        out = [last]
        current = last
        while current.after is not None and current.after != stop_at:
            previous = self._by_id.get(current.after)
            if previous is None or previous.step != current.step - 1:
                raise ContinualStateError(
                    f"the continual state of query {last.query} before window "
                    f"{iso_utc(current.window_start_s)} is missing"
                )
            out.append(previous)
            current = previous
        out.reverse()
        return out

    def forget(self, done: Callable[[str, int], bool]) -> None:
        """Drop every draw of the (query, horizon start) that ``done`` says are finished."""
        for window in [i for i, d in self._winners.items() if done(d.query, d.horizon_start_s)]:
            self._by_id.pop(self._winners.pop(window).draw_id, None)
        for draft in [
            i
            for i, d in self._drafts.items()
            if done(i[0], epoch_of_iso(str(d.header["horizon_start"])))
        ]:
            del self._drafts[draft]
