"""The deployment fingerprint on real workers (issue 25, breaks 1 and 3): a worker whose
meaning-bearing settings differ from the deployment's refuses to start, naming the setting
and the way out; one that changes only other settings (log level, ports, timeouts) joins.

Noise is switched off (test mode, ε = 1e6) so released values equal the bounded counts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from stream_dp.broker.topics import apply_topics
from stream_dp.config import load_config
from stream_dp.config.fingerprint import Topology, deployment_fingerprint
from stream_dp.pipeline.formats.ledger import encode_coverage
from stream_dp.pipeline.stages.release_stage import ReleaseStage
from stream_dp.windows.tumbling import iso_utc
from tests.helpers import ConfigFactory, TopicFactory
from tests.integration.support import (
    HANG_GUARD_S,
    NOISE_FREE,
    WorkerProcess,
    current_assignment,
    decode_values,
    group_partitions,
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

T0 = 1_596_240_000  # 2020-08-01T00:00:00Z, the configs' window.start_at
SIZE_S = 10
HEAVY = 400  # events of each heavy user in window 0
QUERIES = ["visits", "users"]


def _overrides(input_topic: str, k: int) -> dict[str, Any]:
    return {
        "input": {"topic": input_topic, "keyed_by_user": True},
        "window": {"size_s": SIZE_S, "grace_s": 1, "idle_close_s": 2},
        "privacy": NOISE_FREE,
        "bounds": {"max_contributions_per_window": k},
        "queries": [
            {
                "name": "visits",
                "group_by": ["domain"],
                "epsilon": 1e6,
                "keys": {"domain": ["a.example"]},
            },
            {"name": "users", "statistic": "count_distinct_users", "epsilon": 1e6, "keys": {}},
        ],
    }


def _variant(path: Path, name: str, change: dict[str, Any]) -> Path:
    """The same deployment (group id, topics) with some settings changed."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    for section, values in change.items():
        if isinstance(values, dict):
            data.setdefault(section, {}).update(values)
        else:
            data[section] = values
    out = path.with_name(f"{path.stem}-{name}.yaml")
    out.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return out


async def _prepare(
    bootstrap: str, topic_factory: TopicFactory, config_factory: ConfigFactory, k: int
) -> tuple[Path, set[tuple[str, int]]]:
    """A config on a fresh 2-partition input topic, its topics created; the partitions
    the group shares."""
    input_topic = await topic_factory(partitions=2)
    path = config_factory(_overrides(input_topic, k))
    config = load_config(path)
    await apply_topics(config, bootstrap, include_input=False)
    shared = await group_partitions(bootstrap, (input_topic, config.output.partials_topic))
    return path, shared


async def _refused_or_joined(workers: Sequence[WorkerProcess]) -> list[WorkerProcess]:
    """Wait until a worker exits, or every one holds partitions of the group (the hang
    guard is far above either): the workers that exited."""
    deadline = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < deadline:
        exited = [w for w in workers if w.proc.poll() is not None]
        if exited or all(current_assignment(w) for w in workers):
            return exited
        await asyncio.sleep(0.1)
    raise AssertionError("no worker exited and the group did not settle")


def _assert_refused(worker: WorkerProcess, *fields: str) -> str:
    assert worker.proc.returncode == 2, worker.log()
    log = worker.log()
    for field in fields:
        assert field in log, log
    assert "kafka.group_id" in log and "window.start_at" in log, log  # the way out
    assert "partitions assigned" not in log, log  # it never joined the group
    return log


async def test_two_workers_with_different_bounds_never_mix_them(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    config_factory: ConfigFactory,
    workers: list[WorkerProcess],
    tmp_path: Path,
) -> None:
    """Break 1: one worker with k = 400 and one with k = 4 started together in one group
    (a rolling restart that changes k). Exactly one refuses — the one whose coverage record
    came second — naming the bound; the other releases alone, every partial stamped with
    its fingerprint, and the heavy users' counts carry noise calibrated for the k they were
    bounded with."""
    loose, shared = await _prepare(kafka_bootstrap, topic_factory, config_factory, HEAVY)
    strict = _variant(loose, "strict", {"bounds": {"max_contributions_per_window": 4}})
    workers.extend(
        start_worker(cfg, tmp_path / f"{name}.log")
        for name, cfg in (("loose", loose), ("strict", strict))
    )
    exited = await _refused_or_joined(workers)
    assert len(exited) == 1, [w.log()[-2000:] for w in workers]
    _assert_refused(exited[0], "bounds.max_contributions_per_window")
    (survivor,) = [w for w in workers if w not in exited]
    survivor_cfg = loose if survivor is workers[0] else strict
    await wait_for_group([survivor], shared)

    users = [f"heavy-{u}" for u in range(3)]
    events = [
        (
            u.encode(),
            orjson.dumps({"user_id": u, "timestamp": T0 + 1 + i / 100, "domain": "a.example"}),
        )
        for u in users
        for i in range(HEAVY)
    ]
    topics = topics_of(loose)
    await produce_records(kafka_bootstrap, topics["input"], events)
    out = await read_topic(
        kafka_bootstrap, topics["output"], until=windows_done(QUERIES, 1), settle_s=1.0
    )
    assert survivor.terminate() == 0, survivor.log()

    config = load_config(survivor_cfg)
    k = config.bounds.max_contributions_per_window
    plan = ReleaseStage(config).queries[0].plan
    # Window 0 (the heavy users'); idle windows after it may be out already too.
    (visits,) = [
        v
        for _, v in decode_values(out)
        if v["kind"] == "release" and v["query"] == "visits" and v["window_start"] == iso_utc(T0)
    ]
    assert visits["value"] == len(users) * k
    assert visits["noise_scale"] == plan.noise_scale
    # Every partial was bounded under the survivor's settings, as the ledger recorded them.
    ledger = [v for _, v in decode_values(await read_topic(kafka_bootstrap, topics["ledger"]))]
    (coverage,) = [v for v in ledger if v["kind"] == "coverage"][:1]
    digest = coverage["fingerprint"]["digest"]
    partials = decode_values(await read_topic(kafka_bootstrap, config.output.partials_topic))
    stamps = {v["fingerprint"] for _, v in partials if v["kind"] == "partial"}
    assert stamps == {digest}
    topology = Topology(
        partials_partitions=len({p for t, p in shared if t == config.output.partials_topic}),
        ledger_partitions=len(await topic_partitions(kafka_bootstrap, topics["ledger"])),
    )
    assert digest == deployment_fingerprint(config, topology).digest


async def test_a_worker_missing_a_query_is_refused(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    config_factory: ConfigFactory,
    workers: list[WorkerProcess],
    tmp_path: Path,
) -> None:
    """Break 1's other half: a worker without one of the deployment's queries would seal
    partials without it, and its windows would silently miss those counts. It refuses,
    naming the query; the running worker carries on."""
    both, shared = await _prepare(kafka_bootstrap, topic_factory, config_factory, 5)
    one = _variant(both, "one", {"queries": _overrides("x", 5)["queries"][:1]})
    workers.append(start_worker(both, tmp_path / "both.log"))
    await wait_for_group(workers, shared)
    workers.append(start_worker(one, tmp_path / "one.log"))
    exited = await _refused_or_joined(workers)
    assert exited == [workers[1]], [w.log()[-2000:] for w in workers]
    _assert_refused(workers[1], "queries.users (recorded, missing here)")
    assert workers[0].terminate() == 0, workers[0].log()


async def _first_run(
    bootstrap: str, path: Path, tmp_path: Path, windows: range
) -> list[tuple[str | None, bytes]]:
    """Events in ``windows`` (two users each), released by one worker that then stops."""
    events = [
        (
            f"u{u}".encode(),
            orjson.dumps(
                {"user_id": f"u{u}", "timestamp": T0 + w * SIZE_S + 1 + u, "domain": "a.example"}
            ),
        )
        for w in windows
        for u in range(2)
    ]
    await produce_records(bootstrap, topics_of(path)["input"], events)
    out, _ = await run_worker_until_windows(
        bootstrap,
        path,
        tmp_path / f"run-{windows.start}.log",
        QUERIES,
        windows.stop,
        timeout_s=60,
    )
    return out


async def test_a_window_size_changed_across_a_restart_is_refused(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    config_factory: ConfigFactory,
    workers: list[WorkerProcess],
    tmp_path: Path,
) -> None:
    """Break 3: window.size_s 10 → 20 on the same deployment would keep releasing on the
    old grid and lose every later event. The restart is refused with the field and the
    way out (a new group id, window.start_at after the last released window)."""
    path, _ = await _prepare(kafka_bootstrap, topic_factory, config_factory, 5)
    await _first_run(kafka_bootstrap, path, tmp_path, range(3))
    wider = _variant(path, "wider", {"window": {"size_s": 2 * SIZE_S}})
    workers.append(start_worker(wider, tmp_path / "wider.log"))
    assert await _refused_or_joined(workers) == workers
    log = _assert_refused(workers[0], "window.size_s")
    # Where a new deployment may start: the end of the last window on the output topic
    # (not the largest progress cursor, which lies partitions - 1 windows further).
    output = decode_values(await read_topic(kafka_bootstrap, topics_of(path)["output"]))
    last_end = max(v["window_end"] for _, v in output)
    assert last_end == iso_utc(T0 + 3 * SIZE_S)
    assert f"a new kafka.group_id with window.start_at at or after {last_end} (" in log


async def test_a_restart_that_changes_only_logging_ports_and_timeouts_carries_on(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    config_factory: ConfigFactory,
    workers: list[WorkerProcess],
    tmp_path: Path,
) -> None:
    """A rolling restart that changes nothing a number means still works: the worker
    joins the deployment and releases a later window with its exact count."""
    path, shared = await _prepare(kafka_bootstrap, topic_factory, config_factory, 5)
    await _first_run(kafka_bootstrap, path, tmp_path, range(2))
    tuned = _variant(
        path,
        "tuned",
        {
            "logging": {"level": "DEBUG"},
            "metrics": {"enabled": False, "port": 9999},
            "kafka": {"request_timeout_ms": 40_000, "client_id": "tuned"},
            "window": {"grace_s": 2, "idle_close_s": 3},
            "output": {"internal_retention_s": 7200},
        },
    )
    workers.append(start_worker(tuned, tmp_path / "tuned.log"))
    await wait_for_group(workers, shared)  # joined: not refused
    # A window well after what the first run released (idle sources advance with the
    # clock, a second per second): its events are counted, not late.
    later = T0 + 100 * SIZE_S
    users = [f"v{u}" for u in range(3)]
    events = [
        (
            u.encode(),
            orjson.dumps({"user_id": u, "timestamp": later + 1 + i, "domain": "a.example"}),
        )
        for i, u in enumerate(users)
    ]
    topics = topics_of(path)
    await produce_records(kafka_bootstrap, topics["input"], events)
    window = iso_utc(later)

    def visits_of_window(records: list[tuple[str | None, bytes]]) -> bool:
        return any(
            v["kind"] == "release" and v["query"] == "visits" and v["window_start"] == window
            for _, v in decode_values(records)
        )

    out = await read_topic(kafka_bootstrap, topics["output"], until=visits_of_window)
    assert workers[0].terminate() == 0, workers[0].log()
    (visits,) = [
        v
        for _, v in decode_values(out)
        if v["kind"] == "release" and v["query"] == "visits" and v["window_start"] == window
    ]
    assert visits["value"] == len(users)


async def test_a_deployment_from_before_fingerprints_is_held_to_its_window_size(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    config_factory: ConfigFactory,
    workers: list[WorkerProcess],
    tmp_path: Path,
) -> None:
    """A coverage record without a fingerprint (written by an earlier version) states only
    the window size: another size is refused; the same size is adopted and this
    configuration's fingerprint recorded, so the next different worker is refused."""
    path, shared = await _prepare(kafka_bootstrap, topic_factory, config_factory, 5)
    ledger_topic = topics_of(path)["ledger"]
    key, value = encode_coverage(T0, 2 * SIZE_S)  # as the earlier version wrote it
    await produce_records(kafka_bootstrap, ledger_topic, [(key.encode(), value)])
    workers.append(start_worker(path, tmp_path / "refused.log"))
    assert await _refused_or_joined(workers) == workers
    _assert_refused(workers[0], "window.size_s is 10", "20 s")

    matching = _variant(path, "matching", {"window": {"size_s": 2 * SIZE_S}})
    workers.append(start_worker(matching, tmp_path / "adopted.log"))
    await wait_for_group(workers[1:], shared)
    ledger = [v for _, v in decode_values(await read_topic(kafka_bootstrap, ledger_topic))]
    assert [v["kind"] for v in ledger if "fingerprint" in v] == ["fingerprint"]
    other_k = _variant(matching, "k4", {"bounds": {"max_contributions_per_window": 4}})
    workers.append(start_worker(other_k, tmp_path / "k4.log"))
    assert await _refused_or_joined(workers[1:]) == [workers[2]]
    _assert_refused(workers[2], "bounds.max_contributions_per_window")
    assert workers[1].terminate() == 0, workers[1].log()


async def test_a_worker_on_a_partials_topic_of_another_partition_count_is_refused(
    kafka_bootstrap: str,
    topic_factory: TopicFactory,
    config_factory: ConfigFactory,
    workers: list[WorkerProcess],
    tmp_path: Path,
) -> None:
    """A window's partials live on one partials partition: a worker that maps windows to
    partitions of another count would release them from a second owner. Refused, named."""
    path, shared = await _prepare(kafka_bootstrap, topic_factory, config_factory, 5)
    workers.append(start_worker(path, tmp_path / "first.log"))
    await wait_for_group(workers, shared)
    other = await topic_factory(partitions=3)
    moved = _variant(path, "moved", {"output": {"partials_topic": other}})
    workers.append(start_worker(moved, tmp_path / "moved.log"))
    assert await _refused_or_joined(workers) == [workers[1]]
    _assert_refused(workers[1], "topics.partials_partitions")
    assert workers[0].terminate() == 0, workers[0].log()
