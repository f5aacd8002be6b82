"""A small HTTP/1.1 server for ``/metrics``, ``/health/live`` and ``/health/ready``.

Built on :func:`asyncio.start_server` so it runs in the worker's event loop without a thread.
Requests are parsed by httptools, the Python binding of llhttp (the parser of Node.js), not
by code of ours. It answers GET and HEAD, one request per connection
(``Connection: close``), and turns anything malformed into a 4xx answer rather than an
exception. If the event loop is blocked, this server cannot answer either: a liveness probe
then times out, which is the right outcome for a stuck worker.

Connections are capped (:data:`MAX_CONNECTIONS`): when a new one arrives at the cap, the
oldest connection that has not finished sending its request is dropped to make room, so
half-open or slow clients can neither exhaust file descriptors nor lock out the probes
(every client also has :data:`REQUEST_TIMEOUT_S` to send its request).

Endpoints:

- ``/metrics``: Prometheus text format 0.0.4;
- ``/health/live``: 200 when the loop beats, else 503; JSON body from :meth:`Health.status`;
- ``/health/ready``: 200 when every component is ok, else 503; same JSON body;
- anything else: 404; a method other than GET/HEAD: 405.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from http import HTTPStatus
from typing import Protocol

import httptools

from stream_dp.ops.health import Health

log = logging.getLogger(__name__)

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
JSON_CONTENT_TYPE = "application/json"
TEXT_CONTENT_TYPE = "text/plain; charset=utf-8"

#: Limits on what a client may send before it gets a 4xx and the connection is closed.
MAX_LINE_BYTES = 8192
MAX_HEADERS = 100
#: At most this much is read before the request head (request line and headers) must end.
MAX_HEAD_BYTES = 32 * 1024
_READ_CHUNK_BYTES = 4096
REQUEST_TIMEOUT_S = 5.0
#: Connections served at once; at the cap the oldest still sending its request is dropped.
MAX_CONNECTIONS = 32
#: After an error answer, unread input is drained for at most this long / this much.
LINGER_S = 1.0
LINGER_MAX_BYTES = 256 * 1024


class MetricsSource(Protocol):
    """What ``/metrics`` serves: the worker's :class:`~stream_dp.ops.metrics.Metrics`, the
    sink's metrics, anything with a text exposition."""

    def exposition(self) -> bytes: ...


class _BadRequest(Exception):
    def __init__(self, status: HTTPStatus, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class HttpServer:
    """A running ops HTTP server; :attr:`port` is the bound port (useful when 0 was asked)."""

    def __init__(self, metrics: MetricsSource, health: Health) -> None:
        self._metrics = metrics
        self._health = health
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        #: Connections still sending their request, oldest first (dropped first at the cap).
        self._reading: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self.host = ""
        self.port = 0

    async def _start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._on_connection, host, port)
        sockname = self._server.sockets[0].getsockname()
        self.host, self.port = str(sockname[0]), int(sockname[1])

    async def close(self) -> None:
        """Stop listening and end open connections."""
        if self._server is None:
            return
        self._server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        if task is not None:
            if len(self._connections) >= MAX_CONNECTIONS:
                self._drop_oldest_reader()
            self._connections.add(task)
            self._reading[task] = writer
        try:
            try:
                method, path = await asyncio.wait_for(_read_request(reader), REQUEST_TIMEOUT_S)
                if task is not None:
                    self._reading.pop(task, None)
            except _BadRequest as exc:
                body = f"{exc.reason}\n".encode()
                await _respond(writer, exc.status, TEXT_CONTENT_TYPE, body)
                await _lingering_close(reader, writer)
                return
            except TimeoutError:
                body = b"request timeout\n"
                await _respond(writer, HTTPStatus.REQUEST_TIMEOUT, TEXT_CONTENT_TYPE, body)
                await _lingering_close(reader, writer)
                return
            status, ctype, payload = self._route(method, path)
            await _respond(writer, status, ctype, payload, head_only=method == "HEAD")
            if status != HTTPStatus.OK:
                await _lingering_close(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away; nothing to answer
        except asyncio.CancelledError:
            raise
        except Exception:
            # Never let one request take the server down; the traceback is for operators.
            log.exception("ops HTTP server: unexpected error while answering a request")
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                await writer.wait_closed()
            if task is not None:
                self._connections.discard(task)
                self._reading.pop(task, None)

    def _drop_oldest_reader(self) -> None:
        """Make room at the cap: abort the oldest connection still sending its request."""
        if not self._reading:
            return
        task, writer = next(iter(self._reading.items()))
        del self._reading[task]
        self._connections.discard(task)
        # Its read then fails like any dropped client's, and the task ends by itself.
        writer.transport.abort()

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    def _route(self, method: str, path: str) -> tuple[HTTPStatus, str, bytes]:
        if method not in ("GET", "HEAD"):
            return HTTPStatus.METHOD_NOT_ALLOWED, TEXT_CONTENT_TYPE, b"use GET\n"
        path = path.split("?", 1)[0].split("#", 1)[0]
        if path == "/metrics":
            return HTTPStatus.OK, METRICS_CONTENT_TYPE, self._metrics.exposition()
        if path in ("/health/live", "/health/ready"):
            ok = self._health.live() if path == "/health/live" else self._health.ready()
            body = json.dumps(self._health.status(), sort_keys=True).encode() + b"\n"
            status = HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE
            return status, JSON_CONTENT_TYPE, body
        return (
            HTTPStatus.NOT_FOUND,
            TEXT_CONTENT_TYPE,
            b"not found; try /metrics, /health/live or /health/ready\n",
        )


class _RequestHead:
    """The httptools callbacks for one request head: the target, the header count and the
    moment the head is complete. Bodies are not kept."""

    def __init__(self) -> None:
        self.target = b""
        self.headers = 0
        self.longest_header = 0
        self.complete = False

    def on_url(self, url: bytes) -> None:
        self.target += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers += 1
        self.longest_header = max(self.longest_header, len(name) + len(value))

    def on_headers_complete(self) -> None:
        self.complete = True


def _check_limits(head: _RequestHead, head_bytes: int) -> None:
    if len(head.target) > MAX_LINE_BYTES or head.longest_header > MAX_LINE_BYTES:
        raise _BadRequest(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "line too long")
    if head.headers > MAX_HEADERS:
        raise _BadRequest(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "too many headers")
    if head_bytes > MAX_HEAD_BYTES:
        raise _BadRequest(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "request head too large")


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str]:
    """Read the request line and headers with httptools (llhttp); return (method, path).

    Bodies are not read. Only HTTP/1.x requests in origin form (a path starting with ``/``)
    are served; anything the parser rejects, or that breaks a limit, is a :class:`_BadRequest`.
    """
    head = _RequestHead()
    parser = httptools.HttpRequestParser(head)
    head_bytes = 0
    while not head.complete:
        chunk = await reader.read(_READ_CHUNK_BYTES)
        if not chunk:
            if head_bytes:
                raise _BadRequest(HTTPStatus.BAD_REQUEST, "incomplete request")
            raise asyncio.IncompleteReadError(b"", None)
        head_bytes += len(chunk)
        try:
            parser.feed_data(chunk)
        except httptools.HttpParserUpgrade:
            pass  # an Upgrade request: its head is complete; it is answered as plain HTTP
        except httptools.HttpParserError as exc:
            _check_limits(head, head_bytes)
            raise _BadRequest(HTTPStatus.BAD_REQUEST, f"malformed request: {exc}") from None
        _check_limits(head, head_bytes)
    if not parser.get_http_version().startswith("1."):
        raise _BadRequest(HTTPStatus.BAD_REQUEST, "not an HTTP/1.x request")
    method = parser.get_method().decode("ascii")
    try:
        path = head.target.decode("ascii")
    except UnicodeDecodeError:
        raise _BadRequest(HTTPStatus.BAD_REQUEST, "request target is not ASCII") from None
    if not path.startswith("/"):
        raise _BadRequest(HTTPStatus.BAD_REQUEST, "request target must be a path")
    return method, path


async def _respond(
    writer: asyncio.StreamWriter,
    status: HTTPStatus,
    content_type: str,
    body: bytes,
    *,
    head_only: bool = False,
) -> None:
    head = (
        f"HTTP/1.1 {status.value} {status.phrase}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Cache-Control: no-store\r\n"
        "Connection: close\r\n"
        "\r\n"
    ).encode("ascii")
    writer.write(head if head_only else head + body)
    await writer.drain()


async def _lingering_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Half-close, then drain what the client still sends (bounded) before closing.

    Closing a socket with unread input makes the kernel send a reset, which can destroy the
    error response before the client reads it. Reading the rest first avoids that.
    """
    if writer.can_write_eof():
        writer.write_eof()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + LINGER_S
    drained = 0
    with contextlib.suppress(TimeoutError, ConnectionError):
        while drained < LINGER_MAX_BYTES:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            chunk = await asyncio.wait_for(reader.read(65536), remaining)
            if not chunk:
                break
            drained += len(chunk)


async def start_http_server(
    host: str, port: int, metrics: MetricsSource, health: Health
) -> HttpServer:
    """Listen on ``host:port`` (port 0: any free port, see ``.port``) and serve until closed."""
    server = HttpServer(metrics, health)
    await server._start(host, port)
    log.info("ops HTTP server listening on %s:%d", server.host, server.port)
    return server
