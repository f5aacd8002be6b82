"""Topic definitions (``topics/*.yaml``) and creating the missing ones on a broker.

Each YAML file defines one topic: its ``name`` as a template resolved against the Config
(``"{output.topic}"``), ``partitions``, ``replication_factor`` (env
``STREAM_DP_TOPIC_REPLICATION_FACTOR`` overrides it for production clusters), the topic
``config`` (``retention.ms`` is always explicit: some brokers describe only explicitly set
configs, and clients such as quixstreams rely on it), the JSON Schema file of its records
and a description.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError, for_code
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stream_dp.broker.client_options import client_kwargs
from stream_dp.config import Config
from stream_dp.errors import BrokerError, ConfigError

log = logging.getLogger(__name__)

TOPICS_DIR_ENV = "STREAM_DP_TOPICS_DIR"
REPLICATION_FACTOR_ENV = "STREAM_DP_TOPIC_REPLICATION_FACTOR"
_PLACEHOLDER = re.compile(r"\{([A-Za-z_]\w*)\.([A-Za-z_]\w*)\}")
_VALID_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_HINTS = {
    "INVALID_REPLICATION_FACTOR": f"set {REPLICATION_FACTOR_ENV} to at most the broker count",
    "TOPIC_AUTHORIZATION_FAILED": "grant the client CREATE on the topic, or create it by hand",
    "CLUSTER_AUTHORIZATION_FAILED": "grant the client CREATE on the cluster, or create topics "
    "by hand",
    "INVALID_CONFIG": "fix the config entries in the topic's file under topics/",
    "POLICY_VIOLATION": "the cluster's topic policy refuses these settings; ask its operators",
}


@dataclass(frozen=True)
class TopicSpec:
    """One topic definition as read from ``topics/<file>.yaml``."""

    name: str  #: template, e.g. "{output.topic}"
    partitions: int
    config: Mapping[str, str]
    schema: str  #: file name of the JSON Schema of its record values, in the same folder
    description: str
    replication_factor: int = 1
    source: Path | None = field(default=None, compare=False)

    @property
    def is_input(self) -> bool:
        """Whether the topic is the input topic (usually owned by the producers)."""
        return any(m.group(1) == "input" for m in _PLACEHOLDER.finditer(self.name))


class _TopicFile(BaseModel):
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True, populate_by_name=True)

    name: str = Field(min_length=1)
    partitions: int = Field(ge=1)
    replication_factor: int = Field(1, ge=1)
    config: dict[str, str]
    schema_file: str = Field(alias="schema", min_length=1)
    description: str = Field(min_length=1)


def default_topics_dir() -> Path:
    """``$STREAM_DP_TOPICS_DIR``, else ``topics/`` at the root of the source checkout."""
    env = os.environ.get(TOPICS_DIR_ENV)
    return Path(env) if env else Path(__file__).resolve().parents[2] / "topics"


def _check_template(template: str, where: str) -> None:
    for match in _PLACEHOLDER.finditer(template):
        section, key = match.groups()
        owner = Config.model_fields.get(section)
        model = owner.annotation if owner is not None else None
        fields = getattr(model, "model_fields", {})
        if key not in fields:
            raise ConfigError(
                f"{where}: name {template!r} refers to {section}.{key}, which is not a "
                "config setting; use e.g. {output.topic} or {input.topic}"
            )
    if "{" in _PLACEHOLDER.sub("", template) or "}" in _PLACEHOLDER.sub("", template):
        raise ConfigError(f"{where}: name {template!r} has a malformed {{section.key}} placeholder")


def _replication_factor_override() -> int | None:
    raw = os.environ.get(REPLICATION_FACTOR_ENV)
    if raw is None or not raw.strip():
        return None
    if not raw.strip().isdigit() or int(raw) < 1:
        raise ConfigError(f"{REPLICATION_FACTOR_ENV}={raw!r}: use a whole number ≥ 1, e.g. 3")
    return int(raw)


def _load_one(path: Path, override_rf: int | None) -> TopicSpec:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        parsed = _TopicFile.model_validate(data)
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"topic definition {path}: cannot read it: {exc}") from None
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}"
            for e in exc.errors()
        )
        raise ConfigError(
            f"topic definition {path}: {problems} (needed: name, partitions, config, schema, "
            "description; optional: replication_factor)"
        ) from None
    _check_template(parsed.name, str(path))
    if "retention.ms" not in parsed.config:
        raise ConfigError(
            f'topic definition {path}: set config.retention.ms explicitly ("-1" keeps '
            "records forever); brokers that describe only explicit configs need it"
        )
    if not (path.parent / parsed.schema_file).is_file():
        raise ConfigError(f"topic definition {path}: schema file {parsed.schema_file} is missing")
    return TopicSpec(
        name=parsed.name,
        partitions=parsed.partitions,
        replication_factor=override_rf or parsed.replication_factor,
        config=dict(parsed.config),
        schema=parsed.schema_file,
        description=parsed.description.strip(),
        source=path,
    )


def load_topic_specs(topics_dir: str | Path | None = None) -> list[TopicSpec]:
    """All topic definitions in ``topics_dir`` (default: :func:`default_topics_dir`)."""
    directory = Path(topics_dir) if topics_dir is not None else default_topics_dir()
    if not directory.is_dir():
        raise ConfigError(
            f"topic definitions folder {directory} not found; set {TOPICS_DIR_ENV} to the "
            "folder holding the topics/*.yaml files of stream-dp"
        )
    files = sorted(directory.glob("*.yaml")) + sorted(directory.glob("*.yml"))
    if not files:
        raise ConfigError(f"no topic definitions (*.yaml) in {directory}")
    override_rf = _replication_factor_override()
    return [_load_one(path, override_rf) for path in files]


def resolve(spec: TopicSpec, config: Config) -> str:
    """The topic name of ``spec`` for ``config``; ConfigError if it is not a valid name."""

    def value(match: re.Match[str]) -> str:
        section, key = match.groups()
        return str(getattr(getattr(config, section), key))

    name = _PLACEHOLDER.sub(value, spec.name)
    if not _VALID_TOPIC.fullmatch(name) or name in (".", ".."):
        setting = spec.name.strip("{}") if _PLACEHOLDER.fullmatch(spec.name) else spec.name
        raise ConfigError(
            f"{setting} = {name!r} is not a valid Kafka topic name; use 1-249 letters, "
            "digits, '.', '_' or '-'"
        )
    return name


def resolve_all(
    config: Config, specs: list[TopicSpec] | None = None, *, include_input: bool = True
) -> dict[str, TopicSpec]:
    """Topic name → spec, refusing two definitions that resolve to the same topic."""
    out: dict[str, TopicSpec] = {}
    for spec in specs if specs is not None else load_topic_specs():
        if spec.is_input and not include_input:
            continue
        name = resolve(spec, config)
        if name in out:
            raise ConfigError(
                f"{out[name].name} and {spec.name} are both {name!r}; every topic needs its "
                "own name (e.g. output.topic, output.dead_letter_topic, output.ledger_topic)"
            )
        out[name] = spec
    return out


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


def _new_topic(name: str, spec: TopicSpec) -> Any:
    return NewTopic(name, spec.partitions, spec.replication_factor, topic_configs=dict(spec.config))


async def apply_topics(
    config: Config,
    bootstrap_servers: str | None = None,
    *,
    include_input: bool = True,
    topics_dir: str | Path | None = None,
) -> list[str]:
    """Create the topics of ``topics/`` that the broker does not have yet; returns the names
    created (existing topics are left as they are, even if their settings differ)."""
    wanted = resolve_all(config, load_topic_specs(topics_dir), include_input=include_input)
    kwargs = client_kwargs(config.kafka, bootstrap_servers=bootstrap_servers)
    bootstrap = kwargs["bootstrap_servers"]
    admin = AIOKafkaAdminClient(**kwargs)
    try:
        await admin.start()
        existing = set(await admin.list_topics())
        missing = [_new_topic(name, spec) for name, spec in wanted.items() if name not in existing]
        if not missing:
            return []
        created = _created(await admin.create_topics(missing), bootstrap)
    except (KafkaError, OSError) as exc:
        raise BrokerError(
            f"cannot manage topics on {bootstrap}: {type(exc).__name__}: {exc}; check "
            "kafka.bootstrap_servers and the kafka security options"
        ) from None
    finally:
        await admin.close()
    for name in created:
        log.info("created topic %s (%d partitions)", name, wanted[name].partitions)
    return created
