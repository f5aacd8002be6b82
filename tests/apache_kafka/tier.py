"""The Apache Kafka test tier: which broker a test runs on, and how the real one is started.

Tests that should hold on both brokers take the ``kafka_bootstrap`` fixture (directly or
through ``config_factory`` / ``topic_factory``) and carry :data:`ON_BOTH_BROKERS`; tests of
Apache Kafka's own behaviour (compaction, the idempotent producer) carry
:data:`ON_APACHE_KAFKA`. Either way the Apache Kafka cases get the ``apache_kafka`` marker
(``make test-kafka`` runs them alone) and share one broker per pytest process (session scope).

The broker is :class:`stream_dp.broker.apache_kafka.ApacheKafkaBroker` (Java 17+, jars from
Maven Central via ``make kafka-jars``). Where Java is missing but a Docker engine answers,
testcontainers starts the ``apache/kafka`` image of the same version instead. Where neither
is there, the cases skip with a reason saying how to enable them.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from stream_dp.broker.apache_kafka import TEST_BROKER_CONFIG, ApacheKafkaBroker
from stream_dp.broker.apache_kafka_jars import (
    APACHE_KAFKA_VERSION,
    default_libs_dir,
    jars_present,
    java_executable,
)

TANSU = "tansu"
APACHE_KAFKA = "apache_kafka"
#: Run the test on the embedded broker and on Apache Kafka (ids ``[tansu]``, ``[apache_kafka]``).
ON_BOTH_BROKERS = pytest.mark.parametrize(
    "kafka_bootstrap",
    [pytest.param(TANSU), pytest.param(APACHE_KAFKA, marks=pytest.mark.apache_kafka)],
    indirect=True,
)
#: Run the test on Apache Kafka only (behaviour the embedded broker does not have).
ON_APACHE_KAFKA = pytest.mark.parametrize(
    "kafka_bootstrap", [pytest.param(APACHE_KAFKA, marks=pytest.mark.apache_kafka)], indirect=True
)
HOW_TO_ENABLE = (
    "install Java 17+ and Maven (Debian: apt-get install openjdk-17-jre-headless maven) and "
    "run `make kafka-jars`, or run a Docker engine"
)


def broker_of(request: pytest.FixtureRequest) -> str:
    """The broker the requesting test runs on: ``"tansu"`` or ``"apache_kafka"``."""
    callspec = getattr(request.node, "callspec", None)
    return str(callspec.params.get("kafka_bootstrap", TANSU)) if callspec else TANSU


def _jvm_problem() -> str | None:
    if java_executable() is None:
        return "no Java on PATH (nor JAVA_HOME)"
    if not jars_present(default_libs_dir()) and shutil.which("mvn") is None:
        return f"the Apache Kafka jars are not in {default_libs_dir()} and no mvn fetches them"
    return None


def _docker_problem() -> str | None:
    if shutil.which("docker") is None:
        return "no docker CLI on PATH"
    probe = subprocess.run(
        ["docker", "info", "--format", "{{.ServerVersion}}"],
        capture_output=True, text=True, timeout=20, check=False,
    )  # fmt: skip
    if probe.returncode != 0:
        return "no Docker engine answers `docker info`"
    return None


@contextmanager
def _container() -> Iterator[str]:  # pragma: no cover - needs a Docker engine
    from testcontainers.community.kafka import KafkaContainer

    container = KafkaContainer(f"apache/kafka:{APACHE_KAFKA_VERSION}").with_kraft()
    for key, value in TEST_BROKER_CONFIG.items():
        container = container.with_env("KAFKA_" + key.upper().replace(".", "_"), value)
    with container as kafka:
        yield str(kafka.get_bootstrap_server())


def apache_kafka_problem() -> str | None:
    """Why the launcher cannot start Apache Kafka here (a skip reason), or None."""
    problem = _jvm_problem()
    if problem is None:
        return None
    return f"Apache Kafka tier skipped: {problem}; to enable it, {HOW_TO_ENABLE}"


@contextmanager
def apache_kafka_bootstrap_servers() -> Iterator[str]:
    """A running Apache Kafka broker's bootstrap address; pytest.skip when none can run."""
    jvm_problem = _jvm_problem()
    if jvm_problem is None:
        with ApacheKafkaBroker() as broker:
            yield broker.bootstrap_servers
        return
    docker_problem = _docker_problem()
    if docker_problem is not None:
        pytest.skip(
            f"Apache Kafka tier skipped: {jvm_problem}, and {docker_problem}; to enable it, "
            f"{HOW_TO_ENABLE}"
        )
    with _container() as bootstrap:
        yield bootstrap
