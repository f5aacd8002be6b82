"""Storing one :class:`~stream_dp.sink.batch.Batch` in one database transaction.

Within the transaction, in this order:

1. the batch's windows get a row if they have none, and every one is locked
   (``SELECT … FOR UPDATE``, sorted): two sinks writing the same window take turns, so the
   count of stored releases in step 4 always sees the other's committed rows;
2. window records fill their row; a window whose row already holds a window record is left
   as it is (same content: a duplicate; other content: a conflict, logged and counted);
3. releases are inserted, ``ON CONFLICT DO NOTHING``; a release not inserted is compared
   with the stored row: a duplicate, or a conflict (the stored row is kept);
4. each window's ``releases_stored`` is counted again (rows of its ``release_id``) and
   ``complete`` set when its window record is in and every release it announces is stored
   (a row is only rewritten when that changes it);
5. bad records go to ``dead_letters`` (topic, partition, offset, reason — no payload).

A record stored twice changes nothing: every write is keyed and never overwrites. The caller
commits Kafka offsets only after this transaction has committed.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from stream_dp.sink.batch import BadPosition, Batch
from stream_dp.sink.rows import ReleaseRow, WindowId, WindowRow
from stream_dp.sink.schema import Conn

log = logging.getLogger(__name__)


@dataclass
class StoreResult:
    releases_inserted: int = 0
    window_records_inserted: int = 0
    duplicates: int = 0
    conflicts: int = 0
    dead_letters: int = 0
    completed: list[WindowId] = field(default_factory=list)

    def merge(self, other: StoreResult) -> None:
        self.releases_inserted += other.releases_inserted
        self.window_records_inserted += other.window_records_inserted
        self.duplicates += other.duplicates
        self.conflicts += other.conflicts
        self.dead_letters += other.dead_letters
        self.completed = sorted({*self.completed, *other.completed})


@dataclass(frozen=True)
class _StoredWindow:
    release_id: str | None
    released_keys: int | None
    epsilon_spent: float | None
    delta_spent: float | None
    horizon_epsilon_spent: float | None
    complete: bool


_LOCK_WINDOWS = """
INSERT INTO stream_dp.windows (query, window_start, window_end)
SELECT t.query, t.window_start, t.window_end
FROM unnest(%s::text[], %s::timestamptz[], %s::timestamptz[]) AS t(query, window_start, window_end)
ORDER BY t.query, t.window_start
ON CONFLICT (query, window_start) DO NOTHING
"""

_SELECT_WINDOWS = """
SELECT w.query, w.window_start, w.release_id, w.released_keys, w.epsilon_spent,
       w.delta_spent, w.horizon_epsilon_spent, w.complete
FROM stream_dp.windows AS w
JOIN unnest(%s::text[], %s::timestamptz[]) AS t(query, window_start)
  ON w.query = t.query AND w.window_start = t.window_start
ORDER BY w.query, w.window_start
FOR UPDATE OF w
"""

_FILL_WINDOWS = """
UPDATE stream_dp.windows AS w
SET window_end = t.window_end, release_id = t.release_id, released_keys = t.released_keys,
    epsilon_spent = t.epsilon_spent, delta_spent = t.delta_spent,
    horizon_epsilon_spent = t.horizon_epsilon_spent, window_record_at = now()
FROM unnest(%s::text[], %s::timestamptz[], %s::timestamptz[], %s::text[], %s::integer[],
            %s::float8[], %s::float8[], %s::float8[])
     AS t(query, window_start, window_end, release_id, released_keys, epsilon_spent,
          delta_spent, horizon_epsilon_spent)
WHERE w.query = t.query AND w.window_start = t.window_start AND w.release_id IS NULL
"""

_INSERT_RELEASES = """
INSERT INTO stream_dp.releases (
    query, window_start, window_end, group_key, group_values, group_label, statistic, value,
    ci95, epsilon, delta, mechanism, noise_scale, selection, clamped, release_id, release,
    horizon_start, horizon_step, quantiles)
SELECT t.query, t.window_start, t.window_end, t.group_key, t.group_values::jsonb,
       t.group_label, t.statistic, t.value, t.ci95, t.epsilon, t.delta, t.mechanism,
       t.noise_scale, t.selection::jsonb, t.clamped, t.release_id, t.release,
       t.horizon_start, t.horizon_step, t.quantiles::jsonb
FROM unnest(%s::text[], %s::timestamptz[], %s::timestamptz[], %s::text[], %s::text[],
            %s::text[], %s::text[], %s::float8[], %s::float8[], %s::float8[], %s::float8[],
            %s::text[], %s::float8[], %s::text[], %s::boolean[], %s::text[], %s::text[],
            %s::timestamptz[], %s::integer[], %s::text[])
     AS t(query, window_start, window_end, group_key, group_values, group_label, statistic,
          value, ci95, epsilon, delta, mechanism, noise_scale, selection, clamped, release_id,
          release, horizon_start, horizon_step, quantiles)
ORDER BY t.query, t.window_start, t.group_key
ON CONFLICT (query, window_start, group_key) DO NOTHING
RETURNING query, window_start, group_key
"""

_SELECT_RELEASES = """
SELECT r.query, r.window_start, r.group_key, r.window_end, r.statistic, r.value, r.ci95,
       r.epsilon, r.delta, r.mechanism, r.noise_scale, r.selection, r.clamped, r.release_id,
       r.release, r.horizon_start, r.horizon_step, r.quantiles
FROM stream_dp.releases AS r
JOIN unnest(%s::text[], %s::timestamptz[], %s::text[]) AS t(query, window_start, group_key)
  ON r.query = t.query AND r.window_start = t.window_start AND r.group_key = t.group_key
"""

_RECOUNT = """
UPDATE stream_dp.windows AS w
SET releases_stored = c.n,
    complete = w.released_keys IS NOT NULL AND c.n >= w.released_keys,
    completed_at = CASE
        WHEN w.released_keys IS NOT NULL AND c.n >= w.released_keys
        THEN coalesce(w.completed_at, now()) END
FROM (
    SELECT t.query, t.window_start, count(r.group_key)::integer AS n
    FROM unnest(%s::text[], %s::timestamptz[]) AS t(query, window_start)
    JOIN stream_dp.windows AS x ON x.query = t.query AND x.window_start = t.window_start
    LEFT JOIN stream_dp.releases AS r
      ON r.query = t.query AND r.window_start = t.window_start
     AND (x.release_id IS NULL OR r.release_id = x.release_id)
    GROUP BY t.query, t.window_start
) AS c
WHERE w.query = c.query AND w.window_start = c.window_start
  AND (w.releases_stored, w.complete)
      IS DISTINCT FROM (c.n, w.released_keys IS NOT NULL AND c.n >= w.released_keys)
RETURNING w.query, w.window_start, w.complete
"""

_INSERT_DEAD_LETTERS = """
INSERT INTO stream_dp.dead_letters (source_topic, source_partition, source_offset, reason, detail)
SELECT * FROM unnest(%s::text[], %s::integer[], %s::bigint[], %s::text[], %s::text[])
ON CONFLICT DO NOTHING
"""


async def store_batch(conn: Conn, batch: Batch) -> StoreResult:
    """Store ``batch`` in one transaction (committed on return)."""
    result = StoreResult(duplicates=batch.duplicates, conflicts=batch.conflicts)
    async with conn.transaction():
        touched = batch.touched_windows
        if touched:
            stored = await _lock_windows(conn, batch, touched)
            await _fill_windows(conn, batch.windows.values(), stored, result)
            await _insert_releases(conn, list(batch.releases.values()), stored, result)
            result.completed = await _recount(conn, touched, stored)
        if batch.bad:
            result.dead_letters = await _insert_dead_letters(conn, batch.bad)
    return result


def _columns(rows: Iterable[Sequence[Any]], width: int) -> list[list[Any]]:
    """Rows → one list per column (the arrays ``unnest`` takes)."""
    columns: list[list[Any]] = [[] for _ in range(width)]
    for row in rows:
        for column, item in zip(columns, row, strict=True):
            column.append(item)
    return columns


async def _lock_windows(
    conn: Conn, batch: Batch, touched: list[WindowId]
) -> dict[WindowId, _StoredWindow]:
    ends = {r.window_id: r.window_end for r in batch.releases.values()}
    ends.update((w.window_id, w.window_end) for w in batch.windows.values())
    await conn.execute(_LOCK_WINDOWS, _columns(((q, s, ends.get((q, s))) for q, s in touched), 3))
    cur = await conn.execute(_SELECT_WINDOWS, _columns(touched, 2))
    return {(row[0], row[1]): _StoredWindow(*row[2:]) for row in await cur.fetchall()}


def _same_window(stored: _StoredWindow, row: WindowRow) -> bool:
    return (
        stored.release_id == row.release_id
        and stored.released_keys == row.released_keys
        and _same_float(stored.epsilon_spent, row.epsilon_spent)
        and _same_float(stored.delta_spent, row.delta_spent)
        and _same_float(stored.horizon_epsilon_spent, row.horizon_epsilon_spent)
    )


def _same_float(a: float | None, b: float | None) -> bool:
    return a is not None and b is not None and (a == b or math.isclose(a, b, rel_tol=1e-12))


async def _fill_windows(
    conn: Conn,
    rows: Iterable[WindowRow],
    stored: dict[WindowId, _StoredWindow],
    result: StoreResult,
) -> None:
    fresh: list[WindowRow] = []
    for row in rows:
        earlier = stored[row.window_id]
        if earlier.release_id is None:
            fresh.append(row)
        elif _same_window(earlier, row):
            result.duplicates += 1
        else:
            result.conflicts += 1
            log.warning(
                "window record differs from the one stored (another release_id or budget): "
                "kept the stored one; the worker may have released this window twice",
                extra={"query": row.query, "window": row.window_start.isoformat()},
            )
    if not fresh:
        return
    await conn.execute(
        _FILL_WINDOWS,
        _columns(
            (
                (r.query, r.window_start, r.window_end, r.release_id, r.released_keys,
                 r.epsilon_spent, r.delta_spent, r.horizon_epsilon_spent)
                for r in fresh
            ),
            8,
        ),
    )  # fmt: skip
    result.window_records_inserted += len(fresh)
    for row in fresh:
        stored[row.window_id] = _StoredWindow(
            row.release_id, row.released_keys, row.epsilon_spent, row.delta_spent,
            row.horizon_epsilon_spent, complete=stored[row.window_id].complete,
        )  # fmt: skip


def _release_params(rows: Sequence[ReleaseRow]) -> list[list[Any]]:
    return _columns(
        (
            (r.query, r.window_start, r.window_end, r.group_key, r.group_values, r.group_label,
             r.statistic, r.value, r.ci95, r.epsilon, r.delta, r.mechanism, r.noise_scale,
             r.selection, r.clamped, r.release_id, r.release, r.horizon_start,
             r.horizon_step, r.quantiles)
            for r in rows
        ),
        20,
    )  # fmt: skip


def _same_release(row: ReleaseRow, stored: Sequence[Any]) -> bool:
    (window_end, statistic, value, ci95, epsilon, delta, mechanism, noise_scale, selection,
     clamped, release_id, release, horizon_start, horizon_step, quantiles) = stored  # fmt: skip
    wanted = None if row.selection is None else orjson.loads(row.selection)
    wanted_quantiles = None if row.quantiles is None else orjson.loads(row.quantiles)
    return (
        row.release_id == release_id
        and (row.release, row.horizon_start, row.horizon_step)
        == (release, horizon_start, horizon_step)
        and row.window_end == window_end
        and row.statistic == statistic
        and row.mechanism == mechanism
        and row.clamped == clamped
        and (row.ci95 is None) == (ci95 is None)
        and all(
            _same_float(a, b)
            for a, b in (
                (row.value, value),
                (row.ci95 or 0.0, ci95 or 0.0),
                (row.epsilon, epsilon),
                (row.delta, delta),
                (row.noise_scale, noise_scale),
            )
        )
        and wanted == selection
        and wanted_quantiles == quantiles
    )


def _conflict(row: ReleaseRow, what: str) -> None:
    log.warning(
        "release %s: kept the stored one; the worker may have released this window twice",
        what,
        extra={"query": row.query, "window": row.window_start.isoformat()},
    )


async def _insert_releases(
    conn: Conn,
    candidates: list[ReleaseRow],
    windows: dict[WindowId, _StoredWindow],
    result: StoreResult,
) -> None:
    rows = []
    for row in candidates:
        known = windows[row.window_id].release_id
        if known is None or known == row.release_id:
            rows.append(row)
        else:
            result.conflicts += 1
            _conflict(row, "of another release_id than its window record")
    if not rows:
        return
    cur = await conn.execute(_INSERT_RELEASES, _release_params(rows))
    inserted = {(q, s, g) for q, s, g in await cur.fetchall()}
    result.releases_inserted += len(inserted)
    others = [r for r in rows if r.primary_key not in inserted]
    if not others:
        return
    cur = await conn.execute(_SELECT_RELEASES, _columns((r.primary_key for r in others), 3))
    stored = {(row[0], row[1], row[2]): row[3:] for row in await cur.fetchall()}
    for row in others:
        if _same_release(row, stored[row.primary_key]):
            result.duplicates += 1
        else:
            result.conflicts += 1
            _conflict(row, "differs from the one stored for its query, window and group")


async def _recount(
    conn: Conn, touched: list[WindowId], before: dict[WindowId, _StoredWindow]
) -> list[WindowId]:
    """Count each window's stored releases again; returns the windows completed now."""
    cur = await conn.execute(_RECOUNT, _columns(touched, 2))
    completed = []
    for query, window_start, complete in await cur.fetchall():
        earlier = before.get((query, window_start))
        if complete and not (earlier is not None and earlier.complete):
            completed.append((query, window_start))
    return sorted(completed)


async def _insert_dead_letters(conn: Conn, bad: Sequence[BadPosition]) -> int:
    cur = await conn.execute(
        _INSERT_DEAD_LETTERS,
        _columns(((b.topic, b.partition, b.offset, b.bad.reason, b.bad.detail) for b in bad), 5),
    )
    return max(0, cur.rowcount)
