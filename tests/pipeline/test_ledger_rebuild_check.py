"""``ledger rebuild`` checks what it rebuilds from, without a broker: every window found on
the output topic is compared with the rebuild configuration's plan (window length and grid,
each query's ε, δ, bounds, selection and noise scale, the query list) and one mismatch
refuses the whole rebuild before any ledger record is planned, naming window, query, field,
the output topic's value and the configuration's. A configuration that did release the
windows — private keys, sums, means, automatic bounds, running totals — is never refused."""

from __future__ import annotations

import random
import re
from typing import Any

import orjson
import pytest

from stream_dp.config import parse_config
from stream_dp.config.model import UNSAFE_TEST_MODE_ENV, Config
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.formats.ledger import LedgerIndex, LedgerRelease
from stream_dp.pipeline.kafka.ledger_rebuild import RebuildPlan, check_output, plan_rebuild
from stream_dp.pipeline.kafka.output_scan import RawRecord, decode_output
from stream_dp.pipeline.local.local import LocalPipeline
from stream_dp.pipeline.rebuild_check import ReleasedUnderOtherSettingsError
from stream_dp.pipeline.stages.ingest import InputRecord
from stream_dp.windows.tumbling import epoch_of_iso, iso_utc
from tests.pipeline.support import KEYRING, NOW, T0, rec

W0, W1, W2 = (iso_utc(T0 + 10 * i) for i in range(3))

#: Two count queries on public keys (exact in test mode: ε = 1e6, noise scale 3e-6).
PUBLIC = [
    {"name": "visits", "group_by": ["domain"], "epsilon": 1e6, "keys": {"domain": ["a", "b"]}},
    {"name": "all", "epsilon": 1e6, "keys": {}},
]


def _config(
    queries: list[dict[str, Any]] | None = None,
    *,
    size_s: int = 10,
    start_at: str = W0,
    bounds: dict[str, Any] | None = None,
    **privacy: Any,
) -> Config:
    data = {
        "window": {"size_s": size_s, "grace_s": 1, "idle_close_s": 5, "start_at": start_at},
        "privacy": {
            "unsafe_test_mode": True,
            "epsilon_per_window": 2e6,
            "delta_per_window": 1e-5,
            "max_epsilon_per_horizon": 1e12,
            **privacy,
        },
        "bounds": bounds or {"max_contributions_per_window": 3},
        "queries": PUBLIC if queries is None else queries,
    }
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(UNSAFE_TEST_MODE_ENV, "1")
        return parse_config(data)


def _events(windows: int = 3, users: int = 4) -> list[InputRecord]:
    """``users`` users with two events each (domains a and b) in each of ``windows`` windows
    of 10 s from T0."""
    out: list[InputRecord] = []
    for w in range(windows):
        for u in range(users):
            for i, domain in enumerate("ab"):
                out.append(rec(len(out), f"u{u}", 10 * w + 1 + i, domain, bytes=10 * u + 3))
    return out


def _published(config: Config, events: list[InputRecord] | None = None) -> list[RawRecord]:
    """What the worker of ``config`` writes to the output topic for ``events``."""
    p = LocalPipeline(config, KEYRING, metrics=Metrics(), sampling_rng=random.Random(0))
    p.ingest(0, events if events is not None else _events(), now_s=NOW, now_mono_s=0)
    releases: list[LedgerRelease] = p.finish(now_s=NOW)
    assert releases
    return [
        (r.key, v)
        for rel in releases
        for r, v in zip(rel.records, rel.output_values(), strict=True)
    ]


def _plan(config: Config, records: list[RawRecord]) -> RebuildPlan:
    return plan_rebuild(
        config,
        check_output(config, decode_output(records, {q.name for q in config.queries})),
        LedgerIndex(),
        ledger_partitions=[0, 1],
        partials_partitions=[0],
        now_s=NOW,
    )


def _refused(config: Config, records: list[RawRecord]) -> list[str]:
    """The mismatch lines of the refusal (the message is checked whole around them)."""
    with pytest.raises(ReleasedUnderOtherSettingsError) as caught:
        _plan(config, records)
    message = str(caught.value)
    head, *rest = message.split("\n")
    assert head.startswith(
        f"the ledger {config.output.ledger_topic} cannot be rebuilt with this configuration: "
    ), message
    lines = [line for line in rest if line.startswith("  ")]
    tail = [line for line in rest if not line.startswith("  ")]
    assert len(tail) == 1 and tail[0].startswith("Workers started on a ledger rebuilt with it")
    assert "Nothing was written to the ledger." in tail[0]
    assert "Run the rebuild with the configuration that released these windows" in tail[0]
    assert "start a new deployment: a new kafka.group_id" in tail[0]
    return [line.strip() for line in lines]


def _scale(value: float) -> str:
    return orjson.dumps(value).decode()


def test_a_rebuild_with_another_window_size_is_refused_naming_it() -> None:
    """The issue's case: 10-second windows released, rebuilt with size_s: 5. Every window
    is named (two queries, three windows), and the way out says after which window a new
    deployment may start."""
    records = _published(_config())
    with pytest.raises(ReleasedUnderOtherSettingsError) as caught:
        _plan(_config(size_s=5), records)
    assert str(caught.value).split("\n")[:3] == [
        "the ledger stream-dp.ledger cannot be rebuilt with this configuration: 6 of the 6 "
        "(query, window) releases on the output topic dp-releases were released under other "
        "settings (window.size_s):",
        f"  3 windows from {W0} to {W2}, query all: window.size_s: windows of 10 s on the output "
        "topic, 5 s in this configuration",
        f"  3 windows from {W0} to {W2}, query visits: window.size_s: windows of 10 s on the "
        "output topic, 5 s in this configuration",
    ]
    assert f"window.start_at at or after {iso_utc(T0 + 30)}" in str(caught.value)


def test_windows_off_the_configured_grid_are_refused() -> None:
    """Windows of the right length that do not start on the grid (shifted by 5 s)."""
    shifted = []
    for key, value in _published(_config()):
        record = orjson.loads(value)
        for end in ("window_start", "window_end"):
            record[end] = iso_utc(epoch_of_iso(record[end]) + 5)
        shifted.append((key, orjson.dumps(record, option=orjson.OPT_SORT_KEYS)))
    assert _refused(_config(), shifted) == [
        f"{q}: window.size_s (the grid): a window starting 5 s after a grid point on the output "
        "topic, windows of 10 s aligned to the Unix epoch in this configuration"
        for q in (
            f"3 windows from {iso_utc(T0 + 5)} to {iso_utc(T0 + 25)}, query all",
            f"3 windows from {iso_utc(T0 + 5)} to {iso_utc(T0 + 25)}, query visits",
        )
    ]


def test_another_epsilon_is_refused_naming_it() -> None:
    records = _published(_config())
    lower = [{**PUBLIC[0], "epsilon": 5e5}, PUBLIC[1]]
    span = f"3 windows from {W0} to {W2}, query visits"
    assert _refused(_config(lower), records) == [
        f"{span}: queries.visits.epsilon: 1000000.0 on the output topic, 500000.0 in this "
        "configuration",
        f"{span}: noise_scale (set by the bounds and the query's ε, δ, mechanism, lower, "
        f"upper, granularity): {_scale(3e-6)} on the output topic, {_scale(6e-6)} in "
        "this configuration",
    ]


def test_another_delta_is_refused_naming_it() -> None:
    records = _published(_config())
    with_delta = [PUBLIC[0], {**PUBLIC[1], "delta": 1e-6}]
    assert _refused(_config(with_delta), records) == [
        f"3 windows from {W0} to {W2}, query all: queries.all.delta: 0.0 on the output topic, "
        "1e-6 in this configuration"
    ]


def test_another_contribution_bound_is_refused_by_the_noise_scale() -> None:
    """k = 3 released, rebuilt with k = 4: the noise scale (L1 / ε) names it."""
    records = _published(_config())
    lines = _refused(_config(bounds={"max_contributions_per_window": 4}), records)
    assert lines == [
        f"3 windows from {W0} to {W2}, query {q}: noise_scale (set by the bounds and the "
        f"query's ε, δ, mechanism, lower, upper, granularity): {_scale(3e-6)} on the "
        f"output topic, {_scale(4e-6)} in this configuration"
        for q in ("all", "visits")
    ]


def test_a_key_bound_the_noise_scale_does_not_show_is_refused_by_the_selection() -> None:
    """Private keys: L0 = 3 (k) released, rebuilt with L0 = 2. The count's L1 stays
    min(k, L0·Linf) = 3, so the scale is the same; the selection's parameters differ."""
    query = [
        {
            "name": "visits",
            "group_by": ["domain"],
            "epsilon": 1e6,
            "delta": 1e-6,
            "selection": "weighted_gaussian",
        }
    ]
    records = _published(_config(query))
    bounds = {"max_contributions_per_window": 3, "max_keys_per_user": 2}
    lines = _refused(_config(query, bounds=bounds), records)
    assert lines and all(
        line.startswith(f"3 windows from {W0} to {W2}, query visits: selection.") for line in lines
    ), lines
    assert any(
        line.startswith(
            f"3 windows from {W0} to {W2}, query visits: selection.max_partitions_contributed "
            "(set by queries.visits.selection, its ε, δ and the bounds): 3 on the output "
            "topic, 2 in this configuration"
        )
        for line in lines
    ), lines


def test_a_query_list_that_did_not_release_the_windows_is_refused() -> None:
    """A query on the output topic the configuration lacks (in the deployment's windows),
    and a configured query on none of its windows."""
    records = _published(_config())
    more = [PUBLIC[0], {"name": "more", "epsilon": 1e6, "keys": {}}]
    assert _refused(_config(more), records) == [
        f"window {W0}, query all: queries: a query 'all' released in 3 of the deployment's "
        "windows on the output topic, no such query in this configuration",
        "query more: queries: no window of it on the output topic, a query 'more' in this "
        "configuration",
    ]


def test_the_releasing_configuration_is_not_refused() -> None:
    """The control of the tests above: their records, rebuilt with the configuration that
    released them."""
    records = _published(_config())
    plan = _plan(_config(), records)
    assert len(plan.restored) == 6 and plan.warnings == []


def test_windows_before_window_start_at_are_an_earlier_deployments_and_left_alone() -> None:
    """A deployment started with window.start_at after an earlier one's windows (the
    documented way to change the window size on a shared output topic): the earlier
    windows, of another size, are neither checked nor restored, and said so."""
    earlier = _published(_config())  # 10-s windows T0 … T0 + 30
    later_events = [rec(i, f"u{i}", 31 + i, "a") for i in range(4)]
    later = _published(_config(size_s=5, start_at=iso_utc(T0 + 30)), later_events)
    plan = _plan(_config(size_s=5, start_at=iso_utc(T0 + 30)), earlier + later)
    assert sorted(plan.restored) == [("all", T0 + 30), ("visits", T0 + 30)]
    assert plan.warnings == [
        f"6 (query, window) releases on dp-releases end at or before window.start_at "
        f"({iso_utc(T0 + 30)}): an earlier deployment's, neither checked nor restored"
    ]
    # the same 5-s windows rebuilt with the earlier deployment's start: refused
    refused = _refused(_config(size_s=5), earlier + later)
    assert refused[0].startswith(f"3 windows from {W0} to {W2}, query all: window.size_s")


def test_every_kind_of_query_released_by_the_configuration_passes_the_check() -> None:
    """No false refusal: private keys (each selection), sums and means (per-key mean
    scales), distinct users, public keys — the plan gives exactly what the records say."""
    queries = [
        {"name": "tg", "group_by": ["domain"], "epsilon": 1e5, "delta": 1e-7},
        {
            "name": "ct",
            "group_by": ["domain"],
            "epsilon": 1e5,
            "delta": 1e-7,
            "selection": "count_threshold",
        },
        {
            "name": "lt",
            "group_by": ["domain"],
            "epsilon": 1e5,
            "delta": 1e-7,
            "selection": "laplace_threshold",
        },
        {"name": "users", "statistic": "count_distinct_users", "epsilon": 1e5, "keys": {}},
        {
            "name": "bytes",
            "statistic": "sum",
            "value_field": "bytes",
            "lower": 0,
            "upper": 100,
            "epsilon": 1e5,
            "keys": {},
        },
        {
            "name": "avg",
            "statistic": "mean",
            "group_by": ["domain"],
            "value_field": "bytes",
            "lower": 0,
            "upper": 100,
            "epsilon": 1e5,
            "keys": {"domain": ["a", "b"]},
        },
    ]
    cfg = _config(queries)
    # 40 users on a, 20 of them also on b: the means' per-key scales differ
    records = _published(cfg, _events(users=40) + _mean_events())
    means = {
        r["noise_scale"]
        for r in map(orjson.loads, (v for _, v in records))
        if r["query"] == "avg" and r["kind"] == "release"
    }
    assert len(means) >= 2
    plan = _plan(cfg, records)
    assert len(plan.restored) == 3 * len(queries) and plan.warnings == []


def test_automatic_bounds_are_checked_against_the_window_records_bounds() -> None:
    """bounds: auto — each window's noise is planned with the bounds its window record
    states; the same configuration passes, fixed bounds are refused naming the change."""
    auto = {"max_contributions_per_window": "auto", "auto": {"epsilon_share": 0.5}}
    query = [{**PUBLIC[0], "epsilon": 5e5}]
    cfg = _config(query, bounds=auto)
    records = _published(cfg, _events(users=40))
    plan = _plan(cfg, records)
    assert len(plan.restored) == 3 and plan.warnings == []
    fixed = _refused(_config(query, bounds={"max_contributions_per_window": 40}), records)
    assert fixed[0] == (
        f"3 windows from {W0} to {W2}, query visits: bounds (auto or fixed): bounds chosen "
        "automatically (the window record states them) on the output topic, fixed bounds "
        "[40, None, None] in this configuration"
    )


def test_a_running_total_query_is_checked_for_its_horizon() -> None:
    query = {
        "name": "running",
        "group_by": ["domain"],
        "keys": {"domain": ["a", "b"]},
        "epsilon": 1e6,
        "release": "cumulative",
        "horizon_windows": 4,
        "continual_mechanism": "tree_honaker",
    }
    records = _published(_config([query]))
    assert len(_plan(_config([query]), records).restored) == 3
    lines = _refused(_config([{**query, "horizon_windows": 8}]), records)
    assert (
        f"3 windows from {W0} to {W2}, query running: queries.running.horizon_windows: 4 on "
        "the output topic, 8 in this configuration"
    ) in lines, lines


MEAN = {
    "name": "avg",
    "statistic": "mean",
    "group_by": ["domain"],
    "value_field": "bytes",
    "lower": 0,
    "upper": 100,
    "epsilon": 1e5,
    "keys": {"domain": ["a", "b"]},
}


def _mean_events() -> list[InputRecord]:
    """40 users on a, 20 of them also on b, in each of three windows (values 0 … 39)."""
    events = [rec(u, f"u{u}", 10 * w + 1, "a", bytes=u) for w in range(3) for u in range(40)]
    events += [rec(100 + u, f"u{u}", 10 * w + 2, "b", bytes=u) for w in range(3) for u in range(20)]
    return events


def test_a_means_scale_from_other_bounds_is_refused() -> None:
    """A mean's per-key scale is the sum's scale over the key's noisy count (40 on a, 20 on
    b): released with k = 3, the scale under k = 4 divided by no whole count gives it."""
    records = _published(_config([MEAN]), _mean_events())
    lines = _refused(_config([MEAN], bounds={"max_contributions_per_window": 4}), records)
    field = (
        "noise_scale (set by the bounds and the query's ε, δ, mechanism, lower, upper, granularity)"
    )
    assert [line.split(": ")[:2] for line in lines] == [
        [f"3 windows from {W0} to {W2}, query avg", field]
    ] * len(lines)
    assert all(line.endswith("over a whole noisy count in this configuration") for line in lines)


def test_a_mean_outside_the_configured_range_is_refused() -> None:
    """upper 100 released (means 19.5 on a and 9.5 on b), rebuilt with upper 10: the mean
    of a lies above the range. (The sum's scale is a tenth, and a's per-key scale over 40
    users is that scale over a count of 4: a mean's records alone cannot tell them apart;
    only the float division's last bit may differ, so that line is not asserted.)"""
    records = _published(_config([MEAN]), _mean_events())
    lines = _refused(_config([{**MEAN, "upper": 10}]), records)
    assert (
        f"3 windows from {W0} to {W2}, query avg: queries.avg.lower / upper (a mean lies "
        "within them): 19.5 on the output topic, [0.0, 10.0] in this configuration"
    ) in lines, lines
    assert all(
        line.startswith(f"3 windows from {W0} to {W2}, query avg: noise_scale (")
        for line in lines
        if "lower / upper" not in line
    ), lines


VARIANCE = {**MEAN, "name": "spread", "statistic": "variance"}


def test_a_variance_is_checked_like_a_mean_for_its_scale_and_range() -> None:
    """A variance's per-key scale is its squares' scale over the key's noisy count, and its
    value lies in [0, ((upper − lower)/2)²]: the releasing configuration passes; k = 4
    (another scale) and upper 10 (variances of 0 … 39 and 0 … 19, 133.25 and 33.25, lie above
    5² = 25) are
    refused, naming the field."""
    records = _published(_config([VARIANCE]), _mean_events())
    plan = _plan(_config([VARIANCE]), records)
    assert len(plan.restored) == 3 and plan.warnings == []
    lines = _refused(_config([VARIANCE], bounds={"max_contributions_per_window": 4}), records)
    assert lines and all("query spread: noise_scale (" in line for line in lines), lines
    lines = _refused(_config([{**VARIANCE, "upper": 10}]), records)
    ranged = [line for line in lines if "lower / upper" in line]
    assert ranged, lines
    head = "query spread: queries.spread.lower / upper (a variance lies within them): "
    for line in ranged:  # one line per window or a span of windows with one value (two
        # windows whose noisy variances round alike share a line)
        assert re.match(r"(window |[23] windows )", line) and head in line, line
        assert line.endswith(" on the output topic, [0.0, 25.0] in this configuration"), line
        released = float(line.split(head)[1].split(" ")[0])
        assert released > 25.0  # 133.25 on a, 33.25 on b (noise at ε = 1e5 is tiny)


def test_a_quantile_is_checked_against_the_exponential_mechanism_its_records_name() -> None:
    """A quantile's records name the exponential mechanism (its own; the query's
    ``mechanism`` is the additive noise it does not use): the releasing configuration passes,
    and so do records of the version before, which named the query's mechanism there; any
    other mechanism is refused, naming what the configuration releases."""
    quantile = {
        "name": "lat",
        "statistic": "quantile",
        "value_field": "bytes",
        "lower": 0,
        "upper": 100,
        "quantiles": [0.5, 0.9],
        "bins": 10,
        "epsilon": 10.0,
        "keys": {},
    }
    cfg = _config([quantile])
    records = _published(cfg)
    released = [orjson.loads(v) for _, v in records if b'"kind":"release"' in v]
    assert released and {r["mechanism"] for r in released} == {"exponential"}

    def restated(mechanism: str) -> list[RawRecord]:
        return [
            (k, v.replace(b'"mechanism":"exponential"', f'"mechanism":"{mechanism}"'.encode()))
            for k, v in records
        ]

    for accepted in (records, restated("discrete_laplace")):
        plan = _plan(cfg, accepted)
        assert len(plan.restored) == 3 and plan.warnings == []
    lines = _refused(cfg, restated("discrete_gaussian"))
    assert lines == [
        "3 windows from 2020-08-01T00:00:00Z to 2020-08-01T00:00:20Z, query lat: "
        'queries.lat.mechanism: "discrete_gaussian" on the output topic, "exponential" in this '
        "configuration"
    ]
