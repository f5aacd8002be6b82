"""The ops HTTP server answers real requests over loopback and survives garbage."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from prometheus_client.parser import text_string_to_metric_families

from stream_dp.ops import http as ops_http
from stream_dp.ops.health import COMPONENTS, Health
from stream_dp.ops.http import HttpServer, start_http_server
from stream_dp.ops.metrics import Metrics


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes


@dataclass
class Served:
    server: HttpServer
    metrics: Metrics
    health: Health
    clock: FakeClock


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    clock = FakeClock()
    metrics = Metrics(queries=["q"])
    health = Health(metrics=metrics, clock=clock, live_timeout_s=30)
    server = await start_http_server("127.0.0.1", 0, metrics, health)
    try:
        yield Served(server, metrics, health, clock)
    finally:
        await server.close()


async def raw(port: int, request: bytes, *, timeout_s: float = 5.0) -> Reply:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), timeout_s)
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("ascii").split("\r\n")
    version, status, _reason = lines[0].split(" ", 2)
    assert version in ("HTTP/1.0", "HTTP/1.1")  # aiohttp answers unparsed requests in 1.0
    headers = dict(line.split(": ", 1) for line in lines[1:])
    assert int(headers["Content-Length"]) == len(body) or request.startswith(b"HEAD")
    return Reply(int(status), {k.lower(): v for k, v in headers.items()}, body)


async def get(port: int, path: str) -> Reply:
    return await raw(port, f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())


async def test_port_zero_binds_a_real_port(served: Served) -> None:
    assert served.server.port > 0
    assert (await get(served.server.port, "/health/live")).status == 200


async def test_metrics_endpoint_serves_parseable_prometheus_text(served: Served) -> None:
    served.metrics.events_consumed.inc(7)
    reply = await get(served.server.port, "/metrics")
    assert reply.status == 200
    assert reply.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    families = {f.name: f for f in text_string_to_metric_families(reply.body.decode())}
    assert families["stream_dp_events_consumed"].samples[0].value == 7
    assert "stream_dp_ready" in families


async def test_ready_is_503_until_every_component_is_ok(served: Served) -> None:
    port = served.server.port
    reply = await get(port, "/health/ready")
    assert reply.status == 503
    assert reply.headers["content-type"] == "application/json"
    assert json.loads(reply.body)["ready"] is False
    for component in COMPONENTS:
        served.health.set(component, True)
    reply = await get(port, "/health/ready?verbose=1")
    assert reply.status == 200
    body = json.loads(reply.body)
    assert body["ready"] is True
    assert body["components"] == dict.fromkeys(COMPONENTS, True)


async def test_live_turns_503_when_the_loop_stops_beating(served: Served) -> None:
    port = served.server.port
    served.health.beat()
    assert (await get(port, "/health/live")).status == 200
    served.clock.now += 31
    reply = await get(port, "/health/live")
    assert reply.status == 503
    assert json.loads(reply.body)["live"] is False
    served.health.beat()
    assert (await get(port, "/health/live")).status == 200


async def test_unknown_path_is_404_and_other_methods_405(served: Served) -> None:
    port = served.server.port
    assert (await get(port, "/")).status == 404
    assert (await get(port, "/metricsx")).status == 404
    post = b"POST /metrics HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\n\r\n{}"
    assert (await raw(port, post)).status == 405


async def test_head_sends_headers_only(served: Served) -> None:
    reply = await raw(served.server.port, b"HEAD /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert reply.status == 200
    assert reply.body == b""
    assert int(reply.headers["content-length"]) > 0


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x00\xff\xfe garbage\r\n\r\n",
        b"GET\r\n\r\n",
        b"GET /metrics\r\n\r\n",  # an HTTP/0.9 request line
        b"GET metrics HTTP/1.1\r\n\r\n",
        b"get /metrics HTTP/1.1\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n",
        b"GET /metrics SPDY/3\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\n\r\n",  # HTTP/1.1 without Host
        b"GET http://localhost/metrics HTTP/1.1\r\nHost: x\r\n\r\n",  # absolute form
        b"GET * HTTP/1.1\r\nHost: x\r\n\r\n",
    ],
)
async def test_malformed_requests_get_400_and_the_server_keeps_serving(
    served: Served, garbage: bytes
) -> None:
    port = served.server.port
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(garbage)
    data = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    await writer.wait_closed()
    assert data.split(b" ", 2)[1] == b"400", data
    assert (await get(port, "/health/live")).status == 200


async def test_request_cut_off_mid_line_is_closed_and_the_server_keeps_serving(
    served: Served,
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", served.server.port)
    writer.write(b"GET /metrics HTTP/1.1")  # closed before the line ended
    writer.write_eof()
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    await writer.wait_closed()
    assert (await get(served.server.port, "/health/live")).status == 200


async def test_oversized_request_line_gets_400(served: Served) -> None:
    long_path = "/" + "a" * (ops_http.MAX_LINE_BYTES * 2)
    reply = await get(served.server.port, long_path)
    assert reply.status == 400
    assert (await get(served.server.port, "/metrics")).status == 200


async def test_oversized_header_gets_400(served: Served) -> None:
    value = b"v" * (ops_http.MAX_LINE_BYTES + 1)
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + value + b"\r\n\r\n"
    assert (await raw(served.server.port, request)).status == 400


async def test_too_many_headers_get_400(served: Served) -> None:
    """The header count and each header's length are bounded, so the whole head is too."""
    headers = b"".join(b"X-H%d: v\r\n" % i for i in range(ops_http.MAX_HEADERS + 5))
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n"
    assert (await raw(served.server.port, request)).status == 400


async def test_client_that_connects_and_leaves_does_no_harm(served: Served) -> None:
    _reader, writer = await asyncio.open_connection("127.0.0.1", served.server.port)
    writer.close()
    await writer.wait_closed()
    assert (await get(served.server.port, "/health/live")).status == 200


async def test_slow_client_is_closed_after_the_request_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ops_http, "REQUEST_TIMEOUT_S", 0.2)
    server = await start_http_server("127.0.0.1", 0, Metrics(), Health())
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /metr")  # and never finishes the line
        await writer.drain()
        # Closed by the server (the default timeout would hold it for an hour).
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    finally:
        await server.close()


async def test_a_standard_http_client_works(served: Served) -> None:
    url = f"http://127.0.0.1:{served.server.port}"

    def fetch(path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(url + path, timeout=5) as resp:  # noqa: S310 (http URL built above)
                return int(resp.status), resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    status, body = await asyncio.to_thread(fetch, "/metrics")
    assert status == 200 and b"stream_dp_events_consumed_total" in body
    status, body = await asyncio.to_thread(fetch, "/health/ready")
    assert status == 503 and json.loads(body)["ready"] is False


async def test_close_stops_listening_and_ends_idle_connections() -> None:
    server = await start_http_server("127.0.0.1", 0, Metrics(), Health())
    port = server.port
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metr")  # an unfinished request holding a connection open
    await writer.drain()
    await asyncio.wait_for(server.close(), 5)
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)
    await server.close()  # idempotent


async def test_half_open_connections_are_capped_and_probes_still_answer(served: Served) -> None:
    """300 clients that connect and send nothing used to hold 300 sockets for 10 s each
    (issue 13, item 12). At the cap the oldest silent one is dropped: the server holds at
    most MAX_CONNECTIONS, and a probe arriving behind the flood is answered."""
    port = served.server.port
    silent = []
    try:
        for _ in range(300):
            silent.append(await asyncio.open_connection("127.0.0.1", port))
        # Let the server accept them all (a deadline as a hang guard, not a timing claim).
        deadline = asyncio.get_running_loop().time() + 30
        while served.server.open_connections < ops_http.MAX_CONNECTIONS:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        assert served.server.open_connections <= ops_http.MAX_CONNECTIONS
        reply = await asyncio.wait_for(get(port, "/health/live"), 30)
        assert reply.status == 200
        assert served.server.open_connections <= ops_http.MAX_CONNECTIONS
        # The dropped ones were closed by the server: reading them ends at once.
        oldest_reader, _ = silent[0]
        assert await asyncio.wait_for(oldest_reader.read(), 30) == b""
    finally:
        for _, writer in silent:
            writer.close()


async def test_malformed_requests_are_not_logged_as_errors(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    """A client's bad request is answered with 400; it must not put a traceback at ERROR in
    our log (a client could flood it)."""
    bad = [
        b"GET /metrics HTTP/1.1\r\n\r\n",  # no Host
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"v" * 9000 + b"\r\n\r\n",
    ]
    with caplog.at_level(logging.DEBUG):
        for request in bad:
            assert (await raw(served.server.port, request)).status == 400
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_disabled_endpoints_start_no_server() -> None:
    async with ops_http.ops_endpoints(
        False, "127.0.0.1", 0, Metrics(), Health(), setting="metrics.port"
    ) as server:
        assert server is None
    async with ops_http.ops_endpoints(
        True, "127.0.0.1", 0, Metrics(), Health(), setting="metrics.port"
    ) as server:
        assert server is not None
        assert (await get(server.port, "/health/live")).status == 200
        port = server.port
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)


async def test_a_client_trickling_its_request_is_closed_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The timeout runs from the connection's start: sending a byte now and then does not
    extend it (slowloris)."""
    monkeypatch.setattr(ops_http, "REQUEST_TIMEOUT_S", 0.3)
    server = await start_http_server("127.0.0.1", 0, Metrics(), Health())
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10  # a hang guard far above the timeout
        closed = False
        while not closed:
            assert loop.time() < deadline, "the server kept a trickling client open"
            try:
                writer.write(b"a")  # a valid path, one byte at a time, never ended
                await writer.drain()
            except ConnectionError:
                break
            with contextlib.suppress(TimeoutError):
                closed = await asyncio.wait_for(reader.read(1), 0.05) == b""
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    finally:
        await server.close()


async def test_a_port_in_use_is_refused_naming_the_setting() -> None:
    """Not an OSError traceback: a ConfigError (exit 2) naming the address and the setting
    the caller says holds the port."""
    async with ops_http.ops_endpoints(
        True, "127.0.0.1", 0, Metrics(), Health(), setting="metrics.port"
    ) as first:
        assert first is not None
        with pytest.raises(ops_http.PortUnavailableError) as refused:
            async with ops_http.ops_endpoints(
                True, "127.0.0.1", first.port, Metrics(), Health(), setting="metrics.port"
            ):
                pass
    assert refused.value.exit_code == 2
    assert str(refused.value) == (
        f"metrics and health endpoints: 127.0.0.1:{first.port} is already in use; set "
        "metrics.port to a free port (another process, e.g. a second worker or sink on this "
        "host, may hold it)"
    )
