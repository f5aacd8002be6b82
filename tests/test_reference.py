"""The generated references of the docs site (stream_dp/reference.py): the configuration
reference walks the pydantic model and refuses notes that no longer match it; the metrics
reference lists every metric of the worker's and the sink's registries."""

from __future__ import annotations

import datetime
import importlib.util
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml
from prometheus_client import CollectorRegistry
from pydantic import BaseModel, Field

from stream_dp.ops.metrics import Metrics
from stream_dp.reference import (
    ConfigKey,
    ReferenceError,
    config_keys,
    configuration_reference,
    metrics_reference,
)
from stream_dp.sink.metrics import SinkMetrics

ROOT = Path(__file__).resolve().parents[1]
NOTES = ROOT / "docs" / "hooks" / "configuration-notes.yaml"


class _Inner(BaseModel):
    rate_s: float = Field(2.5, gt=0, description="seconds between two ticks")


class _Item(BaseModel):
    name: str = Field(pattern=r"^[a-z]+$")
    mode: Literal["a", "b"] = "a"


class _Root(BaseModel):
    inner: _Inner = Field(default_factory=_Inner)
    items: list[_Item]
    start_at: datetime.datetime | None = None
    size: int = Field(10, ge=1, le=20_000)


def test_keys_types_and_defaults_come_from_the_model() -> None:
    assert list(config_keys(_Root)) == [
        ConfigKey("inner.rate_s", "number (> 0)", "`2.5`", "seconds between two ticks"),
        ConfigKey("items[].name", "string (matching `^[a-z]+$`)", "required", ""),
        ConfigKey("items[].mode", "`a` | `b`", "`a`", ""),
        ConfigKey("start_at", "timestamp with UTC offset, optional", "–", ""),
        ConfigKey("size", "integer (≥ 1, ≤ 20 000)", "`10`", ""),
    ]


def _rows(markdown: str) -> dict[str, str]:
    return {m.group(1): m.group(0) for m in re.finditer(r"^\| `([^`]+)` \|.*$", markdown, re.M)}


def test_the_real_configuration_reference_has_every_section_and_known_keys() -> None:
    notes = yaml.safe_load(NOTES.read_text(encoding="utf-8"))
    rows = _rows(configuration_reference(notes))
    assert set(rows) == {key.path for key in config_keys()}
    assert "`3600`" in rows["window.size_s"]
    assert "≤ 1 000 000" in rows["privacy.horizon_windows"]
    assert "required" in rows["queries[].epsilon"]
    assert "`<kafka.group_id>.ledger`" in rows["output.ledger_topic"]  # a note's default
    for key in ("kafka.bootstrap_servers", "bounds.auto.cap.max_keys_per_user", "erasure.enabled"):
        assert key in rows


def test_a_note_for_a_key_the_model_lacks_fails_the_build() -> None:
    notes = yaml.safe_load(NOTES.read_text(encoding="utf-8"))
    notes["window.size_seconds"] = "renamed long ago"
    with pytest.raises(ReferenceError, match=r"window\.size_seconds"):
        configuration_reference(notes)


def test_a_key_without_description_or_note_fails_the_build() -> None:
    notes = yaml.safe_load(NOTES.read_text(encoding="utf-8"))
    del notes["kafka.group_id"]  # the model gives it no description
    with pytest.raises(ReferenceError, match=r"without a description or a note: kafka\.group_id;"):
        configuration_reference(notes)


@pytest.mark.parametrize(
    ("which", "registry"),
    [("worker", lambda: Metrics(process=False).registry), ("sink", lambda: SinkMetrics().registry)],
)
def test_metrics_reference_lists_every_metric_of_the_registry(
    which: Literal["worker", "sink"], registry: Callable[[], CollectorRegistry]
) -> None:
    table = metrics_reference(which)
    shown = set(re.findall(r"^\| `([a-z_]+)` \|", table, re.M))
    expected = set()
    for family in registry().collect():
        suffix = {"counter": "_total", "info": "_info"}.get(family.type, "")
        expected.add(family.name + suffix)
    assert shown == expected
    assert len(shown) >= (30 if which == "worker" else 12)


def test_metrics_reference_shows_the_reasons_that_exist_from_the_start() -> None:
    table = metrics_reference("worker")
    (row,) = [line for line in table.splitlines() if "stream_dp_partials_ignored_total" in line]
    for reason in ("duplicate_version", "bounds_mismatch", "erasure_stale"):
        assert f"`{reason}`" in row


def _site_hooks() -> Any:
    spec = importlib.util.spec_from_file_location("site_hooks", ROOT / "docs" / "hooks" / "site.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generated_blocks_committed_in_the_pages_are_current() -> None:
    """A page read without a build (a repository browser) shows the generated references
    whole, and true: each committed block is what a build renders now (refresh them with
    `make docs-refs`)."""
    hooks = _site_hooks()
    pages = sorted((ROOT / "docs").glob("*.md"))
    blocks = 0
    for page in pages:
        text = page.read_text(encoding="utf-8")
        blocks += len(hooks.GENERATED.findall(text))
        assert hooks.refresh(text) == text, f"{page.name} is stale: run `make docs-refs`"
    assert blocks == 4  # configuration, fingerprint, the worker's and the sink's metrics
    stale = "<!-- generated: metrics sink -->\nold\n<!-- end generated -->"
    assert hooks.refresh(stale) != stale
    with pytest.raises(hooks.PluginError):
        hooks.refresh("<!-- generated: metrics sink -->\nno end")


def test_the_statistic_enums_of_the_committed_schemas_are_generated_from_the_registry() -> None:
    """Each schema's statistic enum is what `make docs-refs` writes from the statistics
    registry; a schema missing a registered statistic is stale and rewritten whole."""
    from stream_dp.privacy.statistics import STATISTICS

    hooks = _site_hooks()
    assert set(hooks.SCHEMA_ENUMS) == {
        "stream_dp/privacy/plan.schema.json",
        "topics/release.schema.json",
    }
    for relative, keys in hooks.SCHEMA_ENUMS.items():
        text = (ROOT / relative).read_text(encoding="utf-8")
        assert hooks.refresh_schema(text, keys) == text, f"{relative} is stale: make docs-refs"
        last = list(STATISTICS)[-1]
        stale = re.sub(rf',\s*"{last}"', "", text, count=1)
        assert stale != text
        assert hooks.refresh_schema(stale, keys) == text
    with pytest.raises(hooks.PluginError, match="no single statistic enum"):
        hooks.refresh_schema('{"properties": {}}', ("properties", "statistic"))


def test_the_mechanism_enums_of_the_committed_schemas_are_generated() -> None:
    """What a release record and a plan name as ``mechanism`` (the additive noises and the
    statistics' own, a quantile's ``exponential``) is what `make docs-refs` writes; a
    schema missing one is stale and rewritten whole."""
    from stream_dp.privacy.statistics import STATED_MECHANISMS

    hooks = _site_hooks()
    assert STATED_MECHANISMS == ["discrete_laplace", "discrete_gaussian", "exponential"]
    assert set(hooks.MECHANISM_ENUMS) == {
        "stream_dp/privacy/plan.schema.json",
        "topics/release.schema.json",
    }
    for relative, keys in hooks.MECHANISM_ENUMS.items():
        text = (ROOT / relative).read_text(encoding="utf-8")
        assert hooks.refresh_schema(text, keys, STATED_MECHANISMS) == text, f"{relative}: stale"
        stale = re.sub(r',\s*"exponential"', "", text, count=1)
        assert stale != text
        assert hooks.refresh_schema(stale, keys, STATED_MECHANISMS) == text
    with pytest.raises(hooks.PluginError, match="no single mechanism enum"):
        hooks.refresh_schema('{"properties": {}}', ("properties", "mechanism"), ["x"])
