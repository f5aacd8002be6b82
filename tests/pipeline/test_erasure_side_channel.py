"""/metrics says nothing of how active an erased person was (issue 25, break 7; issue 42:
nor where their events fell, in the queries' drop counters).

Before this change ``stream_dp_erased_events_dropped_total`` was an exact per-person oracle:
erasing someone absent added 0, someone with 17 events added 17, and it then counted that
person's later events one by one. Here two runs differ only in whom the erasure names — a
user who never sent anything, or one with 17 events in the open window who keeps sending
afterwards — and the whole exposition (every family, every sample) must be identical, on
every ingest path: stage 1 on keyed input record by record and as columns, and stage 0 →
stage 1 on unkeyed input one record per event and packed.

The exposition is read after every iteration of the worker's loop, with the worker's own
metric updates: the stages', stage 1 sealing and dropping the windows its watermark closed
(as the worker's stage output does), then the hold guards' check on the state the iteration
left (the held record age, the held-state gauge and the memory cap's decision,
:class:`HoldGuards` of a real :class:`Membership`), as the loop runs them; the watermarks
stage 1 reports to stage 2 (which set ``stream_dp_watermark_timestamp_seconds`` there) are
compared too. Before issue 37 the held-state gauge fell by
28 bytes per event of the erased user at the erasure (476 for 17 events), and the cap's
decision (``stream_dp_backpressure``, here with a cap between what the two runs would hold)
could follow it; this test never ran the guards, so it never saw either.

The victim keeps sending: in the open window, the next one, and at last alone in a window of
their own with the batch's latest time. Stage 0 repartitions their events like anyone's and
stage 1 counts them as arrived (held-state figure, time) while no sample takes them, so
which windows open, how far time moves and what the worker holds are the same.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import pytest

from stream_dp.config.model import Config
from stream_dp.ops.health import Health
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.faults import NO_FAULTS
from stream_dp.pipeline.kafka.context import WorkerContext
from stream_dp.pipeline.kafka.hold_guards import HoldGuards
from stream_dp.pipeline.kafka.membership import Membership
from stream_dp.pipeline.kafka.partition_take import Stages
from stream_dp.pipeline.stages import ingest_columns
from stream_dp.pipeline.stages.ingest import IngestSettings, IngestStage, InputRecord
from stream_dp.privacy.erasure import Erasure, ErasureSet, erasure_pseudonyms
from tests.pipeline.support import KEYRING, NOW, T0, config, rec

VICTIM = "victim"
#: Others' events, so that windows open and time moves whoever is erased.
OTHERS = [("bob", "a"), ("carol", "b"), ("dave", "a")]
QUERIES = [
    {"name": "visits", "group_by": ["domain"], "epsilon": 1e6, "keys": {"domain": ["a", "b"]}},
    # The victim's events are outside this query's key list or miss its group field (as
    # the others' do): the drop counters must count them whether the victim is erased or not.
    {"name": "countries", "group_by": ["country"], "epsilon": 1e6, "keys": {"country": ["DE"]}},
]


def _batch(first_offset: int, t0: float, victim_events: int) -> list[InputRecord]:
    """Others' events t0 … t0 + 3 s after T0, and the victim's strictly inside that span."""
    out = [rec(first_offset + i, u, t0 + i, d) for i, (u, d) in enumerate(OTHERS)]
    out += [
        rec(first_offset + len(out) + i, VICTIM, t0 + 0.5 + i / 100, "a", **_country(i))
        for i in range(victim_events)
    ]
    out.append(rec(first_offset + len(out), "erin", t0 + 3, "b"))
    return sorted(out, key=lambda r: r[0])


def _country(i: int) -> dict[str, str]:
    """Every other victim event names a country off the key list, the rest none."""
    return {"country": "XX"} if i % 2 == 0 else {}


#: One ingest path: (metrics, erasures) → a function taking one batch of input records and
#: returning the offsets stage 1 read (on the input topic, or the repartition topic), and
#: the stage-1 owner.
Feed = Callable[[list[InputRecord]], list[int]]
Path = Callable[[Metrics, ErasureSet], tuple[Feed, IngestStage]]
#: window.max_held_state_bytes: between what the two runs would hold in window T0 after the
#: second batch had the erasure freed the victim's rows and dropped their later events
#: (29 events, 21 of them the victim's, 28 bytes each: 812 against 224).
CAP_BYTES = 700


def _config(keyed_by_user: bool = False) -> Config:
    cfg = config(k=50, queries=QUERIES)
    window = cfg.window.model_copy(update={"max_held_state_bytes": CAP_BYTES})
    inp = cfg.input.model_copy(update={"keyed_by_user": keyed_by_user})
    return cfg.model_copy(update={"window": window, "input": inp})


def _stage(metrics: Metrics, erasures: ErasureSet) -> IngestStage:
    settings = IngestSettings(erasures=erasures)
    return IngestStage(
        _config(), KEYRING, metrics=metrics, sampling_rng=random.Random(0), settings=settings
    )


def _keyed(columns: bool) -> Path:
    def build(metrics: Metrics, erasures: ErasureSet) -> tuple[Feed, IngestStage]:
        stage = _stage(metrics, erasures)
        stage.assign([0], 0.0, routed=False)

        def feed(batch: list[InputRecord]) -> list[int]:
            with pytest.MonkeyPatch.context() as mp:
                if not columns:
                    mp.setattr(ingest_columns, "decode_columns", lambda *a: None)
                assert stage.ingest(0, batch, now_s=NOW, now_mono_s=0) == []
            return [o for o, _, _ in batch]

        return feed, stage

    return build


def _unkeyed(packed: bool) -> Path:
    def build(metrics: Metrics, erasures: ErasureSet) -> tuple[Feed, IngestStage]:
        router = _stage(metrics, erasures)
        router.assign_routed([0], 0.0)
        owner = _stage(metrics, erasures)  # one input and one repartition partition
        owner.assign([0], 0.0, routed=True)
        offset = [0]

        def feed(batch: list[InputRecord]) -> list[int]:
            route = router.route_packed if packed else router.route
            out, dead = route(0, batch, now_s=NOW, now_mono_s=0)
            assert dead == []
            # the events, then the router's progress marks (to every repartition partition)
            sent = [(k, v) for k, v, _ in out] + [(None, m) for m in router.progress_marks(0)]
            records = [(offset[0] + i, k, v) for i, (k, v) in enumerate(sent)]
            offset[0] += len(records)
            assert owner.ingest(0, records, now_s=NOW, now_mono_s=0, routed=True, topic="rp") == []
            return [o for o, _, _ in records]

        return feed, owner

    return build


PATHS = {
    "keyed_per_record": _keyed(columns=False),
    "keyed_columns": _keyed(columns=True),
    "unkeyed_per_event": _unkeyed(packed=False),
    "unkeyed_packed": _unkeyed(packed=True),
}


class _NoPartials:
    """Stage 2 of a worker that owns no partials partition (nothing of its own to commit)."""

    def safe_offsets(self) -> dict[int, int]:
        return {}


def _worker(path: str, metrics: Metrics, owner: IngestStage) -> tuple[Membership, HoldGuards]:
    """A real membership and the worker's real hold guards around the stage-1 owner."""
    cfg = _config(keyed_by_user=path.startswith("keyed"))
    health = Health(metrics=metrics)
    context = WorkerContext(cfg, metrics, health, asyncio.Event(), NO_FAULTS)
    membership = Membership(context)
    none: Any = None
    membership.stages = Stages(owner, _NoPartials(), none, none, none)  # type: ignore[arg-type]
    return membership, HoldGuards(context, membership)


def _expositions_after_erasing(path: str, erased_user: str) -> list[bytes]:
    """The whole exposition after each iteration of the worker's loop."""
    metrics = Metrics(process=False)
    erasures = ErasureSet()
    feed, owner = PATHS[path](metrics, erasures)
    worker, guards = _worker(path, metrics, owner)
    seen: list[bytes] = []

    def iteration(batch: list[InputRecord] | None) -> None:
        if batch is not None:
            offsets = feed(batch)  # fetched with their Kafka timestamps, then ingested
            guards.held_age.observe(worker.stage1_topic, 0, ((o, NOW - 60) for o in offsets))
        for p, ws in owner.due(0.0) + owner.reseal_due():  # stage 1's partials, published
            owner.seal(p, ws)
            owner.drop(p, ws)
        marks = owner.watermarks(0.0)
        guards.check(owner, NOW, 0.0)  # the guards, on the state the iteration left
        seen.append(metrics.exposition() + repr(marks).encode())

    iteration(_batch(0, 1, victim_events=17))  # the victim's 17 events, window T0 open
    erasure = Erasure(0, erasure_pseudonyms(erased_user, KEYRING, "nfkc_casefold_strip"), T0 + 3600)
    erasures.add(erasure)
    owner.apply_erasures([erasure], erasures.position)
    iteration(None)  # the iteration that applied the erasure
    # and the victim keeps sending, in the open window and the next one
    iteration(_batch(100, 5, victim_events=4))
    iteration(_batch(200, 12, victim_events=6))
    # alone in a window, with the batch's latest time
    iteration([rec(300, "bob", 21, "a"), rec(301, VICTIM, 35, "a")])
    return seen


@pytest.mark.parametrize("path", list(PATHS))
def test_erasing_an_absent_user_or_one_with_17_events_leaves_identical_metrics(
    path: str,
) -> None:
    absent = _expositions_after_erasing(path, "never-sent-anything")
    victim = _expositions_after_erasing(path, VICTIM)
    last = absent[-1]
    # the runs did take the input, and the guards did run: the gauge is set, the cap engaged
    assert b"stream_dp_events_consumed_total 41.0" in last
    # time moved to the victim's last event: [0, 10), [10, 20), [20, 30) sealed, [30, 40) open
    assert b"stream_dp_partials_published_total 6.0" in last  # 3 windows x 2 queries
    assert b"stream_dp_windows_open 1.0" in last
    assert b"stream_dp_held_state_bytes 28.0" in last  # window boundaries freed the rest
    # after the victim's 17 + 4 events and 8 others', all in window T0: the cap engaged
    assert b"stream_dp_held_state_bytes 812.0" in absent[2]
    assert b"stream_dp_backpressure 1.0" in absent[2]
    # the victim's events off the key list or without a country (and the others') were
    # counted by the query that drops them, identically in both runs (compared above)
    dropped = "stream_dp_query_events_dropped_total"
    assert f'{dropped}{{query="countries",reason="outside_key_list"}} 14.0'.encode() in last
    # 12 others' and 13 of the victim's before, and both events of the last batch
    assert f'{dropped}{{query="countries",reason="missing_group_field"}} 27.0'.encode() in last
    for step, (a, v) in enumerate(zip(absent, victim, strict=True)):
        assert v == a, f"after step {step}: " + _diff(a, v)


def _diff(absent: bytes, victim: bytes) -> str:
    """The samples that differ, to say which series tell (the assertion compares it all)."""
    a, v = set(absent.decode().splitlines()), set(victim.decode().splitlines())
    return f"absent-only {sorted(a - v)}, victim-only {sorted(v - a)}"
