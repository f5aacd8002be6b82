"""``STREAM_DP_*`` environment variables: configuration overrides that cannot surprise.

pydantic-settings (:class:`~pydantic_settings.EnvSettingsSource`) collects the variables into
one nested mapping; this module decides first which names are configuration variables (so a
typo gets a "did you mean" instead of being ignored), and :class:`Config` validates the
merged result with the same strict rules as the file.

A variable ``STREAM_DP_<SECTION>__<KEY>`` overrides one key of the YAML file;
``STREAM_DP_<SECTION>`` (JSON) overrides several keys of a section, and ``STREAM_DP_QUERIES``
(a JSON list) replaces the file's queries — the loader reports that loudly. Every other
``STREAM_DP_*`` variable must be one stream-dp reads for another purpose
(:data:`NON_CONFIG_VARIABLES`, or the name ``pseudonymization.key_env`` /
``previous_key_env`` give): anything else — a misspelt section or key — is a ConfigError that
names the variable, never silently ignored. Names are matched without regard to case, as
before; values are never echoed (they may be secrets).
"""

from __future__ import annotations

import difflib
import functools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, create_model
from pydantic_settings import BaseSettings, EnvSettingsSource

from stream_dp.config.model import Config
from stream_dp.config.numbers import env_value, field_kind
from stream_dp.errors import ConfigError

ENV_PREFIX = "STREAM_DP_"
NESTING = "__"

#: Variables with the prefix that are not configuration keys, and who reads them.
NON_CONFIG_VARIABLES = {
    "STREAM_DP_PSEUDONYM_KEY": "the pseudonym key (default pseudonymization.key_env)",
    "STREAM_DP_CONFIG": "the configuration file of a command given no --config",
    "STREAM_DP_ALLOW_UNSAFE_TEST_MODE": "tests: allows privacy.unsafe_test_mode",
    "STREAM_DP_TEST_CRASH_POINT": "tests: crash the worker at a named point",
    "STREAM_DP_TEST_PAUSE_POINT": "tests: freeze the worker at a named point",
    "STREAM_DP_TEST_LEDGER_DELAY_S": "tests: slow every ledger write (the chaos run)",
    "STREAM_DP_TEST_TAKE_FAILURES": "tests: fail the first ledger reads when partitions arrive",
    "STREAM_DP_TEST_STALL_INPUT": "tests: one input partition fetches nothing for a while",
    "STREAM_DP_TEST_LONG_DRAW": "tests: the first draw lasts until a file exists",
    "STREAM_DP_POSTGRES_DSN": "stream-dp sink: the PostgreSQL connection string",
    "STREAM_DP_APACHE_KAFKA_LIBS": "the Apache Kafka broker's jars (tests, bench, chaos)",
}
#: Variables older versions read, with what replaces them.
RETIRED_VARIABLES = {
    "STREAM_DP_TOPIC_REPLICATION_FACTOR": "set kafka.replication_factor (or "
    "STREAM_DP_KAFKA__REPLICATION_FACTOR) instead",
    "STREAM_DP_TOPICS_DIR": "the topic definitions ship inside the package now; unset it",
}


@dataclass(frozen=True)
class EnvOverrides:
    """What the environment sets: per section the mapping (or, for ``queries``, the list) to
    merge into the file's, and which variable set each dotted key."""

    sections: dict[str, Any] = field(default_factory=dict)
    variables: dict[str, str] = field(default_factory=dict)


class _Collector(EnvSettingsSource):
    """pydantic-settings' environment source over a given mapping (not ``os.environ``): it
    matches names without regard to case, decodes the JSON of section variables and nests
    ``SECTION__KEY`` into them (single keys win). Only names already known to be
    configuration variables are given to it; validation stays with :class:`Config`."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._given = environ
        super().__init__(
            _sections_settings(),
            case_sensitive=False,
            env_prefix=ENV_PREFIX,
            env_nested_delimiter=NESTING,
        )

    def _load_env_vars(self) -> Mapping[str, str | None]:
        # What the source reads instead of os.environ; names lower-cased, as it does itself
        # when not case-sensitive.
        return {name.lower(): value for name, value in self._given.items()}


@functools.cache
def _sections_settings() -> type[BaseSettings]:
    """A settings class with one field per configuration section, typed only as a mapping
    (or a list): the collector nests and decodes, it does not validate."""
    fields: dict[str, Any] = {
        name: ((dict[str, Any] if _section_model(name) else list[Any]) | None, None)
        for name in Config.model_fields
    }
    settings: type[BaseSettings] = create_model("_Sections", __base__=BaseSettings, **fields)
    return settings


def _section_model(section: str) -> type[BaseModel] | None:
    field = Config.model_fields.get(section)
    annotation = field.annotation if field is not None else None
    return (
        annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    )


def suggest(word: str, choices: Iterable[str]) -> str:
    """' (did you mean X?)' for the closest of ``choices`` to a mistyped ``word``, else ''."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _parse_json(variable: str, raw: str, expected: type, what: str) -> Any:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"environment variable {variable}: not valid JSON ({exc.msg} at character "
            f"{exc.pos}); it must hold {what}"
        ) from None
    if not isinstance(value, expected):
        raise ConfigError(f"environment variable {variable} must hold {what}")
    return value


def _classify(variable: str, raw: str) -> tuple[str, str | None] | str:
    """The section and key (None: the whole section) a variable sets, or why it is not a
    configuration variable. A section variable's value must be JSON of the right shape."""
    rest = variable[len(ENV_PREFIX) :].lower()
    section, sep, key = rest.partition(NESTING)
    sections = list(Config.model_fields)
    if section not in Config.model_fields:
        return f"no configuration section {section!r}{suggest(section, sections)}"
    model = _section_model(section)
    if not sep:
        if model is None:  # queries: a JSON list replaces the file's list
            _parse_json(variable, raw, list, "a JSON list")
        else:
            _parse_json(variable, raw, dict, f"a JSON object of {section} keys")
        return section, None
    if model is None:
        return (
            f"{section} cannot be set key by key; set {ENV_PREFIX}{section.upper()} to a JSON list"
        )
    if NESTING in key or key not in model.model_fields:
        return f"{section} has no key {key!r}{suggest(key, model.model_fields)}"
    return section, key


def read_environment(environ: Mapping[str, str]) -> tuple[EnvOverrides, dict[str, str]]:
    """The configuration overrides in ``environ``, and the other ``STREAM_DP_*`` variables
    with the reason each is not one (checked by :func:`check_leftovers` once the config
    says which key variables it reads)."""
    targets: dict[str, tuple[str, str | None]] = {}
    leftovers: dict[str, str] = {}
    for variable in sorted(environ):
        name = variable.upper()
        if not name.startswith(ENV_PREFIX) or name in NON_CONFIG_VARIABLES:
            continue
        if name in RETIRED_VARIABLES:
            leftovers[variable] = f"no longer read: {RETIRED_VARIABLES[name]}"
            continue
        found = _classify(variable, environ[variable])
        if isinstance(found, tuple):
            targets[variable] = found
        else:
            leftovers[variable] = found
    if not targets:
        return EnvOverrides(), leftovers
    sections = _Collector({v: environ[v] for v in targets})()
    variables: dict[str, str] = {}
    # Section variables first (each of their keys), then single keys, which win.
    for variable, (section, key) in sorted(targets.items(), key=lambda t: t[1][1] is not None):
        if key is None and isinstance(sections[section], dict):
            variables.update({f"{section}.{k}": variable for k in sections[section]})
        elif key is None:
            variables[section] = variable
        else:
            variables[f"{section}.{key}"] = variable
            # Text as the number it spells for a number field (digits; a decimal for ε, δ,
            # ...); anything else (``yes``) stays text, and the number field refuses it.
            kind = field_kind(_section_fields(section)[key])
            sections[section][key] = env_value(kind, sections[section][key])
    return EnvOverrides(dict(sections), variables), leftovers


def _section_fields(section: str) -> dict[str, Any]:
    model = _section_model(section)
    return dict(model.model_fields) if model is not None else {}


def check_leftovers(leftovers: Mapping[str, str], key_variables: Iterable[str | None]) -> None:
    """ConfigError naming every ``STREAM_DP_*`` variable nobody reads."""
    readers = {name.upper() for name in key_variables if name}
    unknown = {v: why for v, why in leftovers.items() if v.upper() not in readers}
    if not unknown:
        return
    lines = "\n  ".join(f"{v}: {why}" for v, why in sorted(unknown.items()))
    raise ConfigError(
        f"unknown stream-dp environment variable{'s' if len(unknown) > 1 else ''}:\n  {lines}\n"
        f"Configuration variables are {ENV_PREFIX}<SECTION>__<KEY> (e.g. "
        f"{ENV_PREFIX}PRIVACY__EPSILON_PER_WINDOW) with a section and key of the config "
        "reference; fix the name or unset the variable"
    )


def merge_overrides(data: Mapping[str, Any], overrides: EnvOverrides) -> dict[str, Any]:
    """``data`` with the overrides applied: each section's keys merged into the file's, the
    queries list replaced. ``data`` is not modified."""
    merged: dict[str, Any] = dict(data)
    for section, value in overrides.sections.items():
        current = merged.get(section)
        if isinstance(value, dict):
            base = dict(current) if isinstance(current, Mapping) else {}
            merged[section] = {**base, **value}
        else:
            merged[section] = value
    return merged


def origins(overrides: EnvOverrides) -> dict[str, str]:
    """Dotted key → variable, for every key the environment set (a section variable's JSON
    keys are listed one by one; a single-key variable wins)."""
    return dict(overrides.variables)
