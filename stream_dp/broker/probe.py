"""Is a Kafka-protocol broker answering? A hand-built Metadata (v0) request over a raw socket.

An open TCP port is not enough: a broker is ready when it answers a real Kafka request. The
request is built by hand so the check needs no client library and no consumer group; it works
on any PLAINTEXT listener. For SSL/SASL listeners, :func:`wait_for_broker` connects with
aiokafka and the configured security options instead.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import struct
import time
from dataclasses import dataclass

from aiokafka import AIOKafkaClient
from aiokafka.errors import KafkaError

from stream_dp.config import KafkaConfig
from stream_dp.errors import BrokerError, ConfigError

_METADATA_API_KEY = 3
_CLIENT_ID = b"stream-dp-probe"
_MAX_RESPONSE_BYTES = 16 * 1024 * 1024
_correlation_ids = itertools.count(1)


@dataclass(frozen=True)
class BrokerAddress:
    """A broker as a Metadata response advertises it."""

    node_id: int
    host: str
    port: int


def parse_bootstrap(bootstrap: str) -> list[tuple[str, int]]:
    """``"h1:9092,[::1]:9093"`` → ``[("h1", 9092), ("::1", 9093)]``; ConfigError if malformed."""
    out: list[tuple[str, int]] = []
    for raw in bootstrap.split(","):
        item = raw.strip()
        host, sep, port_text = item.rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ConfigError(
                f"bootstrap servers {bootstrap!r}: {item!r} is not host:port; "
                'write e.g. "127.0.0.1:9092" (several separated by commas)'
            )
        out.append((host, int(port_text)))
    return out


def metadata_request(correlation_id: int) -> bytes:
    """A size-prefixed Metadata v0 request for all topics."""
    header = struct.pack(">hhih", _METADATA_API_KEY, 0, correlation_id, len(_CLIENT_ID))
    body = struct.pack(">i", 0)  # empty topic array = all topics (v0)
    message = header + _CLIENT_ID + body
    return struct.pack(">i", len(message)) + message


def parse_metadata_response(payload: bytes, correlation_id: int) -> list[BrokerAddress]:
    """The brokers listed in a Metadata v0 response (without its size prefix).

    Raises ValueError when the bytes are not the answer to our request.
    """
    try:
        (got_id, n_brokers) = struct.unpack_from(">ii", payload, 0)
        if got_id != correlation_id:
            raise ValueError(f"correlation id {got_id}, expected {correlation_id}")
        pos, brokers = 8, []
        for _ in range(n_brokers):
            node_id, host_len = struct.unpack_from(">ih", payload, pos)
            pos += 6
            host = payload[pos : pos + host_len].decode("utf-8")
            pos += host_len
            (port,) = struct.unpack_from(">i", payload, pos)
            pos += 4
            brokers.append(BrokerAddress(node_id, host, port))
    except (struct.error, UnicodeDecodeError) as exc:
        raise ValueError(f"not a Kafka Metadata response: {exc}") from None
    if not brokers:
        raise ValueError("the Metadata response lists no broker")
    return brokers


def _response_size(prefix: bytes) -> int:
    size: int = struct.unpack(">i", prefix)[0]
    if not 0 < size <= _MAX_RESPONSE_BYTES:
        raise ValueError(f"implausible response size {size}: not a Kafka broker")
    return size


def probe_sync(host: str, port: int, timeout_s: float) -> list[BrokerAddress]:
    """Send one Metadata request; the advertised brokers, or OSError/ValueError."""
    correlation_id = next(_correlation_ids)
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.sendall(metadata_request(correlation_id))
        reader = sock.makefile("rb")
        prefix = reader.read(4)
        if len(prefix) < 4:
            raise ConnectionError("connection closed before a response")
        size = _response_size(prefix)
        payload = reader.read(size)
        if len(payload) < size:
            raise ConnectionError("connection closed in the middle of a response")
    return parse_metadata_response(payload, correlation_id)


async def probe(host: str, port: int, timeout_s: float) -> list[BrokerAddress]:
    """Async :func:`probe_sync`."""
    correlation_id = next(_correlation_ids)

    async def exchange() -> bytes:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(metadata_request(correlation_id))
            await writer.drain()
            size = _response_size(await reader.readexactly(4))
            return await reader.readexactly(size)
        finally:
            writer.close()
            await writer.wait_closed()

    try:
        payload = await asyncio.wait_for(exchange(), timeout_s)
    except asyncio.IncompleteReadError:
        raise ConnectionError("connection closed before a full response") from None
    except TimeoutError:
        raise TimeoutError(f"no response within {timeout_s:g} s") from None
    return parse_metadata_response(payload, correlation_id)


async def _probe_secured(bootstrap: str, kafka: KafkaConfig, timeout_s: float) -> None:
    from stream_dp.broker.client_options import client_kwargs

    kwargs = client_kwargs(kafka, bootstrap_servers=bootstrap)
    kwargs["request_timeout_ms"] = max(1000, int(timeout_s * 1000))
    client = AIOKafkaClient(**kwargs)
    try:
        await asyncio.wait_for(client.bootstrap(), timeout_s)
    finally:
        await client.close()


async def wait_for_broker(
    bootstrap: str, timeout_s: float = 30.0, *, kafka: KafkaConfig | None = None
) -> None:
    """Wait until a broker at ``bootstrap`` (``host:port[,host:port...]``) answers a Metadata
    request; BrokerError after ``timeout_s``.

    Pass ``kafka`` when the listener needs SSL or SASL: then the check connects with aiokafka
    and those security options.
    """
    addresses = parse_bootstrap(bootstrap)
    secured = kafka is not None and kafka.security_protocol != "PLAINTEXT"
    deadline = time.monotonic() + timeout_s
    backoff_s, last_error = 0.05, "no attempt finished"
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        attempt_s = min(remaining, 5.0)
        try:
            if secured:
                assert kafka is not None
                await _probe_secured(bootstrap, kafka, attempt_s)
                return
            for host, port in addresses:
                try:
                    await probe(host, port, attempt_s)
                    return
                except (OSError, ValueError) as exc:
                    last_error = f"{host}:{port}: {exc}"
        except (KafkaError, OSError, ValueError) as exc:
            last_error = f"{type(exc).__name__}: {exc}"
        await asyncio.sleep(min(backoff_s, max(0.0, deadline - time.monotonic())))
        backoff_s = min(backoff_s * 2, 1.0)
    raise BrokerError(
        f"no Kafka broker answered at {bootstrap} within {timeout_s:g} s "
        f"(last error: {last_error}); check that the broker is running and that "
        "kafka.bootstrap_servers (and the kafka security options) point at it"
    )
