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

An existing topic's partition count and replication are never changed: a different partition
count cannot be fixed without breaking open windows (docs/limitations.md). Its topic configs
(``retention.ms``, ``cleanup.policy``, ... — the settings a definition owns) are:
``stream-dp topics apply`` sets them to the definition (AlterConfigs, keeping the topic's
other settings) — except on the input topic (the producers own it) and except a
``retention.ms`` longer than the definition's (never shortened: records someone may still
need would go); ``--dry-run`` and the worker's own start only report the differences.
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
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stream_dp.broker.connection_errors import (
    connection_reason,
    held_connection_errors,
    what_to_check,
)
from stream_dp.config import Config
from stream_dp.config.model import DERIVED_TOPICS
from stream_dp.errors import BrokerError, ConfigError
from stream_dp.kafka_client import AIOKafkaAdminClient, ConfigResource, ConfigResourceType, NewTopic
from stream_dp.kafka_client.client_options import client_kwargs
from stream_dp.kafka_client.errors import (
    IncompatibleBrokerVersion,
    KafkaError,
    TopicAlreadyExistsError,
    UnsupportedVersionError,
    for_code,
)

log = logging.getLogger(__name__)

#: CreateTopics' "use the broker's default" (KIP-464).
BROKER_DEFAULT_REPLICATION = -1
_PLACEHOLDER = re.compile(r"\{([A-Za-z_]\w*)\.([A-Za-z_]\w*)\}")
#: The name template of the partner exports' definition (one topic per export).
EXPORT_TOPIC = "{export.topic}"
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

    @property
    def per_export(self) -> bool:
        """Whether the definition is a partner export's (``{export.topic}``): one topic per
        entry of ``exports``, resolved by :func:`resolve_all`."""
        return self.name == EXPORT_TOPIC

    def wanted(self, config: Config) -> bool:
        """Whether ``config`` uses this topic (a partner export's: see :attr:`per_export`)."""
        if self.per_export:
            return False
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
    #: The definition's configs set on the existing topic (``alter``): ``key old -> new``.
    altered: tuple[str, ...] = ()


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
    if template == EXPORT_TOPIC:
        return
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
        if spec.per_export:  # one topic per partner export (names checked unique by Config)
            out.update((e.topic, _export_topic(spec, config, e.topic)) for e in config.exports)
            continue
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


def _export_topic(spec: TopicSpec, config: Config, name: str) -> Topic:
    """A partner export's topic (``exports[].topic``) from the exports' definition."""
    if not _VALID_TOPIC.fullmatch(name) or name in (".", ".."):
        raise ConfigError(
            f"exports[].topic = {name!r} is not a valid Kafka topic name; use 1-249 letters, "
            "digits, '.', '_' or '-'"
        )
    return Topic(
        name=name,
        spec=spec,
        replication_factor=config.kafka.replication_factor,
        config={k: _substitute(v, config) for k, v in spec.config.items()},
        partitions=spec.partitions,
    )


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


#: DescribeConfigs' config_source of a setting made on the topic itself (v1+).
DYNAMIC_TOPIC_CONFIG = 1


async def describe_topic_configs(
    admin: AIOKafkaAdminClient, names: list[str]
) -> tuple[dict[str, dict[str, str | None]], dict[str, dict[str, str]]]:
    """Per topic, (every described config, the configs set on the topic itself). All configs
    are asked for: the embedded broker closes the connection when asked for named ones."""
    responses = await admin.describe_configs(
        [ConfigResource(ConfigResourceType.TOPIC, name) for name in names]
    )
    actual: dict[str, dict[str, str | None]] = {}
    own: dict[str, dict[str, str]] = {}
    for response in responses:
        for resource in response.to_object()["resources"]:
            if resource["error_code"] != 0:
                continue
            entries = resource["config_entries"]
            name = resource["resource_name"]
            actual[name] = {e["config_names"]: e["config_value"] for e in entries}
            own[name] = {
                e["config_names"]: e["config_value"]
                for e in entries
                if e["config_value"] is not None
                and not e.get("read_only")
                and (
                    e["config_source"] == DYNAMIC_TOPIC_CONFIG
                    if "config_source" in e
                    else not e.get("is_default", True)
                )
            }
    return actual, own


def _config_differences(topic: Topic, actual: Mapping[str, str | None]) -> list[tuple[str, str]]:
    """(key, how it differs) for each of the definition's configs the topic does not have."""
    out = []
    for key, wanted in sorted(topic.config.items()):
        have = actual.get(key)
        if have != wanted:
            shown = "not set" if have is None else have
            out.append((key, f"{key} {shown}, definition {wanted}"))
    return out


def _longer(have_ms: str | None, wanted_ms: str) -> bool:
    """Whether a topic's retention.ms keeps records longer than the definition's (-1:
    forever): never shortened by ``apply`` — records someone may still need would go."""
    try:
        have, wanted = int(have_ms or ""), int(wanted_ms)
    except ValueError:
        return False
    return wanted != -1 and (have == -1 or have > wanted)


async def _alter_configs(
    admin: AIOKafkaAdminClient, topics: list[Topic], bootstrap: str
) -> dict[str, tuple[str, ...]]:
    """Set each existing topic's configs to its definition; returns what changed per topic.
    Not the input topic (the producers own it), and never a retention.ms that keeps records
    longer than the definition (both stay reported as differences). AlterConfigs replaces a
    topic's whole set of own settings, so the request carries the topic's other own settings
    (a setting made by hand stays) with the definition's."""
    if not topics:
        return {}
    topics = [t for t in topics if not t.spec.is_input]  # the producers' topic: reported only
    actual, own = await describe_topic_configs(admin, [t.name for t in topics])
    resources, changed = [], {}
    for topic in topics:
        if topic.name not in actual:
            continue  # not described: reported as a difference, nothing to base a change on
        differs = [
            (key, text)
            for key, text in _config_differences(topic, actual[topic.name])
            if not (
                key == "retention.ms" and _longer(actual[topic.name].get(key), topic.config[key])
            )
        ]
        if not differs:
            continue
        wanted = {
            **own.get(topic.name, {}),
            **{key: topic.config[key] for key, _ in differs},
        }
        resources.append(ConfigResource(ConfigResourceType.TOPIC, topic.name, configs=wanted))
        changed[topic.name] = tuple(
            f"{key} {actual[topic.name].get(key) or 'not set'} -> {topic.config[key]}"
            for key, _ in differs
        )
    if not resources:
        return {}
    try:
        responses = await admin.alter_configs(resources)
    except (IncompatibleBrokerVersion, UnsupportedVersionError) as exc:
        log.warning(
            "the broker does not take AlterConfigs (%s): the topics that differ from their "
            "definitions are reported and stay as they are",
            exc,
        )
        return {}
    failures = []
    for response in responses:
        for resource in response.to_object()["resources"]:
            if resource["error_code"] != 0:
                error = for_code(resource["error_code"])
                detail = resource.get("error_message") or error.description
                failures.append(f"{resource['resource_name']}: {error.message} ({detail})")
                changed.pop(resource["resource_name"], None)
    if failures:
        done = f" (set meanwhile: {', '.join(sorted(changed))})" if changed else ""
        raise BrokerError(
            f"setting topic configs on {bootstrap} failed: {'; '.join(failures)}{done}; grant "
            "the client ALTER_CONFIGS on the topics, or set them by hand (kafka-configs.sh)"
        )
    return changed


async def _differences(
    admin: AIOKafkaAdminClient, topics: list[Topic]
) -> dict[str, tuple[str, ...]]:
    """For each existing topic: how its partitions, replication and configs differ."""
    if not topics:
        return {}
    described = {t["topic"]: t for t in await admin.describe_topics([t.name for t in topics])}
    actual, _ = await describe_topic_configs(admin, [t.name for t in topics])
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
            found.extend(text for _, text in _config_differences(topic, actual[topic.name]))
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
    alter: bool = False,
    topics_dir: str | Path | Traversable | None = None,
) -> list[TopicState]:
    """Every wanted topic's state on the cluster: create the missing ones (unless ``create``
    is false: a dry run sends no CreateTopics at all — some brokers ignore its validate-only
    flag), with ``alter`` set the existing ones' configs to their definitions, and, with
    ``compare``, how the existing ones differ from their definitions (after any change)."""
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
        altered = await _alter_configs(admin, present, bootstrap) if alter else {}
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
    for name, changes in sorted(altered.items()):
        log.info("set the configs of topic %s: %s", name, "; ".join(changes))
    return [
        TopicState(
            topic=topic,
            present=name in existing,
            differences=differences.get(name, ()),
            created=name in created,
            altered=altered.get(name, ()),
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
