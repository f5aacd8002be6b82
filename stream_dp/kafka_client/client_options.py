"""aiokafka client options from the ``kafka`` config section, shared by every Kafka client.

The returned dict holds secrets (SASL password, SSL context): pass it to aiokafka, never log it.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

from aiokafka.helpers import create_ssl_context

from stream_dp.config import KafkaConfig
from stream_dp.errors import ConfigError

#: How often a long-lived consumer's background fetch routine wakes with nothing to do
#: (aiokafka's ``consumer_timeout_ms``, 200 by default). It wakes at once for what it
#: acts on — a fetch answered, records consumed, a seek, a pause lifted, an assignment
#: changed, metadata refreshed — so the timeout is only a safety net; at 200 ms a worker
#: whose fetch is held by the broker (``fetch_max_wait_ms``) or whose readers are paused
#: woke five times a second per consumer for nothing, part of the fixed CPU each member of
#: a group costs while it has nothing to read (bench/RESULTS.md, section 12).
FETCH_ROUTINE_WAKE_MS = 1_000


def _sasl_password(kafka: KafkaConfig) -> str:
    if kafka.sasl_password is not None and kafka.sasl_password_file is not None:
        raise ConfigError(
            "kafka.sasl_password and kafka.sasl_password_file are both set; keep only one"
        )
    if kafka.sasl_password is not None:
        return kafka.sasl_password.get_secret_value()
    path = kafka.sasl_password_file
    if path is None:
        raise ConfigError("SASL needs kafka.sasl_password or kafka.sasl_password_file")
    try:
        password = Path(path).read_text(encoding="utf-8").rstrip("\r\n")
    except OSError as exc:
        raise ConfigError(
            f"kafka.sasl_password_file = {str(path)!r}: cannot read it ({exc.strerror}); "
            "point it at a readable file holding only the password"
        ) from None
    if not password:
        raise ConfigError(f"kafka.sasl_password_file = {str(path)!r} is empty")
    return password


def _ssl_context(kafka: KafkaConfig) -> ssl.SSLContext:
    for field in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
        path = getattr(kafka, field)
        if path is not None and not Path(path).is_file():
            raise ConfigError(f"kafka.{field} = {str(path)!r}: no such file")
    if kafka.ssl_keyfile is not None and kafka.ssl_certfile is None:
        raise ConfigError("kafka.ssl_keyfile needs kafka.ssl_certfile (the client certificate)")
    password = kafka.ssl_key_password.get_secret_value() if kafka.ssl_key_password else None
    try:
        context: ssl.SSLContext = create_ssl_context(
            cafile=kafka.ssl_cafile,
            certfile=kafka.ssl_certfile,
            keyfile=kafka.ssl_keyfile,
            password=password,
        )
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            "cannot load the SSL files (kafka.ssl_cafile / ssl_certfile / ssl_keyfile): "
            f"{type(exc).__name__}: {exc.strerror or exc}; check that they are PEM files and "
            "that kafka.ssl_key_password matches the key"
        ) from None
    return context


def client_kwargs(kafka: KafkaConfig, *, bootstrap_servers: str | None = None) -> dict[str, Any]:
    """Keyword arguments for AIOKafkaAdminClient / AIOKafkaProducer / AIOKafkaConsumer:
    bootstrap servers, client id, request timeout and the security options.

    ``bootstrap_servers`` overrides the configured one (needed when the config says
    ``"embedded"``: pass the started broker's address).
    """
    bootstrap = bootstrap_servers or kafka.bootstrap_servers
    if bootstrap.strip().lower() == "embedded":
        raise ConfigError(
            'kafka.bootstrap_servers is "embedded": start the embedded broker first and pass '
            "its address, or set kafka.bootstrap_servers to host:port"
        )
    kwargs: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "client_id": kafka.client_id,
        "request_timeout_ms": kafka.request_timeout_ms,
        "security_protocol": kafka.security_protocol,
    }
    if kafka.security_protocol.startswith("SASL"):
        kwargs["sasl_mechanism"] = kafka.sasl_mechanism
        kwargs["sasl_plain_username"] = kafka.sasl_username
        kwargs["sasl_plain_password"] = _sasl_password(kafka)
    if kafka.security_protocol.endswith("SSL"):
        kwargs["ssl_context"] = _ssl_context(kafka)
    return kwargs
