"""The JSON Schemas of the records on stream-dp's topics (``topics/*.schema.json``), bundled
for consumers in any language.

Each schema file has a stable ``$id`` URN, ``urn:stream-dp:schema:v1:<name>`` (not a URL: it
names the schema, nothing is served there), and refers to another only by that ``$id``.
:func:`bundled_schema` returns one self-contained JSON Schema (draft 2020-12): every schema it
refers to, directly or through another, is embedded under ``$defs`` with its ``$id`` kept (a
2020-12 *compound schema document*), so any validator resolves every ``$ref`` without a
registry, a resolver or a network.

The added-fields policy: a new *optional* field may appear in any record without a
``schema_version`` bump, so consumers must ignore fields they do not know. The bundled form
is therefore *open* by default (no ``additionalProperties: false``); ``strict=True`` keeps the
files as they are, closed to exactly the fields this version writes (what the project's own
tests check). Removing, renaming or retyping a field, changing its meaning, or a new ``kind``
bumps ``schema_version`` (and the ``v1`` of the ``$id``s).
"""

from __future__ import annotations

import copy
import difflib
import json
from importlib.resources.abc import Traversable
from typing import Any, Final

from stream_dp.broker.topics import default_topics_dir
from stream_dp.errors import ConfigError

#: The prefix of every schema's ``$id``; the name follows.
SCHEMA_ID_PREFIX: Final = "urn:stream-dp:schema:v1:"
_SUFFIX: Final = ".schema.json"


def schema_names(folder: Traversable | None = None) -> list[str]:
    """The names of the record schemas (``output``, ``release``, …), sorted."""
    where = folder if folder is not None else default_topics_dir()
    return sorted(f.name.removesuffix(_SUFFIX) for f in where.iterdir() if f.name.endswith(_SUFFIX))


def load_schema(name: str, folder: Traversable | None = None) -> dict[str, Any]:
    """The schema file of ``name`` as it is (ConfigError naming the known ones if unknown)."""
    where = folder if folder is not None else default_topics_dir()
    names = schema_names(where)
    if name not in names:
        close = difflib.get_close_matches(name, names, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(
            f"no record schema named {name!r}; {hint}the schemas are: {', '.join(names)} "
            "(`stream-dp schema --list`)"
        )
    loaded = json.loads(where.joinpath(name + _SUFFIX).read_text(encoding="utf-8"))
    if not isinstance(loaded, dict):
        raise ConfigError(f"schema file {name}{_SUFFIX} is not a JSON object")
    return loaded


def _refs(node: Any) -> list[str]:
    """Every ``$ref`` in ``node`` that points at another schema (not a local ``#…``)."""
    found: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str) and not value.startswith("#"):
                found.append(value)
            else:
                found.extend(_refs(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(_refs(item))
    return found


def _open(node: Any) -> Any:
    """``node`` without ``additionalProperties: false`` anywhere (added fields allowed)."""
    if isinstance(node, dict):
        return {
            k: _open(v) for k, v in node.items() if not (k == "additionalProperties" and v is False)
        }
    if isinstance(node, list):
        return [_open(v) for v in node]
    return node


def bundled_schema(
    name: str, *, strict: bool = False, folder: Traversable | None = None
) -> dict[str, Any]:
    """The schema of ``name`` with every schema it refers to embedded under ``$defs``:
    self-contained. Open to added fields unless ``strict`` (see the module docstring)."""
    root = copy.deepcopy(load_schema(name, folder))
    embedded: dict[str, dict[str, Any]] = {}
    pending = _refs(root)
    while pending:
        ref = pending.pop()
        if not ref.startswith(SCHEMA_ID_PREFIX):
            raise ConfigError(
                f"schema {name}: $ref {ref!r} is neither local (#…) nor a stream-dp schema "
                f"id ({SCHEMA_ID_PREFIX}<name>); refer to other schemas by their $id"
            )
        target = ref.removeprefix(SCHEMA_ID_PREFIX)
        if target in embedded or target == name:
            continue
        schema = load_schema(target, folder)
        if schema.get("$id") != ref:
            raise ConfigError(f"schema {target}{_SUFFIX}: its $id is not {ref!r}")
        schema.pop("$schema", None)  # the document's dialect applies to it
        embedded[target] = schema
        pending.extend(_refs(schema))
    defs = root.setdefault("$defs", {})
    for target, schema in sorted(embedded.items()):
        key = f"stream-dp:{target}"
        if key in defs:
            raise ConfigError(f"schema {name}: $defs already has {key!r}")
        defs[key] = schema
    return root if strict else dict(_open(root))
