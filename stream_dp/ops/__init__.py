"""Operations: Prometheus metrics, liveness/readiness, the ops HTTP server, logging set-up."""

from stream_dp.ops.health import COMPONENTS, Health
from stream_dp.ops.http import HttpServer, start_http_server
from stream_dp.ops.logging import configure_logging
from stream_dp.ops.metrics import Metrics

__all__ = [
    "COMPONENTS",
    "Health",
    "HttpServer",
    "Metrics",
    "configure_logging",
    "start_http_server",
]
