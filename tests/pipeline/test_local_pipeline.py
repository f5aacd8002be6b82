"""The engine without Kafka: windows, lateness, the ledger, offsets, budgets, state contents."""

from __future__ import annotations

import pickle
import random
from typing import Any

import orjson
import pytest

from stream_dp.config import parse_config
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.engine import Engine
from stream_dp.pipeline.ledger import LedgerIndex, encode_published, encode_release
from stream_dp.privacy.pseudonymize import KeyRing, Pseudonymizer

T0 = 1_596_240_000
KEYRING = KeyRing(Pseudonymizer(b"s" * 32, "k1"))


@pytest.fixture(autouse=True)
def _test_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAM_DP_ALLOW_UNSAFE_TEST_MODE", "1")


def _config(**privacy: Any) -> Any:
    return parse_config(
        {
            "window": {"size_s": 10, "grace_s": 1, "idle_close_s": 5},
            "privacy": {
                "unsafe_test_mode": True,
                "epsilon_per_window": 2e6,
                "max_epsilon_per_horizon": 1e12,
                **privacy,
            },
            "bounds": {"max_contributions_per_window": 3},
            "queries": [
                {
                    "name": "visits",
                    "group_by": ["domain"],
                    "epsilon": 1e6,
                    "keys": {"domain": ["a", "b"]},
                },
                {"name": "all", "epsilon": 1e6, "keys": {}},
            ],
        }
    )


def _rec(offset: int, user: str, t: float, domain: str = "a") -> tuple[int, bytes]:
    return offset, orjson.dumps({"user_id": user, "timestamp": T0 + t, "domain": domain})


def _engine(ledger: LedgerIndex | None = None, **privacy: Any) -> Engine:
    e = Engine(
        _config(**privacy), KEYRING, ledger=ledger, metrics=Metrics(), sampling_rng=random.Random(0)
    )
    e.assign([0, 1], now_mono_s=0)
    return e


def _values(releases: list[Any], query: str) -> dict[str, Any]:
    (rel,) = [r for r in releases if r.query == query]
    return {
        orjson.dumps(r.value.get("group")).decode(): r.value.get("value", r.value.get("kind"))
        for r in rel.records
    }


def test_release_after_watermark_with_bounded_counts() -> None:
    e = _engine()
    e.ingest(
        0,
        [_rec(i, "heavy", 1) for i in range(10)] + [_rec(10, "x", 2, "b")],
        now_s=T0 + 100,
        now_mono_s=1,
    )
    e.ingest(1, [_rec(0, "y", 3)], now_s=T0 + 100, now_mono_s=1)
    assert e.due_windows(now_mono_s=1) == []  # watermark 2 - grace < window end 10
    e.ingest(0, [_rec(11, "x", 12)], now_s=T0 + 100, now_mono_s=2)
    e.ingest(1, [_rec(1, "y", 11.5)], now_s=T0 + 100, now_mono_s=2)
    assert e.due_windows(now_mono_s=2) == [T0]
    releases = e.compute_release(T0, now_s=T0 + 100)
    assert _values(releases, "visits") == {
        '{"domain":"a"}': 3 + 1,
        '{"domain":"b"}': 1,
        "null": "window",
    }
    e.finish_window(T0, releases, T0 + 100)
    assert e.open_windows() == [T0 + 10]


def test_late_events_counted_and_dropped() -> None:
    e = _engine()
    e.ingest(0, [_rec(0, "u", 1), _rec(1, "u", 15)], now_s=T0 + 100, now_mono_s=0)
    e.ingest(1, [_rec(0, "v", 15)], now_s=T0 + 100, now_mono_s=0)
    assert e.due_windows(now_mono_s=0) == [T0]
    e.ingest(1, [_rec(1, "w", 2)], now_s=T0 + 100, now_mono_s=1)
    assert e.metrics.late_events._value.get() == 1


def test_safe_offsets_hold_back_for_open_windows() -> None:
    e = _engine()
    e.ingest(0, [_rec(5, "u", 1), _rec(6, "u", 12), _rec(7, "u", 13)], now_s=T0 + 100, now_mono_s=0)
    assert e.safe_offsets() == {0: 5}
    releases = e.compute_release(T0, now_s=T0)
    e.finish_window(T0, releases, T0)
    assert e.safe_offsets() == {0: 6}  # window T0+10 still needs offset 6


def test_ledgered_window_is_never_redrawn_and_its_events_are_skipped() -> None:
    first = _engine()
    first.ingest(0, [_rec(0, "u", 1)], now_s=T0 + 100, now_mono_s=0)
    drawn = first.compute_release(T0, now_s=T0)
    ledger = LedgerIndex()
    records = [kv for rel in drawn for kv in encode_release(rel, now_s=T0)]
    ledger.load([*records, encode_published(drawn[0])])
    # Restart: the ledger says the window is released; replayed events are skipped.
    again = _engine(ledger)
    again.ingest(0, [_rec(0, "u", 1)], now_s=T0 + 100, now_mono_s=0)
    assert again.open_windows() == []
    assert again.metrics.replayed_events_skipped._value.get() == 1
    assert again.accountant.window_spent(T0)[0] == pytest.approx(2e6)


def test_partially_ledgered_window_reuses_the_ledgered_query() -> None:
    first = _engine()
    first.ingest(0, [_rec(0, "u", 1)], now_s=T0 + 100, now_mono_s=0)
    drawn = {r.query: r for r in first.compute_release(T0, now_s=T0)}
    ledger = LedgerIndex()
    ledger.load(encode_release(drawn["visits"], now_s=T0))  # crash before "all" was ledgered
    again = _engine(ledger)
    again.ingest(0, [_rec(0, "u", 1)], now_s=T0 + 100, now_mono_s=0)
    assert again.open_windows() == [T0]
    redo = {r.query: r for r in again.compute_release(T0, now_s=T0)}
    assert redo["visits"].release_id == drawn["visits"].release_id  # reused, not redrawn
    assert redo["all"].release_id != drawn["all"].release_id


def test_budget_exhaustion_suppresses_release() -> None:
    e = _engine(horizon_windows=2, max_epsilon_per_horizon=4e6)
    e.ingest(0, [_rec(0, "u", 1), _rec(1, "u", 11)], now_s=T0 + 100, now_mono_s=0)
    # The ledger holds a charge from an earlier, larger configuration in the previous window.
    e.accountant.record(T0 - 10, "old_query", 2.5e6, 0)
    releases = e.compute_release(T0, now_s=T0)
    assert [r.query for r in releases] == ["visits"]
    assert e.metrics.budget_exhausted.labels(query="all")._value.get() == 1


def test_state_holds_no_raw_user_id() -> None:
    e = _engine()
    e.ingest(0, [_rec(0, "alice@example.com", 1)], now_s=T0 + 100, now_mono_s=0)
    blob = pickle.dumps((e._state, e._signatures, e._signature_ids))
    assert b"alice" not in blob
