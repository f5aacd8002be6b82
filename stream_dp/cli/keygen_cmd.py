"""``stream-dp keygen``: print a fresh pseudonym key (32 random bytes from the OS CSPRNG).

Hex by default (64 digits), ``--base64`` for the shorter form; either is what
``pseudonymization.key_env`` / ``key_file`` expect and passes the key check at start.
Nothing is stored or logged: the key goes to stdout only.
"""

from __future__ import annotations

import argparse
import base64
import secrets
import sys
from typing import Any

from stream_dp.privacy.key_strength import MIN_KEY_ENTROPY_BYTES, key_problem


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "keygen",
        help="print a fresh random pseudonym key (32 bytes as hex)",
        description="Print a fresh pseudonym key: 32 random bytes from the operating "
        "system's CSPRNG, as hex (default) or base64. Use it as STREAM_DP_PSEUDONYM_KEY "
        "(e.g. `export STREAM_DP_PSEUDONYM_KEY=$(stream-dp keygen)`) or write it to the "
        "pseudonymization.key_file; keep it secret and keep it: a new key makes new "
        "pseudonyms.",
    )
    parser.add_argument("--base64", action="store_true", help="print base64 instead of hex")
    parser.set_defaults(func=run)


def new_key(*, as_base64: bool = False) -> str:
    """32 random bytes as hex or base64, redrawn in the (< 1e-12) case the key check would
    refuse them, so that a printed key is always accepted."""
    while True:
        raw = secrets.token_bytes(MIN_KEY_ENTROPY_BYTES)
        text = base64.b64encode(raw).decode("ascii") if as_base64 else raw.hex()
        if key_problem(text.encode("ascii")) is None:
            return text


def run(args: argparse.Namespace) -> int:
    sys.stdout.write(new_key(as_base64=args.base64) + "\n")
    return 0
