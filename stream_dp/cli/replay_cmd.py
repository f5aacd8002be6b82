"""``stream-dp replay --config FILE --input EVENTS.jsonl [--json]``.

Prints what the worker would publish: release and window records, and (``--json``) the
dead-letter record of every bad line, with its reason. A file none of whose lines is a usable
event (binary garbage, the wrong format) is a failure, exit code 1: a replay that releases
nothing because nothing could be read must not look like success. Some bad lines among good
ones are normal input, as for the worker: counted by reason, exit code 0.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from stream_dp.config import load_config
from stream_dp.errors import StreamDPError
from stream_dp.pipeline.ingest import DeadLetter
from stream_dp.pipeline.keys import load_keyring
from stream_dp.pipeline.replay import Replay, dead_letter_values, replay_file


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


def _reasons(dead: list[DeadLetter]) -> str:
    return ", ".join(
        f"{reason} ×{n}" for reason, n in Counter(d.reason for d in dead).most_common()
    )


def _check_usable(path: Path, replay: Replay) -> None:
    if replay.dead and replay.usable == 0:
        raise StreamDPError(
            f"no line of {path} is a usable event ({len(replay.dead)} bad: "
            f"{_reasons(replay.dead)}); "
            "replay reads JSON lines, one event object per line, with the config's "
            "input.user_field and input.time_field"
        )


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    keyring = load_keyring(config.pseudonymization)
    replay = replay_file(config, keyring, args.input)
    releases, dead = replay.releases, replay.dead
    out = sys.stdout
    if args.json:
        for rel in releases:
            for rec in rel.records:
                out.write(orjson.dumps(rec.value, option=orjson.OPT_SORT_KEYS).decode() + "\n")
        for value in dead_letter_values(dead):
            out.write(orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode() + "\n")
        out.flush()
        _check_usable(args.input, replay)
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
        out.write(
            f"\n{len(dead)} bad records, not released: {_reasons(dead)} (--json prints each "
            "with its line number and detail)\n"
        )
    out.flush()
    _check_usable(args.input, replay)
    return 0
