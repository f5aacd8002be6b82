"""wait_for_broker and probe: ready means a real Kafka answer, not an open port, asked with the
Kafka client (versions negotiated) rather than a hand-built request."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

import pytest

import stream_dp.broker.probe as probe_module
from stream_dp.broker import wait_for_broker
from stream_dp.broker.probe import (
    BrokerAddress,
    KeptProbe,
    parse_bootstrap,
    probe,
    probe_sync,
    watch_broker,
)
from stream_dp.config import KafkaConfig
from stream_dp.errors import BrokerError, ConfigError

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_wait_for_broker_returns_once_the_broker_answers(kafka_bootstrap: str) -> None:
    await wait_for_broker(kafka_bootstrap, timeout_s=5)
    # any one answering address of a list is enough
    await wait_for_broker(f"127.0.0.1:{_closed_port()},{kafka_bootstrap}", timeout_s=5)


async def test_wait_for_broker_times_out_on_a_closed_port() -> None:
    port = _closed_port()
    started = time.monotonic()
    with pytest.raises(BrokerError, match=rf"no Kafka broker answered at 127.0.0.1:{port}"):
        await wait_for_broker(f"127.0.0.1:{port}", timeout_s=0.5)
    assert time.monotonic() - started < 30  # a hang guard: the 0.5 s timeout is honoured


@pytest.fixture
async def fake_server() -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    servers: list[asyncio.Server] = []

    async def serve(handler: Handler) -> str:
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        servers.append(server)
        return f"127.0.0.1:{server.sockets[0].getsockname()[1]}"

    yield serve
    for server in servers:
        server.close()
        await server.wait_closed()


async def test_an_http_server_is_not_a_broker(
    fake_server: Callable[[Handler], Awaitable[str]],
) -> None:
    async def http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    bootstrap = await fake_server(http)
    with pytest.raises(BrokerError, match="not a Kafka broker"):
        await wait_for_broker(bootstrap, timeout_s=0.5)


async def test_a_silent_server_is_not_a_broker(
    fake_server: Callable[[Handler], Awaitable[str]],
) -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()
        writer.close()

    bootstrap = await fake_server(silent)
    with pytest.raises(BrokerError, match="no response"):
        await wait_for_broker(bootstrap, timeout_s=0.5)


async def test_the_probe_negotiates_versions_first(
    fake_server: Callable[[Handler], Awaitable[str]],
) -> None:
    """The first request is ApiVersions (key 18), as any real client sends: the Metadata
    version is chosen from the broker's answer, never fixed (Kafka 4.0 dropped v0)."""
    first_requests: list[tuple[int, int]] = []

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        (size,) = struct.unpack(">i", await reader.readexactly(4))
        api_key, api_version = struct.unpack(">hh", (await reader.readexactly(size))[:4])
        first_requests.append((api_key, api_version))
        writer.close()

    bootstrap = await fake_server(record)
    host, port = parse_bootstrap(bootstrap)[0]
    with pytest.raises(ValueError, match="not a Kafka broker"):
        await probe(host, port, timeout_s=5)
    assert [key for key, _ in first_requests] == [18]


async def test_probe_returns_the_advertised_brokers(kafka_bootstrap: str) -> None:
    host, port = parse_bootstrap(kafka_bootstrap)[0]
    [broker] = await probe(host, port, timeout_s=5)
    assert isinstance(broker, BrokerAddress) and (broker.host, broker.port) == (host, port)
    # from synchronous code, also when this thread runs an event loop
    assert [(b.host, b.port) for b in probe_sync(host, port, timeout_s=5)] == [(host, port)]


def test_parse_bootstrap() -> None:
    assert parse_bootstrap("a:1, [::1]:9093") == [("a", 1), ("::1", 9093)]
    for bad in ("localhost", "host:", ":9092", "host:99999", "host:port"):
        with pytest.raises(ConfigError, match="is not host:port"):
            parse_bootstrap(bad)


async def test_secured_check_uses_the_security_options(kafka_bootstrap: str) -> None:
    # The session broker speaks PLAINTEXT: an SSL client must not take it for ready.
    with pytest.raises(BrokerError, match="no Kafka broker answered"):
        await wait_for_broker(
            kafka_bootstrap, timeout_s=1, kafka=KafkaConfig(security_protocol="SSL")
        )
    await wait_for_broker(kafka_bootstrap, timeout_s=5, kafka=KafkaConfig())


class _CountingProxy:
    """A TCP forwarder to a broker that counts the connections it accepts and can drop
    them all (a broker restarted), stop forwarding (a broker gone: new connections closed
    at once) or black-hole (a broker that hangs: every connection, open or new, held open
    and nothing passed on either way)."""

    def __init__(self, target: str) -> None:
        ((self.host, self.port),) = parse_bootstrap(target)
        self.accepted = 0
        self.forwarding = True
        self.black_hole = False
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        return f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if not self.forwarding:
            writer.close()
            return
        if self.black_hole:  # accepted and held; what is sent is swallowed
            self._writers.append(writer)
            with contextlib.suppress(ConnectionError, OSError):
                while await reader.read(65536):
                    pass
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        self._writers += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    if self.black_hole:
                        continue  # the connection stays open; nothing is passed on
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def drop_all(self) -> None:
        for w in self._writers:
            w.close()
        self._writers.clear()

    async def stop(self) -> None:
        self.drop_all()
        if self._server is not None:
            self._server.close()


async def test_kept_probe_asks_on_one_connection_and_reconnects_when_it_breaks(
    kafka_bootstrap: str,
) -> None:
    proxy = _CountingProxy(kafka_bootstrap)
    address = await proxy.start()
    kept = KeptProbe(address)
    try:
        for _ in range(3):  # one connection for every check while it holds
            await kept.check(5.0)
        assert proxy.accepted == 1
        proxy.drop_all()  # the broker restarted: the next check opens a new connection
        await kept.check(5.0)
        assert proxy.accepted == 2
        await kept.check(5.0)
        assert proxy.accepted == 2
        proxy.forwarding = False  # the broker is gone: the check fails within its timeout
        proxy.drop_all()
        started = time.monotonic()
        with pytest.raises(BrokerError, match=rf"no Kafka broker answered at {address}"):
            await kept.check(0.5)
        assert time.monotonic() - started < 30  # a hang guard
        proxy.forwarding = True  # back: answered again on a new connection
        before = proxy.accepted
        await kept.check(5.0)
        assert proxy.accepted == before + 1
    finally:
        kept.close()
        await proxy.stop()


async def test_a_broker_that_holds_the_connection_and_stops_answering_fails_a_check_in_time(
    kafka_bootstrap: str,
) -> None:
    """A broker that hangs (the connection open, no answer, new connections accepted and
    unanswered too): a check fails within its timeout — one deadline for the kept
    connection and the new ones, not a full timeout for each (about twice it) — and once
    the broker answers again the next check succeeds."""
    proxy = _CountingProxy(kafka_bootstrap)
    address = await proxy.start()
    kept = KeptProbe(address)
    timeout_s = 5.0
    try:
        await kept.check(5.0)
        proxy.black_hole = True
        started = time.monotonic()
        with pytest.raises(BrokerError, match=rf"no Kafka broker answered at {address}"):
            await kept.check(timeout_s)
        elapsed = time.monotonic() - started
        # Two deadlines take at least 2 × 5 s; 3.5 s of slack for a loaded machine.
        assert elapsed < timeout_s + 3.5, f"{elapsed:.2f} s"
        proxy.black_hole = False
        await kept.check(5.0)
    finally:
        kept.close()
        await proxy.stop()


class _FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class _FailingConnection:
    """A kept connection whose request fails after ``takes_s`` of the fake clock."""

    def __init__(self, clock: _FakeClock, takes_s: float) -> None:
        self.clock, self.takes_s, self.closed = clock, takes_s, False

    def connected(self) -> bool:
        return True

    async def send(self, request: Any) -> Any:
        self.clock.now += self.takes_s
        raise ConnectionResetError("reset by peer")

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize(
    ("kept_takes_s", "new_get_s"), [(0.5, 1.5), (1.95, probe_module.MIN_FALLBACK_S), (2.0, None)]
)
async def test_a_check_gives_new_connections_what_the_kept_one_left_of_its_deadline(
    monkeypatch: pytest.MonkeyPatch, kept_takes_s: float, new_get_s: float | None
) -> None:
    """The kept connection fails after part of the check's 2 s: new connections get the
    rest (at least MIN_FALLBACK_S); when nothing is left the check fails at once, as
    wait_for_broker would, naming the kept connection's failure."""
    clock = _FakeClock()
    monkeypatch.setattr(probe_module, "time", clock)
    given: list[float] = []

    async def fallback(bootstrap: str, timeout_s: float, **_: Any) -> None:
        given.append(timeout_s)

    monkeypatch.setattr(probe_module, "wait_for_broker", fallback)
    kept = KeptProbe("127.0.0.1:9")
    conn = kept._conn = _FailingConnection(clock, kept_takes_s)
    if new_get_s is None:
        with pytest.raises(
            BrokerError,
            match=r"no Kafka broker answered at 127.0.0.1:9 within 2 s \(last error: the kept "
            r"connection: ConnectionResetError: reset by peer\)",
        ):
            await kept.check(2.0)
        assert given == []
    else:
        await kept.check(2.0)
        assert given == [pytest.approx(new_get_s)]
    assert conn.closed and kept._conn is None


class _ScriptedProbe(KeptProbe):
    """Answers (True) or not (False, BrokerError) as scripted; ``stop`` is set after the
    last answer."""

    def __init__(self, script: Iterable[bool]) -> None:
        super().__init__("127.0.0.1:9")
        self.script = list(script)
        self.stop = False
        self.timeouts: list[float] = []
        self.closed = False

    async def check(self, timeout_s: float) -> None:
        self.timeouts.append(timeout_s)
        ok = self.script.pop(0)
        self.stop = not self.script
        if not ok:
            raise BrokerError("no Kafka broker answered at 127.0.0.1:9")

    def close(self) -> None:
        self.closed = True


def _said(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [
        (r.levelname, r.getMessage()) for r in caplog.records if r.name == probe_module.__name__
    ]


@pytest.mark.parametrize(
    ("script", "said"),
    [
        ([True, False, False, True, True], ["broker unreachable", "broker reachable again"]),
        ([False, True], ["broker unreachable", "broker reachable again"]),  # first one too
        ([True, True], []),
    ],
)
async def test_watch_broker_gives_each_result_and_logs_each_change(
    caplog: pytest.LogCaptureFixture, script: list[bool], said: list[str]
) -> None:
    fake = _ScriptedProbe(script)
    results: list[bool] = []
    with caplog.at_level(logging.INFO, logger=probe_module.__name__):
        await watch_broker(
            fake, on_result=results.append, stopping=lambda: fake.stop, interval_s=0, timeout_s=7
        )
    assert results == script  # every check, until stopping() held
    assert _said(caplog) == [("WARNING", text) for text in said]
    assert fake.timeouts == [7] * len(script)
    assert fake.closed


async def test_watch_broker_stops_on_the_flag_and_closes_the_probe_however_it_ends() -> None:
    fake = _ScriptedProbe([True])
    await watch_broker(fake, on_result=lambda ok: None, stopping=lambda: True, interval_s=0)
    assert fake.timeouts == [] and fake.closed  # stopping before the first check

    fake = _ScriptedProbe([True, True])

    def fails(ok: bool) -> None:
        raise RuntimeError("the service's handler failed")

    with pytest.raises(RuntimeError):
        await watch_broker(fake, on_result=fails, stopping=lambda: False, interval_s=0)
    assert fake.closed

    class _Hanging(_ScriptedProbe):
        async def check(self, timeout_s: float) -> None:
            entered.set()
            await asyncio.Event().wait()

    entered = asyncio.Event()
    hanging = _Hanging([])
    task = asyncio.create_task(
        watch_broker(hanging, on_result=lambda ok: None, stopping=lambda: False, interval_s=0)
    )
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert hanging.closed
