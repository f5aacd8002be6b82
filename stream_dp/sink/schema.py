"""The sink's tables, created and migrated by the sink itself.

Everything lives in the PostgreSQL schema ``stream_dp``. ``stream_dp.schema_version`` holds
one row per applied migration; :func:`migrate` applies the missing ones in order, in one
transaction, under an advisory lock (several sinks starting at once migrate once). A
database migrated by a newer stream-dp is refused: this sink would not know its tables.

Tables (version 1):

- ``releases`` — one row per released group: primary key (query, window_start, group_key),
  the noisy ``value``, ``ci95`` and the band ``ci95_low``/``ci95_high``, ``epsilon``,
  ``delta``, ``mechanism``, ``noise_scale``, ``selection``, ``release_id``.
- ``windows`` — one row per (query, window): the window record's ``release_id``,
  ``released_keys``, ``epsilon_spent``, ``delta_spent``, ``horizon_epsilon_spent``, and the
  sink's bookkeeping: ``releases_stored``, ``complete``, ``status``.
- ``dead_letters`` — records the sink could not store: topic, partition, offset, reason.
- view ``complete_releases`` — the releases of complete windows only (what dashboards read).

Version 2 adds the continual-release fields to ``releases`` (and the view): ``release``
(``window``: ``value`` is this window's statistic; ``cumulative``: ``value`` is the running
total from ``horizon_start`` to ``window_end``), ``horizon_start`` and ``horizon_step``.
Rows stored before it are per-window values (``release = 'window'``).

Version 3 adds ``quantiles`` (JSONB, NULL for other statistics) to ``releases`` (and the
view): a ``statistic: quantile`` record's list of ``{"quantile": α, "value": v}``, in the
configured order, values non-decreasing; its ``value`` is the first listed quantile's value,
and its ``noise_scale`` is in ranks.

Version 4 lets ``releases.ci95`` be NULL, and makes it NULL for quantile rows (those stored
before included): a quantile's interval is in ranks (the record's ``ci95`` with
``ci95_unit: "ranks"``), not in the value's units, so ``value ± ci95`` meant nothing; with
``ci95`` NULL the generated band ``ci95_low``/``ci95_high`` is NULL too. Every other
statistic's ``ci95`` is stored as before.

At every start :func:`check_tables` compares the tables with what this sink writes: a
column missing, of another type, or added NOT NULL without a default (every insert would
fail) is refused with a message naming it, before anything is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, TypeAlias

import psycopg

from stream_dp.errors import StreamDPError

Conn: TypeAlias = psycopg.AsyncConnection[tuple[Any, ...]]

SCHEMA: Final = "stream_dp"
#: pg_advisory_xact_lock key of the migration ("sdp-sink" in ASCII).
MIGRATION_LOCK_ID: Final = 0x7364702D73696E6B


class SchemaError(StreamDPError):
    """The database holds a sink schema this version cannot use."""


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    sql: str


_V1 = """
CREATE TABLE stream_dp.releases (
    query          text             NOT NULL,
    window_start   timestamptz      NOT NULL,
    window_end     timestamptz      NOT NULL,
    group_key      text             NOT NULL,
    group_values   jsonb            NOT NULL,
    group_label    text             NOT NULL,
    statistic      text             NOT NULL,
    value          double precision NOT NULL,
    ci95           double precision NOT NULL CHECK (ci95 >= 0),
    ci95_low       double precision GENERATED ALWAYS AS (value - ci95) STORED,
    ci95_high      double precision GENERATED ALWAYS AS (value + ci95) STORED,
    epsilon        double precision NOT NULL,
    delta          double precision NOT NULL,
    mechanism      text             NOT NULL,
    noise_scale    double precision NOT NULL,
    selection      jsonb,
    clamped        boolean          NOT NULL DEFAULT false,
    release_id     text             NOT NULL,
    stored_at      timestamptz      NOT NULL DEFAULT now(),
    PRIMARY KEY (query, window_start, group_key)
);
COMMENT ON TABLE stream_dp.releases IS
    'stream-dp: one noisy statistic per (query, window, group); written by stream-dp sink';
COMMENT ON COLUMN stream_dp.releases.group_key IS 'the group as canonical JSON (sorted keys)';
COMMENT ON COLUMN stream_dp.releases.ci95 IS 'half-width of the 95% confidence interval';

CREATE TABLE stream_dp.windows (
    query                  text             NOT NULL,
    window_start           timestamptz      NOT NULL,
    window_end             timestamptz,
    release_id             text,
    released_keys          integer          CHECK (released_keys >= 0),
    epsilon_spent          double precision,
    delta_spent            double precision,
    horizon_epsilon_spent  double precision,
    releases_stored        integer          NOT NULL DEFAULT 0,
    complete               boolean          NOT NULL DEFAULT false,
    status                 text GENERATED ALWAYS AS (
        CASE WHEN complete THEN 'complete'
             WHEN released_keys IS NULL THEN 'awaiting_window_record'
             ELSE 'awaiting_releases' END) STORED,
    first_seen_at          timestamptz      NOT NULL DEFAULT now(),
    window_record_at       timestamptz,
    completed_at           timestamptz,
    PRIMARY KEY (query, window_start)
);
COMMENT ON TABLE stream_dp.windows IS
    'stream-dp: one row per (query, window); complete: its window record and releases are in';

CREATE TABLE stream_dp.dead_letters (
    source_topic      text        NOT NULL,
    source_partition  integer     NOT NULL,
    source_offset     bigint      NOT NULL,
    reason            text        NOT NULL,
    detail            text        NOT NULL,
    received_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (source_topic, source_partition, source_offset)
);
COMMENT ON TABLE stream_dp.dead_letters IS
    'stream-dp sink: output-topic records that could not be stored (no payload)';

CREATE VIEW stream_dp.complete_releases AS
SELECT r.query, r.window_start, r.window_end, r.group_key, r.group_values, r.group_label,
       r.statistic, r.value, r.ci95, r.ci95_low, r.ci95_high, r.epsilon, r.delta,
       r.mechanism, r.noise_scale, r.selection, r.clamped, r.release_id
FROM stream_dp.releases AS r
JOIN stream_dp.windows AS w
  ON w.query = r.query AND w.window_start = r.window_start AND w.release_id = r.release_id
WHERE w.complete;
COMMENT ON VIEW stream_dp.complete_releases IS
    'stream-dp: releases of complete windows only (for dashboards)';
"""

_V2 = """
ALTER TABLE stream_dp.releases
    ADD COLUMN IF NOT EXISTS release text NOT NULL DEFAULT 'window'
        CHECK (release IN ('window', 'cumulative')),
    ADD COLUMN IF NOT EXISTS horizon_start timestamptz,
    ADD COLUMN IF NOT EXISTS horizon_step integer CHECK (horizon_step >= 1);
COMMENT ON COLUMN stream_dp.releases.release IS
    'window: value is this window''s statistic; cumulative: value is the running total from '
    'horizon_start to window_end (never add cumulative values up)';
CREATE OR REPLACE VIEW stream_dp.complete_releases AS
SELECT r.query, r.window_start, r.window_end, r.group_key, r.group_values, r.group_label,
       r.statistic, r.value, r.ci95, r.ci95_low, r.ci95_high, r.epsilon, r.delta,
       r.mechanism, r.noise_scale, r.selection, r.clamped, r.release_id,
       r.release, r.horizon_start, r.horizon_step
FROM stream_dp.releases AS r
JOIN stream_dp.windows AS w
  ON w.query = r.query AND w.window_start = r.window_start AND w.release_id = r.release_id
WHERE w.complete;
"""

_V3 = """
ALTER TABLE stream_dp.releases ADD COLUMN IF NOT EXISTS quantiles jsonb;
COMMENT ON COLUMN stream_dp.releases.quantiles IS
    'statistic quantile: [{"quantile": alpha, "value": v}, ...] in the configured order, '
    'values non-decreasing (value holds the first; ci95 and noise_scale are in ranks)';
CREATE OR REPLACE VIEW stream_dp.complete_releases AS
SELECT r.query, r.window_start, r.window_end, r.group_key, r.group_values, r.group_label,
       r.statistic, r.value, r.ci95, r.ci95_low, r.ci95_high, r.epsilon, r.delta,
       r.mechanism, r.noise_scale, r.selection, r.clamped, r.release_id,
       r.release, r.horizon_start, r.horizon_step, r.quantiles
FROM stream_dp.releases AS r
JOIN stream_dp.windows AS w
  ON w.query = r.query AND w.window_start = r.window_start AND w.release_id = r.release_id
WHERE w.complete;
"""

_V4 = """
ALTER TABLE stream_dp.releases ALTER COLUMN ci95 DROP NOT NULL;
UPDATE stream_dp.releases SET ci95 = NULL WHERE statistic = 'quantile' AND ci95 IS NOT NULL;
COMMENT ON COLUMN stream_dp.releases.ci95 IS
    'half-width of the 95% confidence interval, in the value''s units; NULL (and so '
    'ci95_low and ci95_high) for a quantile, whose interval is in ranks';
COMMENT ON COLUMN stream_dp.releases.quantiles IS
    'statistic quantile: [{"quantile": alpha, "value": v}, ...] in the configured order, '
    'values non-decreasing (value holds the first; noise_scale is in ranks, ci95 NULL)';
"""

MIGRATIONS: Final[tuple[Migration, ...]] = (
    Migration(1, "releases, windows, dead_letters, view complete_releases", _V1),
    Migration(2, "releases: continual-release fields release, horizon_start, horizon_step", _V2),
    Migration(3, "releases: quantiles (statistic quantile's list of quantile and value)", _V3),
    Migration(4, "releases: ci95 NULL for quantiles (their interval is in ranks)", _V4),
)
LATEST_VERSION: Final = MIGRATIONS[-1].version


async def current_version(conn: Conn) -> int:
    """The highest applied migration (0 for a database the sink never touched)."""
    cur = await conn.execute(
        "SELECT to_regclass('stream_dp.schema_version') IS NOT NULL",
    )
    row = await cur.fetchone()
    if row is None or not row[0]:
        return 0
    cur = await conn.execute("SELECT coalesce(max(version), 0) FROM stream_dp.schema_version")
    row = await cur.fetchone()
    return 0 if row is None else int(row[0])


async def migrate(conn: Conn) -> list[int]:
    """Bring the schema to :data:`LATEST_VERSION`; returns the versions applied now."""
    applied: list[int] = []
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_ID,))
        await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
        await conn.execute(
            f"CREATE TABLE IF NOT EXISTS {SCHEMA}.schema_version ("
            " version integer PRIMARY KEY,"
            " description text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        version = await current_version(conn)
        if version > LATEST_VERSION:
            raise SchemaError(
                f"the database's {SCHEMA} schema is at version {version}, newer than this "
                f"stream-dp knows ({LATEST_VERSION}); run the stream-dp version that migrated "
                "it, or a newer one"
            )
        for migration in MIGRATIONS:
            if migration.version <= version:
                continue
            await conn.execute(migration.sql.encode())
            await conn.execute(
                "INSERT INTO stream_dp.schema_version (version, description) VALUES (%s, %s)",
                (migration.version, migration.description),
            )
            applied.append(migration.version)
    return applied


#: What the sink writes and reads: table → column → PostgreSQL type (``format_type``).
EXPECTED_COLUMNS: Final[dict[str, dict[str, str]]] = {
    "releases": {
        "query": "text", "window_start": "timestamp with time zone",
        "window_end": "timestamp with time zone", "group_key": "text", "group_values": "jsonb",
        "group_label": "text", "statistic": "text", "value": "double precision",
        "ci95": "double precision", "ci95_low": "double precision",
        "ci95_high": "double precision", "epsilon": "double precision",
        "delta": "double precision", "mechanism": "text", "noise_scale": "double precision",
        "selection": "jsonb", "clamped": "boolean", "release_id": "text",
        "stored_at": "timestamp with time zone", "release": "text",
        "horizon_start": "timestamp with time zone", "horizon_step": "integer",
        "quantiles": "jsonb",
    },
    "windows": {
        "query": "text", "window_start": "timestamp with time zone",
        "window_end": "timestamp with time zone", "release_id": "text",
        "released_keys": "integer", "epsilon_spent": "double precision",
        "delta_spent": "double precision", "horizon_epsilon_spent": "double precision",
        "releases_stored": "integer", "complete": "boolean", "status": "text",
        "first_seen_at": "timestamp with time zone",
        "window_record_at": "timestamp with time zone",
        "completed_at": "timestamp with time zone",
    },
    "dead_letters": {
        "source_topic": "text", "source_partition": "integer", "source_offset": "bigint",
        "reason": "text", "detail": "text", "received_at": "timestamp with time zone",
    },
}  # fmt: skip

_COLUMNS = """
SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
       a.atthasdef OR a.attgenerated <> '' OR a.attidentity <> ''
FROM pg_attribute AS a
JOIN pg_class AS c ON c.oid = a.attrelid
JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = ANY(%s) AND a.attnum > 0 AND NOT a.attisdropped
"""


async def check_tables(conn: Conn) -> None:
    """Refuse tables the sink cannot write (:class:`SchemaError` naming every problem): a
    column it needs missing or of another type, or a column it does not know that is NOT
    NULL without a default (every insert would fail)."""
    cur = await conn.execute(_COLUMNS, (SCHEMA, list(EXPECTED_COLUMNS)))
    found: dict[str, dict[str, tuple[str, bool, bool]]] = {t: {} for t in EXPECTED_COLUMNS}
    for table, column, type_name, not_null, has_default in await cur.fetchall():
        found[table][column] = (type_name, not_null, has_default)
    problems: list[str] = []
    for table, columns in EXPECTED_COLUMNS.items():
        for column, type_name in columns.items():
            if column not in found[table]:
                problems.append(f"{SCHEMA}.{table}.{column} is missing")
            elif found[table][column][0] != type_name:
                problems.append(
                    f"{SCHEMA}.{table}.{column} is {found[table][column][0]}, not {type_name}"
                )
        for column, (_, not_null, has_default) in sorted(found[table].items()):
            if column not in columns and not_null and not has_default:
                problems.append(
                    f"{SCHEMA}.{table}.{column} is NOT NULL without a default and the sink "
                    "does not write it"
                )
    if problems:
        raise SchemaError(
            f"the sink cannot write the {SCHEMA} tables as they are: "
            + "; ".join(problems)
            + ". Give the added column a default (ALTER TABLE … ALTER COLUMN … SET DEFAULT …) "
            "or drop NOT NULL, or restore the column the sink needs, then start the sink again"
        )
