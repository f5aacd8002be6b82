"""The column path of stage 1 (a whole batch of good events at once) gives what the
per-record path gives: the same totals, lateness, metrics and watermarks; any batch it
cannot take is left, untouched, to the per-record path."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_dp.config.model import Config
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.formats.decode import Decoder
from stream_dp.pipeline.stages import columns, ingest_columns
from stream_dp.pipeline.stages.ingest import IngestSettings, IngestStage, InputRecord, user_key
from stream_dp.pipeline.stages.placement import murmur2_partition
from stream_dp.privacy.erasure import Erasure, ErasureSet, erasure_pseudonyms
from stream_dp.privacy.release import KeyAggregate
from tests.pipeline.support import KEYRING, NOW, T0, config

QUERIES: list[dict[str, Any]] = [
    {"name": "visits", "group_by": ["domain"], "epsilon": 1e6, "delta": 1e-6},
    {"name": "pairs", "group_by": ["domain", "premium"], "epsilon": 1e6, "delta": 1e-6},
    {"name": "all", "epsilon": 1e6, "keys": {}},
    # A key list (values off it, in another case, and missing ones are dropped and counted).
    {"name": "listed", "group_by": ["domain"], "epsilon": 1e6, "keys": {"domain": ["a", 1]}},
]


def _config(**kw: Any) -> Config:
    return config(queries=QUERIES, epsilon_per_window=4e6, delta_per_window=2e-6, **kw)


def _stage(cfg: Config, partitions: int = 1, erasures: ErasureSet | None = None) -> IngestStage:
    settings = IngestSettings(source_partitions=partitions, erasures=erasures)
    stage = IngestStage(
        cfg, KEYRING, metrics=Metrics(), sampling_rng=random.Random(0), settings=settings
    )
    stage.assign(range(partitions), 0.0, routed=False)
    return stage


def _outcome(stage: IngestStage) -> dict[str, Any]:
    """Everything observable: open windows' totals, metrics, offsets, watermarks."""
    totals = {}
    for p, ws in stage.all_open():
        for partial in stage.seal(p, ws):
            totals[(p, ws, partial.query)] = (
                dict(partial.totals),
                partial.events_seen,
                partial.events_retained,
            )
    m = stage.metrics
    return {
        "totals": totals,
        "consumed": m.events_consumed._value.get(),
        "late": m.late_events._value.get(),
        "skipped": m.replayed_events_skipped._value.get(),
        # per query and reason, the events it does not take (issue 42)
        "dropped": {
            (s.labels["query"], s.labels["reason"]): s.value
            for family in m.query_events_dropped.collect()
            for s in family.samples
            if s.name.endswith("_total")
        },
        "offsets": stage.safe_offsets(),
        "marks": stage.watermarks(1.0),
    }


def _run(cfg: Config, batches: Sequence[Sequence[InputRecord]], *, columns_on: bool) -> Any:
    stage = _stage(cfg)
    with pytest.MonkeyPatch.context() as mp:
        if not columns_on:
            mp.setattr(ingest_columns, "decode_columns", lambda *a: None)
        dead = [stage.ingest(0, b, now_s=NOW, now_mono_s=0.5) for b in batches]
        # Seal what is due by now, as the worker would between batches.
        for p, ws in stage.due(1.0):
            stage.seal(p, ws)
            stage.drop(p, ws)
        late = [
            stage.ingest(0, [(10_000, None, _event("late", 0.5, "a"))], now_s=NOW, now_mono_s=1)
        ]
    return _outcome(stage), [[(d.reason, d.offset) for d in x] for x in dead + late]


def _event(user: str | int, t: float, domain: Any, **extra: Any) -> bytes:
    return orjson.dumps({"user_id": user, "timestamp": T0 + t, "domain": domain, **extra})


_values = st.one_of(
    st.sampled_from(["a", "b", "c"]),
    st.integers(-2, 2),
    st.booleans(),
    st.sampled_from([1.0, 2.5, -0.0]),
    st.none(),
)
_events = st.lists(
    st.tuples(
        st.sampled_from(["u1", "U1 ", "u2", "ü3", 7, 8]),
        st.floats(0, 35, allow_nan=False),
        _values,
        st.one_of(st.booleans(), st.none(), st.just(1)),
        st.sampled_from(["s", "ms", "iso"]),
    ),
    min_size=1,
    max_size=60,
)


def _records(events: list[Any], first: int = 0) -> list[InputRecord]:
    out = []
    for i, (user, t, domain, premium, unit) in enumerate(events):
        stamp: Any = T0 + t
        if unit == "ms":
            stamp = int((T0 + t) * 1000)
        elif unit == "iso":
            stamp = f"2020-08-01T00:00:{t:09.6f}+00:00"
        value = orjson.dumps(
            {"user_id": user, "timestamp": stamp, "domain": domain, "premium": premium}
        )
        out.append((first + i, None, value))
    return out


@settings(max_examples=60, deadline=None)
@given(_events, _events, st.integers(1, 4))
def test_column_and_per_record_paths_agree(first: list[Any], second: list[Any], k: int) -> None:
    cfg = _config(k=40)  # k above any user's events: no sampling in play
    batches = [_records(first), _records(second, first=len(first))]
    assert _run(cfg, batches, columns_on=True) == _run(cfg, batches, columns_on=False)
    # With a small k the kept events differ (random), their number does not.
    small = _config(k=k)
    on, _ = _run(small, batches, columns_on=True)
    off, _ = _run(small, batches, columns_on=False)
    retained = {key: v[1:] for key, v in on["totals"].items()}
    assert retained == {key: v[1:] for key, v in off["totals"].items()}
    assert {key: v[0].get(()) for key, v in on["totals"].items() if key[2] == "all"} == {
        key: v[0].get(()) for key, v in off["totals"].items() if key[2] == "all"
    }


def test_queries_that_read_no_field_take_the_column_path_as_record_by_record() -> None:
    """A deployment whose only query counts events (no group_by, no value field): every
    event's signature is the empty tuple. The column path once failed on such a batch (it
    numbered no signature for it)."""
    cfg = config(queries=[{"name": "all", "epsilon": 1e6, "keys": {}}], k=40)
    events = [("u1", 1.0, "a", None, "s"), ("u2", 2.0, "b", True, "ms"), ("u1", 3.0, 1, 1, "s")]
    batches = [_records(events), _records(events[:1], first=3)]
    on = _run(cfg, batches, columns_on=True)
    assert on == _run(cfg, batches, columns_on=False)
    # The four events and the run's probe event ("late", in the same open window).
    assert [(v[0][()].events, v[0][()].users) for v in on[0]["totals"].values()] == [(5, 3)]


def test_a_batch_with_one_bad_record_takes_the_per_record_path() -> None:
    decoder = Decoder(
        user_field="user_id", time_field="timestamp", max_record_bytes=1000, max_future_s=300
    )
    good = [_event("u", 1, "a"), _event(7, 2, "b")]
    assert columns.decode_columns(decoder, [], good, NOW) is not None
    for bad in (
        None,
        b"not json",
        b"[1]",
        orjson.dumps({"timestamp": T0}),
        orjson.dumps({"user_id": "", "timestamp": T0}),
        orjson.dumps({"user_id": True, "timestamp": T0}),
        orjson.dumps({"user_id": "u", "timestamp": "yesterday"}),
        orjson.dumps({"user_id": "u", "timestamp": "2020-08-01T00:00:01"}),  # no offset
        orjson.dumps({"user_id": "u", "timestamp": T0 + 10**6}),  # far future
        orjson.dumps({"user_id": "u", "timestamp": 100}),  # before 1990
        orjson.dumps({"user_id": "u", "timestamp": T0, "pad": "x" * 2000}),  # too large
    ):
        assert columns.decode_columns(decoder, [], [*good, bad], NOW) is None, bad
    typed = Decoder(
        user_field="user_id",
        time_field="timestamp",
        max_record_bytes=1000,
        max_future_s=300,
        scalar_fields=["domain"],
        numeric_fields=["bytes"],
    )
    for bad in (
        _event("u", 1, ["list"]),
        _event("u", 1, "a", bytes="12"),
        _event("u", 1, "a", bytes=True),
    ):
        assert columns.decode_columns(typed, ["domain", "bytes"], [*good, bad], NOW) is None


class _Fetched:
    """A fetched record as the worker's consumer hands it out (offset, key, value)."""

    __slots__ = ("key", "offset", "value")

    def __init__(self, offset: int, key: bytes | None, value: bytes | None) -> None:
        self.offset, self.key, self.value = offset, key, value


def test_fetched_records_with_offset_gaps_give_what_the_per_record_path_gives() -> None:
    """The worker's batches (:class:`FetchedRecords`), keyed, with gaps in their offsets
    (compacted topics, transaction markers): each window's first offset — what the commit
    waits for — comes from its own first record, as record by record."""
    cfg = _config(k=40, keyed_by_user=True)
    times = [1.0, 2.0, 12.0, 22.0, 31.0, 33.0, 3.0, 34.0]
    offsets = [100, 101, 103, 107, 110, 111, 115, 120]
    users = ["u1", "u2", "u1", "U3", "u2", "u1", "u4", "u4"]
    records = [
        _Fetched(o, user_key(u, "nfkc_casefold_strip"), _event(u, t, "a"))
        for o, u, t in zip(offsets, users, times, strict=True)
    ]
    batches = [ingest_columns.FetchedRecords(part) for part in (records[:6], records[6:])]
    on = _run(cfg, batches, columns_on=True)
    assert on == _run(cfg, batches, columns_on=False)
    assert on[0]["offsets"] == {0: 110}  # window 30's first record; 0-20 are sealed
    # Both batches taken whole; the run's unkeyed probe record is dead-lettered.
    assert on[1] == [[], [], [("not_keyed_by_user", 10_000)]]


def test_keyed_batches_with_a_wrong_key_or_partition_are_dead_lettered_as_before() -> None:
    cfg = _config(k=40, keyed_by_user=True)
    stage = _stage(cfg, partitions=4)
    users = [f"user-{i}" for i in range(20)]
    home = {u: murmur2_partition(user_key(u), 4) for u in users}
    mine = [u for u in users if home[u] == 0]
    others = [u for u in users if home[u] != 0]
    good = [(i, user_key(u), _event(u, 1, "a")) for i, u in enumerate(mine)]
    assert stage.ingest(0, good, now_s=NOW, now_mono_s=0) == []  # the column path
    wrong_key = [*good, (50, b"someone-else", _event(mine[0], 1, "a"))]
    misplaced = [*good, (51, user_key(others[0]), _event(others[0], 1, "a"))]
    assert [d.reason for d in stage.ingest(0, wrong_key, now_s=NOW, now_mono_s=0)] == [
        "not_keyed_by_user"
    ]
    assert [d.reason for d in stage.ingest(0, misplaced, now_s=NOW, now_mono_s=0)] == [
        "misplaced_key"
    ]
    # A differently spelled id must be keyed by its normalised form.
    spelled = [(60, b"user-0", _event(" USER-0", 1, "a"))]
    if home["user-0"] == 0:
        assert stage.ingest(0, spelled, now_s=NOW, now_mono_s=0) == []


def test_erased_users_are_dropped_by_the_column_path_as_record_by_record() -> None:
    """Erasure (docs/erasure.md) on the column path: an erased user's events never enter a
    sample, are no activity, and leave no count of their own — as on the per-record path; an
    erasure applied later removes the user from the samples, seen events included."""
    erasures = ErasureSet()
    erasures.add(Erasure(0, erasure_pseudonyms("alice", KEYRING, "nfkc_casefold_strip"), T0 + 3600))
    events = [("Alice ", 1.0, "a", None, "s"), ("bob", 2.0, "b", None, "s")] * 3
    events += [("alice", 5.0, "a", None, "ms"), ("carol", 12.0, "a", True, "s")]
    outcomes = []
    for columns_on in (True, False):
        stage = _stage(_config(k=40), erasures=erasures)
        with pytest.MonkeyPatch.context() as mp:
            if not columns_on:
                mp.setattr(ingest_columns, "decode_columns", lambda *a: None)
            assert stage.ingest(0, _records(events), now_s=NOW, now_mono_s=0.5) == []
        outcomes.append(_outcome(stage))
    assert outcomes[0] == outcomes[1]
    (all_t0,) = [v for (p, ws, q), v in outcomes[0]["totals"].items() if q == "all" and ws == T0]
    assert all_t0[0] == {(): KeyAggregate(3, 1, 0)}  # bob's three: alice is gone
    assert all_t0[1] == 3  # her events were never even seen by the samples


def test_a_later_erasure_removes_events_compaction_had_already_left_out() -> None:
    stage = _stage(_config(k=2))
    heavy = [("dave", i / 1000, "a", None, "s") for i in range(5000)]
    stage.ingest(0, _records(heavy), now_s=NOW, now_mono_s=0.5)
    (part,) = stage.store.parts[0].values()
    part.samples._compact()  # as a large window is compacted while it runs
    assert part.samples.events_retained == 2
    removed = part.samples.remove(KEYRING.current.pseudonym("dave"))
    assert removed == 5000  # every event seen, not just the two kept
    assert part.samples.events_seen == 0 and part.samples.events_retained == 0


@given(
    st.lists(st.sampled_from(["a", "b", 1, None, True, 2.5, ("t",)]), max_size=40),
    st.integers(1, 3),
)
def test_distinct_index_and_signature_ids_against_a_plain_loop(
    values: list[Any], n_fields: int
) -> None:
    distinct, index = columns.distinct_index(values)
    expected: dict[Any, int] = {}
    for v in values:
        expected.setdefault(v, len(expected))
    assert distinct == list(expected)
    assert index.tolist() == [expected[v] for v in values]
    # Signatures: some known before the batch, new ones numbered in first-seen order.
    cols = [values[i:] + values[:i] for i in range(n_fields)]
    known: dict[tuple[Any, ...], int] = {("b",) * n_fields: 0, ("zz",) * n_fields: 1}
    table = list(known)
    ids = columns.intern_signatures(cols, known, table, n_events=len(values))
    reference = {("b",) * n_fields: 0, ("zz",) * n_fields: 1}
    for sig in zip(*cols, strict=True):
        reference.setdefault(sig, len(reference))
    assert ids.tolist() == [reference[sig] for sig in zip(*cols, strict=True)]
    assert known == reference
    assert table == list(reference)
