"""``stream-dp replay --config FILE --input EVENTS.jsonl [--ledger FILE] [--erasures FILE]
[--json]``.

Prints what the worker would publish: release and window records, and (``--json``) the
dead-letter record of every bad line, with its reason, then a summary record. A file none
of whose lines is a usable event (binary garbage, the wrong format) is a failure, exit
code 1: a replay that releases nothing because nothing could be read must not look like
success. Some bad lines among good ones are normal input, as for the worker: counted by
reason, exit code 0.

Every run without ``--ledger`` is a fresh, independent release (new noise, its own budget);
the summary and the text output say so.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from stream_dp.cli._common import add_config_option
from stream_dp.config import load_config
from stream_dp.errors import StreamDPError
from stream_dp.pipeline.local.replay import ReplayResult, dead_letter_values, replay_file
from stream_dp.pipeline.stages.ingest import DeadLetter
from stream_dp.pipeline.stages.keys import load_keyring
from stream_dp.windows.tumbling import iso_utc


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "replay",
        help="run the pipeline offline on a JSON-lines file and print what it would publish",
        description="Decode, pseudonymize, window, bound and release the events of a file "
        "exactly as the worker would, without Kafka. Prints the release and window records. "
        "Every run without --ledger is a fresh, independent release: it draws new noise and "
        "spends its own privacy budget (two shared runs over one file cost twice the ε). "
        "With --ledger FILE, windows already in the ledger file are reprinted with their "
        "recorded values, never drawn again, and new draws are appended to it.",
    )
    add_config_option(p)
    p.add_argument("--input", required=True, type=Path, help="events, one JSON object per line")
    p.add_argument(
        "--ledger",
        type=Path,
        help="ledger file (JSON lines; created if missing): one noise draw per window across runs",
    )
    p.add_argument(
        "--erasures",
        type=Path,
        help="erasure requests (JSON lines of {user_id, requested_at, request_id}): each "
        "removes its user from every window released after requested_at (docs/erasure.md)",
    )
    p.add_argument("--json", action="store_true", help="one JSON record per line")
    p.set_defaults(func=run)


def _reasons(dead: list[DeadLetter]) -> str:
    return ", ".join(
        f"{reason} ×{n}" for reason, n in Counter(d.reason for d in dead).most_common()
    )


def _check_usable(path: Path, result: ReplayResult) -> None:
    if result.dead and result.usable == 0:
        raise StreamDPError(
            f"no line of {path} is a usable event ({len(result.dead)} bad: "
            f"{_reasons(result.dead)}); "
            "replay reads JSON lines, one event object per line, with the config's "
            "input.user_field and input.time_field"
        )


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    keyring = load_keyring(config.pseudonymization)
    result = replay_file(
        config, keyring, args.input, ledger_path=args.ledger, erasures_path=args.erasures
    )
    out = sys.stdout
    if args.json:
        for rel in result.releases:
            for rec in rel.records:
                out.write(orjson.dumps(rec.value, option=orjson.OPT_SORT_KEYS).decode() + "\n")
        for value in dead_letter_values(result.dead):
            out.write(orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode() + "\n")
        for value in result.erasure_responses:
            out.write(orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode() + "\n")
        summary = {
            "kind": "replay_summary",
            "ledger": None if args.ledger is None else str(args.ledger),
            "releases_drawn": result.drawn,
            "releases_from_ledger": result.from_ledger,
            "first_window_start": (
                None if result.coverage_start_s is None else iso_utc(result.coverage_start_s)
            ),
            "bad_records": len(result.dead),
            "notes": result.notes,
        }
        out.write(orjson.dumps(summary, option=orjson.OPT_SORT_KEYS).decode() + "\n")
        out.flush()
        _check_usable(args.input, result)
        return 0
    for rel in result.releases:
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
    out.write(
        f"\n{result.drawn} releases drawn now"
        + (f", {result.from_ledger} reprinted from {args.ledger}" if args.ledger else "")
        + "\n"
    )
    for note in result.notes:
        out.write(f"note: {note}\n")
    for response in result.erasure_responses:
        released = response["released_windows_not_recomputed"]
        affected = response["open_windows_affected"]
        out.write(
            f"erasure {response['request_id']}: windows {affected['from']} … {affected['until']} "
            f"released without the user; {released['from']} … {released['until']} released "
            "before the request, not recomputed\n"
        )
    if result.dead:
        out.write(
            f"\n{len(result.dead)} bad records, not released: {_reasons(result.dead)} (--json "
            "prints each with its line number and detail)\n"
        )
    out.flush()
    _check_usable(args.input, result)
    return 0
