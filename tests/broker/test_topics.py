"""Topic definitions in topics/ and creating them: `apply_topics`, `inspect_topics`
and `stream-dp topics apply [--dry-run]`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from stream_dp.broker import (
    apply_topics,
    default_topics_dir,
    inspect_topics,
    load_topic_specs,
    resolve,
    resolve_all,
)
from stream_dp.config import Config, load_config
from stream_dp.errors import ConfigError
from tests.helpers import TOPICS_DIR, ConfigFactory
from tests.integration.support import listed_topics

REPO = Path(__file__).resolve().parents[2]
SEVEN_DAYS_MS = str(7 * 24 * 3600 * 1000)
SIX_HOURS_MS = str(6 * 3600 * 1000)


def _config(config_factory: ConfigFactory, **output: str) -> Config:
    return load_config(config_factory({"output": output} if output else None))


def test_definitions_match_the_config(config_factory: ConfigFactory) -> None:
    config = _config(config_factory)
    by_name = {resolve(spec, config): spec for spec in load_topic_specs() if spec.wanted(config)}
    expected = {
        config.input.topic: (4, "delete", SEVEN_DAYS_MS, "event.schema.json"),
        config.output.topic: (3, "delete", SEVEN_DAYS_MS, "output.schema.json"),
        config.output.dead_letter_topic: (1, "delete", SEVEN_DAYS_MS, "dead_letter.schema.json"),
        config.output.ledger_topic: (3, "compact", "-1", "ledger.schema.json"),
        # internal: hours, not days (the test config's 10 s windows → the 6 h floor)
        config.output.partials_topic: (6, "delete", SIX_HOURS_MS, "partials.schema.json"),
        config.output.repartition_topic: (4, "delete", SIX_HOURS_MS, "repartition.schema.json"),
        # internal: the running totals' state; no cumulative query here → the 6 h as well
        config.output.continual_topic: (3, "delete", SIX_HOURS_MS, "continual.schema.json"),
        # internal: answered access requests (stream-dp access), kept for a year
        config.output.access_log_topic: (
            1,
            "delete",
            str(365 * 86_400 * 1000),
            "access_log.schema.json",
        ),
    }
    resolved = resolve_all(config)
    got = {
        name: (t.partitions, t.config["cleanup.policy"], t.config["retention.ms"], t.spec.schema)
        for name, t in resolved.items()
    }
    assert got == expected
    assert set(by_name) == set(expected)
    assert all(t.replication_factor is None and t.spec.description for t in resolved.values())
    assert [s.is_input for s in by_name.values()].count(True) == 1
    assert by_name[config.input.topic].is_input


def test_erasure_topics_exist_only_with_erasure_enabled(config_factory: ConfigFactory) -> None:
    off = load_config(config_factory())
    assert not any("erasure" in name for name in resolve_all(off))
    on = load_config(config_factory({"erasure": {"enabled": True}}))
    topics = resolve_all(on)
    group = on.kafka.group_id
    # the erasure log keeps erasures for erasure.retention_s: by default 7 days plus the
    # privacy horizon (24 windows of the test config's 10 s)
    retention_ms = str((7 * 86_400 + 24 * 10) * 1000)
    got = {
        name: (t.partitions, t.config["cleanup.policy"], t.config["retention.ms"], t.spec.schema)
        for name, t in topics.items()
        if "erasure" in name
    }
    assert got == {
        f"{group}.erasure-requests": (1, "delete", SEVEN_DAYS_MS, "erasure.schema.json"),
        f"{group}.erasures": (1, "compact,delete", retention_ms, "erasure_log.schema.json"),
        f"{group}.erasure-responses": (
            1,
            "delete",
            str(30 * 86_400 * 1000),
            "erasure_response.schema.json",
        ),
    }
    assert on.erasure.log_topic == f"{group}.erasures"


def test_definitions_are_package_data() -> None:
    # importlib.resources finds them inside the package, wherever it is installed.
    folder = default_topics_dir()
    assert folder.joinpath("ledger.yaml").is_file()
    assert Path(str(folder)).resolve() == TOPICS_DIR.resolve()  # the source tree's copy here
    # One copy in the tree: the top-level topics/ folder, which the package links to (the
    # sdist and the wheel resolve the link: tests/packaging/test_installed_wheel.py).
    assert (REPO / "topics").is_dir() and not (REPO / "topics").is_symlink()
    assert (REPO / "stream_dp" / "topics").is_symlink()
    assert TOPICS_DIR.resolve() == (REPO / "topics").resolve()


def test_replication_factor_and_retention_come_from_the_config(
    config_factory: ConfigFactory,
) -> None:
    config = load_config(
        config_factory(
            {
                "kafka": {"replication_factor": 3},
                "window": {"size_s": 86_400, "grace_s": 600, "idle_close_s": 60},
            }
        )
    )
    topics = resolve_all(config)
    assert {t.replication_factor for t in topics.values()} == {3}
    # daily windows: 3 × (86,400 + 600 + 60) s, above the 6 h floor
    internal = str(3 * (86_400 + 600 + 60) * 1000)
    assert topics[config.output.partials_topic].config["retention.ms"] == internal
    assert topics[config.output.repartition_topic].config["retention.ms"] == internal
    assert topics[config.output.ledger_topic].config["retention.ms"] == "-1"
    explicit = load_config(config_factory({"output": {"internal_retention_s": 7200}}))
    assert resolve_all(explicit)[explicit.output.partials_topic].config["retention.ms"] == (
        "7200000"
    )


def test_a_replication_factor_in_a_definition_is_refused(tmp_path: Path) -> None:
    broken = _broken_copy(
        tmp_path, "ledger.yaml", "partitions: 3", "partitions: 3\nreplication_factor: 3"
    )
    with pytest.raises(ConfigError, match=r"comes from kafka\.replication_factor"):
        load_topic_specs(broken)


def _broken_copy(tmp_path: Path, file: str, old: str, new: str) -> Path:
    copy = tmp_path / "topics"
    shutil.copytree(TOPICS_DIR, copy)
    path = copy / file
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    return copy


@pytest.mark.parametrize(
    ("file", "old", "new", "message"),
    [
        ("ledger.yaml", '  retention.ms: "-1"', "", "set config.retention.ms explicitly"),
        ("ledger.yaml", "{output.ledger_topic}", "{output.ledger}", "not a config setting"),
        ("ledger.yaml", "partitions: 3", "partitions: 0", "partitions"),
        ("ledger.yaml", "partitions: 3", "partitions: 3\nretention: 1", "retention"),
        ("ledger.yaml", "schema: ledger.schema.json", "schema: nope.json", "nope.json is missing"),
        ("events.yaml", "{input.topic}", "{input.topic", "malformed"),
        (
            "partials.yaml",
            "{output.internal_retention_ms}",
            "{output.retention_ms}",
            "config.retention.ms .* not a config setting",
        ),
    ],
)
def test_broken_definitions_are_config_errors(
    tmp_path: Path, file: str, old: str, new: str, message: str
) -> None:
    broken = _broken_copy(tmp_path, file, old, new)
    with pytest.raises(ConfigError, match=message) as info:
        load_topic_specs(broken)
    assert file in str(info.value)


@pytest.mark.parametrize(
    "overrides",
    [
        {"output": {"topic": "same", "ledger_topic": "same"}},
        {"output": {"partials_topic": "same", "ledger_topic": "same"}},
        {"output": {"repartition_topic": "same"}, "input": {"topic": "same"}},
    ],
    ids=["releases-ledger", "partials-ledger", "repartition-input"],
)
def test_two_definitions_with_one_name_are_refused(
    config_factory: ConfigFactory, overrides: dict[str, dict[str, str]]
) -> None:
    config = load_config(config_factory(overrides))
    with pytest.raises(ConfigError, match="'same'"):
        resolve_all(config)


@pytest.mark.parametrize("setting", ["dead_letter_topic", "partials_topic", "repartition_topic"])
def test_invalid_topic_name_names_the_setting(config_factory: ConfigFactory, setting: str) -> None:
    config = _config(config_factory, **{setting: "bad name"})
    with pytest.raises(ConfigError, match=rf"output.{setting} = 'bad name'"):
        resolve_all(config)


def test_a_group_id_unfit_for_topic_names_says_what_to_set(config_factory: ConfigFactory) -> None:
    path = config_factory({"kafka": {"group_id": "team a"}, "output": {"ledger_topic": None}})
    config = load_config(path)
    assert config.output.ledger_topic == "team a.ledger"
    with pytest.raises(ConfigError, match=r"output.ledger_topic = 'team a.ledger'.*kafka.group_id"):
        resolve_all(config)


async def _topic_configs(bootstrap: str, topic: str) -> dict[str, str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        [response] = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    finally:
        await admin.close()
    [resource] = response.to_object()["resources"]
    assert resource["error_code"] == 0, resource
    return {e["config_names"]: e["config_value"] for e in resource["config_entries"]}


async def _partitions(bootstrap: str, topics: list[str]) -> dict[str, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics(topics)
    finally:
        await admin.close()
    return {t["topic"]: len(t["partitions"]) for t in described}


async def test_apply_topics_creates_only_missing_ones(
    config_factory: ConfigFactory, kafka_bootstrap: str
) -> None:
    config = _config(config_factory)
    created = await apply_topics(config, include_input=False)
    assert sorted(created) == sorted(
        [
            config.output.topic,
            config.output.dead_letter_topic,
            config.output.ledger_topic,
            config.output.partials_topic,
            config.output.repartition_topic,
            config.output.continual_topic,
            config.output.access_log_topic,
        ]
    )
    assert await apply_topics(config) == [config.input.topic]
    assert await apply_topics(config) == []
    ledger = await _topic_configs(kafka_bootstrap, config.output.ledger_topic)
    assert ledger == {"cleanup.policy": "compact", "retention.ms": "-1"}


def _stream_dp(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stream_dp.cli.main", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ.copy(),
    )


async def test_cli_apply_twice(config_factory: ConfigFactory, kafka_bootstrap: str) -> None:
    path = config_factory()
    config = load_config(path)
    names = [
        config.input.topic,
        config.output.topic,
        config.output.dead_letter_topic,
        config.output.ledger_topic,
        config.output.partials_topic,
        config.output.repartition_topic,
        config.output.continual_topic,
        config.output.access_log_topic,
    ]

    first = _stream_dp("topics", "apply", "--config", str(path))
    assert first.returncode == 0, first.stderr
    assert sorted(line.split()[1] for line in first.stdout.splitlines() if "created:" in line) == (
        sorted(names)
    )
    assert "8 created, 0 already present" in first.stdout

    second = _stream_dp("topics", "apply", "--config", str(path))
    assert second.returncode == 0, second.stderr
    assert "created:" not in second.stdout
    assert sorted(
        line.removeprefix("already present: ")
        for line in second.stdout.splitlines()
        if line.startswith("already present: ")
    ) == sorted(names)

    assert await _partitions(kafka_bootstrap, names) == dict(
        zip(names, [4, 3, 1, 3, 6, 4, 3, 1], strict=True)
    )
    ledger = await _topic_configs(kafka_bootstrap, config.output.ledger_topic)
    assert ledger["cleanup.policy"] == "compact"
    releases = await _topic_configs(kafka_bootstrap, config.output.topic)
    assert releases == {"cleanup.policy": "delete", "retention.ms": SEVEN_DAYS_MS}
    partials = await _topic_configs(kafka_bootstrap, config.output.partials_topic)
    assert partials == {"cleanup.policy": "delete", "retention.ms": SIX_HOURS_MS}


async def test_cli_dry_run_changes_nothing(
    config_factory: ConfigFactory, kafka_bootstrap: str
) -> None:
    path = config_factory()
    config = load_config(path)
    before = await listed_topics(kafka_bootstrap)
    result = _stream_dp("topics", "apply", "--config", str(path), "--dry-run")
    assert result.returncode == 0, result.stderr
    would = [line for line in result.stdout.splitlines() if line.startswith("would create: ")]
    assert len(would) == 8
    assert (
        f"would create: {config.output.partials_topic} (6 partitions, replication broker "
        f"default, cleanup.policy=delete, retention.ms={SIX_HOURS_MS})"
    ) in would
    assert "dry run: 8 would be created, 0 already present" in result.stdout
    assert await listed_topics(kafka_bootstrap) == before  # not one topic created


async def test_apply_reports_existing_topics_that_differ(
    config_factory: ConfigFactory, kafka_bootstrap: str
) -> None:
    path = config_factory()
    config = load_config(path)
    partials = config.output.partials_topic
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:  # an older deployment's partials topic: 2 partitions, kept for 7 days
        await admin.create_topics(
            [NewTopic(partials, 2, 1, topic_configs={"retention.ms": SEVEN_DAYS_MS})]
        )
    finally:
        await admin.close()

    states = {s.topic.name: s for s in await inspect_topics(config, create=False)}
    assert states[partials].present and not states[partials].created
    assert states[partials].differences == (
        "partitions 2, definition 6",
        "cleanup.policy not set, definition delete",
        f"retention.ms {SEVEN_DAYS_MS}, definition {SIX_HOURS_MS}",
    )
    assert not any(s.present for name, s in states.items() if name != partials)

    result = _stream_dp("topics", "apply", "--config", str(path))
    assert result.returncode == 0, result.stderr
    assert (
        f"differs: {partials}: partitions 2, definition 6; cleanup.policy not set, definition "
        f"delete; retention.ms {SEVEN_DAYS_MS}, definition {SIX_HOURS_MS}"
    ) in result.stdout
    assert "7 created, 1 already present" in result.stdout
    assert "1 differs from the definitions and stay as they are" in result.stdout
    # left as it was
    assert (await _partitions(kafka_bootstrap, [partials]))[partials] == 2
    assert (await _topic_configs(kafka_bootstrap, partials))["retention.ms"] == SEVEN_DAYS_MS

    again = _stream_dp("topics", "apply", "--config", str(path))
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("already present: ") == 7
    assert "0 created, 8 already present" in again.stdout


async def test_configured_partition_counts_are_the_created_ones(
    config_factory: ConfigFactory, kafka_bootstrap: str
) -> None:
    counts = {"output_partitions": 5, "partials_partitions": 2, "repartition_partitions": 7}
    path = config_factory({"topics": counts})
    config = load_config(path)
    listed = _stream_dp("topics", "list", "--config", str(path))
    assert (
        f"{config.output.partials_topic}: 2 partitions (topics.partials_partitions), "
        in listed.stdout
    ), listed.stderr
    result = _stream_dp("topics", "apply", "--config", str(path))
    assert result.returncode == 0, result.stderr
    names = [
        config.output.topic,
        config.output.partials_topic,
        config.output.repartition_topic,
        config.output.ledger_topic,  # unset: the definition's 3
    ]
    assert await _partitions(kafka_bootstrap, names) == dict(zip(names, [5, 2, 7, 3], strict=True))
    again = _stream_dp("topics", "apply", "--config", str(path))  # the same counts: fine
    assert again.returncode == 0, again.stderr
    assert "0 created, 8 already present" in again.stdout


async def test_a_configured_count_unlike_the_existing_topic_is_refused(
    config_factory: ConfigFactory, kafka_bootstrap: str
) -> None:
    path = config_factory({"topics": {"partials_partitions": 8}})
    config = load_config(path)
    partials = config.output.partials_topic
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:  # an earlier deployment's partials topic with 2 partitions
        await admin.create_topics(
            [NewTopic(partials, 2, 1, topic_configs={"retention.ms": SIX_HOURS_MS})]
        )
    finally:
        await admin.close()
    before = await listed_topics(kafka_bootstrap)

    result = _stream_dp("topics", "apply", "--config", str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert (
        f"topics.partials_partitions is 8 but topic {partials} already has 2 partitions: set "
        "topics.partials_partitions: 2 (or remove it)"
    ) in result.stderr
    for dry in (True, False):  # the worker's own creation (run_worker) is apply_topics
        with pytest.raises(ConfigError, match=r"topics\.partials_partitions is 8"):
            await inspect_topics(config, create=not dry)
    with pytest.raises(ConfigError, match=r"topics\.partials_partitions is 8"):
        await apply_topics(config)
    assert await listed_topics(kafka_bootstrap) == before  # refused before creating anything
    assert (await _partitions(kafka_bootstrap, [partials]))[partials] == 2

    worker = subprocess.run(  # the worker's own creation refuses it too, before starting
        [sys.executable, "-m", "stream_dp.cli.main", "run", "--config", str(path)],
        cwd=REPO, capture_output=True, text=True, timeout=120, env=os.environ.copy(),
    )  # fmt: skip
    assert worker.returncode == 2, worker.stdout + worker.stderr
    assert "topics.partials_partitions is 8" in worker.stderr
    assert await listed_topics(kafka_bootstrap) == before

    fixed = config_factory({"topics": {"partials_partitions": 2}})
    assert _stream_dp("topics", "apply", "--config", str(fixed)).returncode == 0


def test_config_partition_defaults_are_the_definitions() -> None:
    # The defaults the configuration reference states are the definitions' counts.
    by_setting = {s.partitions_setting: s.partitions for s in load_topic_specs()}
    fields = Config.model_fields["topics"].annotation.model_fields  # type: ignore[union-attr]
    assert {f"topics.{k}" for k in fields} == {k for k in by_setting if k is not None}
    for key, field in fields.items():
        assert f"unset: {by_setting[f'topics.{key}']}." in str(field.description), key


def test_cli_apply_refuses_embedded(config_factory: ConfigFactory) -> None:
    path = config_factory({"kafka": {"bootstrap_servers": "embedded"}})
    result = _stream_dp("topics", "apply", "--config", str(path))
    assert result.returncode == 2
    assert "no persistent broker to apply topics to" in result.stderr


def test_cli_apply_config_errors_exit_2(tmp_path: Path) -> None:
    result = _stream_dp("topics", "apply", "--config", str(tmp_path / "missing.yaml"))
    assert result.returncode == 2
    assert "not found" in result.stderr


def test_cli_apply_unreachable_broker_exits_1(config_factory: ConfigFactory) -> None:
    path = config_factory({"kafka": {"bootstrap_servers": "127.0.0.1:1"}})
    result = _stream_dp("topics", "apply", "--config", str(path))
    assert result.returncode == 1
    assert "cannot manage topics on 127.0.0.1:1" in result.stderr


def test_cli_list_works_offline(config_factory: ConfigFactory) -> None:
    path = config_factory({"kafka": {"bootstrap_servers": "embedded"}})
    config = load_config(path)
    result = _stream_dp("topics", "list", "--config", str(path))
    assert result.returncode == 0, result.stderr
    assert f"{config.output.ledger_topic}: 3 partitions" in result.stdout
    assert f"{config.output.partials_topic}: 6 partitions" in result.stdout
    assert f"{config.output.repartition_topic}: 4 partitions" in result.stdout
    assert "cleanup.policy=compact" in result.stdout
    assert f"retention.ms={SIX_HOURS_MS}; records: partials.schema.json" in result.stdout


def test_config_factory_merges_overrides(config_factory: ConfigFactory) -> None:
    first, second = config_factory(), config_factory({"window": {"size_s": 60}, "queries": []})
    data = yaml.safe_load(second.read_text())
    assert data["window"] == {
        "size_s": 60,
        "grace_s": 1,
        "idle_close_s": 2,
        "start_at": "2020-08-01T00:00:00Z",
    }
    assert data["queries"] == []  # lists are replaced, not merged
    one, two = load_config(first), yaml.safe_load(first.read_text())
    assert two["output"]["topic"] != data["output"]["topic"]  # fresh names per config
    assert one.kafka.session_timeout_ms == 2000 and one.metrics.port == 0
    assert len(os.environ["STREAM_DP_PSEUDONYM_KEY"]) == 64
