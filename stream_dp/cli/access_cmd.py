"""``stream-dp access --config FILE --user-id ID [--json]``: the right of access
(docs/records.md).

What the deployment holds about one person right now — their pseudonym per key, the events
held in windows not yet released (per window and per query), the erasures recorded for them
and the partner exports that carried their events, under which partner pseudonyms — and
nothing about anyone else. The request is recorded on ``output.access_log_topic`` (request id, time,
pseudonyms; never the raw id) before the answer is printed; if it cannot be recorded, nothing
is answered (exit 1). ``--user-id -`` reads the id from standard input (a command line shows
in ``ps``).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import orjson

from stream_dp.cli._common import add_config_option, running_broker
from stream_dp.cli.erase_cmd import _user_id
from stream_dp.config import load_config
from stream_dp.errors import ConfigError
from stream_dp.pipeline.duties.access_request import answer_access
from stream_dp.pipeline.formats.erasure_records import new_request_id
from stream_dp.pipeline.stages.keys import load_keyring


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "access",
        help="what the deployment holds about one person (the right of access)",
        description="Report what the deployment holds about one user id right now: the "
        "pseudonym under each key held, the events of the user in windows not yet released "
        "(per window and per query whose filter they pass), the erasures recorded and the "
        "exports that carried the user's events. Nothing about anyone else. The request is "
        "recorded on output.access_log_topic (request id, time, pseudonyms: never the raw "
        "id) before the answer is printed.",
    )
    add_config_option(p)
    p.add_argument(
        "--user-id",
        required=True,
        help="the user id as events carry it (normalised as input.user_id_normalization "
        'says); "-" reads it from standard input',
    )
    p.add_argument("--request-id", help="your id of the request (default: a fresh random id)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--bootstrap-servers", metavar="HOST:PORT", help="override kafka.bootstrap_servers"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    bootstrap = running_broker(config, args.bootstrap_servers, "access")
    request_id = args.request_id or new_request_id()
    if not 0 < len(request_id) <= 200:
        raise ConfigError("--request-id must be 1..200 characters")
    keyring = load_keyring(config.pseudonymization)
    answer = asyncio.run(
        answer_access(
            config,
            keyring,
            _user_id(args.user_id),
            request_id=request_id,
            bootstrap_servers=bootstrap,
            now_s=time.time(),
        )
    )
    if args.json:
        print(orjson.dumps(answer, option=orjson.OPT_INDENT_2).decode())
    else:
        print(describe(answer))
    return 0


def _exports_lines(exports: list[dict[str, Any]]) -> list[str]:
    if not exports:
        return ["Exports: none of your events were exported (no partner export exists)."]
    lines = []
    for e in exports:
        names = ", ".join(f"{p} (key {k})" for k, p in e["pseudonyms"].items())
        carried = ", ".join(f"{w['window_start']} ({w['records']})" for w in e["windows"])
        lines.append(
            f"Export to {e['export']} (topic {e['topic']}), where you are {names}: "
            + (f"your events in windows {carried}." if carried else "none of your events.")
        )
        for r in e["erasure_records"]:
            lines.append(f"  erasure record sent at {r['erased_at']} (key {r['key_id']})")
    return lines


def describe(answer: dict[str, Any]) -> str:
    """The answer as text a person can read."""
    lines = [
        f"Access request {answer['request_id']}, answered at {answer['answered_at']}",
        "",
        "Pseudonyms (what the service knows you by; the raw id is never stored):",
        *(f"  key {k}: {p}" for k, p in answer["pseudonyms"].items()),
        "",
    ]
    windows = answer["open_windows"]
    if windows:
        lines.append("Your events held in windows not yet released:")
        for w in windows:
            per_query = ", ".join(f"{q}: {n}" for q, n in w["queries"].items()) or "none"
            lines.append(
                f"  {w['window_start']} to {w['window_end']}: {w['events']} events "
                f"(counted by queries {per_query})"
            )
    else:
        lines.append("No events of yours are held in windows not yet released.")
    erasure = answer["erasure"]
    lines.append("")
    if not erasure["enabled"]:
        lines.append("Erasure: not enabled in this deployment.")
    elif erasure["recorded"]:
        for e in erasure["recorded"]:
            lines.append(
                f"Erasure recorded at {e['recorded_at']}: windows before {e['expires_at']} "
                "not yet released are released without your events."
            )
    else:
        lines.append("Erasure: none recorded.")
    lines.extend(_exports_lines(answer["exports"]))
    scanned = answer["scanned"]
    lines.append(
        f"Read: topic {scanned['input_topic']}, partitions "
        f"{', '.join(map(str, scanned['partitions'])) or 'none'}, from the start."
    )
    return "\n".join(lines)
