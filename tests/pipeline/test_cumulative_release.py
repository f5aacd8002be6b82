"""Cumulative queries through stage 2 without Kafka: running totals per public key, their
record fields and accounting, restart from persisted state, several owners sharing one
horizon (waiting for the previous window, racing for one), and the ways a chain restarts.

Two harnesses: :class:`LocalPipeline` (what replay runs), and :class:`Node` — one worker's
stage 2 — with the ledger and continual topics as shared in-memory logs, so that two workers
can interleave exactly as the worker's protocol allows (a catch-up reads to the log's end,
which is what reading to a fresh fence does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pytest

from stream_dp.config.model import Config
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.formats.continual_state import ContinualStore, encode_state
from stream_dp.pipeline.formats.ledger import (
    LedgerIndex,
    LedgerRelease,
    encode_progress,
    encode_published,
    encode_release,
)
from stream_dp.pipeline.formats.partials import (
    Partial,
    SourceWatermark,
    encode_partial,
    encode_watermark,
)
from stream_dp.pipeline.local.local import LocalPipeline
from stream_dp.pipeline.stages.cumulative import Preparation
from stream_dp.pipeline.stages.ingest import InputRecord
from stream_dp.pipeline.stages.release_stage import ReleaseStage
from stream_dp.privacy.continual.counter import NoiseSource, opendp_noise, restore_counter
from stream_dp.privacy.mechanisms import NoiseMechanism
from stream_dp.privacy.release import KeyAggregate
from stream_dp.windows.tumbling import iso_utc
from tests.helpers import schema_validator
from tests.pipeline.support import KEYRING, NOW, T0, config, rec

MB = 1_000_000
S = 10  # window size of the support config
DOMAINS = ["a", "b", "c"]
LATER = NOW + 1_000  # wall clock for releases (after every window used here)


def cumulative(
    *,
    epsilon: float = 1e6,
    horizon_windows: int = 4,
    option: str = "tree_honaker",
    mechanism: str = "discrete_laplace",
    origin: str | None = None,
    name: str = "running",
    statistic: str = "count",
) -> dict[str, Any]:
    query: dict[str, Any] = {
        "name": name,
        "statistic": statistic,
        "group_by": ["domain"],
        "keys": {"domain": DOMAINS},
        "epsilon": epsilon,
        "release": "cumulative",
        "horizon_windows": horizon_windows,
        "continual_mechanism": option,
        "mechanism": mechanism,
    }
    if mechanism == "discrete_gaussian":
        query["delta"] = 1e-7
    if origin is not None:
        query["horizon_origin"] = origin
    if statistic == "sum":
        query.update(value_field="bytes", lower=0, upper=100, granularity=1)
    return query


class CountingNoise:
    """The production noise source, counting how many values it perturbs per call."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, mechanism: NoiseMechanism, values: np.ndarray) -> np.ndarray:
        self.calls.append(len(values))
        return opendp_noise(mechanism, values)


def events(counts: Sequence[Mapping[str, int]]) -> list[InputRecord]:
    """counts[w][domain] events in window w, each by its own user (k = 3 keeps them all)."""
    out: list[InputRecord] = []
    for w, per_domain in enumerate(counts):
        for domain, n in per_domain.items():
            for i in range(n):
                out.append(rec(len(out), f"{domain}-{w}-{i}", w * S + 1 + i * 0.01, domain))
    return out


COUNTS: list[dict[str, int]] = [
    {"a": 3, "b": 1},
    {"a": 2, "c": 5},
    {},
    {"b": 4},
    {"a": 1, "b": 1, "c": 1},
    {"c": 2},
    {"a": 7},
]


def run_local(
    cfg: Config,
    records: list[InputRecord],
    *,
    ledger: LedgerIndex | None = None,
    store: ContinualStore | None = None,
    noise: NoiseSource | None = None,
    log: list[tuple[str, str, bytes]] | None = None,
    partials_partitions: int = 1,
) -> list[LedgerRelease]:
    """Replay's pipeline over the records; ``log`` gets every ledger and continual record."""
    sink = log if log is not None else []
    pipe = LocalPipeline(
        cfg,
        KEYRING,
        partials_partitions=partials_partitions,
        ledger=ledger,
        ledger_sink=lambda k, v: sink.append(("ledger", k, v)),
        continual_store=store,
        continual_sink=lambda k, v: sink.append(("continual", k, v)),
        continual_noise=noise,
        retain_ledger=True,
    )
    out = pipe.ingest(0, records, now_s=LATER, now_mono_s=0.0)
    assert not out, out
    released = pipe.step(0.0, now_s=LATER)
    released += pipe.finish(now_s=LATER)
    return released


def running(releases: Sequence[LedgerRelease], query: str = "running") -> dict[int, list[Any]]:
    """window index → the released values of the query's keys, in key order."""
    out: dict[int, list[Any]] = {}
    for rel in releases:
        if rel.query == query:
            values = [r.value["value"] for r in rel.records if r.value["kind"] == "release"]
            out[(rel.window_start_s - T0) // S] = values
    return out


def exact_running(counts: Sequence[Mapping[str, int]], starts: set[int]) -> dict[int, list[int]]:
    """The exact running totals per window, restarting at each window in ``starts``."""
    out: dict[int, list[int]] = {}
    total = dict.fromkeys(DOMAINS, 0)
    for w, per_domain in enumerate(counts):
        if w in starts:
            total = dict.fromkeys(DOMAINS, 0)
        for d, n in per_domain.items():
            total[d] += n
        out[w] = [total[d] for d in DOMAINS]
    return out


# -- one process: replay's pipeline --------------------------------------------------------
def test_running_totals_are_exact_without_noise_and_restart_with_each_horizon() -> None:
    # T = 4 windows per horizon; horizons start at multiples of 4 windows after the origin,
    # 2 windows before T0: the deployment's first horizon (covered from T0) has 2 windows.
    origin = iso_utc(T0 - 2 * S)
    cfg = config(queries=[cumulative(origin=origin)])
    releases = run_local(cfg, events(COUNTS))
    assert running(releases) == exact_running(COUNTS, starts={0, 2, 6})
    validator = schema_validator("output.schema.json")
    by_window = {(r.window_start_s - T0) // S: r for r in releases}
    for w, rel in by_window.items():
        chain_start = T0 if w < 2 else T0 + (2 if w < 6 else 6) * S
        step = (T0 + w * S - chain_start) // S + 1
        *items, summary = [r.value for r in rel.records]
        for v in items:
            validator.validate(v)
            assert v["release"] == "cumulative" and v["horizon_windows"] == 4
            assert v["horizon_start"] == iso_utc(chain_start) and v["horizon_step"] == step
            assert v["cumulative_epsilon"] == pytest.approx(1e6 * step)
        validator.validate(summary)
        assert summary["kind"] == "window" and summary["released_keys"] == len(DOMAINS)
        assert summary["epsilon_spent"] == 1e6 and rel.epsilon_spent == 1e6


def test_each_window_is_charged_the_query_budget_once_like_a_per_window_query() -> None:
    cfg = config(
        queries=[
            cumulative(epsilon=0.5),
            {"name": "hourly", "group_by": ["domain"], "epsilon": 0.5, "keys": {"domain": DOMAINS}},
        ],
        epsilon_per_window=1.0,
        horizon_windows=3,
        max_epsilon_per_horizon=3.0,
    )
    pipe = LocalPipeline(cfg, KEYRING, partials_partitions=2, retain_ledger=True)
    pipe.ingest(0, events(COUNTS), now_s=LATER, now_mono_s=0.0)
    releases = pipe.finish(now_s=LATER)
    windows = sorted({r.window_start_s for r in releases})
    assert len(windows) == len(COUNTS)
    for ws in windows:
        assert pipe.release.accountant.query_spent(ws, "running") == (0.5, 0.0)
        assert pipe.release.accountant.window_spent(ws) == (1.0, 0.0)
    summaries = {(r.query, r.window_start_s): r.records[-1].value for r in releases if r.records}
    # the privacy horizon (3 windows) is charged exactly as with two per-window queries
    assert [summaries[("running", ws)]["horizon_epsilon_spent"] for ws in windows] == [
        1.0,
        2.0,
        3.0,
        3.0,
        3.0,
        3.0,
        3.0,
    ]


@pytest.mark.parametrize(
    ("option", "mechanism"),
    [
        ("per_window_sum", "discrete_laplace"),
        ("tree", "discrete_laplace"),
        ("tree_honaker", "discrete_laplace"),
        ("sqrt_factorization", "discrete_gaussian"),
    ],
)
def test_a_restart_after_the_state_write_publishes_the_persisted_values_without_drawing(
    option: str, mechanism: str
) -> None:
    """A crash after a window's state is written and before its ledger record: the restart
    finds the draw and derives exactly the values the first run computed from it (real
    noise: two draws would differ), drawing nothing for that window or any before it."""
    cfg = config(queries=[cumulative(epsilon=0.05, option=option, mechanism=mechanism)])
    records = events(COUNTS)
    log: list[tuple[str, str, bytes]] = []
    first = running(run_local(cfg, records, log=log))
    crash_window = 3
    ws = iso_utc(T0 + crash_window * S)
    # the log up to and including window 3's state records, before its ledger records
    cut = max(
        i for i, (topic, key, _) in enumerate(log) if topic == "continual" and f"|{ws}|" in key
    )
    ledger, store = LedgerIndex(), ContinualStore()
    for topic, key, value in log[: cut + 1]:
        (ledger if topic == "ledger" else store).feed(key, value)
    assert ledger.get("running", T0 + crash_window * S) is None
    noise = CountingNoise()
    second = running(run_local(cfg, records, ledger=ledger, store=store, noise=noise))
    assert second[crash_window] == first[crash_window]
    assert set(second) == set(range(crash_window, len(COUNTS)))  # earlier: in the ledger
    # one draw per later window, none for window 3
    assert len(noise.calls) == len(COUNTS) - crash_window - 1


def test_the_published_values_are_the_persisted_chain_s_values() -> None:
    """Every published running total equals what the continual records alone give (a
    restore, without noise), so nothing published ever came from an unpersisted draw."""
    cfg = config(queries=[cumulative(epsilon=0.5, horizon_windows=8)])
    log: list[tuple[str, str, bytes]] = []
    published = running(run_local(cfg, events(COUNTS), log=log, partials_partitions=3))
    store = ContinualStore()
    store.load([(k, v) for topic, k, v in log if topic == "continual"])
    stage = ReleaseStage(cfg)
    plan = stage.cumulative.queries["running"]
    for w, values in published.items():
        last = store.winner("running", T0 + w * S)
        assert last is not None
        chain = [d.draws for d in store.chain(last)]
        restored = restore_counter(plan.continual, plan.keys, chain, noise=_forbidden)
        assert restored.values is not None and restored.values.tolist() == values


def _forbidden(mechanism: NoiseMechanism, values: np.ndarray) -> np.ndarray:
    raise AssertionError("a restore drew noise")


def test_a_sum_releases_running_sums_in_value_units() -> None:
    cfg = config(queries=[cumulative(statistic="sum", horizon_windows=3)])
    records = [
        rec(0, "u1", 1, "a", bytes=10),
        rec(1, "u2", 2, "b", bytes=250),  # clamped to 100
        rec(2, "u3", 11, "a", bytes=7),
        rec(3, "u4", 21, "c", bytes=1),
    ]
    assert running(run_local(cfg, records)) == {
        0: [10.0, 100.0, 0.0],
        1: [17.0, 100.0, 0.0],
        2: [17.0, 100.0, 1.0],
    }


def test_a_second_replay_with_the_ledger_file_continues_the_horizon(tmp_path: Any) -> None:
    from stream_dp.pipeline.local.replay import replay_file

    cfg = config(queries=[cumulative(epsilon=0.5, horizon_windows=8)])
    path_a, path_b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    all_events = [orjson.loads(v) for _, _, v in events(COUNTS)]
    split = T0 + 4 * S
    path_a.write_bytes(b"\n".join(orjson.dumps(e) for e in all_events if e["timestamp"] < split))
    path_b.write_bytes(b"\n".join(orjson.dumps(e) for e in all_events))
    ledger = tmp_path / "ledger.jsonl"
    first = replay_file(cfg, KEYRING, path_a, ledger_path=ledger)
    lines = [orjson.loads(line) for line in ledger.read_bytes().splitlines()]
    assert any(line.get("topic") == "continual" for line in lines)
    second = replay_file(cfg, KEYRING, path_b, ledger_path=ledger)
    a, b = running(first.releases), running(second.releases)
    assert set(a) == {0, 1, 2, 3} and set(b) == set(range(len(COUNTS)))
    assert all(b[w] == a[w] for w in a)  # reprinted from the ledger, not drawn again
    assert second.drawn == len(COUNTS) - 4
    # the new windows continue the recorded chain: the file's state restores to them
    store = ContinualStore()
    read_back = [orjson.loads(line) for line in ledger.read_bytes().splitlines()]
    store.load(
        [(e["key"], orjson.dumps(e["value"])) for e in read_back if e.get("topic") == "continual"]
    )
    last = store.winner("running", T0 + 6 * S)
    assert last is not None and [d.step for d in store.chain(last)] == list(range(1, 8))


# -- several owners: one worker's stage 2 each, shared topics ---------------------------------
@dataclass
class Topics:
    ledger: list[tuple[str, bytes]] = field(default_factory=list)
    continual: list[tuple[str, bytes]] = field(default_factory=list)


class Node:
    """One worker's stage 2 on shared ledger and continual logs (2 partials partitions)."""

    def __init__(self, cfg: Config, topics: Topics, partitions: Sequence[int]) -> None:
        self.topics = topics
        self.stage = ReleaseStage(cfg, partials_partitions=2, metrics=Metrics())
        self.stage.assign(partitions)
        self._read = {"ledger": 0, "continual": 0}
        self._offsets: dict[int, int] = {}

    def deliver(self, window: int, counts: Mapping[str, int], *, query: str = "running") -> None:
        """The window's partial (one source partition) and a watermark past it."""
        ws = T0 + window * S
        r = self.stage.windows.partition_of(ws, 2)
        totals = {(d,): KeyAggregate(n, n, 0) for d, n in counts.items()}
        n = sum(counts.values())
        partial = Partial(query, ws, 0, f"v{window}", totals, n, n)
        values = [v for _, v in encode_partial(partial, max_bytes=MB)]
        values.append(encode_watermark(SourceWatermark(0, 1, ws + S, False, True))[1])
        start = self._offsets.get(r, 0)
        self._offsets[r] = start + len(values)
        self.stage.ingest(r, [(start + i, v) for i, v in enumerate(values)])

    def catch_up(self) -> None:
        """Read both topics to their end (a fence written now comes back after all this)."""
        for key, value in self.topics.ledger[self._read["ledger"] :]:
            self.stage.ledger.feed(key, value)
        for key, value in self.topics.continual[self._read["continual"] :]:
            self.stage.continual_store.feed(key, value)
        self._read = {"ledger": len(self.topics.ledger), "continual": len(self.topics.continual)}
        self.stage.adopt_ledger()

    def prepare(self, window: int) -> Preparation:
        self.catch_up()
        return self.stage.continual.prepare_continual(T0 + window * S)

    def write(self, prepared: Preparation) -> None:
        for draw in prepared.to_write:
            self.topics.continual.extend(encode_state(draw, max_bytes=MB))

    def publish(self, window: int) -> list[LedgerRelease]:
        """After the state is read back: draw, ledger, read back, publish winners, progress."""
        ws = T0 + window * S
        self.catch_up()
        for rel in self.stage.compute_release(ws, now_s=LATER):
            self.topics.ledger.extend(encode_release(rel, now_s=LATER, max_bytes=MB))
        self.catch_up()
        winners = self.stage.winners(ws)
        self.topics.ledger.extend(encode_published(rel) for rel in winners)
        cursor = self.stage.finish_window(ws, winners, LATER)
        r = self.stage.windows.partition_of(ws, 2)
        self.topics.ledger.append(encode_progress(r, 2, cursor))
        return winners

    def release(self, window: int) -> list[LedgerRelease] | None:
        prepared = self.prepare(window)
        if prepared.waiting:
            return None
        self.write(prepared)
        return self.publish(window)


def _values(releases: Sequence[LedgerRelease] | None) -> list[Any]:
    assert releases
    (rel,) = releases
    return [r.value["value"] for r in rel.records if r.value["kind"] == "release"]


def test_consecutive_windows_of_one_horizon_released_by_two_owners() -> None:
    cfg = config(queries=[cumulative(horizon_windows=8)])
    topics = Topics()
    even, odd = Node(cfg, topics, [0]), Node(cfg, topics, [1])
    counts = COUNTS[:4]
    for w, c in enumerate(counts):
        (even if w % 2 == 0 else odd).deliver(w, c)
    assert even.stage.due_windows() == [T0, T0 + 2 * S]
    assert odd.stage.due_windows() == [T0 + S, T0 + 3 * S]
    # window 1 cannot go before window 0's state exists: it waits, drawing nothing
    assert odd.release(1) is None
    assert topics.continual == []
    got = {0: _values(even.release(0))}
    assert even.release(2) is None  # window 1 is not durable yet either
    got[1] = _values(odd.release(1))
    got[2] = _values(even.release(2))
    got[3] = _values(odd.release(3))
    assert got == exact_running(counts, starts={0})


def test_two_owners_racing_for_one_window_publish_identical_values() -> None:
    """A worker frozen past its session and the one that took over both draw window 0 (real
    noise): both use the first complete draw in the log, and the next window continues it."""
    # b = 4 levels × k 3 / 0.05 = 240: two independent draws of 3 keys agree w.p. < 1e-8
    cfg = config(queries=[cumulative(epsilon=0.05, horizon_windows=8)])
    topics = Topics()
    stale, fresh, odd = Node(cfg, topics, [0]), Node(cfg, topics, [0]), Node(cfg, topics, [1])
    for node in (stale, fresh):
        node.deliver(0, COUNTS[0])
    odd.deliver(1, COUNTS[1])
    both = [stale.prepare(0), fresh.prepare(0)]  # both drew, in memory
    assert all(len(p.to_write) == 1 for p in both)
    noisy = [p.to_write[0].draws.noisy for p in both]
    assert not np.array_equal(*noisy)  # two different draws of window 0 exist
    fresh.write(both[1])  # the new owner's draw completes first in the log
    stale.write(both[0])
    # each reads back to its fence and draws its ledger release of window 0 from the winner
    drawn = []
    for node in (stale, fresh):
        node.catch_up()
        drawn.extend(node.stage.compute_release(T0, now_s=LATER))
    assert len({rel.release_id for rel in drawn}) == 2  # two ledger draws...
    a, b = (_values([rel]) for rel in drawn)
    assert a == b  # ...with identical values, whichever of them the ledger keeps
    assert stale.stage.continual_store.losing_draws == 1
    winner = stale.stage.continual_store.winner("running", T0)
    assert winner is not None and winner.draw_id == both[1].to_write[0].draw_id
    for rel in drawn:
        topics.ledger.extend(encode_release(rel, now_s=LATER, max_bytes=MB))
    assert _values(fresh.publish(0)) == a
    # the stale owner's own (losing) draw never reaches its next values either
    stale.deliver(2, COUNTS[2])
    next_values = _values(odd.release(1))
    after = _values(stale.release(2))
    store = stale.stage.continual_store
    last = store.winner("running", T0 + 2 * S)
    assert last is not None
    assert store.chain(last)[0].draw_id == both[1].to_write[0].draw_id
    plan = stale.stage.cumulative.queries["running"]
    restore = restore_counter(plan.continual, plan.keys, [d.draws for d in store.chain(last)])
    assert restore.values is not None and restore.values.tolist() == after
    assert len(next_values) == len(DOMAINS)


def test_a_query_without_state_for_a_released_previous_window_starts_a_new_chain() -> None:
    """The query was added after window 0 was released (window 0's ledger has no state for
    it): window 1 must not wait for ever; its running total starts at window 1."""
    old = config(queries=[{"name": "hourly", "epsilon": 1e6, "keys": {}}])
    new = config(queries=[{"name": "hourly", "epsilon": 1e6, "keys": {}}, cumulative()])
    topics = Topics()
    before = Node(old, topics, [0])
    before.deliver(0, {"a": 1}, query="hourly")
    assert before.release(0)
    after = Node(new, topics, [1])
    after.deliver(1, {"a": 2, "b": 1})
    after.deliver(1, {"a": 3}, query="hourly")
    releases = after.release(1)
    assert releases is not None
    (rel,) = [r for r in releases if r.query == "running"]
    first = rel.records[0].value
    assert first["horizon_start"] == iso_utc(T0 + S) and first["horizon_step"] == 1
    assert _values([rel]) == [2, 1, 0]


def test_a_changed_plan_restarts_the_running_total_at_that_window() -> None:
    topics = Topics()
    old = Node(config(queries=[cumulative(epsilon=1e6, horizon_windows=8)]), topics, [0])
    new = Node(config(queries=[cumulative(epsilon=2e6, horizon_windows=8)]), topics, [1])
    old.deliver(0, COUNTS[0])
    new.deliver(1, COUNTS[1])
    assert _values(old.release(0)) == [3, 1, 0]
    releases = new.release(1)
    assert _values(releases) == [2, 0, 5]  # not 5, 1, 5: a new chain
    assert releases is not None and releases[0].records[0].value["horizon_start"] == iso_utc(T0 + S)


def test_a_window_whose_budget_is_exhausted_keeps_the_chain_going_without_its_data() -> None:
    cfg = config(queries=[cumulative(horizon_windows=8)])
    topics = Topics()
    even, odd = Node(cfg, topics, [0]), Node(cfg, topics, [1])
    for w in range(3):
        (even if w % 2 == 0 else odd).deliver(w, COUNTS[w])
    assert _values(even.release(0)) == [3, 1, 0]
    # something else spent window 1's whole budget (never so with a valid configuration)
    odd.stage.accountant.charge(T0 + S, "other", 2e6, 0.0)
    assert odd.release(1) == []  # nothing published for the query in window 1...
    assert odd.stage.continual_store.winner("running", T0 + S) is not None  # ...but a step
    # ...and window 2 continues the chain, without window 1's data
    assert _values(even.release(2)) == [3, 1, 0]


def test_a_moved_horizon_origin_restarts_the_running_total_instead_of_overrunning_it() -> None:
    """The plan's fingerprint does not hold the origin: a window whose horizon moved must not
    continue a chain of the old horizon (its counter could run past T windows)."""
    topics = Topics()
    old = Node(config(queries=[cumulative(horizon_windows=8)]), topics, [0])
    moved = iso_utc(T0 - 3 * S)  # window 1 is now step 5 of a horizon from T0 - 3 windows
    new = Node(config(queries=[cumulative(horizon_windows=8, origin=moved)]), topics, [1])
    old.deliver(0, COUNTS[0])
    new.deliver(1, COUNTS[1])
    assert _values(old.release(0)) == [3, 1, 0]
    releases = new.release(1)
    assert _values(releases) == [2, 0, 5]
    assert releases is not None
    assert releases[0].records[0].value["horizon_start"] == iso_utc(T0 + S)


def test_with_erasure_a_per_window_sum_leaves_the_erased_user_out_and_records_the_position() -> (
    None
):
    from stream_dp.privacy.erasure import Erasure, ErasureSet, erasure_pseudonyms

    cfg = config(queries=[cumulative(option="per_window_sum")])
    erasures = ErasureSet()
    erasures.add(Erasure(0, erasure_pseudonyms("a-0-0", KEYRING, "nfkc_casefold_strip"), LATER))
    log: list[tuple[str, str, bytes]] = []
    pipe = LocalPipeline(
        cfg,
        KEYRING,
        erasures=erasures,
        retain_ledger=True,
        continual_sink=lambda k, v: log.append(("continual", k, v)),
    )
    pipe.ingest(0, events(COUNTS[:2]), now_s=LATER, now_mono_s=0.0)
    releases = pipe.finish(now_s=LATER)
    # user a-0-0 (one of window 0's three visits of a) is gone from every running total
    assert running(releases) == {0: [2, 1, 0], 1: [4, 1, 5]}
    assert {rel.erasures_through for rel in releases} == {1}
    store = ContinualStore()
    store.load([(k, v) for _, k, v in log])
    winner = store.winner("running", T0)
    assert winner is not None and winner.erasures_through == 1
    schema_validator("continual.schema.json").validate(orjson.loads(log[0][2]))


def test_a_window_refused_for_budget_never_enters_a_later_running_total(tmp_path: Any) -> None:
    """Charges before state (issue 25, break 4): a ledger from a looser configuration (one
    written before fingerprints, which would refuse it now) is continued under a lower cap.
    Window 1's cumulative release alone would fit the horizon, but the per-window query
    before it is charged first, so the cumulative one is refused: its exact totals must not
    enter the running total of window 2 (or any later one)."""
    from stream_dp.pipeline.local.replay import replay_file

    def two_queries(hourly_epsilon: float, *, cap: float) -> Config:
        hourly = {"name": "hourly", "epsilon": hourly_epsilon, "keys": {}}
        return config(
            queries=[hourly, cumulative(horizon_windows=8)],
            epsilon_per_window=hourly_epsilon + 1e6,
            horizon_windows=2,
            max_epsilon_per_horizon=cap,
        )

    counts: list[dict[str, int]] = [{"a": 3}, {"b": 4}, {"c": 2}]
    lines = [orjson.loads(v) for _, _, v in events(counts)]
    first_window, every_window = tmp_path / "w0.jsonl", tmp_path / "all.jsonl"
    first_window.write_bytes(b"\n".join(orjson.dumps(e) for e in lines if e["timestamp"] < T0 + S))
    every_window.write_bytes(b"\n".join(orjson.dumps(e) for e in lines))
    ledger = tmp_path / "ledger.jsonl"
    # looser: window 0 spends 2e6 + 1e6 of a 6e6 horizon cap
    replay_file(two_queries(2e6, cap=6e6), KEYRING, first_window, ledger_path=ledger)
    # The deployment fingerprint now refuses a ledger continued under other settings; a
    # ledger written before fingerprints existed is only held to its window size, so the
    # charges must still come before the state there: strip the fingerprint record.
    kept = [
        line
        for line in ledger.read_bytes().splitlines()
        if orjson.loads(line)["value"].get("kind") != "fingerprint"
    ]
    assert len(kept) < len(ledger.read_bytes().splitlines())
    ledger.write_bytes(b"\n".join(kept) + b"\n")
    # stricter: 4e6 per 2 windows; in window 1 "hourly" (1e6) fits, then "running" does not
    result = replay_file(two_queries(1e6, cap=4e6), KEYRING, every_window, ledger_path=ledger)
    values = running(result.releases)
    assert 1 not in values  # refused for budget: nothing published
    assert values[0] == [3, 0, 0]
    assert values[2] == [3, 0, 2]  # window 1's 4 events of "b" are not in it
    assert running(result.releases, "hourly") == {0: [3], 1: [4], 2: [2]}


def test_large_sums_on_a_square_root_running_total_never_stop_the_releases() -> None:
    """Issue 25: a window total of 3·10¹² units (beyond 2⁴¹) raised ContinualStateError out
    of the release on the first window, and since windows release in order nothing was
    released after it, not even other queries. Now the encoding is exact; a total beyond
    the counters' range (2⁴² units) is clamped to it and logged, never raised."""
    per_window = {"name": "hourly", "epsilon": 1e6, "keys": {}}
    running_sum = cumulative(
        statistic="sum", option="sqrt_factorization", mechanism="discrete_gaussian"
    )
    node = Node(config(queries=[per_window, running_sum]), Topics(), [0, 1])
    big, bigger = 3 * 10**12, 5 * 10**12
    for window, value_sum in enumerate([big, bigger, 1]):
        ws = T0 + window * S
        r = node.stage.windows.partition_of(ws, 2)
        records: list[bytes] = []
        for query in ("hourly", "running"):
            key: tuple[str, ...] = ("a",) if query == "running" else ()
            totals = {key: KeyAggregate(1, 1, value_sum if query == "running" else 0)}
            partial = Partial(query, ws, 0, f"v{window}", totals, 1, 1)
            records.extend(v for _, v in encode_partial(partial, max_bytes=MB))
        records.append(encode_watermark(SourceWatermark(0, 1, ws + S, False, True))[1])
        start = node._offsets.get(r, 0)
        node._offsets[r] = start + len(records)
        node.stage.ingest(r, [(start + i, v) for i, v in enumerate(records)])
    released = [node.release(w) for w in range(3)]
    by_query = [{rel.query: rel for rel in rels or []} for rels in released]
    assert [sorted(q) for q in by_query] == [["hourly", "running"]] * 3
    values = [_values([q["running"]]) for q in by_query]
    cap = 1 << 42
    expected = [[big, 0, 0], [big + cap, 0, 0], [big + cap + 1, 0, 0]]
    # noise: sd ≤ 0.2 units per value at ε = 1e6, so |error| > 2 has probability < 1e-20
    # per value; the output's B̃ is floating point (post-processing): ~1e-13 relative here
    assert values == [pytest.approx(row, rel=1e-12, abs=2) for row in expected]
    assert values[1] != pytest.approx([big + bigger, 0, 0], rel=1e-6)  # clamped, not summed
