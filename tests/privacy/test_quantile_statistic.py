"""``statistic: quantile`` through the registry (issue 40): the configuration, the plan's
exact calibration (the QuantilePlan the planner builds is the mechanism's with the noise ε,
L0 and Linf the bounding enforces), stage 1's histogram of kept values, the partials item,
releases through :func:`release_query` (monotone, each naming its quantile), the plan's rank
error checked empirically, and an empirical privacy test at the statistic level that
detects a doubled ε or an L0 left out of ε/(L0·Q).

Every statistical test states its false-failure probability; each is at most 1e-7 (exact
binomial tails), so the file fails by chance with probability below 1e-6.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import orjson
import pytest
from pydantic import ValidationError
from scipy.stats import binomtest

from stream_dp.config import BoundsConfig, QueryConfig
from stream_dp.errors import ConfigError
from stream_dp.pipeline.formats.partials import (
    Partial,
    PartialPart,
    decode,
    encode_partial,
    new_version,
)
from stream_dp.privacy.bounding import bounded_columns
from stream_dp.privacy.exponential.quantiles import QuantilePlan, alpha_fraction
from stream_dp.privacy.key_totals import KeyTotals
from stream_dp.privacy.planner import QueryPlan, plan_query
from stream_dp.privacy.release import release_query
from stream_dp.privacy.statistics.quantile import histogram_binning
from tests.helpers import schema_validator

P_FALSE = 1e-7
ROOT = Path(__file__).resolve().parents[2]


def _config(keys: int | None = 1, **kw: Any) -> QueryConfig:
    base: dict[str, Any] = {
        "name": "q",
        "statistic": "quantile",
        "group_by": ["slot"],
        "value_field": "x",
        "lower": 0.0,
        "upper": 10.0,
        "quantiles": [0.5],
        "bins": 10,
        "epsilon": 1.0,
        "keys": {"slot": list(range(keys))} if keys is not None else "private",
    }
    if keys is None:
        base["delta"] = 1e-6
    base.update(kw)
    return QueryConfig(**base)


def _plan(bounds: BoundsConfig, keys: int | None = 1, **kw: Any) -> QueryPlan:
    return plan_query(_config(keys, **kw).spec(), bounds.spec())


def _totals(histograms: np.ndarray) -> KeyTotals:
    """Keys 0 … n − 1 with these histograms (rows)."""
    n = len(histograms)
    events = histograms.sum(axis=1)
    zeros = np.zeros(n, dtype=np.int64)
    return KeyTotals([(i,) for i in range(n)], events, events, zeros, value_bins=histograms)


# ------------------------------------------------------------------ configuration


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"quantiles": None}, "needs quantiles, a list strictly increasing in (0, 1)"),
        ({"quantiles": [0.9, 0.5]}, "needs quantiles, a list strictly increasing in (0, 1)"),
        ({"quantiles": [0.5, 0.5]}, "needs quantiles, a list strictly increasing in (0, 1)"),
        ({"quantiles": [0.0, 0.5]}, "needs quantiles, a list strictly increasing in (0, 1)"),
        ({"quantiles": [0.5, 1.0]}, "needs quantiles, a list strictly increasing in (0, 1)"),
        ({"mechanism": "discrete_gaussian", "delta": 1e-6}, "remove mechanism: discrete_gaus"),
        ({"statistic": "sum"}, "quantiles is only used by statistic quantile; remove it"),
        (
            {"release": "cumulative", "horizon_windows": 24},
            "cumulative quantiles are not supported; use release: window",
        ),
    ],
)
def test_bad_quantile_settings_are_refused_at_load(change: dict[str, Any], says: str) -> None:
    with pytest.raises(ValidationError) as info:
        _config(**change)
    assert says in str(info.value)


def test_bins_default_to_1024_and_are_bounded() -> None:
    config = _config(bins=1024)
    del_bins = config.model_dump()
    del_bins.pop("bins")
    assert QueryConfig(**del_bins).bins == 1024
    with pytest.raises(ValidationError):
        _config(bins=0)
    with pytest.raises(ValidationError):
        _config(bins=(1 << 16) + 1)


# ------------------------------------------------------------------ calibration (exact)


@pytest.mark.parametrize(
    ("k", "l0", "linf", "want_l0", "want_linf"),
    [(1, None, None, 1, 1), (5, 2, 3, 2, 3), (4, None, 2, 4, 2), (3, 7, 9, 3, 3)],
)
def test_the_plan_is_the_mechanisms_with_the_enforced_bounds(
    k: int, l0: int | None, linf: int | None, want_l0: int, want_linf: int
) -> None:
    """Public keys: the whole ε to the exponential mechanism, with L0 and Linf as the
    bounding enforces them (k when unset, at most k): ε/(L0·Q) per draw, b_α = 2Δ_α/ε_q."""
    bounds = BoundsConfig(
        max_contributions_per_window=k, max_keys_per_user=l0, max_contributions_per_key=linf
    )
    plan = _plan(bounds, quantiles=[0.5, 0.9, 0.99], epsilon=1.5)
    want = QuantilePlan(
        lower=0.0,
        upper=10.0,
        bins=10,
        quantiles=(0.5, 0.9, 0.99),
        epsilon=1.5,
        max_partitions_contributed=want_l0,
        max_contributions_per_partition=want_linf,
    )
    assert plan.quantile == want
    assert plan.quantile.epsilon_per_quantile == 1.5 / (want_l0 * 3)
    for alpha in (0.5, 0.9, 0.99):
        num, den = alpha_fraction(alpha)
        assert plan.quantile.scale(alpha) == 2 * want_linf * max(num, den - num) * want_l0 * 3 / 1.5
    assert plan.noise == ()
    assert [(c.part, c.epsilon, c.delta) for c in plan.charges] == [
        ("exponential:quantiles", 1.5, 0.0),
        ("unused", 0.0, 0.0),
    ][: 1 if plan.delta_unused == 0 else 2]
    assert plan.noise_scale == max(plan.quantile.rank_scale(a) for a in (0.5, 0.9, 0.99))
    assert plan.ci95 == plan.quantile.rank_error(0.05)


def test_private_keys_share_epsilon_with_partition_selection() -> None:
    """Private keys: the selection gets its share of ε and δ as for any query; the
    exponential mechanism the rest (pure ε)."""
    plan = _plan(BoundsConfig(max_contributions_per_window=2), keys=None, epsilon=1.0)
    assert plan.selection is not None
    assert plan.quantile is not None
    assert plan.quantile.epsilon == pytest.approx(1.0 - plan.selection_epsilon)
    assert plan.selection_epsilon == pytest.approx(0.5)
    assert math.fsum(c.epsilon for c in plan.charges) == pytest.approx(1.0)
    with pytest.raises(ConfigError, match="count_threshold"):
        _plan(
            BoundsConfig(max_contributions_per_window=2),
            keys=None,
            selection="count_threshold",
        )


def test_the_plan_describes_the_rank_error() -> None:
    described = _plan(BoundsConfig(max_contributions_per_window=1)).describe()
    figure = described["quantile"]
    assert described["noise"] == []
    assert figure["quantiles"] == [0.5] and figure["bins"] == 10
    assert figure["rank_error"]["beta"] == 0.05
    # rank scale 2·Linf·max(α, 1 − α)·L0·Q/ε = 1 rank; E = 1 · ln(B·Q/β)
    assert figure["rank_error"]["ranks"] == pytest.approx(math.log(10 * 1 / 0.05))


def test_the_plan_names_the_exponential_mechanism_and_ranks_as_its_unit() -> None:
    """``plan`` states what the records state: a quantile's mechanism is the exponential
    mechanism (not the query's additive ``mechanism``), its noise scale and 95% interval are
    in ranks; a count's plan keeps its mechanism and has no unit field."""
    schema = orjson.loads((ROOT / "stream_dp" / "privacy" / "plan.schema.json").read_bytes())
    query_schema = jsonschema.Draft202012Validator(
        {"$ref": "#/$defs/query", "$defs": schema["$defs"]}
    )
    described = _plan(BoundsConfig(max_contributions_per_window=1)).describe()
    query_schema.validate(described)
    assert (described["mechanism"], described["ci95_unit"]) == ("exponential", "ranks")
    count = QueryConfig(name="c", group_by=["slot"], keys={"slot": [0]}, epsilon=1.0)
    counted = plan_query(count.spec(), BoundsConfig(max_contributions_per_window=1).spec())
    query_schema.validate(counted.describe())
    assert counted.describe()["mechanism"] == "discrete_laplace"
    assert "ci95_unit" not in counted.describe()


# ------------------------------------------------------------------ stage 1 and partials


def test_stage1_counts_only_kept_values_per_bin() -> None:
    """One user with 5 values in one key, Linf = 2: 2 values in the histogram, each in
    its bin (values in units of 0.01: 150 → 1.5 → bin 1; 990 → 9.9 → bin 9)."""
    spec = _config(granularity=0.01).spec()
    binning = histogram_binning(spec)
    assert binning is not None and binning[0] == 10
    users = np.array([0, 0, 0, 0, 0, 1], dtype=np.int64)
    keys = np.zeros(6, dtype=np.int64)
    values = np.array([150, 150, 150, 150, 150, 990], dtype=np.int64)
    found = bounded_columns(
        users,
        keys,
        values,
        n_keys=1,
        max_keys=None,
        max_per_key=2,
        rng=np.random.default_rng(1),
        bin_of=binning,
    )
    assert found.value_bins.tolist() == [[0, 2, 0, 0, 0, 0, 0, 0, 0, 1]]
    assert found.events.tolist() == [3]
    assert histogram_binning(_config(statistic="sum", quantiles=None).spec()) is None


def test_the_histogram_survives_the_partials_format() -> None:
    hist = np.array([[1, 0, 2], [0, 0, 5]], dtype=np.int64)
    totals = KeyTotals([("a",), ("b",)], [3, 5], [3, 5], [0, 0], value_bins=hist)
    partial = Partial(
        query="q",
        window_start_s=0,
        source_partition=0,
        version=new_version(),
        totals=totals,
        events_seen=8,
        events_retained=8,
    )
    records = encode_partial(partial, max_bytes=1 << 20)
    validator = schema_validator("partials.schema.json")
    for _, value in records:
        validator.validate(orjson.loads(value))
        columns = orjson.loads(value)["columns"]
        assert (columns["bins"], columns["bin_sizes"]) == (3, [2, 1])
        assert (columns["bin_index"], columns["bin_counts"]) == ([0, 2, 2], [1, 2, 5])
    (decoded,) = [decode(value) for _, value in records]
    assert isinstance(decoded, PartialPart)
    back = KeyTotals.of(dict(decoded.totals))
    assert back.value_bins.tolist() == hist.tolist()
    merged = KeyTotals.merge([totals, back])
    assert merged.value_bins.tolist() == (2 * hist).tolist()


# ------------------------------------------------------------------ release


def test_released_quantiles_are_monotone_and_name_their_quantile() -> None:
    """Two close α's at small ε: unsorted draws would cross often; each key's list is
    ordered by α, its values non-decreasing bin edges in [lower, upper]."""
    plan = _plan(
        BoundsConfig(max_contributions_per_window=1),
        keys=2_000,
        quantiles=[0.5, 0.51],
        epsilon=0.05,
    )
    hist = np.tile(np.arange(1, 11, dtype=np.int64), (2_000, 1))
    released = release_query(_totals(hist), plan).values
    assert len(released) == 2_000
    crossed = 0
    for v in released:
        assert [q["quantile"] for q in v.value] == [0.5, 0.51]
        low, high = (q["value"] for q in v.value)
        assert 0.0 <= low <= high <= 10.0
        assert low * 1 == int(low)  # an edge of 10 bins over [0, 10)
        crossed += low < high
    assert crossed > 0


def test_the_plans_rank_error_holds_at_its_confidence() -> None:
    """20,000 keys with one histogram (200 values in 20 bins, Q = 3): the share of keys
    where some released quantile is further than max_α OPT_α + the plan's rank error (β =
    0.05) from its target rank is ≤ β (one-sided exact binomial test, false failure
    ≤ 1e-7). The plan's figure is the one checked: ``plan.describe()``'s."""
    plan = _plan(
        BoundsConfig(max_contributions_per_window=1),
        keys=20_000,
        quantiles=[0.5, 0.9, 0.99],
        bins=20,
        upper=20.0,
    )
    shape = np.linspace(1.0, 3.0, 20) ** 3
    hist = np.random.default_rng(40).multinomial(200, shape / shape.sum())
    bound = plan.describe()["quantile"]["rank_error"]["ranks"]
    released = release_query(_totals(np.tile(hist, (20_000, 1))), plan).values
    below = np.concatenate([[0], np.cumsum(hist)])
    targets = [200 * a for a in (0.5, 0.9, 0.99)]
    best = max(float(np.abs(below - t).min()) for t in targets)
    failures = 0
    for v in released:
        ranks = [below[int(q["value"])] for q in v.value]  # edge j has value j here
        failures += max(abs(r - t) for r, t in zip(ranks, targets, strict=True)) > best + bound
    assert binomtest(failures, 20_000, 0.05, alternative="greater").pvalue > P_FALSE


# ------------------------------------------------------------------ empirical privacy


def _in_event(plan: QueryPlan, keys: int) -> tuple[int, int]:
    """Neighbours for the median over 10 bins (as the mechanism's test): D has 5 values in
    bin 0, 1 in bin 8 and 4 in bin 9; D' adds one user's value in bin 9. S = {edge 9}.
    Every key of the release holds D (or D'): (releases of D' in S, releases of D in S)."""
    d = np.zeros(10, dtype=np.int64)
    d[0], d[8], d[9] = 5, 1, 4
    d_prime = d.copy()
    d_prime[9] += 1
    counts = []
    for h in (d_prime, d):
        released = release_query(_totals(np.tile(h, (keys, 1))), plan).values
        counts.append(sum(v.value[0]["value"] == 9.0 for v in released))
    return counts[0], counts[1]


def test_empirical_privacy_through_the_registry_detects_a_doubled_epsilon() -> None:
    """ε = 2 with L0 = 2 (k = 2, Q = 1): each draw must be (ε/L0 = 1)-DP, so the share of
    S-releases from D' is Binomial(n, π) with π ≤ e/(1 + e) (one-sided exact binomial test
    at 1e-7). The planned mechanism's exact share is 0.717; a wiring that doubled ε (or left
    L0 out of ε/(L0·Q)) gives 0.870, ≈ 20 standard deviations above 0.731 over ≈ 5,000
    releases in S (miss probability ≪ 1e-12) — the second half shows the test sees it."""
    keys = 40_000
    pi0 = math.e / (1 + math.e)
    bounds = BoundsConfig(max_contributions_per_window=2, max_contributions_per_key=1)
    plan = _plan(bounds, keys=keys, epsilon=2.0)
    x, y = _in_event(plan, keys)
    assert binomtest(x, x + y, pi0, alternative="greater").pvalue > P_FALSE
    doubled = _plan(bounds, keys=keys, epsilon=4.0)
    x, y = _in_event(doubled, keys)
    assert binomtest(x, x + y, pi0, alternative="greater").pvalue < P_FALSE
