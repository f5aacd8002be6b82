"""``stream-dp examples DIR``: write the example configuration and sample events to start from.

They ship inside the package (``stream_dp/examples``, read with importlib.resources), so an
installed wheel has them as well as a clone: ``browser-logs.yaml``, a complete commented
configuration with hourly windows for recorded files, ``browser-logs-live.yaml``, the same
with one-minute windows for a live topic, and ``sample-events.jsonl``, synthetic browser
logs for ``replay``.
"""

from __future__ import annotations

import argparse
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from stream_dp.errors import ConfigError

EXAMPLE_FILES = ("browser-logs.yaml", "browser-logs-live.yaml", "sample-events.jsonl")


def examples_dir() -> Traversable:
    """The examples shipped in the package."""
    return resources.files("stream_dp").joinpath("examples")


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "examples",
        help="write example configurations (replay and live) and sample events into a folder",
        description="Write browser-logs.yaml (a complete, commented configuration with hourly "
        "windows, for replaying recorded files), browser-logs-live.yaml (the same with "
        "one-minute windows, for a live topic) and sample-events.jsonl (synthetic browser logs "
        "for `stream-dp replay`) into DIR, creating it. Existing files are left alone unless "
        "--force.",
    )
    p.add_argument("dir", type=Path, metavar="DIR", help="folder to write them into")
    p.add_argument("--force", action="store_true", help="overwrite files that differ")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    target: Path = args.dir
    if target.exists() and not target.is_dir():
        raise ConfigError(f"{target} exists and is not a folder; choose another DIR")
    source = examples_dir()
    contents = {name: source.joinpath(name).read_bytes() for name in EXAMPLE_FILES}
    clashes = [
        name
        for name, data in contents.items()
        if (target / name).exists() and (target / name).read_bytes() != data
    ]
    if clashes and not args.force:
        raise ConfigError(
            f"{', '.join(str(target / n) for n in clashes)} already exist with other content; "
            "choose another DIR, or pass --force to overwrite them"
        )
    target.mkdir(parents=True, exist_ok=True)
    for name, data in contents.items():
        path = target / name
        state = "unchanged" if path.exists() and path.read_bytes() == data else "wrote"
        if state == "wrote":
            path.write_bytes(data)
        print(f"{state}: {path}")
    return 0
