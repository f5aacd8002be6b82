"""Load the YAML configuration, apply env overrides, and turn every failure into a ConfigError
whose message names the field path, the bad value, where it came from (the file or an
environment variable) and what is allowed.

YAML 1.1 (what PyYAML reads) turns some unquoted words into values nobody meant: ``yes``,
``no``, ``on``, ``off`` are booleans (the country code ``NO`` becomes ``false``), ``010`` is
the octal 8, ``1:30`` the sexagesimal 90, while ``1e3`` (no dot) stays the *string* "1e3".
For ordinary settings: ``keyed_by_user: yes`` is true; an unquoted ``1e-6`` given to a
number field is the number; a boolean is never a number (``horizon_windows: yes`` is
refused, see :mod:`stream_dp.config.numbers`). In the values of ``queries[].keys`` and
``queries[].where``, which are compared with event values exactly, they are refused with
the spelling that says what was meant.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from stream_dp.config.environment import (
    check_leftovers,
    merge_overrides,
    origins,
    read_environment,
    suggest,
)
from stream_dp.config.model import Config, ConfigOrigin
from stream_dp.config.numbers import field_kind
from stream_dp.errors import ConfigError
from stream_dp.privacy.planner import plan_config

log = logging.getLogger(__name__)

#: Plain scalars PyYAML reads as strings that any reader would take for a number.
_NUMBER_LIKE = re.compile(r"^[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)$")
#: Plain integers whose YAML 1.1 value differs from their decimal reading.
_ODD_INT = re.compile(r"^[-+]?(?:0[0-9_]+|0[xXbBoO].*|.*[:_].*)$")
#: Plain integers YAML 1.1 reads in octal (a leading zero).
_OCTAL = re.compile(r"^[-+]?0[0-9_]+$")


@dataclass(frozen=True)
class _Ambiguous:
    """A plain YAML scalar whose YAML 1.1 value is probably not what was meant."""

    text: str
    #: What YAML 1.1 made of it (used outside key and where lists).
    value: Any
    meaning: str


class _Loader(yaml.SafeLoader):
    """SafeLoader that marks ambiguous plain scalars (see the module docstring)."""


def _construct_bool(loader: _Loader, node: yaml.ScalarNode) -> Any:
    value = loader.construct_yaml_bool(node)
    if node.value.lower() in ("true", "false"):
        return value
    return _Ambiguous(
        node.value, value, f"the boolean {'true' if value else 'false'} (YAML 1.1 reads it so)"
    )


def _construct_int(loader: _Loader, node: yaml.ScalarNode) -> Any:
    value = loader.construct_yaml_int(node)
    if _ODD_INT.match(node.value):
        return _Ambiguous(node.value, value, f"the integer {value} (YAML 1.1 reads it so)")
    return value


def _construct_str(loader: _Loader, node: yaml.ScalarNode) -> Any:
    value = loader.construct_scalar(node)
    if node.style is None and isinstance(value, str) and _NUMBER_LIKE.match(value):
        return _Ambiguous(
            value, value, "a string, not a number (YAML 1.1 reads exponents like 1e3 as text)"
        )
    return value


_Loader.add_constructor("tag:yaml.org,2002:bool", _construct_bool)
_Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_Loader.add_constructor("tag:yaml.org,2002:str", _construct_str)


def _settle(data: Any, path: tuple[str | int, ...] = ()) -> Any:
    """Replace ambiguous scalars by their YAML 1.1 value, except in key and where lists."""
    if isinstance(data, Mapping):
        return {
            (k.value if isinstance(k, _Ambiguous) else k): _settle(v, (*path, k))
            for k, v in data.items()
        }
    if isinstance(data, list):
        return [_settle(v, (*path, i)) for i, v in enumerate(data)]
    if isinstance(data, _Ambiguous):
        if len(path) >= 4 and path[0] == "queries" and path[2] in ("keys", "where"):
            raise ConfigError(_ambiguous_message(data, path))
        if _number_field(path):
            return _settle_number(data, path)
        return data.value
    return data


def _settle_number(item: _Ambiguous, path: tuple[str | int, ...]) -> Any:
    """An ambiguous plain scalar given to a number field: an unquoted 1e-6 is the number;
    an octal (010) or base-60 (1:30) integer is refused with the fix. Booleans are left to
    the field, which refuses them."""
    if isinstance(item.value, str):
        return float(item.text)  # an unquoted 1e-6 for δ is the number
    if isinstance(item.value, int) and not isinstance(item.value, bool):
        base = "base 60" if ":" in item.text else "octal" if _OCTAL.match(item.text) else None
        if base is not None:
            raise ConfigError(
                f"{_format_loc(path)} = {item.text}: YAML 1.1 reads this unquoted number in "
                f"{base}, as {item.value}; write the number you mean in plain decimal digits "
                f"(e.g. {item.value}, if that is it)"
            )
    return item.value


def _number_field(path: tuple[str | int, ...]) -> bool:
    """Whether the key at ``path`` is a number field (an integer or a number)."""
    if not path or not isinstance(path[-1], str):
        return False
    model = _model_at(path[:-1])
    field = None if model is None else model.model_fields.get(path[-1])
    return field is not None and field_kind(field) in ("integer", "number")


def _yaml_float(value: float) -> str:
    """A float spelled so that YAML 1.1 reads it as one (a dot, a signed exponent)."""
    text = repr(value)
    if "e" not in text:
        return text
    mantissa, exponent = text.split("e")
    if "." not in mantissa:
        mantissa += ".0"
    if exponent[0] not in "+-":
        exponent = "+" + exponent
    return f"{mantissa}e{exponent}"


def _ambiguous_message(item: _Ambiguous, path: tuple[str | int, ...]) -> str:
    where = _format_loc(path)
    if isinstance(item.value, bool):
        fix = f'quote it ("{item.text}") if you mean the text, or write ' + (
            "true" if item.value else "false"
        )
    elif isinstance(item.value, int):
        fix = f'quote it ("{item.text}") if you mean the text, or write {item.value}'
    else:
        fix = (
            f'quote it ("{item.text}") if you mean the text, or write the number as '
            f"{_yaml_float(float(item.text))}"
        )
    return (
        f"{where} = {item.text}: this unquoted value is {item.meaning}, and key and where "
        f"values are compared with event values exactly; {fix}"
    )


def _format_loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _model_at(loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model class that owns the mapping at ``loc`` (to list its allowed keys)."""
    model: type[BaseModel] = Config
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:
            return None
        ann = field.annotation
        candidates = [ann, *getattr(ann, "__args__", ())]
        models = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
        nxt = models[0] if models else None
        if nxt is None:
            return None
        model = nxt
    return model


def _came_from(loc: tuple[int | str, ...], origin: ConfigOrigin, source: str) -> str:
    """Where the value at ``loc`` came from: the variable that set it (or its section or
    list), else the file; for a whole section, also the variables that set keys in it."""
    names = [str(p) for p in loc if isinstance(p, str)]
    for depth in range(len(names), 0, -1):
        variable = origin.environment.get(".".join(names[:depth]))
        if variable is not None:
            return f"from environment variable {variable}"
    prefix = ".".join(names)
    inside = sorted(
        {v for k, v in origin.environment.items() if not prefix or k.startswith(prefix + ".")}
    )
    if inside:
        return f"from {source} and environment variable{'s' if len(inside) > 1 else ''} " + (
            ", ".join(inside)
        )
    return f"from {source}"


def _describe(error: Mapping[str, Any], origin: ConfigOrigin, source: str) -> str:
    loc = tuple(error["loc"])
    path = _format_loc(loc)
    where = _came_from(loc, origin, source)
    if error["type"] == "extra_forbidden":
        owner = _model_at(loc[:-1])
        allowed = ", ".join(owner.model_fields) if owner else "see docs/configuration.md"
        hint = suggest(str(loc[-1]), owner.model_fields) if owner else ""
        return f"{path} ({where}): unknown key{hint}; allowed here: {allowed}"
    if error["type"] == "missing":
        return f"{path}: required but missing"
    value = error.get("input")
    secret = any("password" in str(part) for part in loc)
    shown = "" if isinstance(value, Mapping) or secret else f" = {_spelled(value)}"
    msg = str(error["msg"]).removeprefix("Value error, ")
    return f"{path}{shown} ({where}): {msg}"


def _spelled(value: Any) -> str:
    """A value as the user wrote it (YAML spells booleans true and false)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def _heading(source: str, origin: ConfigOrigin) -> str:
    variables = sorted(set(origin.environment.values()))
    if not variables:
        return f"invalid configuration in {source}"
    return f"invalid configuration in {source} with environment overrides {', '.join(variables)}"


def parse_config(
    data: Mapping[str, Any],
    *,
    source: str = "config",
    environ: Mapping[str, str] | None = None,
    file: str | None = None,
) -> Config:
    """Validate configuration data with the ``STREAM_DP_*`` overrides of ``environ``
    (default: the process environment) applied; ConfigError (exit code 2) otherwise."""
    overrides, leftovers = read_environment(os.environ if environ is None else environ)
    merged = merge_overrides(data, overrides)
    pseudonymization = merged.get("pseudonymization")
    key_variables: list[Any] = []
    if isinstance(pseudonymization, Mapping):
        key_variables = [pseudonymization.get("key_env"), pseudonymization.get("previous_key_env")]
    check_leftovers(leftovers, [v for v in key_variables if isinstance(v, str)])
    origin = ConfigOrigin(file=file, environment=origins(overrides))
    _report_replaced_queries(data, origin, source)
    try:
        config = Config(**merged)
        # Planning checks what follows from several settings at once (noise scales,
        # value ranges in noise units, public key products): refused at load, not later.
        plan_config(config.spec())
    except ValidationError as exc:
        lines = "\n  ".join(_describe(e, origin, source) for e in exc.errors())
        raise ConfigError(f"{_heading(source, origin)}:\n  {lines}") from None
    except ConfigError as exc:
        raise ConfigError(f"{_heading(source, origin)}: {exc}") from None
    config._origin = origin
    if config.privacy.epsilon_per_window > 1:
        log.warning(
            "privacy.epsilon_per_window = %g is above 1; the released numbers protect "
            "individuals less than the usual recommendations",
            config.privacy.epsilon_per_window,
        )
    return config


def load_config(path: str | Path, environ: Mapping[str, str] | None = None) -> Config:
    """Read a YAML configuration file, with the ``STREAM_DP_*`` overrides of ``environ``
    (default: the process environment); raises ConfigError (exit code 2) with the fix."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"config file {p} not found; pass --config with the path of a YAML file"
        ) from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {p}: {exc.strerror}") from None
    try:
        data = yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"config file {p} is not valid YAML{where}: {problem}") from None
    if data is None:
        data = {}
    data = _settle(data)
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"config file {p} must hold a mapping of sections (kafka, input, ...), "
            f"not a {type(data).__name__}"
        )
    return parse_config(data, source=str(p), environ=environ, file=str(p))


def _report_replaced_queries(data: Mapping[str, Any], origin: ConfigOrigin, source: str) -> None:
    variable = origin.environment.get("queries")
    if variable is None:
        return
    in_file = data.get("queries")
    count = len(in_file) if isinstance(in_file, list) else 0
    log.warning(
        "the queries come from environment variable %s, replacing the %d quer%s in %s",
        variable,
        count,
        "y" if count == 1 else "ies",
        source,
    )
