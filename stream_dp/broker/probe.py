"""Is a Kafka-protocol broker answering? Asked with the Kafka client, not by hand.

An open TCP port is not enough: a broker is ready when it answers a real Kafka request. The
check opens one aiokafka connection per address — which negotiates the protocol versions the
broker supports (ApiVersions) and speaks the configured security protocol (TLS, SASL) — and
asks for the cluster metadata with the best version both sides know. Nothing is hand-built,
so brokers that dropped old protocol versions (Kafka 4.0) answer as well as old ones. No
consumer group, no topic: it works on any listener.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final

from stream_dp.broker.connection_errors import describe_error, what_to_check
from stream_dp.config import KafkaConfig
from stream_dp.errors import BrokerError, ConfigError
from stream_dp.kafka_client.errors import KafkaError
from stream_dp.kafka_client.protocol import MetadataRequest, create_conn
from stream_dp.retry import Backoff, retry

#: client_kwargs keys that a single connection takes as they are.
_CONNECTION_OPTIONS = (
    "client_id",
    "security_protocol",
    "ssl_context",
    "sasl_mechanism",
    "sasl_plain_username",
    "sasl_plain_password",
)

log = logging.getLogger(__name__)

#: How long a service's first contact waits before it says it is waiting for the broker.
FIRST_TRY_S = 2.0

#: Waits between rounds while a broker starts: ceilings 0.05, 0.1, … up to 1 s.
PROBE_BACKOFF = Backoff(base_s=0.05, cap_s=1.0)

#: A running service's broker check (:func:`watch_broker`): how often, and how long one may
#: take in all (:meth:`KeptProbe.check`).
BROKER_PROBE_INTERVAL_S: Final = 1.0
BROKER_PROBE_TIMEOUT_S: Final = 2.0
#: The least a check's new connections are given when the kept one used most of its time.
MIN_FALLBACK_S: Final = 0.1


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


def _connection_options(kafka: KafkaConfig | None, host: str, port: int) -> dict[str, Any]:
    from stream_dp.kafka_client.client_options import client_kwargs

    settings = kafka if kafka is not None else KafkaConfig(client_id="stream-dp-probe")
    kwargs = client_kwargs(settings, bootstrap_servers=f"{host}:{port}")
    return {k: kwargs[k] for k in _CONNECTION_OPTIONS if k in kwargs}


async def probe(
    host: str,
    port: int,
    timeout_s: float,
    *,
    kafka: KafkaConfig | None = None,
    keep: Callable[[Any], None] | None = None,
) -> list[BrokerAddress]:
    """Ask the broker at ``host:port`` for its metadata; the brokers it advertises.

    Raises ``TimeoutError`` when nothing answers within ``timeout_s``, ``OSError`` when the
    connection fails (refused, reset), ``ValueError`` when something answers but not as a
    Kafka broker, and a BrokerError that is not ``retriable`` when the broker refuses this
    client's credentials or certificate (or its own is not trusted): waiting cannot clear
    that, a setting must change. ``kafka`` gives the security options (default: PLAINTEXT).
    ``keep``: given the connection once it answered, instead of closing it (:class:`KeptProbe`).
    """
    options = _connection_options(kafka, host, port)
    timeout_ms = max(100, int(timeout_s * 1000))

    async def exchange() -> Any:
        conn = await create_conn(host, port, request_timeout_ms=timeout_ms, **options)
        try:
            response = await conn.send(MetadataRequest([]))
        except BaseException:
            conn.close()
            raise
        if keep is None:
            conn.close()
        else:
            keep(conn)
        return response

    try:
        response = await asyncio.wait_for(exchange(), timeout_s)
    except TimeoutError:
        raise TimeoutError(f"no response within {timeout_s:g} s") from None
    except OSError as exc:  # also a TLS handshake that fails the certificate's verification
        _raise_if_refused(host, port, exc)
        raise
    except KafkaError as exc:
        _raise_if_refused(host, port, exc)
        raise ValueError(
            f"no Kafka answer ({type(exc).__name__}: {exc}): not a Kafka broker, a listener "
            "with other security settings, or a broker still starting"
        ) from None
    brokers = [BrokerAddress(b[0], b[1], b[2]) for b in response.brokers]
    if not brokers:
        raise ValueError("the Metadata response lists no broker")
    return brokers


def _raise_if_refused(host: str, port: int, exc: BaseException) -> None:
    """A broker that refused this client's credentials or certificate, or whose certificate
    this client does not trust: a BrokerError that is not retriable (waiting cannot help, a
    setting must change), naming the settings."""
    text = str(exc)  # aiokafka's own text names its class ("[Error 58] SaslAuthentica...")
    reason = text if type(exc).__name__ in text else describe_error(exc)
    fix = what_to_check(reason, "")
    if fix:
        error = BrokerError(f"the broker at {host}:{port} refused the connection: {reason}; {fix}")
        error.retriable = False
        raise error from None


def probe_sync(host: str, port: int, timeout_s: float) -> list[BrokerAddress]:
    """:func:`probe` for synchronous callers: it runs an event loop for the call (in a helper
    thread when this thread already runs one)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(probe(host, port, timeout_s))
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, probe(host, port, timeout_s)).result()


async def wait_for_broker(
    bootstrap: str,
    timeout_s: float = 30.0,
    *,
    kafka: KafkaConfig | None = None,
    on_failure: Callable[[BaseException], None] = lambda _: None,
    keep: Callable[[Any], None] | None = None,
) -> None:
    """Wait until a broker at ``bootstrap`` (``host:port[,host:port...]``) answers a Metadata
    request; BrokerError after ``timeout_s``. Pass ``kafka`` for its security options;
    ``on_failure`` is called after each round that found no broker; ``keep`` is given the
    connection that answered (:func:`probe`)."""
    addresses = parse_bootstrap(bootstrap)
    deadline = time.monotonic() + timeout_s

    last_error = "no attempt finished"

    async def ask_each() -> None:
        """One round over the addresses; the last one's error when none answers."""
        nonlocal last_error
        attempt_s = max(0.1, min(deadline - time.monotonic(), 5.0))
        error: OSError | ValueError | None = None
        for host, port in addresses:
            try:
                await probe(host, port, attempt_s, kafka=kafka, keep=keep)
                return
            except (OSError, ValueError) as exc:
                last_error, error = f"{host}:{port}: {exc}", exc
        assert error is not None  # parse_bootstrap returns at least one address
        raise error

    def exhausted(exc: BaseException) -> BaseException:
        return _no_broker(bootstrap, timeout_s, last_error)

    await retry(
        f"ask {bootstrap} for metadata",
        ask_each,
        retry_on=(OSError, ValueError),
        backoff=PROBE_BACKOFF,
        deadline_s=timeout_s,
        exhausted=exhausted,
        on_failure=on_failure,
        log_level=logging.DEBUG,  # waiting for a broker that starts is expected, not a warning
    )


def _no_broker(bootstrap: str, timeout_s: float, last_error: str) -> BrokerError:
    return BrokerError(
        f"no Kafka broker answered at {bootstrap} within {timeout_s:g} s "
        f"(last error: {last_error}); check that the broker is running and that "
        "kafka.bootstrap_servers (and the kafka security options) point at it"
    )


class KeptProbe:
    """A running service's broker check (every second, for its readiness), over one kept
    connection: a Metadata request on the connection that answered last, and only when that
    fails (closed, reset, no answer in time, no broker listed) :func:`wait_for_broker`'s
    rounds over the bootstrap addresses on new connections, keeping the one that answers.
    A new connection per check cost a TCP connect, the protocol versions' exchange and, with
    security on, a TLS handshake and a SASL exchange every second, for as long as the service
    ran (bench/RESULTS.md, section 12: part of what each idle member of a group costs)."""

    def __init__(self, bootstrap: str, *, kafka: KafkaConfig | None = None) -> None:
        self.bootstrap = bootstrap
        self.kafka = kafka
        self._conn: Any = None

    async def check(self, timeout_s: float) -> None:
        """Return once a broker answered a Metadata request; BrokerError after ``timeout_s``
        (as :func:`wait_for_broker`). One deadline for the whole check: new connections get
        what the kept one left (at least :data:`MIN_FALLBACK_S`; none when it left nothing),
        so a broker that holds the connection open and stops answering fails a check within
        ``timeout_s``, not twice that."""
        deadline = time.monotonic() + timeout_s
        failure: str | None = None
        conn = self._conn
        if conn is not None and conn.connected():
            try:
                response = await asyncio.wait_for(conn.send(MetadataRequest([])), timeout_s)
                if response.brokers:
                    return
                failure = "the Metadata response lists no broker"
            except TimeoutError:
                failure = f"no response within {timeout_s:g} s"
            except (OSError, KafkaError) as exc:
                failure = describe_error(exc)
        self.close()
        if failure is not None:
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                raise _no_broker(self.bootstrap, timeout_s, f"the kept connection: {failure}")
            timeout_s = max(MIN_FALLBACK_S, left_s)
        await wait_for_broker(self.bootstrap, timeout_s, kafka=self.kafka, keep=self._keep)

    def _keep(self, conn: Any) -> None:
        self.close()
        self._conn = conn

    def close(self) -> None:
        """Close the kept connection (a later :meth:`check` opens a new one)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


async def watch_broker(
    probe: KeptProbe,
    *,
    on_result: Callable[[bool], None],
    stopping: Callable[[], bool],
    interval_s: float = BROKER_PROBE_INTERVAL_S,
    timeout_s: float = BROKER_PROBE_TIMEOUT_S,
) -> None:
    """A running service's broker watch (its readiness; liveness is unaffected): every
    ``interval_s`` one :meth:`KeptProbe.check` of at most ``timeout_s``, its result given to
    ``on_result`` (True: a broker answered), until ``stopping()`` — also a stop flag, as a
    cancellation can be lost in a check. A change is logged at WARNING ("broker unreachable",
    "broker reachable again"); the service is taken to start with its broker reachable, so a
    first check that fails says so and a first that succeeds says nothing. The probe is
    closed on the way out."""
    reachable = True
    try:
        while not stopping():
            try:
                await probe.check(timeout_s)
                ok = True
            except BrokerError:
                ok = False
            if ok != reachable:
                log.warning("broker %s", "reachable again" if ok else "unreachable")
            reachable = ok
            on_result(ok)
            await asyncio.sleep(interval_s)
    finally:
        probe.close()


async def wait_at_start(
    kafka: KafkaConfig, bootstrap: str, *, who: str, waiting: Callable[[], None]
) -> None:
    """A service's first contact: when no broker answers at once, say so at WARNING (what is
    awaited, for how long, which setting) and wait ``kafka.startup_wait_s`` for one, retrying
    with back-off; BrokerError naming the setting when none answers by then. A broker that
    is restarted with the service (a compose stack, a node reboot) is then no crash loop.
    ``waiting`` is called after every round without a broker (the service's liveness: a
    service waiting for its broker is alive, restarting it would not help)."""
    if kafka.startup_wait_s <= 0:
        return
    try:
        await wait_for_broker(bootstrap, FIRST_TRY_S, kafka=kafka)
        return
    except BrokerError as exc:
        if not exc.retriable:  # the broker answered and refused: no broker to wait for
            raise
        log.warning(
            "%s: no Kafka broker answers at %s yet (%s); waiting up to %g s for one "
            "(kafka.startup_wait_s)",
            who,
            bootstrap,
            exc.__cause__ or "no answer",
            kafka.startup_wait_s,
        )
    try:
        await wait_for_broker(
            bootstrap, kafka.startup_wait_s, kafka=kafka, on_failure=lambda _: waiting()
        )
    except BrokerError as exc:
        raise BrokerError(
            f"{exc}; waited kafka.startup_wait_s = {kafka.startup_wait_s:g} s (raise it to "
            "wait longer for a broker that starts slowly)"
        ) from None
    log.warning("%s: the broker at %s answers; starting", who, bootstrap)
