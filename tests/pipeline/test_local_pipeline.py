"""Both stages in memory (LocalPipeline): windows, lateness, the ledger, offsets, budgets,
state contents, and that splitting the input over partitions never changes a release."""

from __future__ import annotations

import itertools
import pickle
import random
from collections import Counter
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.formats.ledger import (
    LedgerIndex,
    LedgerRelease,
    encode_progress,
    encode_published,
    encode_release,
)
from stream_dp.pipeline.local.local import LocalPipeline
from stream_dp.pipeline.stages.ingest import InputRecord, user_key
from stream_dp.pipeline.stages.placement import murmur2_partition
from tests.pipeline.support import (
    KEYRING,
    NOW,
    T0,
    WEIGHTED_VISITS,
    comparable,
    config,
    rec,
    values,
)

MB = 1_000_000


def _pipeline(
    ledger: LedgerIndex | None = None, *, partitions: int = 1, **privacy: Any
) -> LocalPipeline:
    return LocalPipeline(
        config(**privacy),
        KEYRING,
        partitions=partitions,
        ledger=ledger,
        metrics=Metrics(),
        sampling_rng=random.Random(0),
    )


def _ledger_of(releases: list[LedgerRelease], *, published: bool) -> LedgerIndex:
    """The ledger a worker leaves behind (with the progress record once published)."""
    ledger = LedgerIndex()
    records = [kv for rel in releases for kv in encode_release(rel, now_s=NOW, max_bytes=MB)]
    if published:
        records += [encode_published(rel) for rel in releases]
        records += [encode_progress(0, 1, max(r.window_start_s for r in releases) + 10)]
    ledger.load(records)
    return ledger


def test_release_after_every_partition_passed_the_window_with_bounded_counts() -> None:
    p = _pipeline(partitions=2)
    p.ingest(
        0,
        [rec(i, "heavy", 1) for i in range(10)] + [rec(10, "x", 2, "b")],
        now_s=NOW,
        now_mono_s=1,
    )
    p.ingest(1, [rec(0, "y", 3)], now_s=NOW, now_mono_s=1)
    assert p.step(1, now_s=NOW) == []  # watermarks 2 - grace, 3 - grace < window end 10
    p.ingest(0, [rec(11, "x", 12)], now_s=NOW, now_mono_s=2)
    # Partition 0 has sealed the window (its partial is in stage 2); partition 1 has not.
    assert p.step(2, now_s=NOW) == []
    assert p.release.open_windows() == [T0]
    p.ingest(1, [rec(1, "y", 11.5)], now_s=NOW, now_mono_s=2)
    releases = p.step(2, now_s=NOW)
    assert {(r.query, r.window_start_s) for r in releases} == {("visits", T0), ("all", T0)}
    assert values(releases, "visits") == {
        '{"domain":"a"}': 3 + 1,  # heavy's 10 events bounded to k = 3, plus y
        '{"domain":"b"}': 1,
        "null": "window",
    }
    assert values(releases, "all") == {"{}": 5, "null": "window"}
    assert p.ingest_stage.open_windows() == [T0 + 10]
    assert p.release.open_windows() == []
    assert p.release.released(T0)
    assert p.metrics.windows_released.labels(query="visits")._value.get() == 1
    assert p.metrics.partials_published._value.get() == 2 * 2  # 2 partitions × 2 queries
    assert p.step(3, now_s=NOW) == []  # released once


def test_late_events_counted_and_dropped() -> None:
    p = _pipeline(partitions=2)
    p.ingest(0, [rec(0, "u", 1), rec(1, "u", 15)], now_s=NOW, now_mono_s=0)
    p.ingest(1, [rec(0, "v", 15)], now_s=NOW, now_mono_s=0)
    releases = p.step(0, now_s=NOW)
    assert values(releases, "all") == {"{}": 1, "null": "window"}
    p.ingest(1, [rec(1, "w", 2)], now_s=NOW, now_mono_s=1)
    assert p.metrics.late_events._value.get() == 1
    assert p.ingest_stage.open_windows() == [T0 + 10]  # the late event opened nothing
    final = p.finish(now_s=NOW)
    assert [(r.query, r.window_start_s) for r in final] == [("visits", T0 + 10), ("all", T0 + 10)]
    assert values(final, "all", T0 + 10) == {"{}": 2, "null": "window"}


def test_events_of_a_window_this_process_released_are_late_not_replays() -> None:
    p = _pipeline(partitions=2)
    p.ingest(0, [rec(0, "u", 1), rec(1, "u", 12)], now_s=NOW, now_mono_s=6)
    # Partition 1 has been silent since it was assigned at 0: idle, holding nothing back,
    # but its first idle mark after partition 0's partial is not trusted yet.
    assert p.step(6, now_s=NOW) == []
    releases = p.step(7, now_s=NOW)  # still idle 1 s later: confirmed
    assert values(releases, "all") == {"{}": 1, "null": "window"}
    p.ingest(1, [rec(0, "v", 3)], now_s=NOW, now_mono_s=7)  # too late for the release
    assert p.metrics.late_events._value.get() == 1
    assert p.metrics.replayed_events_skipped._value.get() == 0
    assert p.ingest_stage.open_windows() == [T0 + 10]
    assert p.ingest_stage.safe_offsets() == {0: 1, 1: 1}


def test_a_partition_without_events_does_not_stall_a_live_one() -> None:
    p = _pipeline(partitions=2)
    released = []
    for t in range(60):  # partition 0: one event a second, live; partition 1: none at all
        p.ingest(0, [rec(t, f"u{t}", t)], now_s=NOW, now_mono_s=t)
        released += [r.window_start_s for r in p.step(t, now_s=NOW) if r.query == "all"]
    # The rule before confirmation released them at 11, 21, 31 and 41 s.
    assert released[:4] == [T0, T0 + 10, T0 + 20, T0 + 30]


def test_safe_offsets_hold_back_for_open_windows() -> None:
    p = _pipeline()
    p.ingest(0, [rec(5, "u", 1), rec(6, "u", 12), rec(7, "u", 13)], now_s=NOW, now_mono_s=0)
    assert p.ingest_stage.safe_offsets() == {0: 5}
    releases = p.step(0, now_s=NOW)  # watermark 12 passed the first window's end
    assert {r.window_start_s for r in releases} == {T0}
    assert p.ingest_stage.safe_offsets() == {0: 6}  # window T0+10 still needs offset 6
    p.finish(now_s=NOW)
    assert p.ingest_stage.safe_offsets() == {0: 8}
    # Stage 2's partials partition: everything read, nothing pending.
    assert p.release.safe_offsets() == {0: 6}  # 2 × (2 partials + 1 watermark)


def test_ledgered_window_is_never_redrawn_and_its_events_are_skipped() -> None:
    first = _pipeline()
    first.ingest(0, [rec(0, "u", 1)], now_s=NOW, now_mono_s=0)
    drawn = first.finish(now_s=NOW)
    assert {r.query for r in drawn} == {"visits", "all"}
    # Restart: the ledger says the window is released; replayed events are skipped.
    again = _pipeline(_ledger_of(drawn, published=True))
    again.ingest(0, [rec(0, "u", 1)], now_s=NOW, now_mono_s=0)
    assert again.ingest_stage.open_windows() == []
    assert again.metrics.replayed_events_skipped._value.get() == 1
    assert again.release.accountant.window_spent(T0)[0] == pytest.approx(2e6)
    assert again.finish(now_s=NOW) == []
    assert again.metrics.partials_published._value.get() == 0


def test_partially_ledgered_window_reuses_the_ledgered_query() -> None:
    first = _pipeline()
    first.ingest(0, [rec(0, "u", 1)], now_s=NOW, now_mono_s=0)
    drawn = {r.query: r for r in first.finish(now_s=NOW)}
    # Crash before "all" was ledgered.
    again = _pipeline(_ledger_of([drawn["visits"]], published=False))
    again.ingest(0, [rec(0, "u", 1)], now_s=NOW, now_mono_s=0)
    assert again.ingest_stage.open_windows() == [T0]
    redo = {r.query: r for r in again.finish(now_s=NOW)}
    assert redo["visits"].release_id == drawn["visits"].release_id  # reused, not redrawn
    assert redo["all"].release_id != drawn["all"].release_id
    assert values(list(redo.values()), "all") == {"{}": 1, "null": "window"}
    # The partial for the ledgered query was not merged into anything.
    ignored = again.metrics.partials_ignored
    assert ignored.labels(reason="window_released")._value.get() == 1
    assert ignored.labels(reason="duplicate_version")._value.get() == 0
    assert again.release.accountant.window_spent(T0)[0] == pytest.approx(2e6)


def test_budget_exhaustion_suppresses_release() -> None:
    p = _pipeline(horizon_windows=2, max_epsilon_per_horizon=4e6)
    p.ingest(0, [rec(0, "u", 1), rec(1, "u", 11)], now_s=NOW, now_mono_s=0)
    # The ledger holds a charge from an earlier, larger configuration in the previous window.
    p.release.accountant.record(T0 - 10, "old_query", 2.5e6, 0)
    releases = p.step(0, now_s=NOW)
    assert [(r.query, r.window_start_s) for r in releases] == [("visits", T0)]
    assert p.metrics.budget_exhausted.labels(query="all")._value.get() == 1
    assert p.metrics.budget_exhausted.labels(query="visits")._value.get() == 0
    assert p.release.released(T0)  # suppressed is final: the window is not retried
    assert p.release.accountant.query_spent(T0, "all") == (0.0, 0.0)


def test_state_holds_no_raw_user_id() -> None:
    p = _pipeline()
    p.ingest(0, [rec(0, "alice@example.com", 1), rec(1, "bob", 12)], now_s=NOW, now_mono_s=0)
    stage = p.ingest_stage
    blob = pickle.dumps((stage.store.parts, stage.store.signatures, stage.store.signature_ids))
    assert b"alice" not in blob
    assert p.step(0, now_s=NOW) != []  # T0 sealed into partials and released
    blob = pickle.dumps((stage.store.parts, p.release.inbox._windows, p.release.ledger.releases()))
    assert b"alice" not in blob and b"bob" not in blob


# -- splitting the input over partitions never changes a release ----------------------------

USERS = [f"user-{i}" for i in range(8)]
K = 3
WINDOWS = 4

#: Per (user, window): up to k events as (offset into the window in tenths of s, domain).
_events = st.dictionaries(
    st.tuples(st.sampled_from(USERS), st.integers(0, WINDOWS - 1)),
    st.lists(st.tuples(st.integers(0, 99), st.sampled_from("ab")), min_size=1, max_size=K),
    max_size=20,
)


def _partition_of(user: str, partitions: int) -> int:
    """What a producer keying by user id does: the default partitioner's hash of the key
    (its records are keyed by user id, and the pipeline is told so: input.keyed_by_user)."""
    return murmur2_partition(user.encode(), partitions)


def _run(
    events: list[tuple[float, str, str]], cuts: list[int], partitions: int, partials: int
) -> dict[tuple[str, int], list[Any]]:
    p = LocalPipeline(
        config(k=K, keyed_by_user=True),
        KEYRING,
        partitions=partitions,
        partials_partitions=partials,
        sampling_rng=random.Random(0),
    )
    offsets = [0] * partitions
    released: list[LedgerRelease] = []
    bounds = [0, *sorted(set(cuts)), len(events)]
    for lo, hi in itertools.pairwise(bounds):
        batches: dict[int, list[InputRecord]] = {}
        for t, user, domain in events[lo:hi]:
            part = _partition_of(user, partitions)
            batches.setdefault(part, []).append(
                rec(offsets[part], user, t, domain, key=user_key(user))
            )
            offsets[part] += 1
        for part, batch in sorted(batches.items()):
            assert p.ingest(part, batch, now_s=NOW, now_mono_s=0) == []
        released += p.step(0, now_s=NOW)
    released += p.finish(now_s=NOW)
    assert p.metrics.late_events._value.get() == 0
    return comparable(released)


def _exact(events: list[tuple[float, str, str]]) -> dict[tuple[str, int], dict[str, Any]]:
    """What the releases must say: plain counts (no user exceeds k, no noise in test mode),
    for every window from the first covered one to the last with events — empty ones too."""
    by_window: dict[int, Counter[str]] = {}
    for t, _, domain in events:
        by_window.setdefault(T0 + int(t // 10) * 10, Counter())[domain] += 1
    for ws in range(T0, max(by_window, default=T0 - 10), 10):
        by_window.setdefault(ws, Counter())
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for ws, counts in by_window.items():
        out[("visits", ws)] = {'{"domain":"a"}': counts["a"], '{"domain":"b"}': counts["b"]}
        out[("all", ws)] = {"{}": sum(counts.values())}
    return out


def _released_values(
    released: dict[tuple[str, int], list[Any]],
) -> dict[tuple[str, int], dict[str, Any]]:
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for ident, records in released.items():
        parsed = [orjson.loads(v) for _, v in records]
        out[ident] = {
            orjson.dumps(r["group"]).decode(): r["value"] for r in parsed if r["kind"] == "release"
        }
    return out


@settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    per_user_window=_events,
    cuts=st.lists(st.integers(0, 60), max_size=5),
)
def test_partitioning_never_changes_a_release(
    per_user_window: dict[tuple[str, int], list[tuple[int, str]]], cuts: list[int]
) -> None:
    # One stream in event-time order (as each partition also sees its share of it).
    events = sorted(
        (w * 10 + tenth / 10, user, domain)
        for (user, w), items in per_user_window.items()
        for tenth, domain in items
    )
    cuts = [c for c in cuts if c < len(events)]
    single = _run(events, cuts, partitions=1, partials=1)
    assert _released_values(single) == _exact(events)
    for partitions, partials in [(1, 4), (3, 1), (3, 4)]:
        assert _run(events, cuts, partitions, partials) == single, (partitions, partials)


def test_weighted_selection_adds_each_users_weights_over_partitions_and_keys() -> None:
    """selection: weighted_gaussian through both stages (partials encoded and decoded): a key
    is released on its users' weight sum, summed over stage-1 partitions. In test mode the
    noise is a few units of a threshold of ~4,117: one user alone (weight 4,096 at most) is
    never enough, two users on one key each are, and so are two users on three keys each
    (2 × 2,364); a user with ten keys is cut to L0 = 3 and its keys weigh 2,364 alone.
    P(any of these decisions flips) < 1e-12 (tails beyond 5σ and 100σ)."""
    p = LocalPipeline(
        config(queries=[WEIGHTED_VISITS], k=20, bounds={"max_keys_per_user": 3}),
        KEYRING,
        partitions=2,
        metrics=Metrics(),
        sampling_rng=random.Random(0),
    )
    first = [rec(0, "solo", 1, "lonely"), rec(1, "p", 1, "pair")]
    first += [rec(2 + i, "m1", 2, d) for i, d in enumerate("xyz")]
    first += [rec(5 + i, "heavy", 3, f"h{i}") for i in range(10)]
    second = [rec(0, "q", 1, "pair")] + [rec(1 + i, "m2", 2, d) for i, d in enumerate("xyz")]
    p.ingest(0, first, now_s=NOW, now_mono_s=1)
    p.ingest(1, second, now_s=NOW, now_mono_s=1)
    releases = p.finish(now_s=NOW)
    released = values(releases, "visits")
    assert released == {
        '{"domain":"pair"}': 2,
        '{"domain":"x"}': 2,
        '{"domain":"y"}': 2,
        '{"domain":"z"}': 2,
        "null": "window",
    }
    (rel,) = releases
    selection = next(r.value for r in rel.records if "group" in r.value)["selection"]
    assert selection["strategy"] == "weighted_gaussian"
    assert selection["weight_scale"] == 4096
    assert 4096 < selection["threshold"] < 2 * 2364


def test_a_released_window_reports_the_budget_it_left_unspent() -> None:
    """stream_dp_window_epsilon_remaining after a release: the per-window ε less what the
    window's releases spent (an operator reads it to know whether another query fits)."""
    p = _pipeline(epsilon_per_window=3e6)  # the two queries spend 1e6 each
    p.ingest(0, [rec(0, "u", 1), rec(1, "v", 2, "b")], now_s=NOW, now_mono_s=1)
    p.ingest(0, [rec(2, "w", 12)], now_s=NOW, now_mono_s=2)
    releases = p.step(2, now_s=NOW)
    assert {r.window_start_s for r in releases} == {T0} and len(releases) == 2
    spent = sum(r.epsilon_spent for r in releases)
    per_window = 3e6
    assert 0 < spent < per_window
    remaining = p.metrics.epsilon_remaining._value.get()
    assert remaining == pytest.approx(per_window - spent, rel=1e-12)
