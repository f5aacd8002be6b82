"""`stream-dp schema NAME`: the record schemas bundled for consumers in other languages —
self-contained (every `$ref` resolves inside the printed document), stable `$id`s, open to
added fields unless --strict. The worker's real output records are validated against the
printed schema in tests/integration/test_worker.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from stream_dp.broker.schemas import SCHEMA_ID_PREFIX, bundled_schema, schema_names
from stream_dp.errors import ConfigError
from tests.helpers import TOPICS_DIR

REPO = Path(__file__).resolve().parents[2]


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        own = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return own + [r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


def _stream_dp(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stream_dp.cli.main", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ.copy(),
    )


def test_every_schema_file_is_listed_and_has_a_stable_urn_id() -> None:
    files = sorted(p.name.removesuffix(".schema.json") for p in TOPICS_DIR.glob("*.schema.json"))
    assert schema_names() == files
    for path in TOPICS_DIR.glob("*.schema.json"):
        schema = json.loads(path.read_text(encoding="utf-8"))
        assert schema["$id"] == SCHEMA_ID_PREFIX + path.name.removesuffix(".schema.json")
        # other schemas only by $id: no relative file names left
        assert all(r.startswith(("#", SCHEMA_ID_PREFIX)) for r in _refs(schema)), path.name


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("name", schema_names())
def test_every_ref_resolves_inside_the_bundled_document(name: str, strict: bool) -> None:
    schema = bundled_schema(name, strict=strict)
    jsonschema.Draft202012Validator.check_schema(schema)
    # Only the document itself: the registry a validator builds from it, nothing loaded.
    registry: Registry[Any] = (
        Registry()
        .with_resource(
            schema["$id"], Resource.from_contents(schema, default_specification=DRAFT202012)
        )
        .crawl()
    )
    resolver = registry.resolver(base_uri=schema["$id"])
    embedded = {d["$id"]: d for d in schema.get("$defs", {}).values() if "$id" in d}
    for ref in _refs(schema):
        if ref.startswith("#"):
            continue  # local: resolved against its own (embedded) resource by the validator
        assert ref in embedded, f"{name}: {ref} is not bundled"
        assert resolver.lookup(ref).contents == embedded[ref]
    text = json.dumps(schema)
    assert "stream-dp.example" not in text
    if not strict:  # open to added fields everywhere (the added-fields policy)
        assert '"additionalProperties": false' not in text


def test_output_bundles_release_and_window_and_ledger_bundles_all_three() -> None:
    output = bundled_schema("output")
    assert set(output["$defs"]) == {"stream-dp:release", "stream-dp:window"}
    ledger = bundled_schema("ledger")
    assert {"stream-dp:output", "stream-dp:release", "stream-dp:window"} <= set(ledger["$defs"])


def test_the_release_schema_explains_negative_values_and_the_interval() -> None:
    release = bundled_schema("output")["$defs"]["stream-dp:release"]
    assert "negative" in release["properties"]["value"]["description"]
    assert "[value - ci95, value + ci95]" in release["properties"]["ci95"]["description"]


def test_cli_prints_lists_and_names_the_known_schemas() -> None:
    printed = _stream_dp("schema", "output")
    assert printed.returncode == 0, printed.stderr
    assert json.loads(printed.stdout) == bundled_schema("output")
    listed = _stream_dp("schema", "--list")
    assert listed.returncode == 0, listed.stderr
    assert [line.split(":")[0] for line in listed.stdout.splitlines()] == schema_names()
    typo = _stream_dp("schema", "outptu")
    assert typo.returncode == 2
    assert "no record schema named 'outptu'; did you mean 'output'?" in typo.stderr
    bare = _stream_dp("schema")
    assert bare.returncode == 2 and "--list" in bare.stderr


def test_unknown_name_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="schema --list"):
        bundled_schema("nope")
