"""/metrics says nothing of how active an erased person was (issue 25, break 7; issue 42:
nor where their events fell, in the queries' drop counters).

Before this change ``stream_dp_erased_events_dropped_total`` was an exact per-person oracle:
erasing someone absent added 0, someone with 17 events added 17, and it then counted that
person's later events one by one. Here two runs differ only in whom the erasure names — a
user who never sent anything, or one with 17 events in the open window who keeps sending
afterwards — and the whole exposition (every family, every sample) must be identical, on
every ingest path: stage 1 on keyed input record by record and as columns, and stage 0 →
stage 1 on unkeyed input one record per event and packed — also with the erasure applied
between the two stages (stage 1 drops events stage 0 routed before it read the erasure).

The victim's later events share their windows with other users' and never carry a batch's
latest time: which windows open and how far time moves are the other users' doing (an
erased user's event that alone opens a window on the unkeyed path is a documented limit).
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.stages import ingest_columns
from stream_dp.pipeline.stages.ingest import IngestStage, InputRecord
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


#: One ingest path: (metrics, erasures) → a function taking one batch of input records.
Path = Callable[[Metrics, ErasureSet], tuple[Callable[[list[InputRecord]], None], IngestStage]]


def _stage(metrics: Metrics, erasures: ErasureSet) -> IngestStage:
    stage = IngestStage(
        config(k=50, queries=QUERIES), KEYRING, metrics=metrics, sampling_rng=random.Random(0)
    )
    stage.erasures = erasures
    return stage


def _keyed(columns: bool) -> Path:
    def build(
        metrics: Metrics, erasures: ErasureSet
    ) -> tuple[Callable[[list[InputRecord]], None], IngestStage]:
        stage = _stage(metrics, erasures)
        stage.assign([0], 0.0, routed=False)

        def feed(batch: list[InputRecord]) -> None:
            with pytest.MonkeyPatch.context() as mp:
                if not columns:
                    mp.setattr(ingest_columns, "decode_columns", lambda *a: None)
                assert stage.ingest(0, batch, now_s=NOW, now_mono_s=0) == []

        return feed, stage

    return build


def _unkeyed(packed: bool, *, stage_0_erases: bool = True) -> Path:
    """``stage_0_erases=False``: the erasure reaches stage 1 only (applied between the
    stages: stage 0 routed the user's events before it read the erasure), so stage 1 drops
    the routed events itself."""

    def build(
        metrics: Metrics, erasures: ErasureSet
    ) -> tuple[Callable[[list[InputRecord]], None], IngestStage]:
        router = _stage(metrics, erasures if stage_0_erases else ErasureSet())
        router.assign_routed([0], 0.0)
        router.routed_partitions = 1
        owner = _stage(metrics, erasures)
        owner.input_partitions = 1
        owner.source_partitions = 1
        owner.assign([0], 0.0, routed=True)
        offset = [0]

        def feed(batch: list[InputRecord]) -> None:
            route = router.route_packed if packed else router.route
            out, dead = route(0, batch, now_s=NOW, now_mono_s=0)
            assert dead == []
            records = [(offset[0] + i, k, v) for i, (k, v, _) in enumerate(out)]
            offset[0] += len(records)
            assert owner.ingest(0, records, now_s=NOW, now_mono_s=0, routed=True, topic="rp") == []

        return feed, owner

    return build


PATHS = {
    "keyed_per_record": _keyed(columns=False),
    "keyed_columns": _keyed(columns=True),
    "unkeyed_per_event": _unkeyed(packed=False),
    "unkeyed_packed": _unkeyed(packed=True),
    "unkeyed_per_event_erased_between_stages": _unkeyed(packed=False, stage_0_erases=False),
    "unkeyed_packed_erased_between_stages": _unkeyed(packed=True, stage_0_erases=False),
}


def _exposition_after_erasing(path: Path, erased_user: str) -> bytes:
    metrics = Metrics(process=False)
    erasures = ErasureSet()
    feed, owner = path(metrics, erasures)
    feed(_batch(0, 1, victim_events=17))  # the victim's 17 events, window T0 open
    erasure = Erasure(0, erasure_pseudonyms(erased_user, KEYRING, "nfkc_casefold_strip"), T0 + 3600)
    erasures.add(erasure)
    owner.apply_erasures([erasure], erasures.position)
    # and the victim keeps sending, in the open window and the next one
    feed(_batch(100, 5, victim_events=4))
    feed(_batch(200, 12, victim_events=6))
    return metrics.exposition()


@pytest.mark.parametrize("path", list(PATHS))
def test_erasing_an_absent_user_or_one_with_17_events_leaves_identical_metrics(
    path: str,
) -> None:
    absent = _exposition_after_erasing(PATHS[path], "never-sent-anything")
    victim = _exposition_after_erasing(PATHS[path], VICTIM)
    assert b"stream_dp_events_consumed_total 39.0" in absent  # the runs did take the input
    # and the victim's 14 events off the key list and 13 without a country (and the others'
    # 12) were counted by the query that drops them
    dropped = "stream_dp_query_events_dropped_total"
    assert f'{dropped}{{query="countries",reason="outside_key_list"}} 14.0'.encode() in absent
    assert f'{dropped}{{query="countries",reason="missing_group_field"}} 25.0'.encode() in absent
    assert victim == absent
