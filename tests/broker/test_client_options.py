"""client_kwargs: the kafka config section as aiokafka options, secrets included but never in
error messages."""

from __future__ import annotations

import secrets
import ssl
from pathlib import Path
from typing import Any

import pytest

from stream_dp.config import KafkaConfig
from stream_dp.errors import ConfigError
from stream_dp.kafka_client.client_options import client_kwargs


def _kafka(**fields: Any) -> KafkaConfig:
    return KafkaConfig(**fields)


def test_plaintext_has_no_security_options() -> None:
    kwargs = client_kwargs(_kafka(bootstrap_servers="k1:9092,k2:9092", client_id="me"))
    assert kwargs == {
        "bootstrap_servers": "k1:9092,k2:9092",
        "client_id": "me",
        "request_timeout_ms": 30_000,
        "security_protocol": "PLAINTEXT",
    }


def test_sasl_password_from_file(tmp_path: Path) -> None:
    password = secrets.token_hex(8)
    secret = tmp_path / "password"
    secret.write_text(f"{password}\n")
    kwargs = client_kwargs(
        _kafka(
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="SCRAM-SHA-512",
            sasl_username="svc",
            sasl_password_file=secret,
        )
    )
    assert kwargs["sasl_mechanism"] == "SCRAM-SHA-512"
    assert kwargs["sasl_plain_username"] == "svc"
    assert kwargs["sasl_plain_password"] == password
    assert "ssl_context" not in kwargs


def test_sasl_ssl_builds_an_ssl_context() -> None:
    password = secrets.token_hex(8)
    kwargs = client_kwargs(
        _kafka(
            security_protocol="SASL_SSL",
            sasl_mechanism="PLAIN",
            sasl_username="svc",
            sasl_password=password,
        )
    )
    assert kwargs["sasl_plain_password"] == password
    assert isinstance(kwargs["ssl_context"], ssl.SSLContext)
    assert kwargs["ssl_context"].verify_mode == ssl.CERT_REQUIRED


def test_unreadable_password_file_names_the_setting(tmp_path: Path) -> None:
    kafka = _kafka(
        security_protocol="SASL_SSL",
        sasl_mechanism="PLAIN",
        sasl_username="svc",
        sasl_password_file=tmp_path / "missing",
    )
    with pytest.raises(ConfigError, match=r"kafka\.sasl_password_file"):
        client_kwargs(kafka)


def test_password_and_password_file_together_are_refused(tmp_path: Path) -> None:
    inline, in_file = secrets.token_hex(8), secrets.token_hex(8)
    (tmp_path / "pw").write_text(in_file)
    kafka = _kafka(
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_username="svc",
        sasl_password=inline,
        sasl_password_file=tmp_path / "pw",
    )
    with pytest.raises(ConfigError, match="keep only one") as info:
        client_kwargs(kafka)
    assert inline not in str(info.value) and in_file not in str(info.value)


def test_ssl_files_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"kafka.ssl_cafile = .*no such file"):
        client_kwargs(_kafka(security_protocol="SSL", ssl_cafile=tmp_path / "ca.pem"))
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("this is not a certificate")
    with pytest.raises(ConfigError, match="cannot load the SSL files"):
        client_kwargs(_kafka(security_protocol="SSL", ssl_cafile=not_pem))


def test_embedded_needs_an_explicit_address() -> None:
    kafka = _kafka(bootstrap_servers="embedded")
    with pytest.raises(ConfigError, match="start the embedded broker first"):
        client_kwargs(kafka)
    assert client_kwargs(kafka, bootstrap_servers="127.0.0.1:1234")["bootstrap_servers"] == (
        "127.0.0.1:1234"
    )
