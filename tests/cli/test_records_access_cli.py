"""``stream-dp records`` and ``stream-dp access`` through the CLI, against a real deployment on
the embedded broker and on Apache Kafka: a worker releases three windows of 30 users' events
and stops; then the records list every (query, window) released (the ledger's, and the
output topic's where compaction removed the ledger's) with its ε and δ, and an access request
for one user reports exactly that user's events in the windows not released (counted here
from what the test produced), records the request without the raw id, and says nothing of
the other users."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from stream_dp.broker.topics import apply_topics, resolve_all
from stream_dp.cli.access_cmd import describe
from stream_dp.cli.records_cmd import report
from stream_dp.config import load_config
from stream_dp.pipeline.formats.ledger import LedgerIndex
from stream_dp.pipeline.kafka.output_scan import read_output
from stream_dp.pipeline.stages.keys import load_keyring
from stream_dp.windows.tumbling import epoch_of_iso, iso_utc
from tests.apache_kafka.tier import ON_BOTH_BROKERS
from tests.cli.support import arun_cli
from tests.helpers import schema_validator
from tests.integration.support import produce_events, run_worker_until_windows, spread_windows

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MakeConfig = Callable[[dict[str, Any] | None], Path]
T0 = 1_596_240_000  # 2020-08-01T00:00:00Z, the test configuration's window.start_at
DOMAINS = ["site-a", "site-b", "site-c", "site-d"]
QUERIES = [
    {
        "name": "visits",
        "group_by": ["domain"],
        "keys": {"domain": DOMAINS},
        "epsilon": 0.5,
        "purpose": "capacity planning of the sites",
        "legal_basis": "GDPR Art. 6(1)(f) legitimate interests",
    },
    {
        "name": "visits_a",
        "where": {"domain": "site-a"},
        "group_by": ["domain"],
        "keys": {"domain": ["site-a"]},
        "epsilon": 0.25,
        "delta": 1e-7,
        "purpose": "traffic of site-a",
        "legal_basis": "GDPR Art. 6(1)(a) consent",
    },
]
PERSON = "u7"


def _later_events() -> list[dict[str, Any]]:
    """Events produced once the worker stopped (windows 10 and 11: never released): the
    person's, in both windows and on two domains, among 20 other users'."""
    events = []
    for w, n in ((10, 3), (11, 2)):
        for i in range(n):
            d = "site-a" if i % 2 == 0 else "site-b"
            events.append({"user_id": PERSON, "timestamp": T0 + 10 * w + 1 + i, "domain": d})
        for u in range(20, 40):
            events.append({"user_id": f"u{u}", "timestamp": T0 + 10 * w + 2, "domain": "site-a"})
    return events


async def _ledger(config_path: Path) -> LedgerIndex:
    config = load_config(config_path)
    index = LedgerIndex()
    records = await read_output(config.kafka, config.output.ledger_topic)
    index.load((k or "", v) for k, v in records)
    return index


@ON_BOTH_BROKERS
async def test_records_and_access_of_a_deployment(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    path = config_factory({"queries": QUERIES, "privacy": {"horizon_windows": 2}})
    config = load_config(path)
    await apply_topics(config, kafka_bootstrap, include_input=True)
    first = spread_windows(T0, 3, DOMAINS)
    await produce_events(kafka_bootstrap, config.input.topic, first)
    await run_worker_until_windows(
        kafka_bootstrap, path, tmp_path / "worker.log", ["visits", "visits_a"], 3, timeout_s=120
    )
    later = _later_events()
    await produce_events(kafka_bootstrap, config.input.topic, later)
    index = await _ledger(path)

    # -- records: every (query, window) released, with its ε and δ ------------------------
    # What the ledger holds (all of it on the embedded broker, which never compacts; Apache
    # Kafka may have compacted the released windows' records away), and the output topic's
    # window records, read here directly: the two agree wherever both hold a window.
    names = ("visits", "visits_a")
    ledgered = {
        (r.query, r.window_start_s): (r.window_end_s, r.epsilon_spent, r.delta_spent)
        for r in index.releases()
        if r.query in names
    }
    on_output = {}
    for _, raw in await read_output(config.kafka, config.output.topic):
        v = orjson.loads(raw)
        if v["kind"] == "window":
            ident = (v["query"], epoch_of_iso(v["window_start"]))
            end = epoch_of_iso(v["window_end"])
            on_output[ident] = (end, v["epsilon_spent"], v["delta_spent"])
    assert all(on_output.get(k, f) == f for k, f in ledgered.items())
    figures = {**on_output, **ledgered}
    released = sorted(figures, key=lambda k: (k[1], k[0]))
    assert len({ws for _, ws in released}) >= 3
    done = await arun_cli("records", "--config", str(path), "--json", timeout_s=120)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    entries = orjson.loads(done.stdout)
    got = [
        (e["query"], e["window_start"], e["window_end"], e["epsilon"], e["delta"]) for e in entries
    ]
    assert got == [
        (q, iso_utc(ws), iso_utc(figures[q, ws][0]), figures[q, ws][1], figures[q, ws][2])
        for q, ws in released
    ]
    assert {(e["epsilon"], e["delta"]) for e in entries if e["query"] == "visits"} == {(0.5, 0.0)}
    assert {(e["epsilon"], e["delta"]) for e in entries if e["query"] == "visits_a"} == {
        (0.25, 1e-7)
    }
    assert index.fingerprint is not None
    per_window = Counter[int]()
    per_window_delta: dict[int, float] = {}
    for (_, ws), (_, epsilon, delta) in figures.items():
        per_window[ws] += epsilon  # type: ignore[assignment]
        per_window_delta[ws] = per_window_delta.get(ws, 0.0) + delta
    expected_retention = {
        t.name: {
            "setting": t.spec.name.strip("{}"),
            "retention_ms": int(t.config["retention.ms"]),
            "cleanup_policy": t.config["cleanup.policy"],
        }
        for t in resolve_all(config).values()
    }
    for e, (name, ws) in zip(entries, released, strict=True):
        q = next(q for q in QUERIES if q["name"] == name)
        end, epsilon, delta = figures[name, ws]
        assert e == {
            "query": name,
            "window_start": iso_utc(ws),
            "window_end": iso_utc(end),
            "epsilon": epsilon,
            "delta": delta,
            # the horizon is two windows: this one and the one before
            "horizon_epsilon": pytest.approx(per_window[ws] + per_window[ws - 10]),
            "horizon_delta": pytest.approx(
                per_window_delta[ws] + per_window_delta.get(ws - 10, 0.0)
            ),
            "horizon_windows": 2,
            "max_epsilon_per_horizon": config.privacy.max_epsilon_per_horizon,
            "purpose": q["purpose"],
            "legal_basis": q["legal_basis"],
            "input_fields": ["domain", "timestamp", "user_id"],
            "fingerprint": index.fingerprint.digest,
            "key_id": "k1",
            "published": True,
            "source": "ledger" if (name, ws) in ledgered else "output topic",
            "recipients": [f"output topic {config.output.topic}"],
            "retention": {k: expected_retention[k] for k in sorted(expected_retention)},
        }
    done = await arun_cli("records", "--config", str(path), timeout_s=120)
    assert (done.returncode, done.stderr, done.stdout) == (0, "", report(config, entries) + "\n")

    # -- access: exactly the person's events in the windows not released ------------------
    last_released = max(ws for _, ws in released)
    expected: dict[int, Counter[str]] = {}
    for e in [*first, *later]:
        ws = e["timestamp"] // 10 * 10
        if e["user_id"] != PERSON or ws <= last_released:
            continue
        counts = expected.setdefault(ws, Counter())
        counts["events"] += 1
        counts["visits"] += 1
        counts["visits_a"] += e["domain"] == "site-a"
    assert sorted(expected) == [T0 + 100, T0 + 110]  # the test's own check of its data
    keyring = load_keyring(config.pseudonymization)
    pseudonym = keyring.current.pseudonym(PERSON).hex()
    before = time.time()
    done = await arun_cli(
        "access", "--config", str(path), "--user-id", PERSON, "--request-id", "dsar-1", "--json"
    )
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    answer = orjson.loads(done.stdout)
    assert before - 1 <= epoch_of_iso(answer.pop("answered_at")[:19] + "Z") <= time.time()
    assert answer == {
        "request_id": "dsar-1",
        "user_id": PERSON,
        "pseudonyms": {"k1": pseudonym},
        "open_windows": [
            {
                "window_start": iso_utc(ws),
                "window_end": iso_utc(ws + 10),
                "events": c["events"],
                "queries": {"visits": c["visits"], "visits_a": c["visits_a"]},
            }
            for ws, c in sorted(expected.items())
        ],
        "erasure": {"enabled": False, "recorded": []},
        "exports": [],
        "scanned": {
            "input_topic": config.input.topic,
            "partitions": [0, 1, 2, 3],
            "released_through": {str(p): iso_utc(ws) for p, ws in sorted(index.progress.items())},
            "first_covered_window": iso_utc(T0),
        },
    }
    # The request is recorded: its id and the pseudonym, never the raw id.
    log = await read_output(config.kafka, config.output.access_log_topic)
    assert len(log) == 1
    key, value = log[0]
    record = orjson.loads(value)
    schema_validator("access_log.schema.json").validate(record)
    assert (key, record["request_id"], record["pseudonyms"]) == (
        "dsar-1",
        "dsar-1",
        {"k1": pseudonym},
    )
    assert PERSON.encode() not in value and PERSON not in (key or "")


async def test_records_refuses_queries_without_purpose(config_factory: MakeConfig) -> None:
    queries = [QUERIES[0], {k: v for k, v in QUERIES[1].items() if k != "legal_basis"}]
    path = config_factory({"queries": [*queries, {"name": "bare", "epsilon": 0.1, "delta": 1e-7}]})
    done = await arun_cli("records", "--config", str(path), "--json", timeout_s=60)
    assert (done.returncode, done.stdout, done.stderr) == (
        2,
        "",
        "stream-dp: error: the records of processing need each query's purpose and legal "
        "basis; set queries[].purpose and queries[].legal_basis for: visits_a (legal_basis), "
        "bare (purpose and legal_basis)\n",
    )


def test_the_readable_access_answer_says_each_part() -> None:
    answer = {
        "request_id": "dsar-2",
        "answered_at": "2020-08-01T00:05:00Z",
        "user_id": PERSON,
        "pseudonyms": {"k2": "3a" * 16, "k1": "4b" * 16},
        "open_windows": [
            {
                "window_start": "2020-08-01T00:01:40Z",
                "window_end": "2020-08-01T00:01:50Z",
                "events": 3,
                "queries": {"visits": 3, "visits_a": 2},
            }
        ],
        "erasure": {
            "enabled": True,
            "recorded": [
                {"recorded_at": "2020-08-01T00:02:00Z", "expires_at": "2020-08-08T00:02:00Z"}
            ],
        },
        "exports": [],
        "scanned": {"input_topic": "events", "partitions": [0, 1]},
    }
    assert describe(answer) == (
        "Access request dsar-2, answered at 2020-08-01T00:05:00Z\n"
        "\n"
        "Pseudonyms (what the service knows you by; the raw id is never stored):\n"
        f"  key k2: {'3a' * 16}\n"
        f"  key k1: {'4b' * 16}\n"
        "\n"
        "Your events held in windows not yet released:\n"
        "  2020-08-01T00:01:40Z to 2020-08-01T00:01:50Z: 3 events (counted by queries "
        "visits: 3, visits_a: 2)\n"
        "\n"
        "Erasure recorded at 2020-08-01T00:02:00Z: windows before 2020-08-08T00:02:00Z not yet "
        "released are released without your events.\n"
        "Exports: none of your events were exported (no partner export exists).\n"
        "Read: topic events, partitions 0, 1, from the start."
    )
