"""The ops HTTP server: ``/metrics``, ``/health/live`` and ``/health/ready``.

Served by aiohttp's low-level server (:class:`aiohttp.web.Server` with a
:class:`~aiohttp.web.ServerRunner` and a :class:`~aiohttp.web.TCPSite`) in the worker's own
event loop, without a thread and without signal handlers of its own (the worker keeps
SIGTERM). aiohttp parses the requests (llhttp, the parser of Node.js) and answers malformed
ones with 400 itself; no HTTP code of ours reads the network. Every answer closes its
connection (``Connection: close``). If the event loop is blocked this server cannot answer
either: a liveness probe then times out, which is the right outcome for a stuck worker.

Bounds on what a client can hold:

- the request line and each header at most :data:`MAX_LINE_BYTES`, at most
  :data:`MAX_HEADERS` headers (so the head is bounded too); a longer one gets 400;
- request bodies are never read (aiohttp discards what arrives, for at most
  :data:`LINGER_S`);
- a client has :data:`REQUEST_TIMEOUT_S` from connecting to complete its request, else the
  connection is closed;
- at most :data:`MAX_CONNECTIONS` connections: when a new one arrives at the cap, the oldest
  is dropped to make room (answers are immediate, so the oldest is a slow or silent
  client), so half-open clients can neither exhaust file descriptors nor lock out probes.

Endpoints (GET and HEAD):

- ``/metrics``: Prometheus text format 0.0.4;
- ``/health/live``: 200 when the loop beats, else 503; JSON body from :meth:`Health.status`;
- ``/health/ready``: 200 when every component is ok, else 503; same JSON body;
- anything else: 404; a method other than GET/HEAD: 405; a request target that is not a
  path (absolute form, ``*``) or a request that is not HTTP/1.x: 400.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
from collections.abc import AsyncIterator
from http import HTTPStatus
from typing import Any, Protocol

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from stream_dp.errors import ConfigError
from stream_dp.ops.health import Health

log = logging.getLogger(__name__)

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
JSON_CONTENT_TYPE = "application/json"
TEXT_CONTENT_TYPE = "text/plain; charset=utf-8"

#: Limits on the request head; beyond them aiohttp answers 400 and closes.
MAX_LINE_BYTES = 8190
MAX_HEADERS = 100
#: Seconds a client has, from connecting, to send a complete request head.
REQUEST_TIMEOUT_S = 5.0
#: Connections served at once; at the cap the oldest is dropped.
MAX_CONNECTIONS = 32
#: Seconds an unread request body is drained before the connection closes.
LINGER_S = 1.0


class MetricsSource(Protocol):
    """What ``/metrics`` serves: the worker's :class:`~stream_dp.ops.metrics.Metrics`, the
    sink's metrics, anything with a text exposition."""

    def exposition(self) -> bytes: ...


class _QuietBadRequests(logging.Filter):
    """A malformed request is the client's error, answered with 400: not an error with a
    traceback in our log (a client could flood it). Any other failure is still logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, HttpProcessingError)


_request_log = logging.getLogger(f"{__name__}.requests")
_request_log.addFilter(_QuietBadRequests())


class _CappedServer(web.Server):
    """aiohttp's low-level server with a cap on open connections (oldest dropped)."""

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        open_now = [h for h in self.connections if h.transport is not None]
        if len(open_now) >= MAX_CONNECTIONS:
            open_now[0].force_close()
        super().connection_made(handler, transport)


class HttpServer:
    """A running ops HTTP server; :attr:`port` is the bound port (useful when 0 was asked)."""

    def __init__(self, metrics: MetricsSource, health: Health) -> None:
        self._metrics = metrics
        self._health = health
        self._runner: web.ServerRunner | None = None
        self._server: _CappedServer | None = None
        self.host = ""
        self.port = 0

    async def _start(self, host: str, port: int) -> None:
        self._server = _CappedServer(
            self._handle,
            max_line_size=MAX_LINE_BYTES,
            max_field_size=MAX_LINE_BYTES,
            max_headers=MAX_HEADERS,
            # aiohttp arms this timer when a connection opens: a client that has not sent
            # a complete request by then is closed.
            keepalive_timeout=REQUEST_TIMEOUT_S,
            lingering_time=LINGER_S,
            access_log=None,
            logger=_request_log,
        )
        self._runner = web.ServerRunner(self._server, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            raise PortUnavailableError(host, port, exc) from exc
        address: Any = self._runner.addresses[0]
        self.host, self.port = str(address[0]), int(address[1])

    async def close(self) -> None:
        """Stop listening and end open connections."""
        if self._runner is None:
            return
        runner, self._runner = self._runner, None
        await runner.cleanup()

    @property
    def open_connections(self) -> int:
        if self._server is None:
            return 0
        return sum(1 for h in self._server.connections if h.transport is not None)

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.version < (1, 0):  # an HTTP/0.9 request line, which aiohttp accepts
            status, content_type, body = (
                HTTPStatus.BAD_REQUEST,
                TEXT_CONTENT_TYPE,
                b"not an HTTP/1.x request\n",
            )
        else:
            status, content_type, body = self._route(request.method, request.raw_path)
        response = web.Response(
            status=status,
            body=body,
            headers={"Content-Type": content_type, "Cache-Control": "no-store"},
        )
        response.force_close()
        return response

    def _route(self, method: str, target: str) -> tuple[HTTPStatus, str, bytes]:
        if not target.startswith("/"):
            return HTTPStatus.BAD_REQUEST, TEXT_CONTENT_TYPE, b"request target must be a path\n"
        if method not in ("GET", "HEAD"):
            return HTTPStatus.METHOD_NOT_ALLOWED, TEXT_CONTENT_TYPE, b"use GET\n"
        path = target.split("?", 1)[0].split("#", 1)[0]
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


class PortUnavailableError(ConfigError):
    """The ops server's port cannot be bound (in use, or not allowed); the message names
    the setting to change, set by :func:`ops_endpoints`."""

    def __init__(self, host: str, port: int, cause: OSError, setting: str = "the port") -> None:
        self.host, self.port, self.cause = host, port, cause
        if cause.errno == errno.EADDRINUSE:
            reason = "is already in use"
        else:
            reason = f"cannot be bound ({os.strerror(cause.errno) if cause.errno else cause})"
        super().__init__(
            f"metrics and health endpoints: {host}:{port} {reason}; "
            f"set {setting} to a free port (another process, e.g. a second worker or sink on "
            "this host, may hold it)"
        )

    def naming(self, setting: str) -> PortUnavailableError:
        """The same error, naming ``setting`` as the one to change."""
        return PortUnavailableError(self.host, self.port, self.cause, setting)


async def start_http_server(
    host: str, port: int, metrics: MetricsSource, health: Health
) -> HttpServer:
    """Listen on ``host:port`` (port 0: any free port, see ``.port``) and serve until closed.
    A port that cannot be bound raises :class:`PortUnavailableError`."""
    server = HttpServer(metrics, health)
    await server._start(host, port)
    log.info("ops HTTP server listening on %s:%d", server.host, server.port)
    return server


@contextlib.asynccontextmanager
async def ops_endpoints(
    enabled: bool,
    host: str,
    port: int,
    metrics: MetricsSource,
    health: Health,
    *,
    setting: str,
) -> AsyncIterator[HttpServer | None]:
    """The ops server for the length of a ``with`` block (None when not ``enabled``);
    ``setting`` names where the port is set (a port in use is refused naming it)."""
    if not enabled:
        yield None
        return
    try:
        server = await start_http_server(host, port, metrics, health)
    except PortUnavailableError as exc:
        raise exc.naming(setting) from exc.cause
    log.info("metrics and health on http://%s:%d", host, server.port)
    try:
        yield server
    finally:
        await server.close()
