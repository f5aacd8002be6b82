"""The Apache Kafka tier itself: one pinned version everywhere, a launcher that starts a real
KRaft broker, stops it and leaves nothing behind, and clear errors where it cannot run."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

from stream_dp.broker.apache_kafka import ApacheKafkaBroker, _cluster_id
from stream_dp.broker.apache_kafka_jars import APACHE_KAFKA_VERSION, fetch_jars
from stream_dp.broker.probe import probe_sync
from stream_dp.errors import BrokerError
from tests.apache_kafka.tier import apache_kafka_bootstrap_servers, apache_kafka_problem

ROOT = Path(__file__).resolve().parents[2]


def test_one_apache_kafka_version_in_the_launcher_the_pom_and_compose() -> None:
    pom = (ROOT / "ops" / "apache-kafka" / "pom.xml").read_text(encoding="utf-8")
    (pinned,) = re.findall(r"<kafka\.version>([^<]+)</kafka\.version>", pom)
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    assert pinned == APACHE_KAFKA_VERSION
    assert compose["services"]["kafka"]["image"] == f"apache/kafka:{APACHE_KAFKA_VERSION}"


def test_without_java_the_launcher_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no java, no mvn
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(BrokerError, match=r"needs Java 17\+ and none is on PATH.*apt-get"):
        ApacheKafkaBroker().start()


def test_missing_jars_without_maven_say_how_to_fetch_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BrokerError, match=r"make kafka-jars"):
        fetch_jars(tmp_path / "libs")


@pytest.mark.apache_kafka
def test_the_launcher_starts_a_broker_and_stops_it_leaving_nothing() -> None:
    problem = apache_kafka_problem()
    if problem is not None:
        pytest.skip(problem)
    broker = ApacheKafkaBroker().start()
    try:
        data_dir = broker._data_dir
        assert data_dir is not None and (data_dir / "log" / "meta.properties").is_file()
        (advertised,) = probe_sync("127.0.0.1", broker.port, 10.0)
        assert (advertised.host, advertised.port) == ("127.0.0.1", broker.port)
        pid = broker.pid
    finally:
        broker.stop()
    assert not broker.running and not data_dir.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the JVM is gone (signal 0 only checks that the process exists)
    broker.stop()  # idempotent


def test_without_java_or_docker_the_tier_skips_saying_how_to_enable_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no java, no mvn, no docker
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(pytest.skip.Exception) as skipped, apache_kafka_bootstrap_servers():
        pass
    reason = str(skipped.value)
    assert "no Java on PATH" in reason and "no docker CLI" in reason
    assert "apt-get install openjdk-17-jre-headless maven" in reason and "make kafka-jars" in reason


def test_a_cluster_id_never_starts_with_a_dash() -> None:
    """Kafka's storage tool took a cluster id such as "-Xb3…" (one in 64 of random ids) for an
    option. 2,000 ids: without the guard one starts with "-" except with probability
    (63/64)^2000 < 1e-13; with it, never."""
    ids = [_cluster_id() for _ in range(2000)]
    assert not [i for i in ids if i.startswith("-")]
    assert all(len(i) == 22 for i in ids) and len(set(ids)) == len(ids)
