"""``stream-dp topics apply|list``: the topics defined in ``topics/``, named by the
config. ``apply`` creates the missing ones and sets the existing ones' topic configs
(retention.ms, cleanup.policy, ...) to their definitions; a partition count or replication
that differs is reported, never changed. ``--dry-run`` only reports."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from stream_dp.broker.topics import TopicState, inspect_topics, resolve_all
from stream_dp.cli._common import add_config_option
from stream_dp.config import Config, load_config
from stream_dp.errors import ConfigError

_EPILOG = """\
Topic definitions ship inside stream-dp (topics/*.yaml). Their names come from the
config: input.topic, output.topic, and output.dead_letter_topic, ledger_topic, partials_topic
and repartition_topic, which default to <kafka.group_id>.dead-letter, .ledger, .partials and
.repartition. kafka.replication_factor sets every topic's replication factor (unset: the
broker's default.replication.factor); output.internal_retention_s the retention of the
partials and repartition topics. With erasure.enabled, also erasure.requests_topic,
log_topic and responses_topic (<kafka.group_id>.erasure-requests, .erasures and
.erasure-responses by default)."""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "topics",
        help="create, compare or list the Kafka topics stream-dp uses",
        description="Create, compare or list the Kafka topics stream-dp uses.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="topics_action", metavar="ACTION", required=True)

    apply = actions.add_parser(
        "apply",
        help="create the missing topics and set their configs on the Kafka cluster",
        description="Create the topics that the cluster does not have yet, and set the topic\n"
        "configs (retention.ms, cleanup.policy, ...) of existing ones to the definitions\n"
        "(their other settings stay). A partition count or replication that differs is\n"
        "reported, never changed. Safe to run repeatedly; --dry-run only reports.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_config(apply)
    apply.add_argument(
        "--bootstrap-servers",
        metavar="HOST:PORT",
        help="override kafka.bootstrap_servers of the config",
    )
    apply.add_argument(
        "--skip-input",
        action="store_true",
        help="do not create the input topic (when the producers own it)",
    )
    apply.add_argument(
        "--dry-run",
        action="store_true",
        help="only show what would be created or set and what differs; change nothing",
    )
    apply.set_defaults(func=run_apply)

    listing = actions.add_parser(
        "list",
        help="show the topics the config implies, without contacting Kafka",
        description="Show each topic's name, partitions, settings and record schema.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_config(listing)
    listing.set_defaults(func=run_list)


def _add_config(parser: argparse.ArgumentParser) -> None:
    add_config_option(parser)


def _bootstrap(config: Config, override: str | None) -> str:
    if override:
        return override
    if config.kafka.embedded:
        raise ConfigError(
            'kafka.bootstrap_servers is "embedded": the embedded broker lives only as long as '
            "the command that starts it and keeps topics in memory, so there is no persistent "
            "broker to apply topics to (the worker creates them itself). Set "
            "kafka.bootstrap_servers to your Kafka cluster, or pass --bootstrap-servers "
            "(e.g. the address `stream-dp broker` prints)"
        )
    return config.kafka.bootstrap_servers


def _line(state: TopicState, dry_run: bool) -> str:
    topic = state.topic
    if not state.present:
        verb = "would create" if dry_run else "created"
        return f"{verb}: {topic.name} ({topic.describe()})"
    lines = []
    if state.altered:
        lines.append(f"set: {topic.name}: {'; '.join(state.altered)}")
    if state.differences:
        lines.append(f"differs: {topic.name}: {'; '.join(state.differences)}")
    return "\n".join(lines) or f"already present: {topic.name}"


def run_apply(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    bootstrap = _bootstrap(config, args.bootstrap_servers)
    states = asyncio.run(
        inspect_topics(
            config,
            bootstrap,
            include_input=not args.skip_input,
            create=not args.dry_run,
            alter=not args.dry_run,
        )
    )
    for state in states:
        print(_line(state, args.dry_run))
    missing = sum(not s.present for s in states)
    present = len(states) - missing
    differing = sum(bool(s.differences) for s in states)
    altered = sum(bool(s.altered) for s in states)
    verb = "would be created" if args.dry_run else "created"
    summary = f"{missing} {verb}, {present} already present on {bootstrap}"
    if altered:
        summary += f"; {altered} had {'its' if altered == 1 else 'their'} configs set"
    if differing:
        plural = "s" if differing == 1 else ""
        summary += f"; {differing} differ{plural} from the definitions" + (
            " (apply sets their topic configs where it may: see the runbook, 'Topic settings')"
            if args.dry_run
            else " and stay as they are (see the runbook, 'Topic settings')"
        )
    print(("dry run: " if args.dry_run else "") + summary)
    return 0


def run_list(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    for name, topic in resolve_all(config).items():
        print(f"{name}: {topic.describe()}; records: {topic.spec.schema}")
    return 0
