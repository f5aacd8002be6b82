"""Scale-out: several `stream-dp run` workers in one consumer group on a multi-partition input.

The releases must not depend on how many workers share the work, on a worker dying, or on
whether producers key records by user id. Noise is switched off (test mode, ε = 1e6), and
every expected value is computed here from the data: with at most k events per user and
window, or a heavier user's events all on one key, contribution bounding is deterministic.
"""

from __future__ import annotations

import random
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from stream_dp.windows.tumbling import iso_utc
from tests.apache_kafka.tier import APACHE_KAFKA, ON_BOTH_BROKERS, TANSU
from tests.helpers import ConfigFactory, TopicFactory
from tests.integration.support import (
    NOISE_FREE,
    WorkerProcess,
    decode_values,
    ledger_release_ids,
    produce_records,
    read_topic,
    run_worker_until_windows,
    start_worker,
    topic_partitions,
    topics_of,
    wait_for_group,
    windows_done,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

#: 2020-08-01T00:00:00Z: a multiple of 6 windows (of 10 s or 30 s), so window i goes to
#: partials partition i (partials_partition) and 6 windows give every worker some to release.
T0 = 1_596_240_000
K = 5  # bounds.max_contributions_per_window
DOMAINS = ["a.example", "b.example", "c.example", "d.example"]
COUNTRIES = ["DE", "FR", "NL", "US"]
QUERIES = ["visits_by_domain", "users_by_country"]
INPUT_PARTITIONS = 6
WORKERS = 3
FIRST_EVENT_S = 2.0
#: (query, window start, group value) → released value
Releases = dict[tuple[str, str, str], float]


def _config(
    config_factory: ConfigFactory, input_topic: str, *, keyed: bool, size_s: int = 10
) -> Path:
    return config_factory(
        {
            "input": {"topic": input_topic, "keyed_by_user": keyed},
            "window": {"size_s": size_s, "grace_s": 1, "idle_close_s": 2},
            "privacy": NOISE_FREE,
            "bounds": {"max_contributions_per_window": K},
            "queries": [
                {
                    "name": "visits_by_domain",
                    "statistic": "count",
                    "group_by": ["domain"],
                    "keys": {"domain": DOMAINS},
                    "epsilon": 1e6,
                },
                {
                    "name": "users_by_country",
                    "statistic": "count_distinct_users",
                    "group_by": ["country"],
                    "keys": {"country": COUNTRIES},
                    "epsilon": 1e6,
                },
            ],
        }
    )


def make_events(
    seed: int, n_windows: int, size_s: int, *, users: int = 60, heavy: int = 4
) -> list[dict[str, Any]]:
    """Events in time order. Light users: 1..k events per window on random domains (all
    kept); the first ``heavy`` users: 3k events per window, all on one domain (k kept,
    whichever the reservoir picks). Every user has one country, and a first event in each
    window they are active in within the window's first FIRST_EVENT_S seconds."""
    rng = random.Random(seed)
    events: list[dict[str, Any]] = []
    for w in range(n_windows):
        ws = T0 + w * size_s
        for u in range(users):
            if u < heavy:
                picks = [rng.choice(DOMAINS)] * (3 * K)
            elif rng.random() < 0.7:
                picks = [rng.choice(DOMAINS) for _ in range(rng.randint(1, K))]
            else:
                continue
            for i, domain in enumerate(picks):
                offset_s = rng.uniform(0, FIRST_EVENT_S if i == 0 else size_s - 0.5)
                events.append(
                    {
                        "user_id": f"user-{u}",
                        "timestamp": round(ws + offset_s, 3),
                        "domain": domain,
                        "country": COUNTRIES[u % len(COUNTRIES)],
                    }
                )
    events.sort(key=lambda e: e["timestamp"])
    return events


def expected_releases(events: Sequence[dict[str, Any]], size_s: int, n_windows: int) -> Releases:
    """The exact bounded values of both queries (public keys: zeros are released too)."""
    by_user: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        ws = int(e["timestamp"] // size_s * size_s)
        by_user[(ws, str(e["user_id"]))].append(e)
    out: Releases = {}
    for w in range(n_windows):
        window = iso_utc(T0 + w * size_s)
        out.update({("visits_by_domain", window, d): 0 for d in DOMAINS})
        out.update({("users_by_country", window, c): 0 for c in COUNTRIES})
    for (ws, _), evs in by_user.items():
        window = iso_utc(ws)
        domains = [e["domain"] for e in evs]
        if len(domains) > K:
            assert len(set(domains)) == 1, "a heavy user's sample must not matter"
            domains = domains[:K]
        for d in domains:
            out[("visits_by_domain", window, d)] += 1
        (country,) = {e["country"] for e in evs}
        out[("users_by_country", window, country)] += 1
    return out


def keyed_by_user(events: Sequence[dict[str, Any]]) -> list[tuple[bytes | None, bytes]]:
    return [(str(e["user_id"]).encode(), orjson.dumps(e)) for e in events]


def unkeyed(events: Sequence[dict[str, Any]]) -> list[tuple[bytes | None, bytes]]:
    """No key: the producer spreads one user's events over every partition."""
    return [(None, orjson.dumps(e)) for e in events]


def checked_releases(
    output: Sequence[tuple[str | None, bytes]],
    ledger: Sequence[tuple[str | None, bytes]],
    windows: set[str],
) -> tuple[Releases, dict[tuple[str, str], list[int]]]:
    """Every (query, window) released exactly once: one window record in the output, one
    ledger entry with one release id, which every release record of the window carries.
    Returns the released values, and per (query, window) the source partitions whose
    partials the release merged (from the ledger)."""
    records = [v for _, v in decode_values(output)]
    window_records = Counter(
        (v["query"], v["window_start"]) for v in records if v["kind"] == "window"
    )
    expected_ids = {(q, w) for q in QUERIES for w in windows}
    assert set(window_records) == expected_ids, sorted(window_records)
    assert all(n == 1 for n in window_records.values()), window_records
    ids = ledger_release_ids(ledger)
    assert set(ids) == expected_ids, sorted(ids)
    assert all(len(v) == 1 for v in ids.values()), ids  # never drawn twice
    entries = [v for v in (orjson.loads(raw) for _, raw in ledger) if v["kind"] == "ledger"]
    parts = Counter((v["query"], v["window_start"], v["part"]) for v in entries)
    assert all(n == 1 for n in parts.values()), parts  # written once
    sources = {(v["query"], v["window_start"]): sorted(map(int, v["sources"])) for v in entries}
    values: Releases = {}
    for v in records:
        (release_id,) = ids[(v["query"], v["window_start"])]
        assert v["release_id"] == release_id, v
        if v["kind"] == "release":
            (group,) = v["group"].values()
            key = (v["query"], v["window_start"], group)
            assert key not in values, f"released twice: {key}"
            values[key] = v["value"]
    return values, sources


def assert_exact(
    released: Releases, sources: dict[tuple[str, str], list[int]], expected: Releases
) -> None:
    """Released == expected; otherwise name each short window and the sources it merged."""
    if released == expected:
        return
    wrong = sorted({(q, w) for (q, w, g), v in expected.items() if released.get((q, w, g)) != v})
    lines = [
        f"{q} {w}: released {sum(released.get((q, w, g), 0) for g in _groups(q))}"
        f" of {sum(expected[(q, w, g)] for g in _groups(q))}, merged the partials of"
        f" source partitions {sources.get((q, w))}"
        for q, w in wrong
    ]
    raise AssertionError("releases differ from the exact bounded counts:\n" + "\n".join(lines))


def _groups(query: str) -> list[str]:
    return DOMAINS if query == "visits_by_domain" else COUNTRIES


def published(
    pairs: set[tuple[str, str]],
) -> Callable[[list[tuple[str | None, bytes]]], bool]:
    """``until`` predicate on the ledger: a ``published`` marker for every (query, window)."""

    def check(records: list[tuple[str | None, bytes]]) -> bool:
        seen = {
            (v["query"], v["window_start"])
            for v in (orjson.loads(raw) for _, raw in records)
            if v["kind"] == "published"
        }
        return pairs <= seen

    return check


def idle_marks(partitions: set[int]) -> Callable[[list[tuple[str | None, bytes]]], bool]:
    """``until`` predicate on the partials topic: every stage-1 partition has published a
    watermark saying it is idle with no open window (so it holds no window back)."""

    def check(records: list[tuple[str | None, bytes]]) -> bool:
        idle = {
            v["source_partition"]
            for v in (orjson.loads(raw) for _, raw in records)
            if v["kind"] == "watermark" and v["idle"] and not v["open_windows"]
        }
        return partitions <= idle

    return check


def stop_all(workers: Sequence[WorkerProcess]) -> None:
    """SIGTERM every worker at once; each must exit cleanly (code 0)."""
    running = [w for w in workers if w.proc.poll() is None]
    for w in running:
        w.proc.send_signal(signal.SIGTERM)
    for w in running:
        assert w.proc.wait(timeout=30) == 0, w.log()


@dataclass(frozen=True)
class Setup:
    config: Path
    topics: dict[str, str]
    stage1_topic: str
    partials_topic: str
    #: Every partition the group shares: input, partials, and repartition if unkeyed.
    shared: set[tuple[str, int]]


async def _prepare(
    bootstrap: str,
    topic_factory: TopicFactory,
    config_factory: ConfigFactory,
    keyed: bool,
    **kw: Any,
) -> Setup:
    """A config on a fresh 6-partition input topic, with its other topics created."""
    input_topic = await topic_factory(partitions=INPUT_PARTITIONS)
    cfg = _config(config_factory, input_topic, keyed=keyed, **kw)
    config = load_config(cfg)
    await apply_topics(config, bootstrap, include_input=False)
    stage1 = input_topic if keyed else config.output.repartition_topic
    group_topics = {input_topic, stage1, config.output.partials_topic}
    shared = {(t, p) for t in group_topics for p in await topic_partitions(bootstrap, t)}
    return Setup(cfg, topics_of(cfg), stage1, config.output.partials_topic, shared)


async def check_three_workers(
    bootstrap: str,
    setup: Setup,
    workers: list[WorkerProcess],
    tmp_path: Path,
    *,
    keyed: bool,
    idle_first: bool,
) -> None:
    size, n_windows = 10, 6
    events = make_events(seed=1, n_windows=n_windows, size_s=size)
    workers.extend(start_worker(setup.config, tmp_path / f"w{i}.log") for i in range(WORKERS))
    shares = await wait_for_group(workers, setup.shared)
    settled_at = time.time()
    assert all(any(t == setup.topics["input"] for t, _ in s) for s in shares)  # all route/bound
    if idle_first:
        stage1 = {p for t, p in setup.shared if t == setup.stage1_topic}
        await read_topic(
            bootstrap,
            setup.partials_topic,
            until=idle_marks(stage1),
            since_s=settled_at,
            timeout_s=30,
        )
    await produce_records(
        bootstrap, setup.topics["input"], keyed_by_user(events) if keyed else unkeyed(events)
    )
    out = await read_topic(
        bootstrap,
        setup.topics["output"],
        until=windows_done(QUERIES, n_windows),
        timeout_s=90,
        settle_s=1.0,
    )
    stop_all(workers)
    ledger = await read_topic(bootstrap, setup.topics["ledger"])
    windows = {iso_utc(T0 + w * size) for w in range(n_windows)}
    expected = expected_releases(events, size, n_windows)
    # Heavy users exceed k: bounding per partition instead of per user would show.
    assert sum(v for (q, _, _), v in expected.items() if q == "visits_by_domain") < len(events)
    assert_exact(*checked_releases(out, ledger, windows), expected)
    # Window w goes to partials partition w of 6, two per worker: every worker released.
    assert all("window released" in w.log() for w in workers)


#: Keyed and unkeyed input on the embedded broker; keyed input on Apache Kafka too (where
#: its clients' murmur2 placement meets Kafka's own group coordinator). The unkeyed case adds
#: nothing broker-specific, and the tier's time is better spent elsewhere.
KEYED = pytest.mark.parametrize(
    ("kafka_bootstrap", "keyed"),
    [
        pytest.param(TANSU, True, id="keyed_by_user-tansu"),
        pytest.param(TANSU, False, id="unkeyed-tansu"),
        pytest.param(APACHE_KAFKA, True, id="keyed_by_user-apache_kafka",
                     marks=pytest.mark.apache_kafka),
    ],
    indirect=["kafka_bootstrap"],
)  # fmt: skip


@KEYED
async def test_three_workers_release_exact_bounded_counts_once(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    config_factory: ConfigFactory,
    workers: list[WorkerProcess],
    tmp_path: Path,
    keyed: bool,
) -> None:
    """Three workers share six input partitions; each window is released once with exactly
    the bounded counts of the data. Both parametrizations get the same data and must
    release the same values: keyed by user id with keyed_by_user true, and unkeyed (one
    user's events on every partition) with keyed_by_user false. The data arrives right
    after the group has settled."""
    setup = await _prepare(kafka_bootstrap, topic_factory, config_factory, keyed)
    await check_three_workers(
        kafka_bootstrap, setup, workers, tmp_path, keyed=keyed, idle_first=False
    )


@KEYED
async def test_three_idle_workers_then_a_burst_release_exact_counts(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    config_factory: ConfigFactory,
    workers: list[WorkerProcess],
    tmp_path: Path,
    keyed: bool,
) -> None:
    """As above, but the data arrives only after every stage-1 partition has reported
    itself idle (longer than idle_close_s without data), as after a quiet night: the
    workers read their shares of the burst at slightly different moments, and no window
    may close before every partition's share of it was counted."""
    setup = await _prepare(kafka_bootstrap, topic_factory, config_factory, keyed)
    await check_three_workers(
        kafka_bootstrap, setup, workers, tmp_path, keyed=keyed, idle_first=True
    )


@KEYED
async def test_kill_one_of_three_mid_window_then_replace_it(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    config_factory: ConfigFactory,
    workers: list[WorkerProcess],
    tmp_path: Path,
    keyed: bool,
) -> None:
    """SIGKILL one of three workers while window 3 is open (windows 0-2 released, window
    3's first seconds read), produce the rest, start a replacement: every window is
    released once, with nothing lost."""
    # 30 s windows: the idle rule closes an open window only after the stream is quiet for
    # about a window's length, far longer than the seconds between the data and the kill.
    size, n_windows = 30, 5
    setup = await _prepare(kafka_bootstrap, topic_factory, config_factory, keyed, size_s=size)
    cfg, topics = setup.config, setup.topics
    events = make_events(seed=2, n_windows=n_windows, size_s=size)
    # Every user active in window 3 has an event before the cut, so every stage-1 partition
    # that will see window 3 holds it open when the worker dies.
    cut = T0 + 3 * size + FIRST_EVENT_S
    before = [e for e in events if e["timestamp"] < cut]
    after = [e for e in events if e["timestamp"] >= cut]
    encode = keyed_by_user if keyed else unkeyed
    workers.extend(start_worker(cfg, tmp_path / f"w{i}.log") for i in range(WORKERS))
    shares = await wait_for_group(workers, setup.shared)
    await produce_records(kafka_bootstrap, topics["input"], encode(before))
    first = [iso_utc(T0 + w * size) for w in range(3)]
    await read_topic(
        kafka_bootstrap,
        topics["ledger"],
        until=published({(q, w) for q in QUERIES for w in first}),
        timeout_s=60,
    )
    so_far = decode_values(
        await read_topic(
            kafka_bootstrap, topics["output"], until=windows_done(QUERIES, 3), timeout_s=10
        )
    )
    assert {v["window_start"] for _, v in so_far} == set(first)  # window 3 is still open
    victim = workers[1]
    assert any(t == setup.stage1_topic for t, _ in shares[1])  # it bounds some of window 3
    victim.kill()
    assert victim.proc.returncode == -signal.SIGKILL
    await produce_records(kafka_bootstrap, topics["input"], encode(after))
    workers.append(start_worker(cfg, tmp_path / "replacement.log"))
    survivors = [workers[0], workers[2], workers[3]]
    await wait_for_group(survivors, setup.shared)  # the replacement took a share
    out = await read_topic(
        kafka_bootstrap,
        topics["output"],
        until=windows_done(QUERIES, n_windows),
        timeout_s=90,
        settle_s=1.0,
    )
    stop_all(survivors)
    ledger = await read_topic(kafka_bootstrap, topics["ledger"])
    windows = {iso_utc(T0 + w * size) for w in range(n_windows)}
    assert_exact(
        *checked_releases(out, ledger, windows), expected_releases(events, size, n_windows)
    )


@ON_BOTH_BROKERS
async def test_record_not_keyed_by_its_user_is_dead_lettered(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    config_factory: ConfigFactory,
    tmp_path: Path,
) -> None:
    """keyed_by_user: true trusts the key to co-locate a user's events, so a record whose
    key is not its user id (no key, or another user's) is dead-lettered; the rest counts."""
    size, n_windows = 10, 2
    setup = await _prepare(kafka_bootstrap, topic_factory, config_factory, True)
    topics = setup.topics
    events = make_events(seed=3, n_windows=n_windows, size_s=size, users=20, heavy=1)
    # A numeric user id keyed by its decimal string is keyed correctly.
    events += [
        {"user_id": 4242, "timestamp": T0 + w * size + 1.5, "domain": "a.example", "country": "NL"}
        for w in range(n_windows)
    ]
    events.sort(key=lambda e: e["timestamp"])
    records: list[tuple[bytes | None, bytes]] = []
    good: list[dict[str, Any]] = []
    for i, e in enumerate(events):
        value = orjson.dumps(e)
        if i % 7 == 3:
            records.append((None, value))
        elif i % 7 == 5:
            records.append((f"{e['user_id']}-other".encode(), value))
        else:
            records.append((str(e["user_id"]).encode(), value))
            good.append(e)
    n_bad = len(events) - len(good)
    assert n_bad > 10
    await produce_records(kafka_bootstrap, topics["input"], records)
    out, _ = await run_worker_until_windows(
        kafka_bootstrap, setup.config, tmp_path / "worker.log", QUERIES, n_windows, timeout_s=60
    )
    dead = decode_values(
        await read_topic(
            kafka_bootstrap,
            topics["dead_letter"],
            until=lambda r: len(r) >= n_bad,
            timeout_s=10,
            settle_s=0.5,
        )
    )
    assert Counter(v["reason"] for _, v in dead) == {"not_keyed_by_user": n_bad}
    assert len({(v["source_partition"], v["source_offset"]) for _, v in dead}) == n_bad
    ledger = await read_topic(kafka_bootstrap, topics["ledger"])
    windows = {iso_utc(T0 + w * size) for w in range(n_windows)}
    assert_exact(*checked_releases(out, ledger, windows), expected_releases(good, size, n_windows))
