"""``stream-dp schema NAME``: print the JSON Schema of a record, bundled and self-contained,
for consumers in any language (``stream-dp schema output``: the output topic's release and
window records). ``--list`` lists the names."""

from __future__ import annotations

import argparse
import json
from typing import Any

from stream_dp.broker.schemas import SCHEMA_ID_PREFIX, bundled_schema, load_schema, schema_names

_EPILOG = f"""\
Each schema is JSON Schema draft 2020-12 with a stable $id, {SCHEMA_ID_PREFIX}<name>; every
schema it refers to is embedded under $defs, so no resolver or network is needed. Consumers
must ignore fields they do not know: a new optional field may be added without a
schema_version bump, so the printed schema allows added fields; --strict prints it closed to
exactly the fields this version writes. See docs/topics.md, "The output contract"."""


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "schema",
        help="print the JSON Schema of a record (e.g. output), bundled and self-contained",
        description="Print the JSON Schema of the records of one topic, self-contained. "
        "`stream-dp schema output` covers the output topic (release and window records).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("name", nargs="?", metavar="NAME", help="the record schema (see --list)")
    p.add_argument("--list", action="store_true", help="list the schema names and titles")
    p.add_argument(
        "--strict",
        action="store_true",
        help="closed to the fields this version writes (default: added fields allowed)",
    )
    p.set_defaults(func=run, parser=p)


def run(args: argparse.Namespace) -> int:
    if args.list:
        for name in schema_names():
            print(f"{name}: {load_schema(name).get('title', '')}")
        return 0
    if not args.name:
        args.parser.error("give a schema NAME (e.g. output) or --list")
    print(json.dumps(bundled_schema(args.name, strict=args.strict), indent=2, ensure_ascii=False))
    return 0
