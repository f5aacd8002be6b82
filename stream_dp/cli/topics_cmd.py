"""``stream-dp topics apply|list``: the topics defined in ``topics/``, named by the config."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from stream_dp.broker.topics import (
    REPLICATION_FACTOR_ENV,
    TOPICS_DIR_ENV,
    apply_topics,
    load_topic_specs,
    resolve_all,
)
from stream_dp.config import Config, load_config
from stream_dp.errors import ConfigError

_EPILOG = f"""\
Topic definitions are the YAML files in the topics/ folder of stream-dp (override the folder
with {TOPICS_DIR_ENV}); their names come from the config (input.topic, output.topic,
output.dead_letter_topic, output.ledger_topic). {REPLICATION_FACTOR_ENV} overrides the
replication factor of every topic, e.g. 3 on a production cluster."""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "topics",
        help="create or list the Kafka topics stream-dp uses",
        description="Create or list the Kafka topics stream-dp uses.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="topics_action", metavar="ACTION", required=True)

    apply = actions.add_parser(
        "apply",
        help="create the missing topics on the configured Kafka cluster",
        description="Create the topics that the cluster does not have yet. Existing topics\n"
        "are left untouched (also when their settings differ): safe to run repeatedly.",
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
    parser.add_argument("--config", required=True, metavar="FILE", help="YAML config file")


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


def run_apply(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    bootstrap = _bootstrap(config, args.bootstrap_servers)
    include_input = not args.skip_input
    wanted = resolve_all(config, load_topic_specs(), include_input=include_input)
    created = set(asyncio.run(apply_topics(config, bootstrap, include_input=include_input)))
    for name, spec in wanted.items():
        if name in created:
            plural = "" if spec.partitions == 1 else "s"
            print(f"created: {name} ({spec.partitions} partition{plural})")
        else:
            print(f"already present: {name}")
    print(f"{len(created)} created, {len(wanted) - len(created)} already present on {bootstrap}")
    return 0


def run_list(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    for name, spec in resolve_all(config, load_topic_specs()).items():
        settings = ", ".join(f"{k}={v}" for k, v in sorted(spec.config.items()))
        print(
            f"{name}: {spec.partitions} partitions, replication {spec.replication_factor}, "
            f"{settings}; records: {spec.schema}"
        )
    return 0
