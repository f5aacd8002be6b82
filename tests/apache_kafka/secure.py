"""A secured Apache Kafka for the tests: certificates made here, SASL_SSL (SCRAM-SHA-512) and
mutual-TLS listeners, the StandardAuthorizer, and ACLs written through the admin protocol.

The broker keeps its PLAINTEXT listener (principal ``User:ANONYMOUS``, a super user) for the
test's own producers and readers; the service under test is pointed at a secured listener.

Certificates come from the ``openssl`` command line (the venv has no ``cryptography``): a
CA, the broker's (SAN ``IP:127.0.0.1``, ``DNS:localhost``, in a PKCS12 key store) and a
client's (CN :data:`MTLS_CN`), all PEM besides the broker's store, valid for two days.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka.conn import create_conn
from aiokafka.protocol.admin import CreateAclsRequest, DeleteAclsRequest

from stream_dp.broker.apache_kafka import ApacheKafkaBroker

#: The SCRAM-SHA-512 users: the service's (a super user) and one whose rights the ACL test sets.
USER, PASSWORD = "stream-dp", "scram-secret-of-stream-dp"
RESTRICTED_USER, RESTRICTED_PASSWORD = "restricted", "scram-secret-of-restricted"
#: The client certificate's subject, and so the mutual-TLS principal (a super user).
MTLS_CN = "stream-dp-worker"
_STORE_PASSWORD = "store-secret"  # noqa: S105 - a throw-away test key store

# Kafka's ACL codes (org.apache.kafka.common.acl / resource).
TOPIC, GROUP, CLUSTER, TRANSACTIONAL_ID = 2, 3, 4, 5
ALL, READ, WRITE, DESCRIBE = 2, 3, 4, 8
DENY, ALLOW = 2, 3
_LITERAL = 3


@dataclass(frozen=True)
class Certificates:
    folder: Path
    ca: Path
    broker_store: Path
    client_cert: Path
    client_key: Path


def _openssl(folder: Path, *args: str) -> None:
    done = subprocess.run(
        ["openssl", *args], cwd=folder, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, f"openssl {' '.join(args)} failed:\n{done.stderr}"


def _signed(folder: Path, name: str, subject: str, extensions: str) -> None:
    _openssl(folder, "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", "-subj", subject)  # fmt: skip
    (folder / f"{name}.ext").write_text(extensions + "\n", "utf-8")
    _openssl(folder, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "2", "-out", f"{name}.pem",
             "-extfile", f"{name}.ext")  # fmt: skip


def make_ca(folder: Path) -> Path:
    """A fresh CA (``ca.pem``, ``ca.key``) in ``folder``; the certificate's path."""
    if shutil.which("openssl") is None:
        raise AssertionError("the security tests make their certificates with openssl: install it")
    folder.mkdir(parents=True, exist_ok=True)
    _openssl(folder, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
             "-out", "ca.pem", "-days", "2", "-subj", "/CN=stream-dp test CA")  # fmt: skip
    return folder / "ca.pem"


def make_certificates(folder: Path) -> Certificates:
    """A CA, the broker's key store and a client's certificate and key, in ``folder``."""
    make_ca(folder)
    _signed(folder, "broker", "/CN=localhost",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth")  # fmt: skip
    _openssl(folder, "pkcs12", "-export", "-in", "broker.pem", "-inkey", "broker.key",
             "-certfile", "ca.pem", "-name", "broker", "-out", "broker.p12",
             "-passout", f"pass:{_STORE_PASSWORD}")  # fmt: skip
    _signed(folder, "client", f"/CN={MTLS_CN}", "extendedKeyUsage=clientAuth")
    return Certificates(
        folder, folder / "ca.pem", folder / "broker.p12", folder / "client.pem",
        folder / "client.key",
    )  # fmt: skip


def secure_broker_config(certs: Certificates) -> dict[str, str]:
    """server.properties lines: TLS on both extra listeners, client certificates required on
    ``SSL``, SCRAM-SHA-512 on ``SASL_SSL``, the StandardAuthorizer with its super users."""
    return {
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": str(certs.broker_store),
        "ssl.keystore.password": _STORE_PASSWORD,
        "ssl.key.password": _STORE_PASSWORD,
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(certs.ca),
        "listener.name.ssl.ssl.client.auth": "required",
        "sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "listener.name.sasl_ssl.sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": (
            "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        ),
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": f"User:ANONYMOUS;User:{USER};User:CN={MTLS_CN}",
    }


@contextmanager
def secure_broker(folder: Path) -> Iterator[tuple[ApacheKafkaBroker, Certificates]]:
    """A started broker with listeners PLAINTEXT, SASL_SSL and SSL (mutual TLS)."""
    certs = make_certificates(folder)
    scram = [
        f"SCRAM-SHA-512=[name={user},password={password}]"
        for user, password in ((USER, PASSWORD), (RESTRICTED_USER, RESTRICTED_PASSWORD))
    ]
    broker = ApacheKafkaBroker(
        broker_config=secure_broker_config(certs),
        extra_listeners={"SASL_SSL": "SASL_SSL", "SSL": "SSL"},
        scram_credentials=scram,
    )
    with broker:
        yield broker, certs


def scram_kafka(broker: ApacheKafkaBroker, certs: Certificates, **extra: Any) -> dict[str, Any]:
    """The ``kafka`` section settings of a client of the SASL_SSL listener (as ``USER``)."""
    return {
        "bootstrap_servers": broker.listener_bootstrap("SASL_SSL"),
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_username": USER,
        "sasl_password": PASSWORD,
        "ssl_cafile": str(certs.ca),
        **extra,
    }


def mtls_kafka(broker: ApacheKafkaBroker, certs: Certificates) -> dict[str, Any]:
    """The ``kafka`` section settings of a client of the mutual-TLS listener."""
    return {
        "bootstrap_servers": broker.listener_bootstrap("SSL"),
        "security_protocol": "SSL",
        "ssl_cafile": str(certs.ca),
        "ssl_certfile": str(certs.client_cert),
        "ssl_keyfile": str(certs.client_key),
    }


async def create_acls(plaintext_bootstrap: str, acls: list[tuple[int, str, str, int, int]]) -> None:
    """Write ACLs ``(resource type, resource name, principal, operation, permission)`` (literal
    patterns, any host) through the PLAINTEXT listener (a super user); AssertionError naming
    the broker's answer when one is refused."""
    host, _, port = plaintext_bootstrap.rpartition(":")
    conn = await create_conn(host, int(port), request_timeout_ms=60_000)
    errors: list[tuple[int, str]] = []
    try:
        for rtype, name, principal, op, perm in acls:
            request = CreateAclsRequest(rtype, name, _LITERAL, principal, "*", op, perm)
            response = await conn.send(request)
            errors += [(c, m) for c, m in response.creation_responses if c != 0]
    finally:
        conn.close()
    assert not errors, f"CreateAcls refused: {errors}"


async def delete_acls(plaintext_bootstrap: str, acls: list[tuple[int, str, str, int, int]]) -> None:
    """Remove ACLs written by :func:`create_acls` (the same tuples, matched exactly);
    AssertionError when the broker refuses one or none matched."""
    host, _, port = plaintext_bootstrap.rpartition(":")
    conn = await create_conn(host, int(port), request_timeout_ms=60_000)
    problems: list[Any] = []
    try:
        for rtype, name, principal, op, perm in acls:
            request = DeleteAclsRequest(rtype, name, _LITERAL, principal, "*", op, perm)
            response = await conn.send(request)
            for code, message, matched in response.filter_responses:
                if code != 0 or len(matched) != 1:
                    problems.append((name, code, message, matched))
    finally:
        conn.close()
    assert not problems, f"DeleteAcls: {problems}"
