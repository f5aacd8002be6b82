"""No value is read as a number it was not written as (issue 25, break 8).

YAML 1.1 reads unquoted ``yes``/``on``/``true`` as booleans and pydantic's lax mode read a
boolean as 1: ``privacy.horizon_windows: yes`` was a horizon of one window (the horizon cap
then capped nothing), ``epsilon: on`` was 1.0, ``window.size_s: true`` one second, and
``window.start_at: 0`` the Unix epoch. Every numeric field of the model — the list is derived
from the model itself, and checked to hold known fields — refuses booleans and text (and
decimals where an integer belongs; numbers where a timestamp belongs) with a message naming
the field and what to write, from the YAML file and from ``STREAM_DP_*`` variables alike,
while the values a user means are accepted.
"""

from __future__ import annotations

import copy
import os
import types
import typing
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Union

import pytest
import yaml
from pydantic import BaseModel

from stream_dp.config import load_config
from stream_dp.config.model import Config
from stream_dp.config.numbers import field_kind
from stream_dp.errors import ConfigError

FieldPath = tuple[str | int, ...]
T0 = datetime(2020, 8, 1, tzinfo=UTC)

#: A valid configuration with a private-key count query.
BASE: dict[str, Any] = {
    "kafka": {"bootstrap_servers": "broker:9092"},
    "queries": [{"name": "q", "group_by": ["domain"], "epsilon": 0.5, "delta": 1e-7}],
}
#: Contexts in which a field applies: a sum query, a cumulative query, automatic bounds,
#: a key rotation, a top-k query.
SUM = {"name": "q", "statistic": "sum", "value_field": "v", "lower": 0, "upper": 10}
SUM |= {"epsilon": 0.5, "keys": {}}
CUMULATIVE = {"name": "q", "release": "cumulative", "horizon_windows": 24, "epsilon": 0.5}
CUMULATIVE |= {"group_by": ["domain"], "keys": {"domain": ["a"]}}
AUTO = {"bounds": {k: "auto" for k in ("max_contributions_per_window", "max_keys_per_user")}}
AUTO["bounds"] |= {"max_contributions_per_key": "auto", "auto": {"epsilon_share": 0.2}}
TOP_K = {"name": "q", "group_by": ["domain"], "epsilon": 0.5, "delta": 1e-7, "top_k": 5}
QUANTILE = {**SUM, "statistic": "quantile", "quantiles": [0.5, 0.9]}
ROTATION = {"pseudonymization": {"previous_key_env": "OLD_KEY", "previous_key_id": "k0"}}
EXPORT = {"partner": "acme", "topic": "to-acme", "fields": ["born"], "purpose": "research"}
EXPORT |= {"generalize": {"born": "year"}, "legal_basis": "consent"}


def _with(**sections: Any) -> dict[str, Any]:
    return {**copy.deepcopy(BASE), **copy.deepcopy(sections)}


#: Every numeric field → (a configuration it applies in, a valid value as the loaded config
#: holds it). The test below checks that this lists exactly the model's numeric fields.
VALID: dict[FieldPath, tuple[dict[str, Any], Any]] = {
    ("kafka", "session_timeout_ms"): (BASE, 12_000),
    ("kafka", "heartbeat_interval_ms"): (BASE, 2_000),
    ("kafka", "request_timeout_ms"): (BASE, 20_000),
    ("kafka", "max_message_bytes"): (BASE, 2_000_000),
    ("kafka", "give_up_after_s"): (BASE, 60.5),
    ("kafka", "startup_wait_s"): (BASE, 30.5),
    ("kafka", "replication_factor"): (BASE, 3),
    ("input", "max_record_bytes"): (BASE, 100_000),
    ("input", "max_future_s"): (BASE, 120),
    ("output", "internal_retention_s"): (BASE, 90_000),
    ("output", "continual_retention_s"): (BASE, 100_000),
    ("output", "max_hold_s"): (BASE, 7_200),
    ("window", "max_held_state_bytes"): (BASE, 2_000_000_000),
    ("window", "max_backpressure_s"): (BASE, 120),
    ("topics", "output_partitions"): (BASE, 5),
    ("topics", "dead_letter_partitions"): (BASE, 2),
    ("topics", "ledger_partitions"): (BASE, 4),
    ("topics", "partials_partitions"): (BASE, 8),
    ("topics", "repartition_partitions"): (BASE, 6),
    ("topics", "continual_partitions"): (BASE, 2),
    ("window", "size_s"): (BASE, 1800),
    ("window", "grace_s"): (BASE, 30),
    ("window", "idle_close_s"): (BASE, 10.5),
    ("window", "start_at"): (BASE, T0),
    ("pseudonymization", "rotate_at"): (_with(**ROTATION), T0),
    ("privacy", "epsilon_per_window"): (BASE, 2),
    ("privacy", "delta_per_window"): (BASE, 1e-7),
    ("privacy", "horizon_windows"): (BASE, 40),
    ("privacy", "max_epsilon_per_horizon"): (BASE, 30.0),
    ("bounds", "max_contributions_per_window"): (BASE, 20),
    ("bounds", "max_keys_per_user"): (BASE, 3),
    ("bounds", "max_contributions_per_key"): (BASE, 5),
    ("bounds", "auto", "epsilon_share"): (_with(**AUTO), 0.25),
    ("bounds", "auto", "start", "max_contributions_per_window"): (_with(**AUTO), 30),
    ("bounds", "auto", "start", "max_keys_per_user"): (_with(**AUTO), 4),
    ("bounds", "auto", "start", "max_contributions_per_key"): (_with(**AUTO), 8),
    ("bounds", "auto", "cap", "max_contributions_per_window"): (_with(**AUTO), 500),
    ("bounds", "auto", "cap", "max_keys_per_user"): (_with(**AUTO), 32),
    ("bounds", "auto", "cap", "max_contributions_per_key"): (_with(**AUTO), 200),
    ("queries", 0, "selection_epsilon_share"): (BASE, 0.3),
    ("queries", 0, "epsilon"): (BASE, 1),
    ("queries", 0, "delta"): (BASE, 2e-7),
    ("queries", 0, "lower"): (_with(queries=[SUM]), -5),
    ("queries", 0, "upper"): (_with(queries=[SUM]), 20.5),
    ("queries", 0, "granularity"): (_with(queries=[SUM]), 0.5),
    ("queries", 0, "mean_count_share"): (BASE, 0.4),
    ("queries", 0, "horizon_windows"): (_with(queries=[CUMULATIVE]), 12),
    ("queries", 0, "bins"): (_with(queries=[QUANTILE]), 64),
    ("queries", 0, "horizon_origin"): (_with(queries=[CUMULATIVE]), T0),
    ("queries", 0, "top_k"): (BASE, 10),
    ("queries", 0, "top_k_epsilon_share"): (_with(queries=[TOP_K]), 0.3),
    ("metrics", "port"): (BASE, 9200),
    ("metrics", "live_timeout_s"): (BASE, 45.0),
    ("erasure", "retention_s"): (BASE, 700_000),
    ("exports", 0, "k_anonymity"): (_with(input={"keyed_by_user": True}, exports=[EXPORT]), 5),
}

#: Aliases YAML or a careless hand produce, by the kind of field: none of them is the number
#: it seems. 1e3 without a dot is text in YAML 1.1, read as 1000.0 for number fields: a
#: decimal, refused where an integer belongs; 010 and 1:30 are YAML 1.1's octal 8 and
#: base-60 90.
ALIASES = {
    "integer": [
        *("yes", "on", "true", "false", "no", '"1"', "'40'", "1.0", "3600.0", "1e3"),
        *("010", "1:30"),  # YAML 1.1: octal 8, base-60 90
    ],
    "number": ["yes", "on", "true", "off", '"1"', "'0.5'", '"1e-6"', "010", "1:30"],
    "timestamp": ["0", "1596240000", "1596240000.0", "yes", "2020-08-01", '"1596240000"'],
}


def _model_fields(model: type[BaseModel], prefix: FieldPath) -> Iterator[tuple[FieldPath, Any]]:
    for name, field in model.model_fields.items():
        path = (*prefix, name)
        kind = field_kind(field)
        if kind is not None:
            yield path, kind
            continue
        for member in _members(field.annotation):
            if isinstance(member, type) and issubclass(member, BaseModel):
                yield from _model_fields(member, path)
            elif typing.get_origin(member) is list:
                (item,) = typing.get_args(member)
                if isinstance(item, type) and issubclass(item, BaseModel):
                    yield from _model_fields(item, (*path, 0))
            elif member in (int, float, datetime):
                yield path, f"UNCHECKED {member.__name__}"  # a numeric field without a kind


def _members(annotation: Any) -> tuple[Any, ...]:
    if typing.get_origin(annotation) in (Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


NUMERIC_FIELDS = dict(_model_fields(Config, ()))


def _dotted(path: FieldPath) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _set(data: dict[str, Any], path: FieldPath, value: Any) -> dict[str, Any]:
    data = copy.deepcopy(data)
    node: Any = data
    for part in path[:-1]:
        node = node.setdefault(part, {}) if isinstance(node, dict) else node[part]
    node[path[-1]] = value
    return data


def _get(config: Config, path: FieldPath) -> Any:
    node: Any = config
    for part in path:
        node = node[part] if isinstance(part, int) else getattr(node, part)
    return node


@pytest.fixture(autouse=True)
def _no_stray_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("STREAM_DP_"):
            monkeypatch.delenv(name)


def _write(tmp_path: Path, data: dict[str, Any], path: FieldPath, yaml_text: str) -> Path:
    """The configuration as YAML with ``yaml_text`` written verbatim at ``path``."""
    marker = "@@value@@"
    text = yaml.safe_dump(_set(data, path, marker), sort_keys=False)
    assert text.count(f"'{marker}'") == 1
    file = tmp_path / "config.yaml"
    file.write_text(text.replace(f"'{marker}'", yaml_text))
    return file


def test_the_numeric_field_list_is_the_model_s_and_holds_the_known_fields() -> None:
    unchecked = [_dotted(p) for p, kind in NUMERIC_FIELDS.items() if kind.startswith("UNCHECKED")]
    assert unchecked == []  # every int/float/datetime field has a strict type
    known = {
        ("privacy", "horizon_windows"): "integer",
        ("privacy", "epsilon_per_window"): "number",
        ("window", "size_s"): "integer",
        ("window", "start_at"): "timestamp",
        ("queries", 0, "epsilon"): "number",
        ("bounds", "max_contributions_per_window"): "integer",
        ("bounds", "auto", "cap", "max_keys_per_user"): "integer",
        ("erasure", "retention_s"): "integer",
    }
    assert {p: NUMERIC_FIELDS.get(p) for p in known} == known
    assert len(NUMERIC_FIELDS) >= 40
    assert set(VALID) == set(NUMERIC_FIELDS)


CASES = [(p, alias) for p, kind in NUMERIC_FIELDS.items() for alias in ALIASES.get(kind, [])]


@pytest.mark.parametrize(("path", "alias"), CASES, ids=[f"{_dotted(p)}={a}" for p, a in CASES])
def test_an_alias_is_refused_with_the_field_and_what_to_write(
    tmp_path: Path, path: FieldPath, alias: str
) -> None:
    data, _ = VALID[path]
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, data, path, alias))
    message = str(info.value)
    line = next((x for x in message.splitlines() if _dotted(path) in x), message)
    assert _dotted(path) in line, message
    kind = NUMERIC_FIELDS[path]
    if kind == "timestamp":
        assert "2020-08-01T00:00:00Z" in line, message  # the spelling to use
    else:
        assert "write" in line, message
    if alias in ("yes", "on", "true", "false", "no", "off"):
        assert "boolean" in line and "YAML reads unquoted yes" in line, message


@pytest.mark.parametrize("path", list(VALID), ids=[_dotted(p) for p in VALID])
def test_the_meant_value_is_accepted_from_the_file(tmp_path: Path, path: FieldPath) -> None:
    data, value = VALID[path]
    text = value.isoformat().replace("+00:00", "Z") if isinstance(value, datetime) else repr(value)
    config = load_config(_write(tmp_path, data, path, text))
    assert _get(config, path) == value


def test_an_unquoted_exponent_without_a_dot_is_a_number_for_a_number_field(
    tmp_path: Path,
) -> None:
    """YAML 1.1 reads 1e-7 (no dot) as text; given to a number field it is the number."""
    path: FieldPath = ("queries", 0, "delta")
    config = load_config(_write(tmp_path, BASE, path, "1e-7"))
    assert _get(config, path) == 1e-7


#: Fields a single variable can set: STREAM_DP_<SECTION>__<KEY>.
ENV_FIELDS = [p for p in VALID if len(p) == 2]


def _variable(path: FieldPath) -> str:
    return f"STREAM_DP_{str(path[0]).upper()}__{str(path[1]).upper()}"


@pytest.mark.parametrize("path", ENV_FIELDS, ids=[_dotted(p) for p in ENV_FIELDS])
def test_a_variable_written_as_the_number_is_accepted_and_yes_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: FieldPath
) -> None:
    data, value = VALID[path]
    file = tmp_path / "config.yaml"
    file.write_text(yaml.safe_dump(data))
    text = value.isoformat() if isinstance(value, datetime) else str(value)
    monkeypatch.setenv(_variable(path), text)
    assert _get(load_config(file), path) == value
    for alias in ("yes", "on", "true", "1.0" if NUMERIC_FIELDS[path] == "integer" else "0"):
        if alias == "0" and NUMERIC_FIELDS[path] != "timestamp":
            continue
        monkeypatch.setenv(_variable(path), alias)
        with pytest.raises(ConfigError) as info:
            load_config(file)
        message = str(info.value)
        assert _dotted(path) in message and _variable(path) in message, message
        assert "write" in message or "2020-08-01T00:00:00Z" in message, message


def test_the_reported_breaks_are_refused(tmp_path: Path) -> None:
    """The four configurations of the report, as written there."""
    for path, alias in [
        (("privacy", "horizon_windows"), "yes"),
        (("queries", 0, "epsilon"), "yes"),
        (("queries", 0, "epsilon"), "on"),
        (("window", "size_s"), "true"),
        (("window", "start_at"), "0"),
    ]:
        with pytest.raises(ConfigError, match=_dotted(path).replace("[", r"\[")):
            load_config(_write(tmp_path, VALID[path][0], path, alias))
