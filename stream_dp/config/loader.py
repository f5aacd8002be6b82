"""Load the YAML configuration, apply env overrides, and turn every failure into a ConfigError
whose message names the field path, the bad value and what is allowed."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from stream_dp.config.model import Config
from stream_dp.errors import ConfigError

log = logging.getLogger(__name__)


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


def _describe(error: Mapping[str, Any]) -> str:
    loc = tuple(error["loc"])
    path = _format_loc(loc)
    if error["type"] == "extra_forbidden":
        owner = _model_at(loc[:-1])
        allowed = ", ".join(owner.model_fields) if owner else "see README"
        return f"{path}: unknown key; allowed here: {allowed}"
    if error["type"] == "missing":
        return f"{path}: required but missing"
    value = error.get("input")
    shown = "" if isinstance(value, Mapping) else f" = {value!r}"
    msg = str(error["msg"]).removeprefix("Value error, ")
    return f"{path}{shown}: {msg}"


def parse_config(data: Mapping[str, Any], *, source: str = "config") -> Config:
    """Validate already-parsed configuration data (plus env overrides)."""
    try:
        config = Config(**dict(data))
    except ValidationError as exc:
        lines = "\n  ".join(_describe(e) for e in exc.errors())
        raise ConfigError(f"invalid configuration in {source}:\n  {lines}") from None
    except ConfigError as exc:
        raise ConfigError(f"invalid configuration in {source}: {exc}") from None
    if config.privacy.epsilon_per_window > 1:
        log.warning(
            "privacy.epsilon_per_window = %g is above 1; the released numbers protect "
            "individuals less than the usual recommendations",
            config.privacy.epsilon_per_window,
        )
    return config


def load_config(path: str | Path) -> Config:
    """Read a YAML configuration file; raises ConfigError (exit code 2) with the fix."""
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
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"config file {p} is not valid YAML{where}: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"config file {p} must hold a mapping of sections (kafka, input, ...), "
            f"not a {type(data).__name__}"
        )
    return parse_config(data, source=str(p))
