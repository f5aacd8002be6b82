"""The right of erasure end to end on the embedded broker (docs/erasure.md; issue 18).

Alice has a public key of her own (``own.example``); with ε = 1e6 in the unsafe test mode
every released value is the exact bounded count (discrete Laplace noise of scale ≤ 3e-6
draws 0 except with probability < e^-300000), so "her events are excluded" is an exact
check: her key's value is 0 while everyone else's is their full count.

Windows close by event time only (``idle_close_s`` 600, far beyond the test): events of
window n + 1 on every input partition (40 filler users spread over the 4 partitions) close
window n, and nothing closes while the test waits."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from stream_dp.broker.topics import apply_topics
from stream_dp.config import Config, load_config
from tests.apache_kafka.tier import ON_BOTH_BROKERS
from tests.helpers import schema_validator
from tests.integration.support import (
    NOISE_FREE,
    decode_values,
    free_port,
    group_partitions,
    http_get,
    ledger_release_ids,
    produce_events,
    produce_records,
    read_topic,
    start_worker,
    topics_of,
    wait_for_group,
    wait_status,
    windows_done,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow, ON_BOTH_BROKERS]
MakeConfig = Callable[[dict[str, Any] | None], Path]
T0 = 1_596_240_000  # 2020-08-01T00:00:00Z
FILLERS = 40


def _config(config_factory: MakeConfig, **metrics: Any) -> Path:
    return config_factory(
        {
            "erasure": {"enabled": True},
            "privacy": NOISE_FREE,
            "window": {"size_s": 10, "grace_s": 1, "idle_close_s": 600},
            "bounds": {"max_contributions_per_window": 100},
            "queries": [
                {
                    "name": "visits",
                    "group_by": ["domain"],
                    "epsilon": 1e6,
                    "keys": {"domain": ["own.example", "shared.example"]},
                }
            ],
            **({"metrics": metrics} if metrics else {}),
        }
    )


def _window(n: int, at: float, *, alice: str | None, visits: int) -> list[dict[str, Any]]:
    """``visits`` of Alice's (under the spelling ``alice``) to her own domain and one visit
    per filler user to the shared one, ``at`` seconds into window ``n``."""
    t = T0 + 10 * n + at
    events = [{"user_id": alice, "timestamp": t, "domain": "own.example"}] * visits
    events += [
        {"user_id": f"filler-{i}", "timestamp": t, "domain": "shared.example"}
        for i in range(FILLERS)
    ]
    return events if alice is not None else events[visits:]


def _released(records: list[tuple[str | None, bytes]]) -> dict[tuple[str, str], int]:
    """(window start, domain) → released value."""
    return {
        (v["window_start"], v["group"]["domain"]): v["value"]
        for _, v in decode_values(records)
        if v["kind"] == "release"
    }


def _erase(config_path: Path, user_id: str, *, wait_s: float = 90) -> dict[str, Any]:
    """``stream-dp erase … --user-id - --wait`` (the id on standard input, not in ``ps``)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "stream_dp.cli.main",
            "erase",
            "--config",
            str(config_path),
            "--user-id",
            "-",
            "--wait",
            str(wait_s),
            "--json",
        ],
        input=user_id + "\n",
        capture_output=True,
        text=True,
        timeout=wait_s + 60,
    )
    assert done.returncode == 0, done.stderr
    assert user_id.strip().lower() not in (done.stdout + done.stderr).lower()
    sent, response = (orjson.loads(line) for line in done.stdout.splitlines())
    assert sent["kind"] == "erasure_request_sent"
    assert response["request_id"] == sent["request_id"]
    schema_validator("erasure_response.schema.json").validate(response)
    return dict(response)


def _iso(n: int) -> str:
    return f"2020-08-01T00:00:{10 * n:02d}Z"


async def test_an_erasure_mid_window_excludes_the_user_across_a_crash_and_a_rebalance(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    cfg = _config(config_factory)
    await apply_topics(load_config(cfg), kafka_bootstrap, include_input=True)
    topics = topics_of(cfg)
    # Window 0 (released before the request) and the first half of window 1.
    await produce_events(
        kafka_bootstrap,
        topics["input"],
        _window(0, 1, alice="Alice", visits=2) + _window(1, 2, alice="alice", visits=3),
    )
    first = start_worker(cfg, tmp_path / "first.log")
    try:
        await read_topic(
            kafka_bootstrap, topics["output"], until=windows_done(["visits"], 1), timeout_s=90
        )
        # Mid-window 1: " ALICE " is the user Alice and alice (input.user_id_normalization).
        response = _erase(cfg, " ALICE ")
    finally:
        first.kill()  # kill -9 after the request was applied: nothing is shut down cleanly
    assert response["status"] == "applied"
    assert response["released_windows_not_recomputed"] == {"from": _iso(0), "until": _iso(1)}
    assert response["open_windows_affected"]["from"] == _iso(1)

    # The rest of window 1 (her pre-crash events are replayed from the input), window 2.
    await produce_events(
        kafka_bootstrap,
        topics["input"],
        _window(1, 6, alice="ALICE", visits=2) + _window(2, 2, alice="alice", visits=2),
    )
    second = start_worker(cfg, tmp_path / "second.log")
    third = None
    try:
        out = await read_topic(
            kafka_bootstrap, topics["output"], until=windows_done(["visits"], 2), timeout_s=90
        )
        released = _released(out)
        assert released[(_iso(0), "own.example")] == 2  # released before: not recomputed
        assert released[(_iso(1), "own.example")] == 0  # her 5 visits: none released
        assert released[(_iso(1), "shared.example")] == 2 * FILLERS  # the others: all
        # A second worker joins: the partitions holding window 2 (and her events of it)
        # move, and the first worker leaves, so the newcomer replays all of them.
        config = load_config(cfg)
        third = start_worker(cfg, tmp_path / "third.log")
        expected = await group_partitions(
            kafka_bootstrap,
            (
                config.input.topic,
                config.output.repartition_topic,
                config.output.partials_topic,
                config.erasure.requests_topic,
            ),
        )
        await wait_for_group([second, third], expected, timeout_s=90)
        assert second.terminate() == 0, second.log()
        await produce_events(
            kafka_bootstrap,
            topics["input"],
            _window(3, 2, alice=" Alice", visits=4) + _window(4, 2, alice=None, visits=0),
        )
        out = await read_topic(
            kafka_bootstrap,
            topics["output"],
            until=windows_done(["visits"], 4),
            timeout_s=90,
            settle_s=1.0,
        )
    finally:
        for worker in (second, third):
            if worker is not None and worker.proc.poll() is None:
                assert worker.terminate() == 0, worker.log()
    released = _released(out)
    assert [released[(_iso(n), "own.example")] for n in range(4)] == [2, 0, 0, 0]
    assert [released[(_iso(n), "shared.example")] for n in range(4)] == [
        FILLERS,
        2 * FILLERS,
        FILLERS,
        FILLERS,
    ]
    # Never a second draw for any window (the erasure recomputed nothing).
    ledger = await read_topic(kafka_bootstrap, topics["ledger"])
    assert all(len(ids) == 1 for ids in ledger_release_ids(ledger).values())


RAW_ID = "Zoë.Raw-Id.7f3a"


def _sensitive(raw: bytes) -> list[str]:
    """Which spellings of the raw id a blob holds (raw, normalised, either in JSON escapes)."""
    text = raw.decode("utf-8", errors="replace").lower()
    escaped = orjson.dumps(RAW_ID).decode().lower().strip('"')
    return [s for s in {RAW_ID.lower(), "zoë.raw-id.7f3a", escaped, "raw-id.7f3a"} if s in text]


async def test_the_raw_id_of_an_erasure_appears_nowhere_downstream(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    """Requests hold raw ids; once read, only pseudonyms go on — into no topic but the
    requests topic itself, no log line and no metric. A request stream-dp cannot apply
    (a whitespace-only id) is dead-lettered without its payload and answered rejected."""
    port = free_port()
    cfg = _config(config_factory, port=port)
    config: Config = load_config(cfg)
    await apply_topics(config, kafka_bootstrap, include_input=True)
    topics = topics_of(cfg)
    await produce_events(
        kafka_bootstrap,
        topics["input"],
        _window(0, 1, alice=RAW_ID, visits=2) + _window(1, 1, alice=RAW_ID, visits=2),
    )
    log_path = tmp_path / "worker.log"
    worker = start_worker(cfg, log_path)
    try:
        await wait_status(port, "/health/ready", 200, 90)
        response = _erase(cfg, RAW_ID)
        bad = orjson.dumps({"user_id": "   ", "requested_at": T0, "request_id": "dsr-bad"})
        await produce_records(kafka_bootstrap, config.erasure.requests_topic, [(None, bad)])
        await produce_events(
            kafka_bootstrap, topics["input"], _window(2, 1, alice=RAW_ID, visits=2)
        )
        out = await read_topic(
            kafka_bootstrap, topics["output"], until=windows_done(["visits"], 2), timeout_s=90
        )
        responses = await read_topic(
            kafka_bootstrap,
            config.erasure.responses_topic,
            until=lambda records: len(records) >= 2,
            timeout_s=60,
        )
        _, metrics = await asyncio.to_thread(http_get, port, "/metrics")
    finally:
        assert worker.terminate() == 0, worker.log()
    assert response["status"] == "applied"
    assert _released(out)[(_iso(1), "own.example")] == 0
    statuses = {orjson.loads(v)["request_id"]: orjson.loads(v)["status"] for _, v in responses}
    assert statuses == {response["request_id"]: "applied", "dsr-bad": "rejected"}
    downstream = [
        config.output.topic,
        config.output.ledger_topic,
        config.output.partials_topic,
        config.output.repartition_topic,
        config.output.dead_letter_topic,
        config.erasure.log_topic,
        config.erasure.responses_topic,
    ]
    found: dict[str, list[str]] = {}
    for topic in downstream:
        records = await read_topic(kafka_bootstrap, topic)
        assert records, f"{topic} is empty: the scan would prove nothing"
        for key, value in records:
            hits = _sensitive((key or "").encode() + b" " + value)
            if hits:
                found.setdefault(topic, []).extend(hits)
    for name, blob in (("log", log_path.read_bytes()), ("metrics", metrics)):
        hits = _sensitive(blob)
        if hits:
            found[name] = hits
    assert found == {}, found
    dead = decode_values(await read_topic(kafka_bootstrap, config.output.dead_letter_topic))
    assert [(v["reason"], "payload" in v) for _, v in dead] == [("bad_erasure_request", False)]
    # the erasure log holds her pseudonym; /metrics counts the request, never her events
    erasures = await read_topic(kafka_bootstrap, config.erasure.log_topic)
    assert [orjson.loads(v)["kind"] for _, v in erasures].count("erasure") == 1
    assert b"stream_dp_erasure_requests_applied_total 1.0" in metrics
    assert b"erased_events" not in metrics


async def test_two_workers_release_every_window_once_and_without_the_erased_user(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    """Stage 1 and stage 2 of one window on different workers: the stage-1 side keeps the
    sealed window until it sees the release in the ledger, the stage-2 side waits for
    partials that applied the erasure; every window is still released, once."""
    cfg = _config(config_factory)
    config = load_config(cfg)
    await apply_topics(config, kafka_bootstrap, include_input=True)
    topics = topics_of(cfg)
    workers = [start_worker(cfg, tmp_path / f"w{i}.log") for i in range(2)]
    try:
        expected = await group_partitions(
            kafka_bootstrap,
            (
                config.input.topic,
                config.output.repartition_topic,
                config.output.partials_topic,
                config.erasure.requests_topic,
            ),
        )
        await wait_for_group(workers, expected, timeout_s=90)
        await produce_events(
            kafka_bootstrap,
            topics["input"],
            _window(0, 1, alice="alice", visits=1) + _window(1, 1, alice="alice", visits=2),
        )
        await read_topic(
            kafka_bootstrap, topics["output"], until=windows_done(["visits"], 1), timeout_s=90
        )
        response = _erase(cfg, "Alice")
        assert response["open_windows_affected"]["from"] == _iso(1)
        await produce_events(
            kafka_bootstrap,
            topics["input"],
            [e for n in range(2, 6) for e in _window(n, 1, alice="alice", visits=3)],
        )
        out = await read_topic(
            kafka_bootstrap,
            topics["output"],
            until=windows_done(["visits"], 5),
            timeout_s=90,
            settle_s=1.0,
        )
    finally:
        codes = [w.terminate() for w in workers]
    assert codes == [0, 0], [w.log()[-3000:] for w in workers]
    released = _released(out)
    assert [released[(_iso(n), "own.example")] for n in range(5)] == [1, 0, 0, 0, 0]
    assert all(released[(_iso(n), "shared.example")] == FILLERS for n in range(5))
    ledger = await read_topic(kafka_bootstrap, topics["ledger"])
    ids = ledger_release_ids(ledger)
    assert len(ids) == 5 and all(len(v) == 1 for v in ids.values())
    # Each release records how far its partials had applied the erasure log (the cut-off
    # is auditable): the windows after the request applied it.
    applied = {
        orjson.loads(v)["window_start"]: orjson.loads(v).get("erasures_through", 0)
        for _, v in ledger
        if orjson.loads(v)["kind"] == "ledger"
    }
    # (positions are offsets in the one-partition log, fences included)
    log_kinds = [
        orjson.loads(v)["kind"]
        for _, v in await read_topic(kafka_bootstrap, config.erasure.log_topic)
    ]
    erasure_at = log_kinds.index("erasure")
    assert applied[_iso(0)] <= erasure_at < min(applied[_iso(n)] for n in range(2, 5))
