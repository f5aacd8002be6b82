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
VISITS, USERS, TOP, _VARIANCE, QUANTILES = CONFIG.queries


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


def test_a_quantile_record_gives_a_row_per_quantile_beside_its_exact_value() -> None:
    """10 values in bin 100 and 10 in bin 500 of 1024 over [0, 600): the exact median is
    bin 100's lower edge, the 0.9 and 0.99 quantiles bin 500's."""
    bins = [0] * 1024
    bins[100], bins[500] = 10, 10
    totals = {("DE",): KeyAggregate(events=20, users=5, value_sum=0, value_bins=tuple(bins))}
    record = {**_release({"country": "DE"}, 0), "ci95": 7.0,
              "value": [{"quantile": 0.5, "value": 60.0}, {"quantile": 0.9, "value": 290.0},
                        {"quantile": 0.99, "value": 300.0}]}  # fmt: skip
    q = compare_query(QUANTILES, [record], _window(1, eps=0.1), totals)
    edge = 600 / 1024
    assert [(r.label, r.true_value, r.released) for r in q.rows] == [
        ("DE, 0.5", 100 * edge, 60.0),
        ("DE, 0.9", 500 * edge, 290.0),
        ("DE, 0.99", 500 * edge, 300.0),
    ]
    # The ci95 counts ranks: no comparison with an error in milliseconds.
    assert all(r.ci95_in_ranks and not r.within_ci95 for r in q.rows)


def test_summary_checks_only_the_counts_of_every_kept_key_against_their_ci() -> None:
    """top_domains' values are counts too, but of chosen keys only: not in the check."""
    totals = {("site00.example",): KeyAggregate(LARGE_KEY_MIN_TRUE * 2, 90, 0)}
    releases = [_release({"domain": "site00.example"}, LARGE_KEY_MIN_TRUE * 2 + 5)]
    visits = compare_query(VISITS, releases, _window(1), totals)
    top = compare_query(TOP, releases, _window(1), totals)
    s = summarize([WindowResult(1, 1, "s", "e", [visits, top])], CONFIG,
                  windows_expected=1, elapsed_s=1.0)  # fmt: skip
    assert s.large_values == 1 and s.large_within_ci95 == 1
