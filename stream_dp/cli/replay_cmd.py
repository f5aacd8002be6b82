"""``stream-dp replay --config FILE --input EVENTS.jsonl [--json]``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson

from stream_dp.config import load_config
from stream_dp.pipeline.keys import load_keyring
from stream_dp.pipeline.replay import replay_file


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "replay",
        help="run the pipeline offline on a JSON-lines file and print what it would publish",
        description="Decode, pseudonymize, window, bound and release the events of a file "
        "exactly as the worker would, without Kafka. Prints the release and window records.",
    )
    p.add_argument("--config", required=True, type=Path, help="YAML configuration file")
    p.add_argument("--input", required=True, type=Path, help="events, one JSON object per line")
    p.add_argument("--json", action="store_true", help="one JSON record per line")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    keyring = load_keyring(config.pseudonymization)
    releases, dead = replay_file(config, keyring, args.input)
    out = sys.stdout
    if args.json:
        for rel in releases:
            for rec in rel.records:
                out.write(orjson.dumps(rec.value, option=orjson.OPT_SORT_KEYS).decode() + "\n")
        return 0
    for rel in releases:
        out.write(
            f"\n{rel.query}  window {rel.records[-1].value['window_start']}"
            f" … {rel.records[-1].value['window_end']}\n"
        )
        for rec in rel.records:
            v = rec.value
            if v["kind"] == "release":
                group = ", ".join(f"{k}={val}" for k, val in v["group"].items()) or "(all)"
                out.write(f"  {group:<40} {v['value']:>12}  ±{v['ci95']}\n")
            else:
                out.write(
                    f"  released keys {v['released_keys']}, ε spent {v['epsilon_spent']:g}, "
                    f"horizon ε {v['horizon_epsilon_spent']:g}\n"
                )
    if dead:
        out.write(f"\n{len(dead)} bad records (not released; see reasons with --json)\n")
    return 0
