"""Reference pages generated from the code, for the documentation site (``make docs``).

Two references must never drift from what the service does, so they are rendered from the
objects that define it rather than written by hand:

- :func:`configuration_reference`: every key of :class:`stream_dp.config.model.Config`, with
  its type, constraints, default and description, walked from the pydantic model. Longer
  explanations that do not fit a field's ``description`` come from a notes mapping (the docs
  site keeps it in ``docs/hooks/configuration-notes.yaml``): a note for a key the model does
  not have, or a key with neither a description nor a note, is an error, so the build fails
  when the model and its documentation part.
- :func:`fingerprint_reference`: which settings the deployment fingerprint holds and why each
  other one is left out, from the classification of every key
  (:mod:`stream_dp.config.classification`).
- :func:`metrics_reference`: every metric of the worker's and the sink's registries, with its
  type, labels, the label values that exist from the start, and its help text.

The docs site's hook (``docs/hooks/site.py``) calls them; nothing at run time does.
"""

from __future__ import annotations

import datetime
import enum
import json
import types
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import annotated_types
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from stream_dp.config.classification import SETTINGS, Role
from stream_dp.config.model import Config
from stream_dp.errors import StreamDPError
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.formats.decode import REASONS
from stream_dp.sink.metrics import SinkMetrics


class ReferenceError(StreamDPError):
    """The generated reference and its hand-written notes disagree (fix the notes file)."""


# --------------------------------------------------------------------------- configuration


class ConfigKey(typing.NamedTuple):
    """One leaf key of the configuration, as the reference shows it."""

    path: str
    type: str
    default: str
    description: str


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _without_none(annotation: Any) -> tuple[Any, bool]:
    """``X | None`` → (X, True); anything else → (itself, False)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) < len(typing.get_args(annotation)):
            rest = args[0] if len(args) == 1 else typing.Union[tuple(args)]  # noqa: UP007
            return rest, True
    return annotation, False


def _type_name(annotation: Any) -> str:
    """A reader's name for a field's type (``int``, ``earliest | latest``, ``list of str``)."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is Literal:
        return " | ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is list:
        return f"list of {_grouped(args[0])}"
    if origin is dict:
        return f"mapping of {_grouped(args[0])} to {_grouped(args[1])}"
    if annotation is type(None):
        return "null"
    names: dict[Any, str] = {
        str: "string",
        int: "integer",
        float: "number",
        bool: "boolean",
        SecretStr: "secret string",
        Path: "file path",
        datetime.datetime: "timestamp with UTC offset",
    }
    if annotation in names:
        return names[annotation]
    return getattr(annotation, "__name__", str(annotation))


def _grouped(annotation: Any) -> str:
    """A type name, parenthesised when it is a choice (inside ``list of …``)."""
    name = _type_name(annotation)
    return f"({name})" if " | " in name else name


_BOUND_SYMBOLS: tuple[tuple[type[Any], str, str], ...] = (
    (annotated_types.Ge, "ge", "≥"),
    (annotated_types.Gt, "gt", ">"),
    (annotated_types.Le, "le", "≤"),
    (annotated_types.Lt, "lt", "<"),
)


def _constraints(field: FieldInfo) -> str:
    parts = []
    for item in field.metadata:
        for kind, attribute, symbol in _BOUND_SYMBOLS:
            if isinstance(item, kind):
                parts.append(f"{symbol} {_literal(getattr(item, attribute))}")
        pattern = getattr(item, "pattern", None)
        if isinstance(pattern, str):
            parts.append(f"matching `{pattern}`")
    return ", ".join(parts)


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value:,}".replace(",", " ") if abs(value) >= 10_000 else str(value)
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, enum.Enum):
        return str(value.value)
    return str(value)


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        made = field.default_factory()  # type: ignore[call-arg]
        return f"`{json.dumps(made)}`" if isinstance(made, list | dict) else "–"
    value = field.default
    if value is None or value is PydanticUndefined:
        return "–"
    return f"`{_literal(value)}`"


def config_keys(model: type[BaseModel] = Config, prefix: str = "") -> Iterator[ConfigKey]:
    """Every leaf key of ``model``, sections and list items walked (``queries[].name``)."""
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        annotation, optional = _without_none(field.annotation)
        if _is_model(annotation):
            yield from config_keys(annotation, f"{path}.")
            continue
        if typing.get_origin(annotation) is list and _is_model(typing.get_args(annotation)[0]):
            yield from config_keys(typing.get_args(annotation)[0], f"{path}[].")
            continue
        type_name = _type_name(annotation)
        constraints = _constraints(field)
        if constraints:
            type_name = f"{type_name} ({constraints})"
        if optional:
            type_name = f"{type_name}, optional"
        yield ConfigKey(path, type_name, _default(field), field.description or "")


def _escape_cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def configuration_reference(notes: Mapping[str, Mapping[str, str] | str]) -> str:
    """The configuration reference as Markdown: one table per section.

    ``notes`` maps a key (``kafka.group_id``, ``queries[].keys``) to extra text, or to a
    mapping with ``text`` and, for defaults that follow other keys, ``default`` (shown in
    place of the model's literal default, which is the default group id's)."""
    keys = list(config_keys())
    known = {k.path for k in keys}
    unknown = sorted(set(notes) - known)
    if unknown:
        raise ReferenceError(
            f"configuration notes name keys the model does not have: {', '.join(unknown)}; "
            "rename or remove them in docs/hooks/configuration-notes.yaml"
        )
    undocumented = [k.path for k in keys if not k.description and k.path not in notes]
    if undocumented:
        raise ReferenceError(
            f"configuration keys without a description or a note: {', '.join(undocumented)}; "
            "add a Field(description=...) or a note in docs/hooks/configuration-notes.yaml"
        )
    out: list[str] = []
    section = None
    for key in keys:
        head = key.path.split(".")[0]
        if head != section:
            section = head
            out += ["", f"### `{head}` {{#{_anchor(head)}}}", ""]
            out += ["| key | type | default | meaning |", "|---|---|---|---|"]
        note = notes.get(key.path, "")
        default = key.default
        if isinstance(note, Mapping):
            default = note.get("default", default)
            note = note.get("text", "")
        meaning = _sentences(key.description, note)
        out.append(
            f"| `{key.path}` | {_escape_cell(key.type)} | {_escape_cell(default)} | "
            f"{_escape_cell(meaning)} |"
        )
    return "\n".join(out).strip() + "\n"


def _sentences(*parts: str) -> str:
    """Parts joined as sentences: each capitalised and ended with a full stop."""
    out = []
    for part in parts:
        part = " ".join(part.split())
        if not part:
            continue
        part = part[0].upper() + part[1:]
        out.append(part if part.endswith((".", ")", "!", "?")) else f"{part}.")
    return " ".join(out)


def _anchor(section: str) -> str:
    return f"config-{section.replace('_', '-')}"


def fingerprint_reference() -> str:
    """The classification of every key as Markdown: one table row per role and reason,
    naming the keys it covers, the fingerprint's first."""
    groups: dict[tuple[Role, str], list[str]] = {}
    for path, setting in SETTINGS.items():
        groups.setdefault((setting.role, setting.reason), []).append(path)
    order = list(Role)
    out = ["| keys | fingerprint | why |", "|---|---|---|"]
    for (role, reason), paths in sorted(groups.items(), key=lambda g: order.index(g[0][0])):
        keys = ", ".join(f"`{p}`" for p in paths)
        out.append(f"| {keys} | {role.value} | {_escape_cell(_sentences(reason))} |")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------- metrics


def _wrappers(owner: object) -> list[MetricWrapperBase]:
    return [v for v in vars(owner).values() if isinstance(v, MetricWrapperBase)]


def _metric_rows(owner: object, registry: CollectorRegistry) -> list[str]:
    # prometheus_client keeps a metric's name and label names on the wrapper only.
    labels_of = {w._name: tuple(w._labelnames) for w in _wrappers(owner)}
    rows = []
    for family in registry.collect():
        if family.name not in labels_of:
            continue  # process_* and other collectors: documented in the prose
        shown = {
            "counter": f"{family.name}_total",
            "info": f"{family.name}_info",
        }.get(family.type, family.name)
        labels = labels_of[family.name]
        values: dict[str, set[str]] = {label: set() for label in labels}
        for sample in family.samples:
            for label, value in sample.labels.items():
                if label in values:
                    values[label].add(value)
        label_text = ", ".join(f"`{label}`" for label in labels) or "–"
        preset = [
            f"`{label}`: " + ", ".join(f"`{v}`" for v in sorted(found))
            for label, found in values.items()
            if found and label == "reason"
        ]
        help_text = family.documentation
        if preset:
            help_text += " Series from the start: " + "; ".join(preset) + "."
        rows.append(f"| `{shown}` | {family.type} | {label_text} | {_escape_cell(help_text)} |")
    return rows


def metrics_reference(which: Literal["worker", "sink"]) -> str:
    """The metrics of the worker (``stream-dp run``) or of the sink (``stream-dp sink``) as a
    Markdown table, read from a fresh registry of each."""
    owner: Metrics | SinkMetrics = (
        Metrics(reasons=REASONS, process=False) if which == "worker" else SinkMetrics()
    )
    rows = _metric_rows(owner, owner.registry)
    head = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    return "\n".join([*head, *rows]) + "\n"
