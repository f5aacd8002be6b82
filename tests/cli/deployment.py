"""Every command against one deployment, each as its own process, each checked by its exit code
and its whole output (the parts that vary from run to run named, nothing else left out):
``topics apply``, ``produce``, ``check``, ``run``, ``tail``, ``schema``, ``sink``,
``ledger rebuild --dry-run`` and ``erase``, in the order a team meets them.

The same scenario runs on both brokers (tests/cli/test_every_command.py) and over the
secured listeners of Apache Kafka (tests/apache_kafka/test_security.py). The configuration's
``kafka`` section is the one the commands use; ``reader`` is the address the test's own
readers use (the same one, or a secured broker's PLAINTEXT listener).
"""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import psycopg

from stream_dp.config import load_config
from tests.helpers import ConfigFactory
from tests.integration.support import (
    HANG_GUARD_S,
    NOISE_FREE,
    WorkerProcess,
    decode_values,
    http_get,
    read_topic,
    run_worker_until_windows,
)
from tests.sink.support import sink_http_port, start_sink

T0 = 1_596_240_000  # 2020-08-01T00:00:00Z, the config's window.start_at
#: Users per public domain, one event each in the first window: the exact counts.
COUNTS = {"a.example": 7, "b.example": 3}
QUERY = [
    {"name": "visits", "group_by": ["domain"], "epsilon": 1e6, "keys": {"domain": list(COUNTS)}}
]

#: The one line every command prints for the noise-free test configuration (after its time).
NOISE_FREE_WARNING = (
    " WARNING stream_dp.config.loader: privacy.epsilon_per_window = 2e+06 is above 1; the "
    "released numbers protect individuals less than the usual recommendations"
)


def events() -> list[dict[str, Any]]:
    """One event per user in the first window: ``COUNTS[domain]`` users per domain."""
    return [
        {"user_id": f"{domain}-user{u}", "timestamp": T0 + 1 + u % 8, "domain": domain}
        for domain, users in COUNTS.items()
        for u in range(users)
    ]


def deployment_config(config_factory: ConfigFactory, kafka: dict[str, Any], **extra: Any) -> Path:
    """The noise-free test deployment (JSON logs) with these ``kafka`` settings."""
    return config_factory(
        {"kafka": kafka, "privacy": NOISE_FREE, "queries": QUERY, "logging": {"format": "json"},
         **extra}
    )  # fmt: skip


def cli(*args: str | Path, reads_config: bool = True) -> tuple[int, str, str]:
    """``stream-dp ARGS``: (exit code, stdout, stderr less the noise-free config's warning,
    which must be its first line when the command ``reads_config``)."""
    done = subprocess.run(
        [sys.executable, "-m", "stream_dp.cli.main", *map(str, args)],
        capture_output=True, text=True, timeout=HANG_GUARD_S, check=False,
    )  # fmt: skip
    if not reads_config:
        return done.returncode, done.stdout, done.stderr
    first, _, rest = done.stderr.partition("\n")
    assert first.endswith(NOISE_FREE_WARNING), done.stderr
    return done.returncode, done.stdout, rest


def released_counts(records: list[tuple[str | None, bytes]]) -> dict[str, Any]:
    return {
        v["group"]["domain"]: v["value"]
        for _, v in decode_values(records)
        if v["kind"] == "release"
    }


def service_log_entries(log: str) -> list[dict[str, Any]]:
    """A service's whole log (``run``, ``sink``): the configuration's warning, then only JSON
    log entries (a traceback or a stray print is not one), none of stream-dp's own above
    INFO but the retries of a step that failed for a transient reason (Apache Kafka loads a
    fresh group's coordinator while the worker starts its producer). aiokafka's entries may
    warn or err about such a coordinator too; what it could not recover from, stream-dp
    says."""
    first, *rest = log.splitlines()
    assert first.endswith(NOISE_FREE_WARNING), log[-4000:]
    entries = []
    for line in rest:
        try:
            entry = orjson.loads(line)
        except orjson.JSONDecodeError:
            raise AssertionError(f"not a log entry: {line!r}\n{log[-4000:]}") from None
        assert isinstance(entry, dict) and {"level", "logger", "msg"} <= entry.keys(), line
        entries.append(entry)
    ours = [e for e in entries if e["logger"].startswith("stream_dp")]
    loud = [
        e for e in ours
        if e["level"] not in ("DEBUG", "INFO")
        and not (e["logger"] == "stream_dp.retry" and e["level"] == "WARNING")
    ]  # fmt: skip
    assert ours and not loud, loud or log[-4000:]
    return entries


def topics_apply(cfg: Path, bootstrap: str) -> None:
    """``topics apply`` (input included): every topic created, the summary line last."""
    config = load_config(cfg)
    code, out, err = cli("topics", "apply", "--config", cfg)
    assert (code, err) == (0, ""), (code, out, err)
    lines = out.splitlines()
    created = sorted(line.split()[1] for line in lines[:-1])
    assert all(line.startswith("created: ") for line in lines[:-1]), out
    assert config.input.topic in created and config.output.topic in created, out
    assert lines[-1] == f"{len(created)} created, 0 already present on {bootstrap}", out


def produce_file(cfg: Path, tmp_path: Path, bootstrap: str) -> None:
    """``produce --file``: the events sent, one report line (its time and rate vary)."""
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events()))
    code, out, err = cli("produce", "--config", cfg, "--file", path)
    n, topic = sum(COUNTS.values()), load_config(cfg).input.topic
    assert (code, err) == (0, ""), (code, out, err)
    said = rf"sent {n} events \(0\.00 MB\) to {re.escape(topic)} on {re.escape(bootstrap)} in "
    assert re.fullmatch(said + r"\d+\.\d\d s \([\d,]+ events/s\)\n", out), out


def check(cfg: Path, bootstrap: str) -> None:
    topic, n = load_config(cfg).input.topic, sum(COUNTS.values())
    code, out, err = cli("check", "--config", cfg, "--timeout", "30")
    assert (code, err) == (0, ""), (code, out, err)
    assert out == (
        f"stream-dp check: {topic} on {bootstrap} (4 partitions)\n"
        f"{n} events sampled, {n} JSON objects, {n} usable\n\n"
        "field      role                     missing or null  types\n"
        "---------  -----------------------  ---------------  ---------\n"
        "user_id    user (input.user_field)  0                -\n"
        "timestamp  time (input.time_field)  0                -\n"
        f"domain     query field              0                string {n}\n\n"
        "event windows: 2020-08-01T00:00:00Z … 2020-08-01T00:00:00Z (10 s windows)\n"
        "first covered window (window.start_at): 2020-08-01T00:00:00Z\n\n"
        "no problems found\n"
    ), out


async def run_worker(cfg: Path, reader: str, tmp_path: Path) -> WorkerProcess:
    """``run`` until the window is released (exact counts), then SIGTERM: exit code 0 and a
    clean log."""
    out, worker = await run_worker_until_windows(
        reader, cfg, tmp_path / "worker.log", ["visits"], 1
    )
    assert released_counts(out) == COUNTS
    service_log_entries(worker.log())
    return worker


def tail(cfg: Path, bootstrap: str) -> list[dict[str, Any]]:
    """``tail --json``: the window's two releases and its window record; the records."""
    output = load_config(cfg).output.topic
    code, out, err = cli("tail", "--config", cfg, "--from-beginning", "--json",
                         "--max-windows", "1")  # fmt: skip
    assert code == 0, (code, out, err)
    assert err == f"stream-dp tail: reading {output} on {bootstrap} from the beginning " \
        "(Ctrl-C stops)\n", err  # fmt: skip
    records = [orjson.loads(line) for line in out.splitlines()]
    assert [r["kind"] for r in records] == ["release", "release", "window"], out
    assert {r["group"]["domain"]: r["value"] for r in records[:2]} == COUNTS
    return records


def schema_validates(records: list[dict[str, Any]]) -> None:
    """``schema output``: one JSON document, a valid JSON Schema every record validates
    against with a plain validator (no registry: it is self-contained)."""
    code, out, err = cli("schema", "output", reads_config=False)
    assert (code, err) == (0, ""), (code, out, err)
    schema = orjson.loads(out)
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    for record in records:
        validator.validate(record)


def _stored_releases(dsn: str) -> dict[str, Any] | None:
    """The releases once the sink has stored the window complete, else None."""
    try:
        with psycopg.connect(dsn) as c:
            rows = c.execute("SELECT group_key, value FROM stream_dp.releases").fetchall()
            complete = c.execute("SELECT count(*) FROM stream_dp.windows WHERE complete")
            (windows,) = complete.fetchone() or (0,)
    except psycopg.errors.UndefinedTable:
        return None
    if windows != 1:
        return None
    return {orjson.loads(key)["domain"] if key.startswith("{") else key: v for key, v in rows}


async def sink(cfg: Path, dsn: str, tmp_path: Path) -> None:
    """``sink`` until the window is stored (ready meanwhile), then SIGTERM: exit code 0, a
    clean log, the exact counts in PostgreSQL."""
    log_path = tmp_path / "sink.log"
    proc = start_sink(cfg, dsn, log_path)
    deadline = time.monotonic() + HANG_GUARD_S
    try:
        while (stored := await asyncio.to_thread(_stored_releases, dsn)) is None:
            assert proc.poll() is None, log_path.read_text(errors="replace")
            assert time.monotonic() < deadline, "the sink stored no complete window"
            await asyncio.sleep(0.2)
        ready = await asyncio.to_thread(http_get, sink_http_port(log_path), "/health/ready")
        assert ready[0] == 200, ready
    finally:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 60)
    log = log_path.read_text(errors="replace")
    assert code == 0, log[-4000:]
    service_log_entries(log)
    assert stored == COUNTS


def ledger_dry_run(cfg: Path) -> None:
    """The worker wrote the ledger; the output's one release is found in it."""
    ledger = load_config(cfg).output.ledger_topic
    code, out, err = cli("ledger", "rebuild", "--config", cfg, "--dry-run")
    assert (code, out) == (0, (
        "dry run: 1 releases were already in the ledger\n"
        "dry run: first covered window: 2020-08-01T00:00:00Z\n"
        "dry run: nothing to write: the ledger already holds every release on the output\n"
    )), (code, out, err)  # fmt: skip
    warned = (
        rf"stream-dp ledger rebuild: warning: the ledger topic {ledger} is not empty "
        r"\(\d+ records\): only what it lacks is written\n"
    )
    assert re.fullmatch(warned, err), err


async def erase(cfg: Path, reader: str) -> None:
    """``erase``: one line, the request on its topic (keyed by its id)."""
    requests = load_config(cfg).erasure.requests_topic
    code, out, err = cli("erase", "--config", cfg, "--user-id", "a.example-user0",
                         "--request-id", "r1")  # fmt: skip
    assert (code, out, err) == (0, f"erasure request r1 sent to {requests}\n", "")
    ((key, value),) = await read_topic(reader, requests, until=lambda r: len(r) >= 1)
    assert key == "r1" and orjson.loads(value)["user_id"] == "a.example-user0"


async def every_command(cfg: Path, reader: str, dsn: str, tmp_path: Path) -> None:
    """The whole scenario on the deployment ``cfg`` (``erasure.enabled``; its topics not
    created yet)."""
    bootstrap = load_config(cfg).kafka.bootstrap_servers
    topics_apply(cfg, bootstrap)
    produce_file(cfg, tmp_path, bootstrap)
    check(cfg, bootstrap)
    await run_worker(cfg, reader, tmp_path)
    schema_validates(tail(cfg, bootstrap))
    await sink(cfg, dsn, tmp_path)
    ledger_dry_run(cfg)
    await erase(cfg, reader)
