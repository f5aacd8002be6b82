"""The ledger, the erasure log and the cumulative state are checked on the broker at start: a
topic that would delete records earlier than its definition allows is refused, with the
command that fixes it."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from stream_dp.broker.durability import (
    durable_topics,
    hold_problem,
    internal_topics,
    retention_problem,
)
from stream_dp.broker.topics import Topic
from stream_dp.config import Config, load_config
from tests.apache_kafka.tier import ON_APACHE_KAFKA
from tests.helpers import ConfigFactory, wait_until
from tests.integration.support import HANG_GUARD_S, start_worker, topics_of

#: What Apache Kafka describes for a topic created without settings (its defaults).
KAFKA_DEFAULTS = {"cleanup.policy": "delete", "retention.ms": "604800000", "retention.bytes": "-1"}


def _topics(config: Config) -> dict[str, Topic]:
    return {t.spec.name: t for t in durable_topics(config)}


@pytest.fixture
def with_erasure(config_factory: ConfigFactory) -> Config:
    return load_config(config_factory({"erasure": {"enabled": True}}))


def test_the_ledger_erasure_log_and_not_the_rest_are_checked(
    config_factory: ConfigFactory, with_erasure: Config
) -> None:
    assert set(_topics(load_config(config_factory()))) == {"{output.ledger_topic}"}
    assert set(_topics(with_erasure)) == {"{output.ledger_topic}", "{erasure.log_topic}"}


def test_a_ledger_with_the_brokers_default_retention_is_refused_with_the_fix(
    config_factory: ConfigFactory,
) -> None:
    ledger = _topics(load_config(config_factory()))["{output.ledger_topic}"]
    problem = retention_problem(ledger, KAFKA_DEFAULTS)
    assert problem is not None
    assert f"topic {ledger.name} has cleanup.policy=delete" in problem
    assert "retention.ms=604800000 deletes records after 604800000 ms (never wanted)" in problem
    assert "drawn again" in problem
    assert (
        f"--entity-name {ledger.name} --add-config cleanup.policy=compact,retention.ms=-1"
        in problem
    )


@pytest.mark.parametrize(
    "actual",
    [
        {"cleanup.policy": "compact", "retention.ms": "-1"},
        {"cleanup.policy": "compact", "retention.ms": "3600000"},  # compaction deletes nothing
        {"cleanup.policy": "compact,delete", "retention.ms": "-1", "retention.bytes": "-1"},
        {},  # not described (the embedded broker describes only settings given at creation)
    ],
)
def test_a_ledger_the_broker_never_deletes_from_is_accepted(
    config_factory: ConfigFactory, actual: dict[str, str]
) -> None:
    ledger = _topics(load_config(config_factory()))["{output.ledger_topic}"]
    assert retention_problem(ledger, actual) is None


def test_the_erasure_log_may_not_be_kept_shorter_nor_capped_by_size(with_erasure: Config) -> None:
    log_topic = _topics(with_erasure)["{erasure.log_topic}"]
    wanted_ms = int(log_topic.config["retention.ms"])
    as_defined = {"cleanup.policy": "compact,delete", "retention.ms": str(wanted_ms)}
    assert retention_problem(log_topic, as_defined) is None
    assert retention_problem(log_topic, {**as_defined, "retention.ms": "-1"}) is None
    shorter = retention_problem(log_topic, {**as_defined, "retention.ms": str(wanted_ms - 1)})
    assert shorter is not None and f"not before {wanted_ms} ms wanted" in shorter
    assert "cleanup.policy=[compact,delete]" in shorter  # the value kafka-configs.sh takes
    capped = retention_problem(log_topic, {**as_defined, "retention.bytes": "1073741824"})
    assert capped is not None and "--delete-config retention.bytes" in capped


@ON_APACHE_KAFKA
async def test_a_worker_refuses_a_ledger_topic_created_with_the_brokers_defaults(
    kafka_bootstrap: str, config_factory: ConfigFactory, tmp_path: Path
) -> None:
    """A platform (or a person) created the ledger topic without settings: Apache Kafka
    deletes its records after 7 days. The worker asks the broker and refuses to start."""
    cfg = config_factory()
    ledger = topics_of(cfg)["ledger"]
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(ledger, 3, 1)])
    finally:
        await admin.close()
    worker = start_worker(cfg, tmp_path / "worker.log")
    try:
        wait_until(
            lambda: worker.proc.poll() is not None or "partitions taken" in worker.log(),
            HANG_GUARD_S,
            "the worker to exit or to take partitions",
        )
    finally:
        if worker.proc.poll() is None:
            worker.terminate()
    assert worker.proc.returncode not in (0, None), worker.log()
    assert f"topic {ledger} has cleanup.policy=delete" in worker.log(), worker.log()
    assert "partitions taken" not in worker.log()


# -- the internal topics against the maximum hold (issue 39, item 5) ----------------------------


def _internal(config: Config) -> dict[str, Topic]:
    return {t.spec.name: t for t in internal_topics(config)}


def _hold_problem(topic: Topic, actual: dict[str, str], hold_s: int = 300) -> str | None:
    return hold_problem(topic, actual, max_hold_s=hold_s, internal_retention_s=600)


def test_the_internal_topics_are_the_partials_and_the_repartition_unless_keyed(
    config_factory: ConfigFactory,
) -> None:
    both = {"{output.partials_topic}", "{output.repartition_topic}"}
    assert set(_internal(load_config(config_factory()))) == both
    keyed = load_config(config_factory({"input": {"keyed_by_user": True}}))
    assert set(_internal(keyed)) == {"{output.partials_topic}"}


def test_an_internal_topic_kept_shorter_than_the_maximum_hold_is_refused_with_the_fix(
    config_factory: ConfigFactory,
) -> None:
    config = load_config(
        config_factory({"output": {"internal_retention_s": 600, "max_hold_s": 300}})
    )
    partials = _internal(config)["{output.partials_topic}"]
    problem = _hold_problem(partials, {"cleanup.policy": "delete", "retention.ms": "60000"})
    assert problem == (
        f"topic {partials.name} keeps records for retention.ms=60000 (60 s), less than "
        "output.max_hold_s = 300 s plus 10 s: the broker would delete records of a held "
        "window before the worker stops on it, and that window could never be released. Its "
        "definition says retention.ms=600000 (output.internal_retention_s): run `stream-dp "
        "topics apply` with this config to set it (or kafka-configs.sh --alter --entity-type "
        f"topics --entity-name {partials.name} --add-config retention.ms=600000), or lower "
        "output.max_hold_s"
    )
    # Just enough (the hold plus the margin), forever, compaction only, not described: fine.
    for actual in (
        {"cleanup.policy": "delete", "retention.ms": "310000"},
        {"cleanup.policy": "delete", "retention.ms": "-1"},
        {"cleanup.policy": "compact", "retention.ms": "60000"},
        {},
    ):
        assert _hold_problem(partials, actual) is None, actual
    assert _hold_problem(partials, {"retention.ms": "309999"}) is not None


def test_the_configured_retention_itself_always_passes(config_factory: ConfigFactory) -> None:
    """The configuration allows a hold up to a second below the retention: the topics as
    stream-dp creates them are never refused, whatever the margin."""
    config = load_config(config_factory({"output": {"internal_retention_s": 60, "max_hold_s": 59}}))
    repartition = _internal(config)["{output.repartition_topic}"]
    actual = {"cleanup.policy": "delete", "retention.ms": "60000"}
    assert hold_problem(repartition, actual, max_hold_s=59, internal_retention_s=60) is None
    assert (
        hold_problem(repartition, {"retention.ms": "59999"}, max_hold_s=59, internal_retention_s=60)
        is not None
    )
