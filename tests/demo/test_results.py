"""The demo's comparison of released and true values (pure; no broker)."""

from __future__ import annotations

import math

from stream_dp.demo.results import (
    LARGE_KEY_MIN_TRUE,
    ExactTotals,
    WindowResult,
    compare_query,
    summarize,
)
from stream_dp.demo.scenario import DemoOptions, demo_config
from stream_dp.privacy.release import KeyAggregate

CONFIG = demo_config(DemoOptions(users=100, windows=2), "127.0.0.1:1")
VISITS, USERS = CONFIG.queries


def _release(group: dict[str, str], value: int, ci95: float = 10.0) -> dict[str, object]:
    return {"group": group, "value": value, "ci95": ci95, "noise_scale": 3.0,
            "mechanism": "discrete_laplace"}  # fmt: skip


def _window(released: int, eps: float = 0.75, horizon: float = 1.0) -> dict[str, object]:
    return {"released_keys": released, "epsilon_spent": eps, "delta_spent": 1e-6,
            "horizon_epsilon_spent": horizon}  # fmt: skip


def test_observer_keeps_totals_per_query_and_window() -> None:
    totals = ExactTotals()
    totals("q", 1_596_240_000, {("a",): KeyAggregate(3, 2, 0)})
    assert totals.get("q", "2020-08-01T00:00:00Z") == {("a",): KeyAggregate(3, 2, 0)}
    assert totals.get("q", "2020-08-01T00:00:10Z") is None


def test_private_keys_rows_and_suppressed_count() -> None:
    totals = {
        ("site00.example",): KeyAggregate(events=500, users=200, value_sum=0),
        ("site01.example",): KeyAggregate(events=40, users=12, value_sum=0),
        ("rare-001.example",): KeyAggregate(events=2, users=1, value_sum=0),
    }
    q = compare_query(VISITS, [_release({"domain": "site00.example"}, 512)], _window(1), totals)
    (row,) = q.rows
    assert (row.true_value, row.released, row.error) == (500, 512, 12)
    assert not row.within_ci95  # |12| > 10
    assert math.isclose(row.relative_error or 0, 12 / 500)
    assert q.suppressed_keys == 2 and q.rare_keys_in_data == 1
    assert not row.rare


def test_public_keys_use_distinct_users_and_zero_for_absent_keys() -> None:
    totals = {("DE",): KeyAggregate(events=90, users=30, value_sum=0)}
    releases = [_release({"country": "DE"}, 33), _release({"country": "FR"}, -2)]
    q = compare_query(USERS, releases, _window(2, eps=0.25), totals)
    assert [(r.label, r.true_value, r.released) for r in q.rows] == [("DE", 30, 33), ("FR", 0, -2)]
    assert q.suppressed_keys is None  # public keys: nothing is selected


def test_summary_counts_large_keys_rare_releases_and_epsilon() -> None:
    totals = {("site00.example",): KeyAggregate(LARGE_KEY_MIN_TRUE * 2, 90, 0),
              ("rare-001.example",): KeyAggregate(1, 1, 0)}  # fmt: skip
    releases = [_release({"domain": "site00.example"}, LARGE_KEY_MIN_TRUE * 2 + 5),
                _release({"domain": "rare-001.example"}, 1)]  # fmt: skip
    q = compare_query(VISITS, releases, _window(2, eps=1.0, horizon=2.0), totals)
    windows = [WindowResult(i, 2, "s", "e", [q]) for i in (1, 2)]
    s = summarize(windows, CONFIG, windows_expected=2, elapsed_s=1.0)
    assert s.large_values == 2 and s.large_within_ci95 == 2
    assert math.isclose(s.mean_relative_error_large or 0, 5 / (LARGE_KEY_MIN_TRUE * 2))
    assert s.rare_keys_released == 2  # a broken selection would be reported, not hidden
    assert s.epsilon_spent_total == 2.0 and s.horizon_epsilon_spent == 2.0
    assert s.complete
