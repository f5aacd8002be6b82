"""Every event stage 1 reads is accounted for on /metrics (issue 42).

A stream with each kind of vanishing event — a bad record, an event stamped ahead of the
clock, a late event, values outside a query's public key list (in another letter case and
unknown), events missing a query's group field — on every ingest path (keyed input record
by record and as columns, unkeyed input through stage 0 one record per event and packed).
For every query, exactly:

    events consumed = bad records + late + replayed + dropped{query, reason} + taken{query}

where ``taken`` is what the query takes into its users' samples (known from the stream
here; on /metrics it is the remainder). On main before this change the key-list and
group-field drops had no counter at all, and an event without the group field was taken
under a null key.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.stages import ingest_columns
from stream_dp.pipeline.stages.ingest import IngestStage, InputRecord
from stream_dp.pipeline.stages.late_events import LateEventsNotice
from stream_dp.pipeline.stages.queries import CompiledQuery
from tests.pipeline.support import KEYRING, NOW, T0, config

QUERIES: list[dict[str, Any]] = [
    {"name": "visits", "group_by": ["domain"], "epsilon": 1e6, "delta": 1e-6},
    {
        "name": "countries",
        "group_by": ["country"],
        "keys": {"country": ["DE", "FR"]},
        "epsilon": 1e6,
    },
]


def _event(user: str, t: float, **fields: Any) -> bytes:
    return orjson.dumps({"user_id": user, "timestamp": T0 + t, **fields})


def _good_form() -> list[bytes]:
    """Events every path takes as columns: 4 taken by both queries, 3 in another case and 2
    unknown for the key list, 2 without a domain, 1 without a country."""
    out = [_event(f"u{i}", 1 + i / 10, domain="a.example", country="DE") for i in range(4)]
    out += [_event(f"v{i}", 2 + i / 10, domain="b.example", country="de") for i in range(3)]
    out += [_event(f"w{i}", 3 + i / 10, domain="a.example", country="XX") for i in range(2)]
    out += [_event(f"x{i}", 4 + i / 10, country="FR") for i in range(2)]
    out.append(_event("y", 5, domain="c.example"))
    return out


def _others() -> list[bytes | None]:
    """A batch the per-record path takes: a record that is not JSON, one stamped ahead of the
    clock, one before the first covered window (late), one good event."""
    return [
        b"{not json",
        _event("z", NOW - T0 + 10 * 24 * 3600, domain="a.example", country="DE"),
        _event("z", -30, domain="a.example", country="DE"),
        _event("z", 6, domain="a.example", country="FR"),
    ]


#: Per query, the exact accounting of the stream above.
EXPECTED_DROPPED = {
    ("visits", "missing_group_field"): 2,
    ("countries", "outside_key_list"): 5,
    ("countries", "missing_group_field"): 1,
}
EXPECTED_TAKEN = {"visits": 4 + 3 + 2 + 1 + 1, "countries": 4 + 2 + 1}
CONSUMED = 12 + 4


class _CoveredFromT0:
    """Stage 2 as stage 1 sees it: nothing released, windows covered from T0 on."""

    coverage_start_s: int | None = T0
    first_unreleased_s: int | None = T0
    last_release_wall_s: float | None = None

    def released(self, window_start_s: int) -> bool:
        return False

    def released_earlier(self, window_start_s: int) -> bool:
        return False

    def bounds_for(self, window_start_s: int) -> None:
        return None


def _stage(metrics: Metrics) -> IngestStage:
    return IngestStage(
        config(k=50, queries=QUERIES),
        KEYRING,
        released=_CoveredFromT0(),
        metrics=metrics,
        sampling_rng=random.Random(0),
    )


def _records(values: list[bytes | None], first: int) -> list[InputRecord]:
    return [(first + i, None, v) for i, v in enumerate(values)]


Feed = Callable[[Metrics], None]


def _keyed(columns: bool) -> Feed:
    def feed(metrics: Metrics) -> None:
        stage = _stage(metrics)
        stage.assign([0], 0.0, routed=False)
        with pytest.MonkeyPatch.context() as mp:
            if not columns:
                mp.setattr(ingest_columns, "decode_columns", lambda *a: None)
            assert stage.ingest(0, _records(_good_form(), 0), now_s=NOW, now_mono_s=0) == []
            dead = stage.ingest(0, _records(_others(), 100), now_s=NOW, now_mono_s=0)
        assert sorted(d.reason for d in dead) == ["not_json", "timestamp_out_of_range"]

    return feed


def _unkeyed(packed: bool) -> Feed:
    def feed(metrics: Metrics) -> None:
        router = _stage(metrics)
        router.assign_routed([0], 0.0)
        owner = _stage(metrics)  # one input and one repartition partition (the defaults)
        owner.assign([0], 0.0, routed=True)
        route = router.route_packed if packed else router.route
        offset = 0
        dead = []
        for batch in (_records(_good_form(), 0), _records(_others(), 100)):
            out, letters = route(0, batch, now_s=NOW, now_mono_s=0)
            dead += letters
            records = [(offset + i, k, v) for i, (k, v, _) in enumerate(out)]
            offset += len(records)
            assert owner.ingest(0, records, now_s=NOW, now_mono_s=0, routed=True, topic="rp") == []
        assert sorted(d.reason for d in dead) == ["not_json", "timestamp_out_of_range"]

    return feed


PATHS = {
    "keyed_per_record": _keyed(columns=False),
    "keyed_columns": _keyed(columns=True),
    "unkeyed_per_event": _unkeyed(packed=False),
    "unkeyed_packed": _unkeyed(packed=True),
}


def _samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.mark.parametrize("path", list(PATHS))
def test_every_event_read_is_accounted_for_per_query(path: str) -> None:
    metrics = Metrics(process=False, queries=[q["name"] for q in QUERIES])
    PATHS[path](metrics)
    samples = _samples(metrics)
    consumed = samples[("stream_dp_events_consumed_total", ())]
    bad = sum(v for (n, _), v in samples.items() if n == "stream_dp_bad_records_total")
    late = samples[("stream_dp_late_events_total", ())]
    replayed = samples[("stream_dp_replayed_events_skipped_total", ())]
    dropped = {
        (dict(labels)["query"], dict(labels)["reason"]): v
        for (n, labels), v in samples.items()
        if n == "stream_dp_query_events_dropped_total"
    }
    assert (consumed, bad, late, replayed) == (CONSUMED, 2, 1, 0)
    assert {k: v for k, v in dropped.items() if v} == EXPECTED_DROPPED
    for query in EXPECTED_TAKEN:
        dropped_q = sum(v for (q, _), v in dropped.items() if q == query)
        assert consumed == bad + late + replayed + dropped_q + EXPECTED_TAKEN[query]


@pytest.mark.parametrize("setting", ["drop", "null_key"])
def test_a_missing_group_field_is_dropped_by_default_or_kept_under_a_null_key(
    setting: str,
) -> None:
    visits: dict[str, Any] = {"name": "visits", "group_by": ["domain"], "epsilon": 1e6}
    visits["delta"] = 1e-6
    if setting != "drop":  # drop is the default
        visits["missing_group"] = setting
    query = config(queries=[visits]).queries[0]
    compiled = CompiledQuery(query, config().bounds, ["domain"])
    compiled.bind([("a.example",), (None,), ("b.example",)])
    key_of, _, keys = compiled.project_columns(np.array([0, 1, 2, 1]))
    taken = [keys[k] for k in key_of.tolist() if k >= 0]
    if setting == "drop":
        assert taken == [("a.example",), ("b.example",)]
        assert compiled.dropped_counts(np.array([0, 1, 2, 1])) == [0, 2, 0, 0]
    else:
        assert taken == [("a.example",), (None,), ("b.example",), (None,)]
        assert compiled.dropped_counts(np.array([0, 1, 2, 1])) == [0, 0, 0, 0]


def test_each_query_s_dropped_events_are_warned_about_once_per_interval_with_the_fix(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = Metrics(process=False, queries=[q["name"] for q in QUERIES])
    PATHS["keyed_columns"](metrics)
    queries = config(k=50, queries=QUERIES).queries
    notice = LateEventsNotice(metrics, None, queries, interval_s=300)
    check = "`stream-dp check` compares a sample of the topic with the configuration"
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="stream_dp.pipeline.stages.late_events"):
        notice.observe(coverage_start_s=T0, now_mono_s=1000.0)
        notice.observe(coverage_start_s=T0, now_mono_s=1001.0)  # within the interval
    assert [r.getMessage() for r in caplog.records] == [
        "query visits dropped 2 events without a value for 'domain' (missing or null; "
        "missing_group: drop): set group_by to the fields the events hold, or "
        f"missing_group: null_key to count them under a null key; {check}",
        "query countries dropped 5 events whose 'country' value is not on its public key "
        "list (keys): list the values as the events spell them (letter case included) or "
        f"use keys: private; {check}",
        "query countries dropped 1 events without a value for 'country' (missing or null; "
        "missing_group: drop): set group_by to the fields the events hold, or "
        f"missing_group: null_key to count them under a null key; {check}",
        "1 events dropped as late: their windows are before the first covered window "
        "2020-08-01T00:00:00Z (from the first start, window.start_at unset) or already "
        "closed; to count older events, set window.start_at to the first window you want "
        "released (e.g. window.start_at: 2020-08-01T00:00:00Z) before the first run of a new "
        "kafka.group_id — every window from it to now is released and charged — or run "
        "`stream-dp replay` on a file of them; events that arrive after their window closed "
        "need a larger window.grace_s",
    ]
