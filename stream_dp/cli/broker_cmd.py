"""``stream-dp broker``: the embedded Kafka-protocol broker in the foreground."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType
from typing import Any

from stream_dp.broker import EmbeddedBroker

_DESCRIPTION = """\
Run the bundled Kafka-protocol broker (Tansu) on 127.0.0.1 until Ctrl-C or SIGTERM.
Prints "bootstrap: 127.0.0.1:PORT" once it answers requests; point
kafka.bootstrap_servers at that address. Clients tested against it: aiokafka (stream-dp
itself) and confluent-kafka's wheels (librdkafka 2.16); Debian's kcat (librdkafka 2.0.2)
fails at its first request (ApiVersions), so use a recent librdkafka or Apache Kafka for
other clients.

Everything is kept in memory: topics and records vanish when the broker stops. For
development and tests only; production runs Apache Kafka."""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "broker",
        help="run the embedded Kafka-protocol broker in the foreground",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--port",
        type=int,
        default=None,
        metavar="N",
        help="TCP port to listen on (default: a free port)",
    )
    parser.add_argument(
        "--startup-timeout-s",
        type=float,
        default=30.0,
        metavar="S",
        help="give up if the broker does not answer within S seconds (default: 30)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.port is not None and not 0 < args.port < 65536:
        print(f"stream-dp broker: error: --port {args.port}: use 1-65535", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with EmbeddedBroker(args.port, startup_timeout_s=args.startup_timeout_s) as broker:
            print(f"bootstrap: {broker.bootstrap_servers}", flush=True)
            print(
                f"broker pid {broker.pid}; topics are kept in memory; Ctrl-C stops it",
                file=sys.stderr,
                flush=True,
            )
            while not stop.wait(0.5):
                broker.check_alive()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
