"""A real Apache Kafka broker (single node, KRaft) for the test tier, the bench and chaos runs.

>>> with ApacheKafkaBroker() as broker:            # doctest: +SKIP
...     print(broker.bootstrap_servers)            # 127.0.0.1:PORT

The jars come from :mod:`stream_dp.broker.apache_kafka_jars` (Maven Central, pinned, cached in
``.venv``). Starting: a temporary data folder, a ``server.properties`` with two free loopback
ports (the client listener and the KRaft controller), the storage formatted by Kafka's own
tool (``kafka.tools.StorageTool format``), then ``kafka.Kafka server.properties``; the start
returns once the broker answers a Metadata request and advertises itself (a condition with a
hard timeout, not a sleep). Stopping: SIGTERM (Kafka's controlled shutdown), SIGKILL after
``stop_timeout_s``, and the data folder removed. As with the embedded broker, the JVM dies with
the thread that started it (``PR_SET_PDEATHSIG``), and at interpreter exit.

The defaults suit a 2-core machine shared by several test processes: a small heap, the serial
collector, few request threads, and a log cleaner that wakes every half second so compaction
can be watched in a test (``broker_config`` overrides any ``server.properties`` line;
``jvm_options`` replaces the JVM flags, e.g. for a benchmark).

A test of the security modes adds listeners: ``extra_listeners`` maps a listener name to its
security protocol (``{"SASL_SSL": "SASL_SSL", "SSL": "SSL"}``), each gets a free port and is
advertised (:meth:`ApacheKafkaBroker.listener_bootstrap` gives its address); their settings
(key stores, ``ssl.client.auth``, the authorizer) go in ``broker_config``, and
``scram_credentials`` (``"SCRAM-SHA-512=[name=alice,password=secret]"``) are written by the
storage tool's ``--add-scram`` before the broker starts (KRaft keeps them in its metadata).
The PLAINTEXT listener stays: the start's probe and a test's own admin use it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from base64 import urlsafe_b64encode
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Self

from stream_dp.broker.apache_kafka_jars import (
    APACHE_KAFKA_VERSION,
    JAVA_MIN_MAJOR,
    fetch_jars,
    java_executable,
    java_major_version,
)
from stream_dp.broker.embedded import broker_environment
from stream_dp.broker.probe import probe_sync
from stream_dp.broker.process import BrokerProcess, free_port, owns_listener
from stream_dp.errors import BrokerError

__all__ = ["APACHE_KAFKA_VERSION", "TEST_BROKER_CONFIG", "TEST_JVM_OPTIONS", "ApacheKafkaBroker"]

#: ``server.properties`` lines besides listeners and folders. Group timings as the tests need
#: them (Kafka's default least session timeout is 6 s; the tests use 2 s), a one-node cluster's
#: replication factors, small internal topics, few threads, a log cleaner that looks every
#: 500 ms. Topic auto-creation is on, as Kafka's default has it (stated, so that the tests of
#: topics deleted under a worker keep meaning something): stream-dp's clients never ask for it
#: (stream_dp/kafka_client/metadata.py), and tests create their topics.
TEST_BROKER_CONFIG: Mapping[str, str] = {
    "auto.create.topics.enable": "true",
    "group.initial.rebalance.delay.ms": "0",
    "group.min.session.timeout.ms": "500",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "4",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "num.network.threads": "2",
    "num.io.threads": "2",
    "num.recovery.threads.per.data.dir": "1",
    "background.threads": "2",
    "log.cleaner.threads": "1",
    "log.cleaner.backoff.ms": "500",
    "log.cleaner.dedupe.buffer.size": "8388608",
    "log.retention.check.interval.ms": "5000",
}
#: The JVM flags: a small heap and the serial collector (several brokers may share 2 cores),
#: and the quick-start JIT tier only.
TEST_JVM_OPTIONS: tuple[str, ...] = (
    "-Xms64m",
    "-Xmx384m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Djava.awt.headless=true",
)
_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.out.ref = out
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = info
"""
_PORT_ATTEMPTS = 3
_FORMAT_TIMEOUT_S = 120.0


def _cluster_id() -> str:
    """A random cluster id as Kafka spells them (URL-safe base64 of 16 bytes), never starting
    with "-" (Kafka's own ``Uuid.randomUuid`` avoids it too: a command line would take it for
    an option)."""
    while True:
        cluster_id = urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


class ApacheKafkaBroker(BrokerProcess):
    """A single-node KRaft Apache Kafka broker on loopback ports, its data in a temp folder."""

    NAME = "the Apache Kafka broker"
    TAIL_BYTES = 6000

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        libs_dir: Path | None = None,
        broker_config: Mapping[str, str] | None = None,
        jvm_options: Sequence[str] = TEST_JVM_OPTIONS,
        startup_timeout_s: float = 180.0,
        stop_timeout_s: float = 30.0,
        extra_listeners: Mapping[str, str] | None = None,
        scram_credentials: Sequence[str] = (),
    ) -> None:
        super().__init__(host=host, stop_timeout_s=stop_timeout_s)
        self._libs_dir = libs_dir
        self._broker_config = {**TEST_BROKER_CONFIG, **(broker_config or {})}
        self._jvm_options = tuple(jvm_options)
        self._startup_timeout_s = startup_timeout_s
        self._data_dir: Path | None = None
        self._extra_listeners = dict(extra_listeners or {})
        for name in self._extra_listeners:
            if name.upper() in ("PLAINTEXT", "CONTROLLER"):
                raise ValueError(f"listener name {name!r} is the launcher's own; pick another")
        self._scram_credentials = tuple(scram_credentials)
        self._extra_ports: dict[str, int] = {}

    # -- properties ---------------------------------------------------------------------
    @property
    def version(self) -> str:
        return APACHE_KAFKA_VERSION

    def listener_bootstrap(self, name: str) -> str:
        """``host:port`` of the extra listener ``name`` (of ``extra_listeners``)."""
        if name not in self._extra_ports:
            raise KeyError(f"no listener {name!r} (extra listeners: {sorted(self._extra_ports)})")
        return f"{self._host}:{self._extra_ports[name]}"

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> Self:
        """Format the storage, start the broker, block until it answers (BrokerError if not)."""
        java = self._java()
        libs = fetch_jars(self._libs_dir)
        for attempt in range(_PORT_ATTEMPTS):
            try:
                self._spawn(java, libs)
                self._wait_ready()
                return self
            except BaseException as exc:  # also KeyboardInterrupt: never leave it running
                self.stop()
                taken = isinstance(exc, BrokerError) and "Address already in use" in str(exc)
                if not taken or attempt + 1 == _PORT_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    def stop(self) -> None:
        """SIGTERM (controlled shutdown), SIGKILL after ``stop_timeout_s``; data removed."""
        super().stop()
        if self._data_dir is not None:
            shutil.rmtree(self._data_dir, ignore_errors=True)
            self._data_dir = None

    def kill(self) -> None:
        """SIGKILL, no controlled shutdown (then cleaned up as by :meth:`stop`)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self.stop()

    def pause(self) -> None:
        """Freeze the broker (SIGSTOP): clients see a broker that stops answering."""
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def check_alive(self) -> None:
        """BrokerError (with the broker's last output) if the JVM has exited."""
        if self._proc is None:
            raise BrokerError("the Apache Kafka broker is not running")
        code = self._proc.poll()
        if code is not None:
            raise BrokerError(
                f"the Apache Kafka broker exited with code {code}; its last output:\n"
                f"{self.output_tail()}"
            )

    # -- internals ----------------------------------------------------------------------
    @staticmethod
    def _java() -> str:
        java = java_executable()
        if java is None:
            raise BrokerError(
                f"the Apache Kafka broker needs Java {JAVA_MIN_MAJOR}+ and none is on PATH "
                "(nor in JAVA_HOME): install one (Debian: apt-get install "
                "openjdk-17-jre-headless)"
            )
        major = java_major_version(java)
        if major < JAVA_MIN_MAJOR:
            raise BrokerError(
                f"Apache Kafka {APACHE_KAFKA_VERSION} needs Java {JAVA_MIN_MAJOR}+, and {java} "
                f"is Java {major}: set JAVA_HOME to a newer JDK"
            )
        return java

    def _server_properties(self, data_dir: Path, port: int, controller_port: int) -> str:
        extra = {name: f"{self._host}:{p}" for name, p in self._extra_ports.items()}
        advertised = [f"PLAINTEXT://{self._host}:{port}"]
        advertised += [f"{name}://{address}" for name, address in extra.items()]
        listeners = [*advertised, f"CONTROLLER://{self._host}:{controller_port}"]
        protocols = ["PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT"]
        protocols += [f"{name}:{protocol}" for name, protocol in self._extra_listeners.items()]
        lines = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{self._host}:{controller_port}",
            "listeners": ",".join(listeners),
            "advertised.listeners": ",".join(advertised),
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": ",".join(protocols),
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(data_dir / "log"),
            **self._broker_config,
        }
        return "".join(f"{key}={value}\n" for key, value in lines.items())

    def _spawn(self, java: str, libs: Path) -> None:
        self._check_not_running()
        data_dir = Path(tempfile.mkdtemp(prefix="stream-dp-apache-kafka-"))
        self._data_dir = data_dir
        port, controller_port = free_port(self._host), free_port(self._host)
        self._extra_ports = {name: free_port(self._host) for name in self._extra_listeners}
        properties = data_dir / "server.properties"
        properties.write_text(self._server_properties(data_dir, port, controller_port), "utf-8")
        (data_dir / "log4j2.properties").write_text(_LOG4J2, "utf-8")
        log4j = f"-Dlog4j2.configurationFile={data_dir}/log4j2.properties"
        base = [java, *self._jvm_options, log4j, "-cp", f"{libs}/*"]
        env = broker_environment(os.environ)
        # Kafka's own storage tool writes meta.properties and the bootstrap metadata.
        cluster_id = _cluster_id()
        formatted = subprocess.run(  # noqa: S603 - a fixed argv, no shell
            [*base, "kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}",
             f"--config={properties}",
             *(f"--add-scram={credential}" for credential in self._scram_credentials)],
            capture_output=True, env=env, timeout=_FORMAT_TIMEOUT_S, check=False,
        )  # fmt: skip
        if formatted.returncode != 0:
            output = (formatted.stdout + formatted.stderr).decode("utf-8", "replace")
            raise BrokerError(f"Kafka's storage tool failed to format {data_dir}:\n{output}")
        self._launch([*base, "kafka.Kafka", str(properties)], env, port, "stream-dp-apache-kafka-")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self._startup_timeout_s
        last_error = "no attempt finished"
        while time.monotonic() < deadline:
            self.check_alive()
            assert self._proc is not None
            try:
                timeout_s = min(5.0, max(0.1, deadline - time.monotonic()))
                advertised = probe_sync(self._host, self.port, timeout_s)
            except (OSError, ValueError) as exc:
                last_error = str(exc) or type(exc).__name__
            else:
                if advertised and owns_listener(self._proc.pid, self.port):
                    return
                last_error = "the broker answered but does not advertise itself yet"
            time.sleep(0.1)
        self.check_alive()
        raise BrokerError(
            f"the Apache Kafka broker did not answer on {self.bootstrap_servers} within "
            f"{self._startup_timeout_s:g} s (last error: {last_error}); its last output:\n"
            f"{self.output_tail() or '(none)'}"
        )
