"""``stream-dp erase --config FILE --user-id ID``: send an erasure request (docs/erasure.md).

Writes one request ``{user_id, requested_at, request_id}`` to ``erasure.requests_topic``,
acknowledged, and prints its request id; with ``--wait S`` it then reads
``erasure.responses_topic`` until the deployment's response to that id arrives and prints
it (exit 1 if none comes in time, or if the request was rejected). The user id is never
printed. ``--user-id -`` reads it from standard input (a command line shows in ``ps``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

import orjson

from stream_dp.cli._common import add_config_option, running_broker
from stream_dp.config import Config, load_config
from stream_dp.errors import BrokerError, ConfigError, StreamDPError
from stream_dp.kafka_client import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from stream_dp.kafka_client.client_options import client_kwargs
from stream_dp.kafka_client.errors import KafkaError
from stream_dp.pipeline.formats.decode import parse_event_time
from stream_dp.pipeline.formats.erasure_records import encode_request, new_request_id


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "erase",
        help="ask a deployment to erase one user from every window not yet released",
        description="Send an erasure request for one user id to erasure.requests_topic. The "
        "deployment removes the user's events from every window released after the request "
        "is applied; windows released before are not recomputed (docs/erasure.md). Needs "
        "erasure.enabled: true.",
    )
    add_config_option(p)
    p.add_argument(
        "--user-id",
        required=True,
        help="the user id as events carry it (normalised as input.user_id_normalization "
        'says); "-" reads it from standard input',
    )
    p.add_argument("--request-id", help="your id of the request (default: a fresh random id)")
    p.add_argument(
        "--requested-at",
        default="now",
        help="when the person asked: ISO-8601 with a UTC offset, or now (default)",
    )
    p.add_argument(
        "--wait",
        type=float,
        metavar="S",
        help="wait up to S seconds for the deployment's response and print it",
    )
    p.add_argument("--json", action="store_true", help="print JSON records")
    p.add_argument(
        "--bootstrap-servers", metavar="HOST:PORT", help="override kafka.bootstrap_servers"
    )
    p.set_defaults(func=run)


def _user_id(value: str) -> str:
    if value != "-":
        return value
    line = sys.stdin.readline().rstrip("\r\n")
    if not line:
        raise ConfigError("--user-id -: standard input held no user id")
    return line


def _requested_at(value: str) -> float:
    if value == "now":
        return time.time()
    parsed = parse_event_time(value)
    if isinstance(parsed, str):
        raise ConfigError(
            "--requested-at must be ISO-8601 with a UTC offset (2020-08-01T12:00:00Z) or now"
        )
    return parsed


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    if not config.erasure.enabled:
        raise ConfigError(
            "erasure is off in this configuration: set erasure.enabled: true (and restart the "
            "workers) before sending erasure requests (docs/erasure.md)"
        )
    if args.wait is not None and args.wait <= 0:
        raise ConfigError("--wait must be a positive number of seconds")
    bootstrap = running_broker(config, args.bootstrap_servers, "erase")
    request_id = args.request_id or new_request_id()
    if not 0 < len(request_id) <= 200:
        raise ConfigError("--request-id must be 1..200 characters")
    value = encode_request(
        _user_id(args.user_id),
        request_id=request_id,
        requested_at_s=_requested_at(args.requested_at),
    )
    asyncio.run(_send(config, bootstrap, request_id, value))
    sent = {
        "kind": "erasure_request_sent",
        "request_id": request_id,
        "topic": config.erasure.requests_topic,
    }
    if args.json:
        print(orjson.dumps(sent).decode(), flush=True)
    else:
        print(f"erasure request {request_id} sent to {config.erasure.requests_topic}", flush=True)
    if args.wait is None:
        return 0
    options = client_kwargs(config.kafka, bootstrap_servers=bootstrap)
    response = asyncio.run(_await_response(config, options, request_id, args.wait))
    print(
        orjson.dumps(response, option=orjson.OPT_SORT_KEYS).decode()
        if args.json
        else _describe(response)
    )
    if response.get("status") != "applied":
        raise StreamDPError(
            f"the deployment rejected request {request_id} ({response.get('reason')}): see "
            "its dead-letter topic for the reason"
        )
    return 0


def _describe(response: dict[str, Any]) -> str:
    if response.get("status") != "applied":
        return f"rejected: {response.get('reason')}"
    released = response["released_windows_not_recomputed"]
    affected = response["open_windows_affected"]
    return (
        f"applied at {response['applied_at']}: every window from {affected['from']} until "
        f"{affected['until']} is released without the user's events; windows from "
        f"{released['from']} until {released['until']} were released before and are not "
        "recomputed (their values are differentially private)"
    )


async def _send(config: Config, bootstrap: str, request_id: str, value: bytes) -> None:
    options = client_kwargs(config.kafka, bootstrap_servers=bootstrap)
    producer = AIOKafkaProducer(acks="all", **options)
    try:
        await producer.start()
        await producer.send_and_wait(config.erasure.requests_topic, value, key=request_id.encode())
    except KafkaError as exc:
        raise BrokerError(
            f"cannot send to {config.erasure.requests_topic} on {bootstrap}: "
            f"{type(exc).__name__}; is the topic there (stream-dp topics apply)?"
        ) from None
    finally:
        await producer.stop()


async def _await_response(
    config: Config, options: dict[str, Any], request_id: str, wait_s: float
) -> dict[str, Any]:
    topic = config.erasure.responses_topic
    consumer = AIOKafkaConsumer(enable_auto_commit=False, auto_offset_reset="earliest", **options)
    deadline = time.monotonic() + wait_s
    try:
        await consumer.start()
        partitions: set[int] | None = None
        while not partitions and time.monotonic() < deadline:
            partitions = consumer.partitions_for_topic(topic)
            if not partitions:
                await consumer._client.force_metadata_update()  # no public way to wait
                await asyncio.sleep(0.2)
        if partitions:
            consumer.assign([TopicPartition(topic, p) for p in sorted(partitions)])
            await consumer.seek_to_beginning()
        while partitions and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            for messages in batch.values():
                for m in messages:
                    if m.key == request_id.encode():
                        found: dict[str, Any] = orjson.loads(m.value)
                        return found
    except KafkaError as exc:
        raise BrokerError(f"cannot read {topic}: {type(exc).__name__}") from None
    finally:
        await consumer.stop()
    raise StreamDPError(
        f"no response to erasure request {request_id} on {topic} within {wait_s:g} s: is a "
        "worker with erasure.enabled running? The request stays queued and is applied "
        "when one reads it"
    )
