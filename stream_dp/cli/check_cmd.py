"""``stream-dp check --config FILE``: what a sample of the input topic says before the first run.

Reads at most ``--max-events`` of the newest events of ``input.topic`` (split over its
partitions) for at most ``--timeout`` seconds, without joining a consumer group or
committing anything, and decodes them with the worker's own decoder
(:mod:`stream_dp.pipeline.kafka.input_check`). Prints a table of the fields the configuration
names (records without them, JSON types), the windows the events fall in against the first
window a worker covers, and every problem at once with what to change: fields under another
name, values outside a key list, undecodable and late events. It prints counts, field names,
type names, window starts and the configuration's own key values only — never a user id or
a value of the sample. With partner exports (docs/exports.md) it also checks that each
export's topic exists.

Exit code 0 when no problem was found, 1 when some were (or the broker could not be
read), 2 for a bad configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from typing import Any

from stream_dp.cli._common import add_config_option, running_broker, text_table
from stream_dp.clients.connect import start_client, stop_client, topic_partitions
from stream_dp.config import Config, load_config
from stream_dp.errors import BrokerError, ConfigError
from stream_dp.kafka_client import AIOKafkaConsumer, TopicPartition
from stream_dp.kafka_client.client_options import client_kwargs
from stream_dp.kafka_client.errors import KafkaError
from stream_dp.kafka_client.fetch_errors import (
    classify_fetch_error,
    describe_fetch_error,
    principal_of,
)
from stream_dp.pipeline.kafka.input_check import InputReport, check_values
from stream_dp.windows.tumbling import iso_utc

DEFAULT_MAX_EVENTS = 1000
DEFAULT_TIMEOUT_S = 10.0


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "check",
        help="check a sample of the input topic against the config before the first run",
        description="Read a sample of the newest events of input.topic (no consumer group, "
        "nothing committed) and report, before the first run and all at once, every kind "
        "of event the worker would drop: events it could not use (bad timestamps, wrong "
        "types), user, time and group fields the events hold under another name (with the "
        "sample's names), values outside a query's key list (and those listed in another "
        "letter case), and events stamped before the first window the worker covers (set "
        "window.start_at for those). Prints counts and field names, never user ids or "
        "values. Exit code 1 when it found a problem.",
    )
    add_config_option(p)
    p.add_argument(
        "--max-events",
        type=int,
        default=DEFAULT_MAX_EVENTS,
        metavar="N",
        help=f"read at most N events (default {DEFAULT_MAX_EVENTS})",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"stop reading after this long (default {DEFAULT_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--bootstrap-servers", metavar="HOST:PORT", help="override kafka.bootstrap_servers"
    )
    p.set_defaults(func=run)


def newest_shares(sizes: dict[TopicPartition, int], total: int) -> dict[TopicPartition, int]:
    """How many of its newest records to read from each partition: ``total`` split as evenly
    as the partitions' ``sizes`` allow (a short partition's unused share goes to the others),
    so a topic holding ``total`` records or more gives exactly ``total``."""
    shares = dict.fromkeys(sizes, 0)
    left = total
    room = [tp for tp in sizes if sizes[tp] > 0]
    while left > 0 and room:
        each = max(1, left // len(room))
        for tp in list(room):
            n = min(each, sizes[tp] - shares[tp], left)
            shares[tp] += n
            left -= n
            if shares[tp] == sizes[tp]:
                room.remove(tp)
            if left == 0:
                break
    return shares


async def sample_values(
    config: Config, bootstrap: str, max_events: int, timeout_s: float
) -> tuple[list[bytes | None], int]:
    """Up to ``max_events`` of the newest record values of the input topic, and its
    partition count; BrokerError when the topic does not exist or cannot be read."""
    topic = config.input.topic
    options = client_kwargs(config.kafka, bootstrap_servers=bootstrap)
    consumer = AIOKafkaConsumer(enable_auto_commit=False, group_id=None, **options)
    await start_client(consumer, bootstrap)
    values: list[bytes | None] = []
    try:
        partitions = await topic_partitions(consumer, topic)
        if partitions is None:
            error = BrokerError(
                f"topic {topic} does not exist on {bootstrap}: set input.topic to the topic "
                "your producers write to, or create it with `stream-dp topics apply --config "
                "FILE`"
            )
            error.retriable = False
            raise error
        tps = [TopicPartition(topic, p) for p in partitions]
        consumer.assign(tps)
        starts = await consumer.beginning_offsets(tps)
        ends = await consumer.end_offsets(tps)
        shares = newest_shares({tp: ends[tp] - starts[tp] for tp in tps}, max_events)
        remaining = 0
        for tp in tps:
            first = ends[tp] - shares[tp]
            consumer.seek(tp, first)
            remaining += shares[tp]
        deadline = time.monotonic() + timeout_s
        wanted = min(remaining, max_events)
        while len(values) < wanted and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200, max_records=max_events)
            for msgs in batch.values():
                values.extend(m.value for m in msgs)
    except KafkaError as exc:
        cause = describe_fetch_error(
            classify_fetch_error(exc, principal=principal_of(config.kafka))
        )
        raise BrokerError(f"reading {topic} failed: {cause}") from None
    finally:
        await stop_client(consumer)
    return values[:max_events], len(partitions)


async def missing_export_topics(config: Config, bootstrap: str) -> list[str]:
    """The problems of the partner exports' topics: each one missing (docs/exports.md)."""
    if not config.exports:
        return []
    options = client_kwargs(config.kafka, bootstrap_servers=bootstrap)
    consumer = AIOKafkaConsumer(enable_auto_commit=False, group_id=None, **options)
    await start_client(consumer, bootstrap)
    try:
        present = await consumer.topics()
    except KafkaError as exc:
        raise BrokerError(f"listing the topics failed: {type(exc).__name__}") from None
    finally:
        await stop_client(consumer)
    return [
        f"the export topic {e.topic} (exports: partner {e.partner}) does not exist: create it "
        "with `stream-dp topics apply --config FILE`"
        for e in config.exports
        if e.topic not in present
    ]


def render(config: Config, report: InputReport, more_problems: Sequence[str] = ()) -> list[str]:
    """The check's report as text lines (counts, names and windows only); ``more_problems``
    are the partner exports' (:func:`missing_export_topics`)."""
    inp = config.input
    rows = [["field", "role", "missing or null", "types"]]
    for name, role in ((inp.user_field, "user"), (inp.time_field, "time")):
        rows.append([name, f"{role} (input.{role}_field)", str(report.absent(name)), "-"])
    for f in report.fields.values():
        types = ", ".join(f"{name} {n}" for name, n in f.types.most_common()) or "-"
        rows.append([f.name, "query field", str(report.absent(f.name)), types])
    lines = [
        f"{report.events} events sampled, {report.objects} JSON objects, {report.usable} usable",
        "",
        *text_table(rows),
        "",
    ]
    over = report.over_bound()
    if over:
        lines.append(
            f"{over} of {report.usable} usable events are beyond "
            f"bounds.max_contributions_per_window ({report.max_contributions_per_window}) for "
            "their user and window in this sample: the worker keeps a random "
            f"{report.max_contributions_per_window} of each user's events per window (by "
            "design; not counted on /metrics)"
        )
    if report.earliest_window_s is not None and report.latest_window_s is not None:
        lines.append(
            f"event windows: {iso_utc(report.earliest_window_s)} … "
            f"{iso_utc(report.latest_window_s)} ({report.window_size_s} s windows)"
        )
    origin = "window.start_at" if report.start_at_set else "a worker started now"
    lines.append(f"first covered window ({origin}): {iso_utc(report.coverage_start_s)}")
    problems = [*report.problems(), *more_problems]
    lines.append("")
    if problems:
        lines.append(f"{len(problems)} problem{'s' if len(problems) > 1 else ''}:")
        lines.extend(f"  - {p}" for p in problems)
    else:
        lines.append("no problems found")
    return lines


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    bootstrap = running_broker(config, args.bootstrap_servers, "check")
    if args.max_events < 1 or args.timeout <= 0:
        raise ConfigError("--max-events must be at least 1 and --timeout above 0")
    values, partitions = asyncio.run(
        sample_values(config, bootstrap, args.max_events, args.timeout)
    )
    report = check_values(config, values, time.time())
    exports = asyncio.run(missing_export_topics(config, bootstrap))
    print(f"stream-dp check: {config.input.topic} on {bootstrap} ({partitions} partitions)")
    for line in render(config, report, exports):
        print(line)
    return 1 if report.problems() or exports else 0
