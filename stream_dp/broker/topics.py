"""Topic definitions (``topics/*.yaml``, package data ``stream_dp/topics``) and bringing a
cluster in line with them: create the missing topics, report the existing ones whose settings
differ.

Each YAML file defines one topic: its ``name`` as a template resolved against the Config
(``"{output.topic}"``), ``partitions``, the topic ``config`` (values may be templates too,
e.g. ``"{output.internal_retention_ms}"``; ``retention.ms`` is always explicit: some brokers
describe only explicitly set configs, and clients such as quixstreams rely on it), the JSON
Schema file of its records, a description and optionally ``requires``: a boolean setting
without which the topic is not wanted (``erasure.enabled``). The replication factor is the
config's ``kafka.replication_factor`` for every topic, or the broker's
``default.replication.factor`` when unset (CreateTopics with -1, KIP-464).

Existing topics are never changed: a different partition count cannot be fixed without
breaking open windows (docs/limitations.md), and a config change is the operator's decision.
``inspect`` reports the differences; ``stream-dp topics apply`` prints them.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import yaml
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError, TopicAlreadyExistsError, for_code
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stream_dp.broker.client_options import client_kwargs
from stream_dp.broker.connection_errors import (
    connection_reason,
    held_connection_errors,
    what_to_check,
)
from stream_dp.config import Config
from stream_dp.config.model import DERIVED_TOPICS
from stream_dp.errors import BrokerError, ConfigError

log = logging.getLogger(__name__)

#: CreateTopics' "use the broker's default" (KIP-464).
BROKER_DEFAULT_REPLICATION = -1
_PLACEHOLDER = re.compile(r"\{([A-Za-z_]\w*)\.([A-Za-z_]\w*)\}")
_VALID_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_HINTS = {
    "INVALID_REPLICATION_FACTOR": "set kafka.replication_factor to at most the broker count",
    "TOPIC_AUTHORIZATION_FAILED": "grant the client CREATE on the topic, or create it by hand",
    "CLUSTER_AUTHORIZATION_FAILED": "grant the client CREATE on the cluster, or create topics "
    "by hand",
    "INVALID_CONFIG": "fix the config entries in the topic's definition (topics/)",
    "POLICY_VIOLATION": "the cluster's topic policy refuses these settings; ask its operators",
}


@dataclass(frozen=True)
class TopicSpec:
    """One topic definition as read from ``topics/<file>.yaml``."""

    name: str  #: template, e.g. "{output.topic}"
    partitions: int
    config: Mapping[str, str]  #: values may be templates, e.g. "{output.internal_retention_ms}"
    schema: str  #: file name of the JSON Schema of its record values, in the same folder
    description: str
    source: str | None = field(default=None, compare=False)
    #: A boolean setting ("erasure.enabled") the topic is wanted only with; None: always.
    requires: str | None = None
    #: The config key that, when set, overrides ``partitions`` ("topics.partials_partitions").
    partitions_setting: str | None = None

    def wanted(self, config: Config) -> bool:
        """Whether ``config`` uses this topic."""
        if self.requires is None:
            return True
        section, _, key = self.requires.partition(".")
        return bool(getattr(getattr(config, section), key))

    @property
    def is_input(self) -> bool:
        """Whether the topic is the input topic (usually owned by the producers)."""
        return any(m.group(1) == "input" for m in _PLACEHOLDER.finditer(self.name))


@dataclass(frozen=True)
class Topic:
    """A definition resolved for one configuration: what the cluster should have."""

    name: str
    spec: TopicSpec
    replication_factor: int | None  #: None: the broker's default
    config: Mapping[str, str]
    partitions: int
    #: The config key that set ``partitions`` ("topics.output_partitions"); None: the
    #: definition's count.
    partitions_set_by: str | None = None

    def describe(self) -> str:
        replication = (
            "broker default" if self.replication_factor is None else str(self.replication_factor)
        )
        settings = ", ".join(f"{k}={v}" for k, v in sorted(self.config.items()))
        source = f" ({self.partitions_set_by})" if self.partitions_set_by else ""
        return (
            f"{self.partitions} partition{'s' if self.partitions != 1 else ''}{source}, "
            f"replication {replication}, {settings}"
        )


@dataclass(frozen=True)
class TopicState:
    """A wanted topic on the cluster: missing (created unless a dry run), or present with
    the differences between its settings and the definition (empty: it matches)."""

    topic: Topic
    present: bool
    differences: tuple[str, ...] = ()
    created: bool = False


class _TopicFile(BaseModel):
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True, populate_by_name=True)

    name: str = Field(min_length=1)
    partitions: int = Field(ge=1)
    config: dict[str, str]
    schema_file: str = Field(alias="schema", min_length=1)
    description: str = Field(min_length=1)
    requires: str | None = Field(None, pattern=r"^[a-z_]+\.[a-z_]+$")
    partitions_setting: str | None = Field(None, pattern=r"^[a-z_]+\.[a-z_]+$")


def default_topics_dir() -> Traversable:
    """The definitions shipped in the package (``stream_dp/topics``: in a source checkout a
    link to the top-level ``topics/``, in the wheel its files), wherever it is
    installed: read through importlib.resources."""
    return resources.files("stream_dp").joinpath("topics")


def _check_template(template: str, where: str, what: str) -> None:
    for match in _PLACEHOLDER.finditer(template):
        section, key = match.groups()
        owner = Config.model_fields.get(section)
        model = owner.annotation if owner is not None else None
        known = key in getattr(model, "model_fields", {}) or isinstance(
            getattr(model, key, None), property
        )
        if not known:
            raise ConfigError(
                f"{where}: {what} {template!r} refers to {section}.{key}, which is not a "
                "config setting; use e.g. {output.topic} or {input.topic}"
            )
    rest = _PLACEHOLDER.sub("", template)
    if "{" in rest or "}" in rest:
        raise ConfigError(
            f"{where}: {what} {template!r} has a malformed {{section.key}} placeholder"
        )


def _load_one(path: Traversable, folder: Traversable) -> TopicSpec:
    where = f"topic definition {path}"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        parsed = _TopicFile.model_validate(data)
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{where}: cannot read it: {exc}") from None
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}"
            for e in exc.errors()
        )
        raise ConfigError(
            f"{where}: {problems} (needed: name, partitions, config, schema, description; "
            "the replication factor comes from kafka.replication_factor)"
        ) from None
    _check_template(parsed.name, where, "name")
    if parsed.requires is not None:
        _check_template("{" + parsed.requires + "}", where, "requires")
    if parsed.partitions_setting is not None:
        _check_template("{" + parsed.partitions_setting + "}", where, "partitions_setting")
    for key, value in parsed.config.items():
        _check_template(value, where, f"config.{key}")
    if "retention.ms" not in parsed.config:
        raise ConfigError(
            f'{where}: set config.retention.ms explicitly ("-1" keeps records forever); '
            "brokers that describe only explicit configs need it"
        )
    if not folder.joinpath(parsed.schema_file).is_file():
        raise ConfigError(f"{where}: schema file {parsed.schema_file} is missing")
    return TopicSpec(
        name=parsed.name,
        partitions=parsed.partitions,
        config=dict(parsed.config),
        schema=parsed.schema_file,
        description=parsed.description.strip(),
        source=str(path),
        requires=parsed.requires,
        partitions_setting=parsed.partitions_setting,
    )


def load_topic_specs(topics_dir: str | Path | Traversable | None = None) -> list[TopicSpec]:
    """All topic definitions in ``topics_dir`` (default: the package's, see
    :func:`default_topics_dir`)."""
    if topics_dir is None:
        folder: Traversable = default_topics_dir()
    elif isinstance(topics_dir, str | Path):
        folder = Path(topics_dir)
    else:
        folder = topics_dir
    if not folder.is_dir():
        raise ConfigError(
            f"topic definitions folder {folder} not found; reinstall stream-dp (the wheel "
            "carries them in stream_dp/topics)"
        )
    files = sorted(
        (f for f in folder.iterdir() if f.name.endswith((".yaml", ".yml")) and f.is_file()),
        key=lambda f: f.name,
    )
    if not files:
        raise ConfigError(f"no topic definitions (*.yaml) in {folder}")
    return [_load_one(path, folder) for path in files]


def _substitute(template: str, config: Config) -> str:
    def value(match: re.Match[str]) -> str:
        section, key = match.groups()
        return str(getattr(getattr(config, section), key))

    return _PLACEHOLDER.sub(value, template)


def resolve(spec: TopicSpec, config: Config) -> str:
    """The topic name of ``spec`` for ``config``; ConfigError if it is not a valid name."""
    name = _substitute(spec.name, config)
    if not _VALID_TOPIC.fullmatch(name) or name in (".", ".."):
        setting = spec.name.strip("{}") if _PLACEHOLDER.fullmatch(spec.name) else spec.name
        section, _, key = setting.partition(".")
        derived = ""
        suffix = DERIVED_TOPICS.get(key) if section == "output" else None
        if suffix is not None and name == f"{config.kafka.group_id}.{suffix}":
            derived = (
                f" (by default it is named after kafka.group_id {config.kafka.group_id!r}: "
                f"set {setting} explicitly, or use a group id of such characters)"
            )
        raise ConfigError(
            f"{setting} = {name!r} is not a valid Kafka topic name; use 1-249 letters, "
            f"digits, '.', '_' or '-'{derived}"
        )
    return name


def resolve_topic(spec: TopicSpec, config: Config) -> Topic:
    """``spec`` for ``config``: name, replication factor, partitions and topic config
    resolved."""
    partitions, set_by = spec.partitions, None
    if spec.partitions_setting is not None:
        section, _, key = spec.partitions_setting.partition(".")
        configured = getattr(getattr(config, section), key)
        if configured is not None:
            partitions, set_by = int(configured), spec.partitions_setting
    return Topic(
        name=resolve(spec, config),
        spec=spec,
        replication_factor=config.kafka.replication_factor,
        config={k: _substitute(v, config) for k, v in spec.config.items()},
        partitions=partitions,
        partitions_set_by=set_by,
    )


def resolve_all(
    config: Config, specs: list[TopicSpec] | None = None, *, include_input: bool = True
) -> dict[str, Topic]:
    """Topic name → resolved topic, refusing two definitions that resolve to the same name.
    Topics the configuration does not use (``requires``) are left out."""
    out: dict[str, Topic] = {}
    for spec in specs if specs is not None else load_topic_specs():
        if (spec.is_input and not include_input) or not spec.wanted(config):
            continue
        topic = resolve_topic(spec, config)
        if topic.name in out:
            raise ConfigError(
                f"{out[topic.name].spec.name} and {spec.name} are both {topic.name!r}; every "
                "topic needs its own name (e.g. output.topic, output.dead_letter_topic, "
                "output.ledger_topic)"
            )
        out[topic.name] = topic
    return out


# -- the cluster ------------------------------------------------------------------------------
def _created(response: Any, bootstrap: str) -> list[str]:
    """Names created according to a CreateTopics response; BrokerError for any other error."""
    created, failures, retriable = [], [], True
    for entry in response.to_object()["topic_errors"]:
        code, name = entry["error_code"], entry["topic"]
        if code == 0:
            created.append(name)
        elif code != TopicAlreadyExistsError.errno:  # created concurrently: fine
            error = for_code(code)
            retriable = retriable and bool(error.retriable)
            hint = _HINTS.get(error.message, "")
            detail = entry.get("error_message") or error.description
            failures.append(f"{name}: {error.message} ({detail}){'; ' + hint if hint else ''}")
    if failures:
        done = f" (created meanwhile: {', '.join(created)})" if created else ""
        exc = BrokerError(f"creating topics on {bootstrap} failed: {'; '.join(failures)}{done}")
        exc.retriable = retriable
        raise exc
    return created


def _new_topic(topic: Topic) -> NewTopic:
    replication = topic.replication_factor
    new = NewTopic(topic.name, topic.partitions, replication or 1, topic_configs=dict(topic.config))
    if replication is None:
        # aiokafka's NewTopic refuses -1 without an explicit assignment, but the request may
        # carry it: brokers then apply default.replication.factor (KIP-464).
        new.replication_factor = BROKER_DEFAULT_REPLICATION
    return new


async def _differences(
    admin: AIOKafkaAdminClient, topics: list[Topic]
) -> dict[str, tuple[str, ...]]:
    """For each existing topic: how its partitions, replication and configs differ."""
    if not topics:
        return {}
    described = {t["topic"]: t for t in await admin.describe_topics([t.name for t in topics])}
    # All configs of each topic: the embedded broker closes the connection when asked for
    # named ones, and Apache Kafka answers both.
    responses = await admin.describe_configs(
        [ConfigResource(ConfigResourceType.TOPIC, t.name) for t in topics]
    )
    actual: dict[str, dict[str, str | None]] = {}
    for response in responses:
        for resource in response.to_object()["resources"]:
            if resource["error_code"] != 0:
                continue
            actual[resource["resource_name"]] = {
                e["config_names"]: e["config_value"] for e in resource["config_entries"]
            }
    out: dict[str, tuple[str, ...]] = {}
    for topic in topics:
        found: list[str] = []
        partitions = described.get(topic.name, {}).get("partitions") or []
        if partitions and len(partitions) != topic.partitions:
            found.append(f"partitions {len(partitions)}, definition {topic.partitions}")
        replicas = len(partitions[0]["replicas"]) if partitions else None
        if topic.replication_factor is not None and replicas not in (
            None,
            topic.replication_factor,
        ):
            found.append(
                f"replication {replicas}, kafka.replication_factor {topic.replication_factor}"
            )
        if topic.name not in actual:
            found.append("its configs could not be described (DescribeConfigs refused)")
        else:
            for key, wanted in sorted(topic.config.items()):
                have = actual[topic.name].get(key)
                if have != wanted:
                    shown = "not set" if have is None else have
                    found.append(f"{key} {shown}, definition {wanted}")
        out[topic.name] = tuple(found)
    return out


async def _refuse_partition_conflicts(admin: AIOKafkaAdminClient, topics: list[Topic]) -> None:
    """ConfigError when a configured partition count (``topics.*_partitions``) differs from
    an existing topic's: the count cannot change under open windows, and the worker would
    otherwise run on a shape the operator did not ask for."""
    configured = [t for t in topics if t.partitions_set_by is not None]
    if not configured:
        return
    described = {t["topic"]: t for t in await admin.describe_topics([t.name for t in configured])}
    conflicts = []
    for topic in configured:
        have = len(described.get(topic.name, {}).get("partitions") or [])
        if have and have != topic.partitions:
            conflicts.append(
                f"{topic.partitions_set_by} is {topic.partitions} but topic {topic.name} "
                f"already has {have} partitions: set {topic.partitions_set_by}: {have} (or "
                "remove it), or give the deployment new topics (a new kafka.group_id or "
                "output topic names) to start with the new count"
            )
    if conflicts:
        raise ConfigError(
            "; ".join(conflicts) + ". A topic's partition count is never changed in place: a "
            "window's records live on one partition (see Limitations)"
        )


async def inspect_topics(
    config: Config,
    bootstrap_servers: str | None = None,
    *,
    include_input: bool = True,
    create: bool = True,
    compare: bool = True,
    topics_dir: str | Path | Traversable | None = None,
) -> list[TopicState]:
    """Every wanted topic's state on the cluster: create the missing ones (unless ``create``
    is false: a dry run sends no CreateTopics at all — some brokers ignore its validate-only
    flag) and, with ``compare``, how the existing ones differ from their definitions."""
    wanted = resolve_all(config, load_topic_specs(topics_dir), include_input=include_input)
    kwargs = client_kwargs(config.kafka, bootstrap_servers=bootstrap_servers)
    bootstrap = kwargs["bootstrap_servers"]
    admin = AIOKafkaAdminClient(**kwargs)
    try:
        with held_connection_errors() as held:
            await admin.start()
        existing = set(await admin.list_topics())
        missing = [t for name, t in wanted.items() if name not in existing]
        # before creating anything: a refused configuration leaves the cluster as it was
        await _refuse_partition_conflicts(
            admin, [t for name, t in wanted.items() if name in existing]
        )
        created: set[str] = set()
        if create and missing:
            created = set(
                _created(await admin.create_topics([_new_topic(t) for t in missing]), bootstrap)
            )
        present = [t for name, t in wanted.items() if name in existing]
        differences = await _differences(admin, present) if compare else {}
    except (KafkaError, OSError) as exc:
        reason = connection_reason(held, exc)
        check = what_to_check(
            reason,
            "check kafka.bootstrap_servers (or --bootstrap-servers), that the broker is up, "
            "and the kafka security options",
        )
        raise BrokerError(f"cannot manage topics on {bootstrap}: {reason}; {check}") from None
    finally:
        await admin.close()
    for name in sorted(created):
        log.info("created topic %s (%s)", name, wanted[name].describe())
    return [
        TopicState(
            topic=topic,
            present=name in existing,
            differences=differences.get(name, ()),
            created=name in created,
        )
        for name, topic in wanted.items()
    ]


async def apply_topics(
    config: Config,
    bootstrap_servers: str | None = None,
    *,
    include_input: bool = True,
    topics_dir: str | Path | Traversable | None = None,
) -> list[str]:
    """Create the defined topics that the broker does not have yet; returns the names created
    (existing topics are left as they are: ``inspect_topics`` reports differences)."""
    states = await inspect_topics(
        config,
        bootstrap_servers,
        include_input=include_input,
        compare=False,
        topics_dir=topics_dir,
    )
    return [s.topic.name for s in states if s.created]
