"""The sink's tables on a real PostgreSQL server: migrations, completeness in any arrival
order, idempotence (storing again changes nothing, not even a row version), conflicts."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from stream_dp.config import load_config
from stream_dp.sink.batch import Consumed, assemble
from stream_dp.sink.schema import LATEST_VERSION, Conn, current_version, migrate
from stream_dp.sink.service import Sink, SinkError
from stream_dp.sink.store import store_batch
from tests.sink.support import releases, window_records, windows


@pytest.fixture
async def conn(postgres_dsn: str) -> AsyncIterator[Conn]:
    async with await psycopg.AsyncConnection.connect(postgres_dsn) as c:
        await migrate(c)
        yield c


def _batch(values: list[bytes | None], first_offset: int = 0, partition: int = 0) -> Any:
    return assemble(Consumed("out", partition, first_offset + i, v) for i, v in enumerate(values))


def _values(records: list[tuple[str, bytes]]) -> list[bytes | None]:
    return [v for _, v in records]


async def test_migrate_creates_the_tables_once(postgres_dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(postgres_dsn) as c:
        assert await current_version(c) == 0
        assert await migrate(c) == list(range(1, LATEST_VERSION + 1))
        assert await migrate(c) == []
        assert await current_version(c) == LATEST_VERSION
        cur = await c.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'stream_dp' "
            "ORDER BY 1"
        )
        assert [r[0] for r in await cur.fetchall()] == [
            "complete_releases", "dead_letters", "releases", "schema_version", "windows",
        ]  # fmt: skip


async def test_a_newer_schema_is_refused(postgres_dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as c:
        await migrate(c)
        await c.execute(
            "INSERT INTO stream_dp.schema_version (version, description) VALUES (%s, 'future')",
            (LATEST_VERSION + 1,),
        )
        with pytest.raises(Exception, match="newer than this stream-dp knows"):
            await migrate(c)


async def test_a_window_is_partial_until_its_record_and_every_release_are_in(
    conn: Conn, postgres_dsn: str
) -> None:
    records = window_records("visits", 0, ["a", "b", "c"])
    window_record, rel = records[-1][1], _values(records[:-1])
    # The window record first (another partition), then the releases in two batches.
    first = await store_batch(conn, _batch([window_record]))
    assert first.window_records_inserted == 1 and first.completed == []
    second = await store_batch(conn, _batch(rel[:2], 10))
    assert second.releases_inserted == 2 and second.completed == []
    with psycopg.connect(postgres_dsn) as c:
        status = c.execute(
            "SELECT complete, status, releases_stored, released_keys FROM stream_dp.windows"
        ).fetchall()
        assert status == [(False, "awaiting_releases", 2, 3)]
        assert c.execute("SELECT count(*) FROM stream_dp.complete_releases").fetchone() == (0,)
    third = await store_batch(conn, _batch(rel[2:], 20))
    assert third.completed and third.completed[0][0] == "visits"
    with psycopg.connect(postgres_dsn) as c:
        status = c.execute(
            "SELECT complete, status, releases_stored, completed_at IS NOT NULL "
            "FROM stream_dp.windows"
        ).fetchall()
        assert status == [(True, "complete", 3, True)]
        view = c.execute(
            "SELECT group_label, value, ci95_low, ci95_high FROM stream_dp.complete_releases "
            "ORDER BY group_label"
        ).fetchall()
        assert view == [("a", 100.0, 82.0, 118.0), ("b", 107.0, 89.0, 125.0),
                        ("c", 114.0, 96.0, 132.0)]  # fmt: skip


async def test_releases_before_their_window_record_wait_for_it(
    conn: Conn, postgres_dsn: str
) -> None:
    records = window_records("visits", 0, ["a", "b"])
    await store_batch(conn, _batch(_values(records[:-1])))
    with psycopg.connect(postgres_dsn) as c:
        assert c.execute("SELECT status, releases_stored FROM stream_dp.windows").fetchall() == [
            ("awaiting_window_record", 2)
        ]
    done = await store_batch(conn, _batch(_values(records[-1:]), 5))
    assert len(done.completed) == 1


async def test_storing_again_changes_nothing(conn: Conn, postgres_dsn: str) -> None:
    records = [r for w in range(3) for r in window_records("visits", w, ["a", "b", "c"])]
    records += window_records("users", 0, ["DE", "FR"], field="country")
    values = [*_values(records), b"garbage"]
    result = await store_batch(conn, _batch(values))
    assert result.releases_inserted == 11 and len(result.completed) == 4
    assert result.dead_letters == 1
    with psycopg.connect(postgres_dsn) as c:
        before = (releases(c), windows(c), c.execute(
            "SELECT xmin::text, * FROM stream_dp.dead_letters").fetchall())  # fmt: skip
    # The same records again: as one batch, one by one, and in reverse order.
    again = await store_batch(conn, _batch(values))
    assert again.duplicates == len(records) and again.conflicts == 0
    assert again.releases_inserted == again.window_records_inserted == 0
    assert again.completed == [] and again.dead_letters == 0
    for i, v in enumerate(reversed(values)):
        single = await store_batch(conn, _batch([v], len(values) - 1 - i))
        assert single.releases_inserted == single.window_records_inserted == 0
    with psycopg.connect(postgres_dsn) as c:
        after = (releases(c), windows(c), c.execute(
            "SELECT xmin::text, * FROM stream_dp.dead_letters").fetchall())  # fmt: skip
    assert after == before  # the same rows, not even a new row version (xmin)


async def test_a_conflicting_record_keeps_the_stored_one(conn: Conn, postgres_dsn: str) -> None:
    records = window_records("visits", 0, ["a", "b"])
    await store_batch(conn, _batch(_values(records)))
    redrawn = orjson.loads(records[0][1])
    redrawn["value"] += 5
    redrawn["release_id"] = "second-draw"
    new_key = orjson.loads(records[1][1])
    new_key["group"] = {"domain": "z"}
    new_key["release_id"] = "second-draw"
    window = orjson.loads(records[-1][1])
    window["release_id"] = "second-draw"
    result = await store_batch(
        conn, _batch([orjson.dumps(redrawn), orjson.dumps(new_key), orjson.dumps(window)], 9)
    )
    assert result.conflicts == 3
    assert result.releases_inserted == result.window_records_inserted == 0
    with psycopg.connect(postgres_dsn) as c:
        rows = c.execute(
            "SELECT group_label, value, release_id FROM stream_dp.releases ORDER BY 1"
        ).fetchall()
        assert rows == [("a", 100.0, "visits-0"), ("b", 107.0, "visits-0")]
        assert c.execute("SELECT release_id, complete FROM stream_dp.windows").fetchall() == [
            ("visits-0", True)
        ]


async def test_a_user_who_cannot_create_the_schema_gets_the_fix(
    postgres_dsn: str, tmp_path: Path
) -> None:
    role = f"limited_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as c:
        c.execute(f"CREATE ROLE {role} LOGIN")
    config_path = tmp_path / "config.yaml"
    config_path.write_text(
        "queries: [{name: q, group_by: [domain], epsilon: 1.0, delta: 1.0e-6}]\n",
        encoding="utf-8",
    )
    dsn = postgres_dsn.replace("user=postgres", f"user={role}")
    sink = Sink(load_config(config_path), dsn, bootstrap_servers="127.0.0.1:1")
    with pytest.raises(SinkError, match="needs CREATE on the database"):
        await asyncio.wait_for(sink.run(), timeout=60)
    assert not sink.health.ready()


async def test_an_unreachable_database_is_retried_until_stopped(tmp_path: Path) -> None:
    config_path = tmp_path / "config.yaml"
    config_path.write_text(
        "queries: [{name: q, group_by: [domain], epsilon: 1.0, delta: 1.0e-6}]\n",
        encoding="utf-8",
    )
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dsn = f"host=127.0.0.1 port={port} user=nobody dbname=x connect_timeout=2"
    sink = Sink(load_config(config_path), dsn, bootstrap_servers="127.0.0.1:1")
    task = asyncio.create_task(sink.run())
    deadline = asyncio.get_running_loop().time() + 60
    while sink.metrics.database_errors._value.get() < 2:
        assert not task.done(), task
        assert asyncio.get_running_loop().time() < deadline, "no retry seen"
        await asyncio.sleep(0.05)
    assert not sink.health.ready()
    sink.request_stop()
    await asyncio.wait_for(task, timeout=30)  # returns cleanly, no exception


async def test_a_quantile_release_is_stored_with_its_list(conn: Conn, postgres_dsn: str) -> None:
    """Migration 3: ``quantiles`` holds a quantile record's list (JSONB), in the table and
    in the complete view; storing it again is a duplicate, not a conflict."""
    records = window_records("lat", 0, ["a"])
    listed = [{"quantile": 0.5, "value": 40.0}, {"quantile": 0.9, "value": 90.0}]
    release = orjson.loads(records[0][1]) | {"statistic": "quantile", "value": listed}
    values = [orjson.dumps(release), records[-1][1]]
    first = await store_batch(conn, _batch(values))
    assert first.releases_inserted == 1 and len(first.completed) == 1
    again = await store_batch(conn, _batch(values, 5))
    assert again.duplicates == 2 and again.conflicts == 0
    with psycopg.connect(postgres_dsn) as c:
        view = c.execute(
            "SELECT statistic, value, quantiles FROM stream_dp.complete_releases"
        ).fetchall()
    assert view == [("quantile", 40.0, listed)]


async def test_a_quantile_row_has_no_interval_in_the_values_units(
    conn: Conn, postgres_dsn: str
) -> None:
    """A quantile's ci95 is in ranks (its record says ``ci95_unit: ranks``): the row's ci95
    and so its band ci95_low/ci95_high are NULL, in the table and the complete view, where a
    count's band is value ± ci95. Storing it again is a duplicate, not a conflict."""
    records = window_records("lat", 0, ["a", "b"])
    listed = [{"quantile": 0.5, "value": 40.0}, {"quantile": 0.9, "value": 90.0}]
    first_record = orjson.loads(records[0][1])
    quantile = first_record | {
        "statistic": "quantile", "value": listed, "mechanism": "exponential",
        "ci95_unit": "ranks", "ci95": 12.5,
    }  # fmt: skip
    values = [orjson.dumps(quantile), records[1][1], records[-1][1]]
    stored = await store_batch(conn, _batch(values))
    assert stored.releases_inserted == 2 and len(stored.completed) == 1
    again = await store_batch(conn, _batch(values, 5))
    assert again.duplicates == 3 and again.conflicts == 0
    count = orjson.loads(records[1][1])
    low, high = count["value"] - count["ci95"], count["value"] + count["ci95"]
    with psycopg.connect(postgres_dsn) as c:
        for source, rows in (
            (
                "table",
                c.execute(
                    "SELECT statistic, mechanism, ci95, ci95_low, ci95_high, noise_scale "
                    "FROM stream_dp.releases ORDER BY group_key"
                ),
            ),
            (
                "view",
                c.execute(
                    "SELECT statistic, mechanism, ci95, ci95_low, ci95_high, noise_scale "
                    "FROM stream_dp.complete_releases ORDER BY group_key"
                ),
            ),
        ):
            assert rows.fetchall() == [
                ("quantile", "exponential", None, None, None, quantile["noise_scale"]),
                (count["statistic"], count["mechanism"], count["ci95"], low, high,
                 count["noise_scale"]),
            ], source  # fmt: skip
