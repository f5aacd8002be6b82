"""The security modes on a real broker: Apache Kafka with a SASL_SSL listener (SCRAM-SHA-512)
and a mutual-TLS listener, certificates made by the test, the StandardAuthorizer.

- over SASL_SSL/SCRAM-SHA-512 and over mutual TLS, the worker releases exact counts, the
  sink stores them, and ``topics apply``, ``produce``, ``check``, ``tail``, ``schema``,
  ``ledger rebuild --dry-run`` and ``erase`` give the whole output they give on a plain
  listener (tests/cli/deployment.py, the scenario tests/cli/test_every_command.py runs on
  both brokers);
- a wrong password is one line naming the settings to fix, from a command and from the
  worker (at once: the broker answered, there is no broker to wait for);
- a broker certificate signed by another CA than kafka.ssl_cafile is refused;
- a worker whose principal may not Read its input topic, or its group (a real ACL), says so
  at ERROR at once (naming the principal and the kafka-acls grant), is not ready, counts
  ``authorization_failed`` fetch errors, and StreamDPFetchFailing fires over its scraped
  counter (``promtool test rules``); once the grant is there it reads, is ready and
  releases exact counts without a restart.

One secured broker for the module; the test's own producers and readers use its PLAINTEXT
listener (a super user), the service under test a secured one.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from stream_dp.broker.apache_kafka import ApacheKafkaBroker
from stream_dp.broker.topics import apply_topics
from stream_dp.clients.connect import TopicNotAuthorizedError
from stream_dp.config import load_config
from tests.apache_kafka.secure import (
    ALL,
    ALLOW,
    CLUSTER,
    DENY,
    DESCRIBE,
    GROUP,
    READ,
    RESTRICTED_PASSWORD,
    RESTRICTED_USER,
    TOPIC,
    TRANSACTIONAL_ID,
    WRITE,
    Certificates,
    create_acls,
    delete_acls,
    make_ca,
    mtls_kafka,
    scram_kafka,
    secure_broker,
)
from tests.apache_kafka.tier import apache_kafka_problem
from tests.cli.deployment import (
    COUNTS,
    NOISE_FREE_WARNING,
    cli,
    deployment_config,
    events,
    every_command,
    released_counts,
)
from tests.helpers import ConfigFactory
from tests.integration.support import (
    HANG_GUARD_S,
    WorkerProcess,
    decode_values,
    free_port,
    http_get,
    produce_events,
    read_topic,
    start_worker,
    windows_done,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.apache_kafka]

WRONG_PASSWORD = "not-the-password"  # noqa: S105 - the point of the test
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApacheKafkaBroker, Any]]:
    problem = apache_kafka_problem()
    if problem is not None:
        pytest.skip(problem)
    with secure_broker(tmp_path_factory.mktemp("certs")) as started:
        yield started


@pytest.fixture
def kafka_bootstrap(secured: tuple[ApacheKafkaBroker, Certificates]) -> str:
    """The secured broker's PLAINTEXT address (config_factory's default; overridden per test)."""
    return secured[0].bootstrap_servers


@pytest.mark.parametrize("mode", ["sasl_ssl_scram_sha_512", "mutual_tls"])
async def test_the_worker_the_sink_and_every_command_work_over_a_secured_listener(
    secured: tuple[ApacheKafkaBroker, Certificates],
    config_factory: ConfigFactory,
    postgres_dsn: str,
    tmp_path: Path,
    mode: str,
) -> None:
    """tests/cli/deployment.py's scenario: the worker releases exact counts, the sink stores
    them, every command's whole output is the one it gives on a PLAINTEXT listener."""
    broker, certs = secured
    kafka = scram_kafka(broker, certs) if mode != "mutual_tls" else mtls_kafka(broker, certs)
    cfg = deployment_config(config_factory, kafka, erasure={"enabled": True})
    await every_command(cfg, broker.bootstrap_servers, postgres_dsn, tmp_path)


@pytest.mark.parametrize("command", ["topics", "check"])
def test_a_wrong_password_is_one_line_naming_the_settings(
    secured: tuple[ApacheKafkaBroker, Certificates], config_factory: ConfigFactory, command: str
) -> None:
    broker, certs = secured
    kafka = scram_kafka(broker, certs, sasl_password=WRONG_PASSWORD)
    cfg = deployment_config(config_factory, kafka)
    args = ("topics", "apply") if command == "topics" else ("check",)
    code, out, err = cli(*args, "--config", cfg)
    bootstrap = kafka["bootstrap_servers"]
    what = "cannot manage topics on" if command == "topics" else "cannot reach the broker at"
    assert (code, out) == (1, ""), (code, out, err)
    assert err == (
        f'stream-dp: error: {what} {bootstrap}: Unable connect to "{bootstrap}": [Error 58] '
        "SaslAuthenticationFailed: Authentication failed during authentication due to invalid "
        "credentials with SASL mechanism SCRAM-SHA-512; the broker refused the SASL "
        "credentials: check kafka.sasl_username and kafka.sasl_password (or "
        "kafka.sasl_password_file), and kafka.sasl_mechanism against the mechanisms the "
        "listener enables\n"
    ), err


# -- a worker denied READ on its input ---------------------------------------------------------


def _fetch_errors(port: int, reason: str) -> float | None:
    code, body = http_get(port, "/metrics")
    if code != 200:
        return None
    prefix = f'stream_dp_fetch_errors_total{{reason="{reason}"}} '
    values = [float(x[len(prefix) :]) for x in body.decode().splitlines() if x.startswith(prefix)]
    return values[0] if values else None


async def _until(condition: Callable[[], bool], what: str, worker: WorkerProcess) -> None:
    deadline = time.monotonic() + HANG_GUARD_S  # a hang guard only
    while not await asyncio.to_thread(condition):
        assert worker.proc.poll() is None, f"worker exited:\n{worker.log()[-4000:]}"
        assert time.monotonic() < deadline, f"{what} never happened:\n{worker.log()[-4000:]}"
        await asyncio.sleep(0.2)


async def _scrapes(port: int, n: int, worker: WorkerProcess) -> list[float]:
    """``n`` scrapes of the authorization_failed counter, each higher than the one before."""
    values: list[float] = []

    def above(last: float) -> Callable[[], bool]:
        return lambda: (_fetch_errors(port, "authorization_failed") or 0.0) > last

    while len(values) < n:
        await _until(above(values[-1] if values else 0.0), "a further failure", worker)
        values.append(_fetch_errors(port, "authorization_failed") or 0.0)
    return values


def _alert_fires_over(values: list[float], tmp_path: Path) -> str:
    """StreamDPFetchFailing as shipped (less annotations) over ``values`` scraped a minute
    apart: ``promtool test rules``'s output; AssertionError when it does not fire."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian's prometheus package)")
    doc = yaml.safe_load((REPO / "ops" / "prometheus" / "alerts.yml").read_text("utf-8"))
    rule = next(
        r for g in doc["groups"] for r in g["rules"] if r.get("alert") == "StreamDPFetchFailing"
    )
    rule.pop("annotations", None)
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": [
        {"name": "fetch", "rules": [rule]}]}), "utf-8")  # fmt: skip
    where = {"namespace": "team-a", "job": "stream-dp", "instance": "10.0.0.1:9108"}
    selector = ",".join(f'{k}="{v}"' for k, v in where.items())
    tests = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [{
                "series": f'stream_dp_fetch_errors_total{{reason="authorization_failed",'
                          f"{selector}}}",
                "values": " ".join(f"{v:g}" for v in values),
            }],
            "alert_rule_test": [{
                "eval_time": f"{len(values) - 1}m", "alertname": "StreamDPFetchFailing",
                "exp_alerts": [{"exp_labels": {**where, "reason": "authorization_failed",
                                               "severity": "critical"}}],
            }],
        }],
    }  # fmt: skip
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(tests, sort_keys=False), "utf-8")
    done = subprocess.run(
        [promtool, "test", "rules", "tests.yml"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    return output


async def _run_to_exit(cfg: Path, log_path: Path) -> tuple[WorkerProcess, int]:
    """``stream-dp run`` until it exits by itself (killed at the hang guard): its exit code."""
    worker = start_worker(cfg, log_path)
    try:
        code = await asyncio.to_thread(worker.proc.wait, HANG_GUARD_S)
    finally:
        if worker.proc.poll() is None:
            worker.kill()
    return worker, code


async def _allow_all(broker: ApacheKafkaBroker, principal: str) -> None:
    """Every operation on every topic, group and transactional id, and on the cluster: the
    tests then deny one."""
    await create_acls(broker.bootstrap_servers, [
        (TOPIC, "*", principal, ALL, ALLOW),
        (GROUP, "*", principal, ALL, ALLOW),
        (CLUSTER, "kafka-cluster", principal, ALL, ALLOW),
        (TRANSACTIONAL_ID, "*", principal, ALL, ALLOW),
    ])  # fmt: skip


@pytest.mark.parametrize("denied", ["input_topic", "group"])
async def test_a_worker_denied_read_on_its_input_says_so_and_the_alert_fires(
    secured: tuple[ApacheKafkaBroker, Certificates],
    config_factory: ConfigFactory,
    tmp_path: Path,
    denied: str,
) -> None:
    """Read denied on the input topic (its fetches fail) or on the consumer group (its
    join fails before any fetch): either is the same loud, classified failure."""
    broker, certs = secured
    port = free_port()
    kafka = scram_kafka(broker, certs, sasl_username=RESTRICTED_USER,
                        sasl_password=RESTRICTED_PASSWORD)  # fmt: skip
    cfg = deployment_config(config_factory, kafka, metrics={"port": port})
    config = load_config(cfg)
    principal = f"User:{RESTRICTED_USER}"
    await _allow_all(broker, principal)
    resource = config.input.topic if denied == "input_topic" else config.kafka.group_id
    deny = [(TOPIC if denied == "input_topic" else GROUP, resource, principal, READ, DENY)]
    await create_acls(broker.bootstrap_servers, deny)
    await apply_topics(config, kafka["bootstrap_servers"], include_input=True)
    await produce_events(broker.bootstrap_servers, config.input.topic, events())
    worker = start_worker(cfg, tmp_path / "worker.log")
    try:

        def loud() -> list[str]:
            entries = [orjson.loads(x) for x in worker.log().splitlines() if x.startswith("{")]
            return [
                e["msg"] for e in entries
                if e["level"] == "ERROR" and "authorization_failed" in e["msg"]
            ]  # fmt: skip

        await _until(lambda: bool(loud()), "an ERROR naming the authorization failure", worker)
        named = loud()
        # Loud at once (not after 30 s of retries), naming the resource, the principal and
        # the grant that clears it.
        assert "(fetch error authorization_failed, failing for 0 s on " in named[0], named
        assert f"the broker refuses {principal} Read on " in named[0], named
        assert resource in named[0] and "grant the principal Read" in named[0], named
        assert (
            f"kafka-acls.sh --bootstrap-server <broker> --add --allow-principal {principal} "
            in named[0]
        ), named
        code, body = http_get(port, "/health/ready")
        assert code == 503 and orjson.loads(body)["components"]["input_readable"] is False
        assert http_get(port, "/health/live")[0] == 200  # it holds: a restart meets the same
        values = await _scrapes(port, 6, worker)
        assert _alert_fires_over(values, tmp_path).split() == [
            "Unit", "Testing:", "tests.yml", "SUCCESS"]  # fmt: skip
        assert await read_topic(broker.bootstrap_servers, config.output.topic) == []
        # The operator grants Read: the same worker reads, is ready and releases, no restart.
        await delete_acls(broker.bootstrap_servers, deny)

        def readable() -> bool:
            code, body = http_get(port, "/health/ready")
            return code in (200, 503) and orjson.loads(body)["components"]["input_readable"]

        out = await read_topic(
            broker.bootstrap_servers, config.output.topic, until=windows_done(["visits"], 1)
        )
        assert released_counts(out) == COUNTS
        await _until(readable, "input_readable again", worker)
        assert "fetching again after " in worker.log()
    finally:
        code = worker.terminate()
    assert code == 0, worker.log()[-4000:]


@pytest.mark.parametrize(
    ("denied", "operation"), [("output", "Write"), ("partials", "Describe"), ("ledger", "Write")]
)
async def test_a_worker_refused_one_of_its_own_topics_stops_naming_the_grant_then_releases_once(
    secured: tuple[ApacheKafkaBroker, Certificates],
    config_factory: ConfigFactory,
    tmp_path: Path,
    denied: str,
    operation: str,
) -> None:
    """An ACL refuses the worker Write on its output topic (found when the release is
    written, after its ledger entry), Describe on its partials topic (the broker then
    leaves the topic out of its topic list, as if deleted) or Write on its ledger (found at
    start, by the first fence: a write retried until the worker stops, so it never got ready
    and never said why). Each stops it at once (exit 1), its last line naming the principal,
    the operation, the topic and the grant: not a retry for give_up_after_s that advises a
    longer wait, not a deleted topic to create again, not a silent wait. Nothing is
    published; once the grant is there, a restart releases the window once, with exact
    counts."""
    broker, certs = secured
    kafka = scram_kafka(broker, certs, sasl_username=RESTRICTED_USER,
                        sasl_password=RESTRICTED_PASSWORD)  # fmt: skip
    cfg = deployment_config(config_factory, kafka)
    config = load_config(cfg)
    principal = f"User:{RESTRICTED_USER}"
    await _allow_all(broker, principal)
    await apply_topics(config, kafka["bootstrap_servers"], include_input=True)
    await produce_events(broker.bootstrap_servers, config.input.topic, events())
    topic = {
        "output": config.output.topic,
        "partials": config.output.partials_topic,
        "ledger": config.output.ledger_topic,
    }[denied]
    deny = [(TOPIC, topic, principal, WRITE if operation == "Write" else DESCRIBE, DENY)]
    await create_acls(broker.bootstrap_servers, deny)
    worker, code = await _run_to_exit(cfg, tmp_path / "worker.log")
    log = worker.log()
    last = log.splitlines()[-1]
    assert code == 1, log[-4000:]
    assert last.startswith(
        f"stream-dp: error: the broker refuses {principal} {operation} on topic {topic} "
        "(TopicAuthorizationFailedError): an ACL denies it or grants it no longer. Grant the "
        "principal what the worker needs on its own topics (kafka-acls.sh --bootstrap-server "
        f"<broker> --add --allow-principal {principal} --operation Describe --operation Read "
        f"--operation Write --topic {topic}), "
    ), log[-4000:]
    assert last == f"stream-dp: error: {TopicNotAuthorizedError(topic, principal, operation)}"
    assert "no longer exists" not in log and "kept failing" not in log, log[-4000:]
    assert await read_topic(broker.bootstrap_servers, config.output.topic) == []
    await delete_acls(broker.bootstrap_servers, deny)
    worker = start_worker(cfg, tmp_path / "again.log")
    try:
        out = await read_topic(
            broker.bootstrap_servers, config.output.topic, until=windows_done(["visits"], 1)
        )
        releases = [v for _, v in decode_values(out) if v["kind"] == "release"]
        assert len(releases) == len(COUNTS) and released_counts(out) == COUNTS, out
    finally:
        code = worker.terminate()
    assert code == 0, worker.log()[-4000:]


async def test_a_worker_with_a_wrong_password_stops_at_once_naming_the_settings(
    secured: tuple[ApacheKafkaBroker, Certificates], config_factory: ConfigFactory, tmp_path: Path
) -> None:
    """The broker answered and refused: no broker to wait ``kafka.startup_wait_s`` for."""
    broker, certs = secured
    kafka = scram_kafka(broker, certs, sasl_password=WRONG_PASSWORD, startup_wait_s=600)
    cfg = deployment_config(config_factory, kafka)
    worker, code = await _run_to_exit(cfg, tmp_path / "worker.log")
    *logged, last = worker.log().splitlines()
    assert code == 1 and logged[0].endswith(NOISE_FREE_WARNING), worker.log()
    build, *started = [orjson.loads(x) for x in logged[1:]]  # the build line comes first
    assert build["logger"] == "stream_dp.cli.run_cmd", worker.log()
    assert build["msg"].startswith("stream-dp "), worker.log()
    assert [x["level"] for x in started] == ["INFO", "INFO"], worker.log()
    bootstrap = kafka["bootstrap_servers"]
    assert last == (
        f"stream-dp: error: the broker at {bootstrap} refused the connection: [Error 58] "
        "SaslAuthenticationFailed: Authentication failed during authentication due to invalid "
        "credentials with SASL mechanism SCRAM-SHA-512; the broker refused the SASL "
        "credentials: check kafka.sasl_username and kafka.sasl_password (or "
        "kafka.sasl_password_file), and kafka.sasl_mechanism against the mechanisms the "
        "listener enables"
    ), worker.log()


def test_a_broker_certificate_signed_by_another_ca_is_refused(
    secured: tuple[ApacheKafkaBroker, Certificates], config_factory: ConfigFactory, tmp_path: Path
) -> None:
    """The client verifies the broker's certificate against kafka.ssl_cafile: a CA that did
    not sign it (a broker in the middle) is refused, naming the setting."""
    broker, certs = secured
    other_ca = make_ca(tmp_path / "other-ca")
    kafka = {**mtls_kafka(broker, certs), "ssl_cafile": str(other_ca)}
    cfg = deployment_config(config_factory, kafka)
    code, out, err = cli("topics", "apply", "--config", cfg)
    bootstrap = kafka["bootstrap_servers"]
    assert (code, out) == (1, ""), (code, out, err)
    said = (
        rf"stream-dp: error: cannot manage topics on {bootstrap}: .*CERTIFICATE_VERIFY_FAILED.*; "
        r"this client does not trust the broker's certificate: set kafka.ssl_cafile to the CA "
        r"that signed it \(the certificate must name the host of kafka.bootstrap_servers\)\n"
    )
    assert re.fullmatch(said, err), err
    assert err.count("\n") == 1, err
