"""Helpers shared by tests: config merging, record schemas, waiting for processes."""

from __future__ import annotations

import json
import os
import select
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import IO, Any, Protocol

from jsonschema import Draft202012Validator
from referencing import Registry, Resource

#: The topic definitions and JSON Schemas (package data of stream_dp).
TOPICS_DIR = Path(__file__).resolve().parents[1] / "topics"

#: ``await topic_factory(partitions=1, *, config=None, prefix="test") -> name``
TopicFactory = Callable[..., Awaitable[str]]
#: ``group_id_factory() -> group id``
GroupIdFactory = Callable[[], str]


class ConfigFactory(Protocol):
    """``config_factory(overrides=None) -> path of a YAML config file``"""

    def __call__(self, overrides: Mapping[str, Any] | None = None) -> Path: ...


def deep_merge(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A new dict: ``overrides`` merged into ``base``; dicts merge recursively, anything else
    (lists included) is replaced. Neither argument is modified."""
    out: dict[str, Any] = {k: _copy(v) for k, v in base.items()}
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = _copy(value)
    return out


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def schema_registry(topics_dir: Path = TOPICS_DIR) -> Registry:
    """Every ``*.schema.json`` of ``topics/``, registered under its file name and its ``$id``
    (the ``$ref``s between the files are relative file names, resolved against the ``$id``)."""
    resources = []
    for path in sorted(topics_dir.glob("*.schema.json")):
        resource = Resource.from_contents(json.loads(path.read_text(encoding="utf-8")))
        resources.append((path.name, resource))
        if resource.id() is not None:
            resources.append((str(resource.id()), resource))
    return Registry().with_resources(resources)


def schema_validator(schema_file: str, topics_dir: Path = TOPICS_DIR) -> Draft202012Validator:
    """A validator for records of ``topics/<schema_file>``, e.g. ``"release.schema.json"``.

    ``schema_validator("output.schema.json").validate(record)`` raises on an invalid record.
    """
    registry = schema_registry(topics_dir)
    schema = registry.contents(schema_file)
    return Draft202012Validator({"$ref": schema_file, **_dialect(schema)}, registry=registry)


def _dialect(schema: Any) -> dict[str, Any]:
    return {"$schema": schema["$schema"]} if "$schema" in schema else {}


def process_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (missing, or a zombie waiting to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    state = stat.rsplit(")", 1)[1].split()[0]
    return state in ("Z", "X")


def wait_for_exit(pid: int, timeout_s: float) -> None:
    """Block until process ``pid`` (any process, not only a child) has exited; AssertionError
    after ``timeout_s``. Waits on a pidfd, which becomes readable when the process ends."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        ready, _, _ = select.select([fd], [], [], timeout_s)
    finally:
        os.close(fd)
    if not ready:
        raise AssertionError(f"process {pid} still runs after {timeout_s:g} s")


def tansu_pids(port: int) -> list[int]:
    """Pids of running Tansu processes listening on ``port`` (found by their command line)."""
    needle = f"tcp://127.0.0.1:{port}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if b"tansu" in cmdline and needle in cmdline and not process_gone(int(entry)):
            pids.append(int(entry))
    return pids


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``condition`` until it holds; AssertionError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        select.select([], [], [], min(0.02, remaining))  # poll interval within the deadline


def read_line(stream: IO[str], timeout_s: float) -> str:
    """The next line of a subprocess pipe; AssertionError if none arrives within ``timeout_s``."""
    ready, _, _ = select.select([stream], [], [], timeout_s)
    if not ready:
        raise AssertionError(f"no output line within {timeout_s:g} s")
    return stream.readline()
