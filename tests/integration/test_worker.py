"""The streaming worker end to end, as a real `stream-dp run` process, on the embedded broker
and on Apache Kafka."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import math
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest

from stream_dp.broker.topics import apply_topics
from stream_dp.cli.main import main
from stream_dp.config import load_config
from stream_dp.pipeline.formats.packed import decode_binary, is_binary
from stream_dp.synthetic.browser_logs import LEAVER, BrowserLogSpec, browser_log_events
from stream_dp.windows.tumbling import iso_utc
from tests.apache_kafka.tier import ON_BOTH_BROKERS
from tests.helpers import schema_validator
from tests.integration.support import (
    NOISE_FREE,
    decode_values,
    produce,
    produce_events,
    read_topic,
    run_worker_until_windows,
    start_worker,
    topics_of,
    windows_done,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow, ON_BOTH_BROKERS]

TOPICS = Path(__file__).resolve().parents[2] / "topics"
MakeConfig = Callable[[dict[str, Any] | None], Path]
TEST_MODE = {"STREAM_DP_ALLOW_UNSAFE_TEST_MODE": "1"}


def _validator(name: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((TOPICS / f"{name}.schema.json").read_text())
    registry_base = jsonschema.Draft202012Validator(schema)
    return registry_base


async def _prepare(cfg_path: Path, bootstrap: str) -> dict[str, str]:
    await apply_topics(load_config(cfg_path), bootstrap, include_input=True)
    return topics_of(cfg_path)


def _releases(records: list[tuple[str | None, dict[str, Any]]]) -> list[dict[str, Any]]:
    return [v for _, v in records if v["kind"] == "release"]


async def test_end_to_end_private_and_public_keys(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    await check_end_to_end(kafka_bootstrap, config_factory, tmp_path)


async def check_end_to_end(bootstrap: str, config_factory: MakeConfig, tmp_path: Path) -> None:
    """Synthetic browser logs for several windows → releases for every window and query.

    Shared with the Apache Kafka tier (tests/apache_kafka), which runs it unchanged.
    """
    kafka_bootstrap = bootstrap
    # ~465 distinct users visit site00 per window: above the 283 users from which truncated-
    # geometric selection (ε_s = 0.25, L0 = 3) keeps a key with probability 1.
    spec = BrowserLogSpec(users=700, windows=4, window_size_s=10)
    cfg = config_factory(
        {
            "kafka": {"bootstrap_servers": bootstrap},
            "bounds": {
                "max_contributions_per_window": 20,
                "max_keys_per_user": 3,
                "max_contributions_per_key": 10,
            },
            "queries": [
                {"name": "visits_by_domain", "group_by": ["domain"], "epsilon": 0.5, "delta": 1e-6},
                {
                    "name": "users_by_country",
                    "statistic": "count_distinct_users",
                    "group_by": ["country"],
                    "keys": {"country": ["DE", "FR", "NL", "US", "BE"]},
                    "epsilon": 0.5,
                },
            ],
        }
    )
    topics = await _prepare(cfg, kafka_bootstrap)
    events = list(browser_log_events(spec))
    await produce_events(kafka_bootstrap, topics["input"], events)
    out, worker = await run_worker_until_windows(
        kafka_bootstrap,
        cfg,
        tmp_path / "worker.log",
        ["visits_by_domain", "users_by_country"],
        spec.windows,
        timeout_s=90,
    )
    records = decode_values(out)
    release_schema, window_schema = _validator("release"), _validator("window")
    for _, value in records:
        (release_schema if value["kind"] == "release" else window_schema).validate(value)
    starts = {v["window_start"] for _, v in records}
    assert len(starts) == spec.windows
    by_window: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for v in _releases(records):
        by_window[(v["query"], v["window_start"])].append(v)
    for start in starts:
        countries = {v["group"]["country"] for v in by_window[("users_by_country", start)]}
        assert countries == {"DE", "FR", "NL", "US", "BE"}  # public keys, BE has no data
        domains = {v["group"]["domain"] for v in by_window[("visits_by_domain", start)]}
        assert "site00.example" in domains
        assert not any(d.startswith("rare-") for d in domains), domains
    await check_output_contract(kafka_bootstrap, topics["output"], len(records))
    ledger = await read_topic(kafka_bootstrap, topics["ledger"])
    ledger_schema = schema_validator("ledger.schema.json")
    kinds = set()
    for _, raw in ledger:
        value = orjson.loads(raw)
        ledger_schema.validate(value)
        kinds.add(value["kind"])
    assert kinds == {"ledger", "published", "fence", "progress", "coverage"}
    # Invariant 1: no raw user id anywhere the service writes.
    for topic in (topics["output"], topics["ledger"], topics["dead_letter"]):
        blob = b"".join(v for _, v in await read_topic(kafka_bootstrap, topic))
        assert b"employee-" not in blob and b"@corp.example" not in blob
    assert "employee-" not in worker.log() and LEAVER not in worker.log()
    # ... nor on the internal topics, where pseudonyms travel hex- or base64-encoded: every
    # string of every record is decoded both ways and searched too.
    config = load_config(cfg)
    internal = [config.output.repartition_topic, config.output.partials_topic]
    routed = 0
    for topic in internal:
        for _, value in await read_topic(kafka_bootstrap, topic):
            routed += topic == config.output.repartition_topic
            for form in _decoded_forms(value):
                assert b"employee" not in form and b"@corp.example" not in form, topic
    assert routed > 0  # the events went through stage 0 (else the search proves nothing)


def _decoded_forms(value: bytes) -> list[bytes]:
    """The record, and each string in it decoded as hex and as base64 (a binary packed
    record: its bytes as written, and each string of its metadata)."""
    forms = [value]
    if is_binary(value):
        carried = decode_binary(value, []).fields
        packed = decode_binary(value, carried)
        strings = [packed.key_id, packed.key_check, *carried]
        strings += [str(v) for signature in packed.signatures for v in signature]
        value = orjson.dumps(strings)

    def walk(item: Any) -> None:
        if isinstance(item, str):
            with contextlib.suppress(ValueError):
                forms.append(bytes.fromhex(item))
            with contextlib.suppress(ValueError):
                forms.append(base64.b64decode(item))
        elif isinstance(item, dict):
            for inner in item.values():
                walk(inner)
        elif isinstance(item, list):
            for inner in item:
                walk(inner)

    walk(orjson.loads(value))
    return forms


def _printed_schema(*args: str) -> dict[str, Any]:
    """What `stream-dp schema ARGS` prints, parsed."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["schema", *args]) == 0
    schema: dict[str, Any] = json.loads(printed.getvalue())
    return schema


async def check_output_contract(bootstrap: str, output_topic: str, expected: int) -> None:
    """Every record on the output topic carries the content-type and schema-version headers
    and validates against what `stream-dp schema output` prints, with a plain validator: no
    registry, no resolver (the schema is self-contained)."""
    headers: list[dict[str, bytes]] = []
    records = await read_topic(bootstrap, output_topic, headers_out=headers)
    assert len(records) >= expected > 0
    assert len(headers) == len(records)
    for record_headers in headers:
        assert record_headers.get("content-type") == b"application/json", record_headers
        assert record_headers.get("stream-dp-schema-version") == b"1", record_headers
    strict, consumer = _printed_schema("output", "--strict"), _printed_schema("output")
    for schema in (strict, consumer):
        jsonschema.Draft202012Validator.check_schema(schema)
        validator = jsonschema.Draft202012Validator(
            schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
        )
        for _, raw in records:
            validator.validate(orjson.loads(raw))
    # The consumer form accepts an added field (the policy); the strict one refuses it.
    value = orjson.loads(records[0][1])
    added = {**value, "a_field_of_a_later_version": 1}
    jsonschema.Draft202012Validator(consumer).validate(added)
    assert not jsonschema.Draft202012Validator(strict).is_valid(added)
    assert not jsonschema.Draft202012Validator(consumer).is_valid({**value, "kind": "other"})


async def test_bounding_caps_one_heavy_user(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    k = 5
    cfg = config_factory(
        {
            "privacy": NOISE_FREE,
            "bounds": {"max_contributions_per_window": k},
            "queries": [
                {
                    "name": "visits",
                    "group_by": ["domain"],
                    "epsilon": 1e6,
                    "keys": {"domain": ["heavy.example"]},
                }
            ],
        }
    )
    topics = await _prepare(cfg, kafka_bootstrap)
    t0 = 1_596_240_000
    events = [
        {"user_id": "heavy", "timestamp": t0 + i % 10, "domain": "heavy.example"}
        for i in range(10 * k)
    ]
    events += [
        {"user_id": f"light{u}", "timestamp": t0 + 9.5, "domain": "heavy.example"}
        for u in range(3)
        for _ in range(2)
    ]
    await produce_events(kafka_bootstrap, topics["input"], events)
    out, _ = await run_worker_until_windows(
        kafka_bootstrap, cfg, tmp_path / "worker.log", ["visits"], 1, env=TEST_MODE
    )
    (release,) = _releases(decode_values(out))
    # The heavy user's 50 events move the count by exactly k (noise is ~0 at ε = 1e6).
    assert release["value"] == k + 6


async def test_bad_input_goes_to_dead_letter(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    cfg = config_factory(
        {
            "privacy": NOISE_FREE,
            "input": {"max_record_bytes": 512},
            "bounds": {"max_contributions_per_window": 1000},
            "queries": [
                {
                    "name": "visits",
                    "group_by": ["domain"],
                    "epsilon": 1e6,
                    "keys": {"domain": ["a.example"]},
                }
            ],
        }
    )
    topics = await _prepare(cfg, kafka_bootstrap)
    t0 = 1_596_240_000
    bad_kinds: list[tuple[str, bytes]] = [
        ("not_json", b"{oops"),
        ("not_object", b'["secret-user-1", 1596240001]'),
        ("missing_user", b'{"timestamp": 1596240001, "domain": "a.example"}'),
        ("bad_timestamp", b'{"user_id": "secret-user-2", "timestamp": "later"}'),
        ("too_large", b'{"user_id": "secret-user-3", "pad": "' + b"x" * 600 + b'"}'),
        ("bad_user", b'{"user_id": ["secret-user-4"], "timestamp": 1596240001}'),
        ("bad_field", b'{"user_id": "secret-user-5", "timestamp": 1596240001, "domain": {}}'),
        ("not_utf8", b"\xff\xfe\xfd"),
    ]
    values: list[bytes] = []
    expected: dict[str, int] = defaultdict(int)
    good = 0
    for i in range(1000):
        reason, raw = bad_kinds[i % len(bad_kinds)]
        values.append(raw)
        expected[reason] += 1
        if i % 2 == 0:
            values.append(
                orjson.dumps(
                    {
                        "user_id": f"secret-good-{i % 97}",
                        "timestamp": t0 + (i % 10),
                        "domain": "a.example",
                    }
                )
            )
            good += 1
    await produce(kafka_bootstrap, topics["input"], values, lambda v: None)
    worker = start_worker(cfg, tmp_path / "worker.log", TEST_MODE)
    try:
        dead = await read_topic(
            kafka_bootstrap,
            topics["dead_letter"],
            until=lambda r: len(r) >= 1000,
            timeout_s=60,
            settle_s=0.5,
        )
        out = await read_topic(
            kafka_bootstrap, topics["output"], until=windows_done(["visits"], 1), timeout_s=60
        )
        assert worker.proc.poll() is None  # still running: bad input never crashes it
    finally:
        assert worker.terminate() == 0, worker.log()
    dead_values = decode_values(dead)
    schema = _validator("dead_letter")
    got: dict[str, int] = defaultdict(int)
    for _, v in dead_values:
        schema.validate(v)
        got[v["reason"]] += 1
        assert "payload" not in v
    assert dict(got) == dict(expected)
    assert b"secret-" not in b"".join(v for _, v in dead)
    (release,) = _releases(decode_values(out))
    assert release["value"] == good


@pytest.mark.parametrize(
    ("idle", "keyed"),
    [(2.0, False), (0.2, False), (0.2, True)],
    ids=["idle-2s", "idle-0.2s", "idle-0.2s-keyed"],
)
async def test_idle_stream_closes_window_by_wall_clock(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path, idle: float, keyed: bool
) -> None:
    """A window is released with no event after it, by the wall clock alone, and not
    before the clock allows (its end plus the grace, and the idle timeout after the last
    event): waited for on its record, checked on the records' own time stamps. Also with
    an idle timeout below the idle fetch's shortest wait (0.2 s, where the idle marks are
    due every 0.1 s and an idle loop turns every 0.2 s), repartitioned and keyed by user."""
    size, grace = 8, 1
    first = math.floor(time.time() / size) * size
    cfg = config_factory(
        {
            "input": {"keyed_by_user": keyed},
            "window": {
                "size_s": size,
                "grace_s": grace,
                "idle_close_s": idle,
                "start_at": iso_utc(first),
            },
            "queries": [
                {
                    "name": "visits",
                    "group_by": ["domain"],
                    "epsilon": 1.0,
                    "keys": {"domain": ["a.example"]},
                }
            ],
        }
    )
    topics = await _prepare(cfg, kafka_bootstrap)
    worker = start_worker(cfg, tmp_path / "worker.log")
    try:
        # Wait until the worker has joined its group (ready) by polling its log.
        deadline = time.monotonic() + 30
        while "partitions assigned" not in worker.log():
            assert time.monotonic() < deadline, worker.log()
            await read_topic(kafka_bootstrap, topics["output"], timeout_s=0.3)
        # Send at the start of a window (a wait on the clock, at most one window long), so
        # that the window may close only well after the idle timeout: a release that waits
        # for the idle timeout alone would come before the window's end and be seen.
        while time.time() % size > 0.5:
            await asyncio.sleep(0.02)
        now = time.time()
        window_end = (math.floor(now / size) + 1) * size
        await produce_events(
            kafka_bootstrap,
            topics["input"],
            [{"user_id": f"u{i}", "timestamp": now, "domain": "a.example"} for i in range(5)],
        )
        start = iso_utc(window_end - size)

        def released(records: list[tuple[str | None, bytes]]) -> bool:
            return any(v["kind"] == "window" and v["window_start"] == start
                       for _, v in decode_values(records))  # fmt: skip

        # No event arrives after these: the wall clock alone must close the window (the
        # deadline is a hang guard only; the read returns once the window is released).
        out = await read_topic(kafka_bootstrap, topics["output"], until=released, timeout_s=120)
    finally:
        assert worker.terminate() == 0, worker.log()
    (window,) = [
        v for _, v in decode_values(out) if v["kind"] == "window" and v["window_start"] == start
    ]
    assert any(v["kind"] == "release" and v["window_start"] == start for _, v in decode_values(out))
    # ... and not before the clock allowed it: the window's end plus the grace, and the
    # idle timeout after the last event (the records' own time stamps, in ms).
    earliest_s = math.floor(max(window_end + grace, now + idle) * 1000) / 1000
    late_enough = await read_topic(kafka_bootstrap, topics["output"], since_s=earliest_s)
    assert window in [v for _, v in decode_values(late_enough) if v["kind"] == "window"]


async def test_weighted_selection_end_to_end_with_weights_on_the_partials_topic(
    kafka_bootstrap: str, config_factory: MakeConfig, tmp_path: Path
) -> None:
    """selection: weighted_gaussian through a real worker: stage 1 writes each key's weight
    sum in the partials' selection_weights column (schema-valid), stage 2 adds them and keeps
    the keys whose noisy sum reaches the threshold. In test mode the noise is a few units of
    a ~4,117 threshold (P(any decision here flips) < 1e-12): one user alone never suffices
    (4,096 at most), two users do, and so do two users on three keys each (2 × 2,364)."""
    cfg = config_factory(
        {
            "privacy": {**NOISE_FREE, "delta_per_window": 1e-6},
            "bounds": {"max_contributions_per_window": 20, "max_keys_per_user": 3},
            "queries": [
                {
                    "name": "visits",
                    "group_by": ["domain"],
                    "epsilon": 1e6,
                    "delta": 1e-6,
                    "selection": "weighted_gaussian",
                }
            ],
        }
    )
    topics = await _prepare(cfg, kafka_bootstrap)
    t0 = 1_596_240_000

    def visit(user: str, domain: str) -> dict[str, Any]:
        return {"user_id": user, "timestamp": t0 + 5, "domain": domain}

    events = [visit("solo", "lonely.example"), visit("a", "pair.example")]
    events += [visit("b", "pair.example")]
    events += [visit(u, f"{d}.example") for u in ("m1", "m2") for d in "xyz"]
    events += [visit("heavy", f"h{i}.example") for i in range(10)]
    await produce_events(kafka_bootstrap, topics["input"], events)
    out, _ = await run_worker_until_windows(
        kafka_bootstrap, cfg, tmp_path / "worker.log", ["visits"], 1, env=TEST_MODE
    )
    releases = _releases(decode_values(out))
    assert {r["group"]["domain"]: r["value"] for r in releases} == {
        "pair.example": 2,
        "x.example": 2,
        "y.example": 2,
        "z.example": 2,
    }
    assert {r["selection"]["strategy"] for r in releases} == {"weighted_gaussian"}
    partials_schema = schema_validator("partials.schema.json")
    entries = []  # (group values, weight sum) per key and source partition
    for _, raw in await read_topic(kafka_bootstrap, load_config(cfg).output.partials_topic):
        value = orjson.loads(raw)
        partials_schema.validate(value)
        if value["kind"] == "partial":
            columns = value["columns"]
            entries += zip(columns["groups"], columns["selection_weights"], strict=True)
    weights = {e[0][0]: e[1] for e in entries}
    assert weights["lonely.example"] == 4096  # ⌊4096/√1⌋: solo kept one key
    heavy = [d for d in weights if d.startswith("h")]
    assert len(heavy) == 3 and {weights[d] for d in heavy} == {2364}  # L0 = 3: ⌊4096/√3⌋
    # the two users of pair.example may sit on different stage-1 partitions: stage 2 adds
    pair = [e[1] for e in entries if e[0] == ["pair.example"]]
    assert sum(pair) == 2 * 4096
