"""The sink against a database that changes or is busy, on a real PostgreSQL server:

- tables changed under the sink are refused at start, naming the column;
- deadlocks and serialization failures are retried a bounded number of times, then the
  sink stops with an error (nothing stored);
- ``lock_timeout`` and ``statement_timeout`` are set on the sink's session: a lock held
  elsewhere fails the try (retried) instead of stalling the sink;
- running totals of continual release are stored with ``release``, ``horizon_start`` and
  ``horizon_step``; rows of an older schema become per-window ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from stream_dp.config import Config, load_config
from stream_dp.pipeline.formats.records import dumps, release_record
from stream_dp.retry import Backoff
from stream_dp.sink import schema
from stream_dp.sink.batch import Consumed, assemble
from stream_dp.sink.schema import SchemaError, migrate
from stream_dp.sink.service import Sink, SinkError
from tests.sink.support import W0, window_records

DEADLINE_S = 60.0
FAST = Backoff(base_s=0.01, cap_s=0.05)


@pytest.fixture
def config(tmp_path: Path) -> Config:
    path = tmp_path / "config.yaml"
    path.write_text(
        "queries: [{name: q, group_by: [domain], epsilon: 1.0, delta: 1.0e-6}]\n",
        encoding="utf-8",
    )
    return load_config(path)


def _batch(records: list[tuple[str, bytes]]) -> Any:
    return assemble(Consumed("out", 0, i, v) for i, (_, v) in enumerate(records))


def _scalar(dsn: str, sql: str) -> Any:
    with psycopg.connect(dsn) as c:
        row = c.execute(sql).fetchone()
    assert row is not None
    return row[0]


async def _until(what: str, check: Callable[[], bool]) -> None:
    deadline = asyncio.get_running_loop().time() + DEADLINE_S
    while not check():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def _migrate(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as c:
        await migrate(c)


async def test_a_not_null_column_added_under_the_sink_is_refused_at_start(
    config: Config, postgres_dsn: str
) -> None:
    await _migrate(postgres_dsn)
    with psycopg.connect(postgres_dsn) as c:
        c.execute("ALTER TABLE stream_dp.releases ADD COLUMN tenant text NOT NULL DEFAULT 'x'")
        c.execute("ALTER TABLE stream_dp.releases ALTER COLUMN tenant DROP DEFAULT")
        c.execute("ALTER TABLE stream_dp.dead_letters ALTER COLUMN source_offset TYPE integer")
    sink = Sink(config, postgres_dsn, bootstrap_servers="127.0.0.1:1")
    with pytest.raises(SchemaError) as raised:
        await asyncio.wait_for(sink.run(), timeout=DEADLINE_S)
    message = str(raised.value)
    assert "stream_dp.releases.tenant is NOT NULL without a default" in message
    assert "stream_dp.dead_letters.source_offset is integer, not bigint" in message
    assert "SET DEFAULT" in message
    assert not sink.health.ready()

    # A column added with a default is no obstacle: the sink fills every other one.
    with psycopg.connect(postgres_dsn) as c:
        c.execute("ALTER TABLE stream_dp.releases ALTER COLUMN tenant SET DEFAULT 'x'")
        c.execute("ALTER TABLE stream_dp.dead_letters ALTER COLUMN source_offset TYPE bigint")
    sink = Sink(config, postgres_dsn, bootstrap_servers="127.0.0.1:1")
    try:
        await asyncio.wait_for(sink._database(), timeout=DEADLINE_S)
    finally:
        await sink._shutdown()


_INJECT = """
CREATE SEQUENCE public.tries;
CREATE FUNCTION public.conflict() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF nextval('public.tries') <= {failures} THEN
        RAISE EXCEPTION 'injected conflict' USING ERRCODE = '{sqlstate}';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER conflict BEFORE INSERT ON stream_dp.releases
    FOR EACH STATEMENT EXECUTE FUNCTION public.conflict();
"""


def _inject_conflicts(dsn: str, failures: int, sqlstate: str) -> None:
    """Every insert into stream_dp.releases fails with ``sqlstate`` for the first
    ``failures`` statements (a sequence counts them: it survives the rollbacks)."""
    with psycopg.connect(dsn) as c:
        c.execute(_INJECT.format(failures=failures, sqlstate=sqlstate).encode())


def _tries(dsn: str) -> int:
    return int(_scalar(dsn, "SELECT last_value FROM public.tries"))


@pytest.mark.parametrize("sqlstate", ["40P01", "40001"])  # deadlock, serialization failure
async def test_a_transaction_conflict_is_retried_then_stored(
    config: Config, postgres_dsn: str, sqlstate: str
) -> None:
    await _migrate(postgres_dsn)
    _inject_conflicts(postgres_dsn, 3, sqlstate)
    sink = Sink(config, postgres_dsn, bootstrap_servers="127.0.0.1:1", conflict_backoff=FAST)
    try:
        result = await asyncio.wait_for(
            sink._store(_batch(window_records("q", 0, ["a", "b"]))), timeout=DEADLINE_S
        )
    finally:
        await sink._shutdown()
    assert result.releases_inserted == 2
    assert _tries(postgres_dsn) == 4  # three conflicts, then the try that stored it
    assert sink.metrics.database_errors._value.get() == 3
    assert _scalar(postgres_dsn, "SELECT count(*) FROM stream_dp.windows WHERE complete") == 1


async def test_transaction_conflicts_without_end_stop_the_sink_after_the_bound(
    config: Config, postgres_dsn: str
) -> None:
    await _migrate(postgres_dsn)
    _inject_conflicts(postgres_dsn, 1_000_000, "40P01")
    sink = Sink(
        config,
        postgres_dsn,
        bootstrap_servers="127.0.0.1:1",
        max_conflict_tries=5,
        conflict_backoff=FAST,
    )
    try:
        with pytest.raises(SinkError, match="aborted the batch's transaction 5 times"):
            await asyncio.wait_for(
                sink._store(_batch(window_records("q", 0, ["a", "b"]))), timeout=DEADLINE_S
            )
    finally:
        await sink._shutdown()
    assert _tries(postgres_dsn) == 5
    assert _scalar(postgres_dsn, "SELECT count(*) FROM stream_dp.releases") == 0
    assert _scalar(postgres_dsn, "SELECT count(*) FROM stream_dp.windows") == 0


async def test_the_session_has_lock_and_statement_timeouts_and_a_held_lock_is_retried(
    config: Config, postgres_dsn: str
) -> None:
    sink = Sink(
        config,
        postgres_dsn,
        bootstrap_servers="127.0.0.1:1",
        lock_timeout_s=0.3,
        statement_timeout_s=7.5,
    )
    try:
        conn = await sink._database()
        cur = await conn.execute("SELECT current_setting('lock_timeout'), "
                                 "current_setting('statement_timeout')")  # fmt: skip
        assert await cur.fetchone() == ("300ms", "7500ms")
        await conn.commit()

        # A migration elsewhere holds the table: the sink's try fails after lock_timeout
        # (counted, retried with back-off) instead of waiting as long as the lock is held.
        blocker = psycopg.connect(postgres_dsn)
        try:
            blocker.execute("LOCK TABLE stream_dp.windows IN ACCESS EXCLUSIVE MODE")
            store = asyncio.create_task(sink._store(_batch(window_records("q", 0, ["a", "b"]))))
            await _until("a lock timeout", lambda: sink.metrics.database_errors._value.get() >= 1)
            assert not store.done()
        finally:
            blocker.rollback()
            blocker.close()
        result = await asyncio.wait_for(store, timeout=DEADLINE_S)
        assert result.releases_inserted == 2
    finally:
        await sink._shutdown()


def _cumulative(window: int, step: int, value: int) -> bytes:
    ws = W0 + window * 10
    return dumps(
        release_record(
            release_id=f"c-{window}", query="total", window_start_s=ws, window_end_s=ws + 10,
            group={}, statistic="count", value=value, epsilon=0.1, delta=0.0,
            mechanism="discrete_laplace", noise_scale=3.0, ci95=9.0, selection=None,
            clamped=False,
            extra={"release": "cumulative", "horizon_start": "2020-08-01T00:00:00Z",
                   "horizon_windows": 4, "horizon_step": step, "continual_mechanism": "tree",
                   "noise_sd": 2.0, "cumulative_epsilon": 0.1 * step,
                   "cumulative_delta": 0.0},
        )
    )  # fmt: skip


async def test_running_totals_are_stored_with_their_continual_release_fields(
    config: Config, postgres_dsn: str
) -> None:
    sink = Sink(config, postgres_dsn, bootstrap_servers="127.0.0.1:1")
    records = [("k", _cumulative(0, 1, 40)), ("k", _cumulative(1, 2, 95)),
               *window_records("visits", 0, ["a"])]  # fmt: skip
    try:
        result = await sink._store(_batch(records))
        again = await sink._store(_batch(records))  # read again after a restart
    finally:
        await sink._shutdown()
    assert result.releases_inserted == 3
    assert (again.releases_inserted, again.duplicates, again.conflicts) == (0, 4, 0)
    with psycopg.connect(postgres_dsn) as c:
        rows = c.execute(
            "SELECT query, value, release, horizon_start, horizon_step FROM stream_dp.releases "
            "ORDER BY query, window_start"
        ).fetchall()
    horizon = datetime(2020, 8, 1, tzinfo=UTC)
    assert rows == [
        ("total", 40.0, "cumulative", horizon, 1),
        ("total", 95.0, "cumulative", horizon, 2),
        ("visits", 100.0, "window", None, None),
    ]
    # The running total of the horizon is the last step's value, not the sum of them.
    assert (
        _scalar(
            postgres_dsn,
            "SELECT sum(value) FROM stream_dp.releases WHERE release = 'window'",
        )
        == 100.0
    )


async def test_a_version_1_database_is_migrated_and_its_rows_are_per_window(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:1])
    monkeypatch.setattr(schema, "LATEST_VERSION", 1)
    await _migrate(postgres_dsn)
    with psycopg.connect(postgres_dsn) as c:
        c.execute(
            "INSERT INTO stream_dp.releases (query, window_start, window_end, group_key, "
            "group_values, group_label, statistic, value, ci95, epsilon, delta, mechanism, "
            "noise_scale, release_id) VALUES ('old', now(), now(), '{}', '{}', '(all)', "
            "'count', 5, 1, 1, 0, 'discrete_laplace', 1, 'r')"
        )
    monkeypatch.undo()
    async with await psycopg.AsyncConnection.connect(postgres_dsn) as c:
        assert await migrate(c) == list(range(2, schema.LATEST_VERSION + 1))
        await schema.check_tables(c)
    assert _scalar(postgres_dsn, "SELECT release FROM stream_dp.releases") == "window"
    assert _scalar(postgres_dsn, "SELECT quantiles IS NULL FROM stream_dp.releases") is True
    assert _scalar(postgres_dsn, "SELECT ci95 FROM stream_dp.releases") == 1.0  # a count's
    count = "SELECT count(*) FROM stream_dp.schema_version"
    assert _scalar(postgres_dsn, count) == schema.LATEST_VERSION


async def test_quantile_rows_stored_before_version_4_lose_their_meaningless_band(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Version 4: a quantile's ci95 is in ranks, so value ± ci95 meant nothing; rows stored
    by a version 3 sink get ci95 (and so ci95_low, ci95_high) NULL, a count's stay."""
    monkeypatch.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:3])
    monkeypatch.setattr(schema, "LATEST_VERSION", 3)
    await _migrate(postgres_dsn)
    with psycopg.connect(postgres_dsn) as c:
        for statistic, group in (("quantile", "a"), ("count", "b")):
            c.execute(
                "INSERT INTO stream_dp.releases (query, window_start, window_end, group_key, "
                "group_values, group_label, statistic, value, ci95, epsilon, delta, mechanism, "
                "noise_scale, release_id) VALUES ('old', now(), now(), %s, '{}', '(all)', "
                "%s, 40, 7, 1, 0, 'discrete_laplace', 1, 'r')",
                (f'{{"g": "{group}"}}', statistic),
            )
    monkeypatch.undo()
    async with await psycopg.AsyncConnection.connect(postgres_dsn) as c:
        assert 4 in await migrate(c)
        await schema.check_tables(c)
    with psycopg.connect(postgres_dsn) as c:
        rows = c.execute(
            "SELECT statistic, ci95, ci95_low, ci95_high FROM stream_dp.releases ORDER BY statistic"
        ).fetchall()
    assert rows == [("count", 7.0, 33.0, 47.0), ("quantile", None, None, None)]
