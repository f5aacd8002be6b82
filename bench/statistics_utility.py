"""Variance, percentiles and top-k against PipelineDP at equal ε, δ and bounds (issue 40).

``python -m bench.statistics_utility [--smoke] [--out RUN.json] [--write] [--render]``:
``--write`` keeps the run in ``bench/statistics_utility.json`` and writes its section of
RESULTS.md; ``--render`` writes the section from what is kept; ``--smoke`` is a small run
(its test: tests/bench/test_statistics_utility.py). ``bench.run`` does not rerun it;
``bench.report`` renders the kept run.

Data (:func:`dataset`, seed :data:`SEED`): users with Geometric(1/5) events each (at least 1,
mean 5), each event a ``category`` (Zipf(1) over :data:`CATEGORIES` values), a ``domain``
(Zipf(1.1) over :data:`DOMAINS` values: a long tail) and a log-normal ``value`` (median
e^2.5 ≈ 12, clamped to [:data:`LOWER`, :data:`UPPER`]). Each query's rows are bounded once,
seeded, before either library sees them (:func:`bound_rows`: at most L0 keys per user, at
most Linf events per user and key), so both get the same rows and the same sensitivity; the
truth is the exact statistic of those bounded rows. Each library then redraws its noise in
each of ``runs`` repetitions.

1. **Variance** by ``category`` (public keys): stream-dp's ``plan_query`` and
   ``release_query`` for ``statistic: variance`` (a noisy count, a noisy sum and a noisy sum
   of centred squares, discrete Laplace, ε in thirds) against PipelineDP's
   ``Metrics.VARIANCE`` (the same three sums, continuous Laplace, but its squares bounded by
   [0, max(lower², upper²)] rather than centred), public partitions, ε each, δ = 0.
2. **Percentiles** 50, 90, 99 by ``category`` (public keys): stream-dp's
   :func:`~stream_dp.privacy.exponential.quantiles.release_quantile_rows` (the exponential
   mechanism over the B + 1 edges of a :data:`BINS`-bin histogram, ε/(L0·3) per quantile)
   against PipelineDP's ``Metrics.PERCENTILE`` (Google's quantile tree), ε each, δ = 0.
   Rank error |F(estimate) − p| (F the empirical distribution of the key's bounded values)
   and absolute error |estimate − exact percentile|.
3. **Top-k** by ``domain`` (private keys), N = :data:`TOP_N`: stream-dp's ``top_k: N`` on a
   count (``plan_query``/``release_query``: half of ε chooses the keys by the exponential
   mechanism, the other half is partition selection and noise as without top_k) against a
   PipelineDP pipeline — ``DPEngine.aggregate`` with ``COUNT``, truncated-geometric partition
   selection, then the N largest noisy counts. (ε, δ) the same in total. Recall: the share of
   the true top N (by bounded count) released.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.sections import splice_section
from stream_dp.config import BoundsConfig, QueryConfig
from stream_dp.privacy.exponential.quantiles import QuantilePlan, release_quantile_rows
from stream_dp.privacy.key_totals import KeyAggregate
from stream_dp.privacy.planner import QueryPlan, plan_query
from stream_dp.privacy.release import release_query
from stream_dp.privacy.statistics.variance import center_units

SEED = 20_261_202
EPSILON = 1.0
#: δ of the top-k queries (partition selection); the public-key queries are pure ε.
DELTA = 1e-6
#: L0 (keys per user) and Linf (events per user and key), the same on both sides.
MAX_KEYS_PER_USER = 2
MAX_CONTRIBUTIONS_PER_KEY = 3
LOWER, UPPER, GRANULARITY = 0.0, 100.0, 0.01
#: stream-dp's histogram for the percentiles: bins of width 0.1 over [0, 100).
BINS = 1000
PERCENTILES = (50, 90, 99)
CATEGORIES = 8
DOMAINS = 3000
TOP_N = 10
SIZES: dict[str, dict[str, int]] = {
    "full": {"users": 20_000, "runs": 20},
    "smoke": {"users": 1_500, "runs": 2},
}
RESULTS_FILE = Path(__file__).resolve().parent / "statistics_utility.json"
RESULTS_MD = Path(__file__).resolve().parent / "RESULTS.md"
TITLE = "## 13. Variance, percentiles and top-k against PipelineDP (issue 40)"
LIBRARIES = ("stream-dp", "pipeline_dp")

Row = tuple[str, str, float]  # (user, key, value)


def _zipf_choices(rng: np.random.Generator, keys: int, s: float, size: int) -> np.ndarray:
    weights = 1 / np.arange(1, keys + 1) ** s
    return rng.choice(keys, size=size, p=weights / weights.sum())


def dataset(users: int, seed: int = SEED) -> list[dict[str, Any]]:
    """The synthetic events (see the module docstring), the same for a given seed."""
    rng = np.random.default_rng(seed)
    per_user = rng.geometric(1 / 5, size=users)  # ≥ 1, mean 5
    total = int(per_user.sum())
    category = _zipf_choices(rng, CATEGORIES, 1.0, total)
    domain = _zipf_choices(rng, DOMAINS, 1.1, total)
    value = np.clip(rng.lognormal(2.5, 0.8, size=total), LOWER, UPPER)
    owner = np.repeat(np.arange(users), per_user)
    return [
        {"user": f"u{u}", "category": f"c{c}", "domain": f"d{d}", "value": round(float(v), 2)}
        for u, c, d, v in zip(
            owner.tolist(), category.tolist(), domain.tolist(), value.tolist(), strict=True
        )
    ]


def bound_rows(events: Sequence[dict[str, Any]], field: str, seed: int = SEED) -> list[Row]:
    """Each user's events on at most L0 of its ``field`` values (chosen at random) and at
    most Linf events per value (the first): rows that satisfy both libraries' bounds."""
    rng = np.random.default_rng(seed)
    by_user: dict[str, dict[str, list[float]]] = {}
    for e in events:
        by_user.setdefault(e["user"], {}).setdefault(e[field], []).append(e["value"])
    rows: list[Row] = []
    for user, per_key in by_user.items():
        keys = sorted(per_key)
        if len(keys) > MAX_KEYS_PER_USER:
            picked = rng.choice(len(keys), size=MAX_KEYS_PER_USER, replace=False)
            keys = [keys[i] for i in sorted(picked.tolist())]
        for key in keys:
            rows += [(user, key, v) for v in per_key[key][:MAX_CONTRIBUTIONS_PER_KEY]]
    return rows


def _standard_error(xs: Sequence[float]) -> float:
    """The standard error of the mean of ``xs`` (0 for fewer than two)."""
    return statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else 0.0


def _values_by_key(rows: Sequence[Row]) -> dict[str, np.ndarray]:
    out: dict[str, list[float]] = {}
    for _, key, value in rows:
        out.setdefault(key, []).append(value)
    return {k: np.sort(np.asarray(v, dtype=float)) for k, v in sorted(out.items())}


def _bounds() -> Any:
    return BoundsConfig(
        max_contributions_per_window=MAX_KEYS_PER_USER * MAX_CONTRIBUTIONS_PER_KEY,
        max_keys_per_user=MAX_KEYS_PER_USER,
        max_contributions_per_key=MAX_CONTRIBUTIONS_PER_KEY,
    ).spec()


def _pipeline_dp(
    rows: Sequence[Row],
    metrics: list[Any],
    *,
    delta: float = 0.0,
    public: Sequence[str] | None = None,
) -> dict[str, Any]:
    """One PipelineDP aggregation of ``rows`` (LocalBackend, Laplace, L0/Linf bounds)."""
    import pipeline_dp

    accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=EPSILON, total_delta=delta)
    engine = pipeline_dp.DPEngine(accountant, pipeline_dp.LocalBackend())
    params = pipeline_dp.AggregateParams(
        metrics=metrics,
        noise_kind=pipeline_dp.NoiseKind.LAPLACE,
        max_partitions_contributed=MAX_KEYS_PER_USER,
        max_contributions_per_partition=MAX_CONTRIBUTIONS_PER_KEY,
        min_value=LOWER,
        max_value=UPPER,
        partition_selection_strategy=pipeline_dp.PartitionSelectionStrategy.TRUNCATED_GEOMETRIC,
    )
    extractors = pipeline_dp.DataExtractors(
        privacy_id_extractor=lambda r: r[0],
        partition_extractor=lambda r: r[1],
        value_extractor=lambda r: r[2],
    )
    result = engine.aggregate(
        rows, params, extractors, public_partitions=None if public is None else list(public)
    )
    accountant.compute_budgets()
    return dict(result)


# ------------------------------------------------------------------ 1. variance


def variance_plan(keys: Sequence[str]) -> QueryPlan:
    query = QueryConfig(
        name="value_variance",
        statistic="variance",
        group_by=["category"],
        value_field="value",
        lower=LOWER,
        upper=UPPER,
        granularity=GRANULARITY,
        epsilon=EPSILON,
        keys={"category": list(keys)},
    )
    return plan_query(query.spec(), _bounds())


def variance_aggregates(rows: Sequence[Row]) -> dict[tuple[str, ...], KeyAggregate]:
    """The exact totals stage 1 keeps for a variance: count, users, Σ units, Σ centred²."""
    center, _ = center_units(LOWER, UPPER, GRANULARITY)
    users: dict[str, set[str]] = {}
    for user, key, _ in rows:
        users.setdefault(key, set()).add(user)
    out: dict[tuple[str, ...], KeyAggregate] = {}
    for key, values in _values_by_key(rows).items():
        units = np.rint(values / GRANULARITY).astype(np.int64)
        out[(key,)] = KeyAggregate(
            events=len(units),
            users=len(users[key]),
            value_sum=int(units.sum()),
            value_squares=int(((units - center) ** 2).sum()),
        )
    return out


def measure_variance(events: Sequence[dict[str, Any]], runs: int) -> dict[str, Any]:
    import pipeline_dp

    rows = bound_rows(events, "category")
    values = _values_by_key(rows)
    truth = {k: float(np.var(v)) for k, v in values.items()}
    plan = variance_plan(list(values))
    aggregates = variance_aggregates(rows)
    errors: dict[str, list[float]] = {name: [] for name in LIBRARIES}
    relative: dict[str, list[float]] = {name: [] for name in LIBRARIES}
    outside = {name: 0 for name in LIBRARIES}

    def score(name: str, key: str, estimate: float) -> None:
        outside[name] += not 0 <= estimate <= ((UPPER - LOWER) / 2) ** 2
        errors[name].append(abs(estimate - truth[key]))
        relative[name].append(abs(estimate - truth[key]) / truth[key])

    for _ in range(runs):
        for v in release_query(aggregates, plan).values:
            score("stream-dp", v.group[0], float(v.value))
        got = _pipeline_dp(rows, [pipeline_dp.Metrics.VARIANCE], public=list(values))
        for key, metrics in got.items():
            score("pipeline_dp", key, float(metrics.variance))
    return {
        "keys": len(values),
        "rows": len(rows),
        "events_per_key": {k: len(v) for k, v in values.items()},
        "true_variance": truth,
        # what one value moves the noised sum of squares by (real units): PipelineDP's half
        # of [0, max(lower², upper²)], stream-dp's half of the centred squares' [0, D²]
        "squares_sensitivity_per_value": {
            "stream-dp": ((UPPER - LOWER) / 2) ** 2 / 2,
            "pipeline_dp": max(LOWER**2, UPPER**2) / 2,
        },
        **{
            name: {
                "mae": statistics.fmean(errors[name]),
                "mae_se": _standard_error(errors[name]),
                "relative_error": statistics.fmean(relative[name]),
                "median_relative_error": statistics.median(relative[name]),
                "outside_range_share": outside[name] / len(errors[name]),
                "estimates": len(errors[name]),
            }
            for name in LIBRARIES
        },
    }


# ------------------------------------------------------------------ 2. percentiles


def quantile_plan() -> QuantilePlan:
    return QuantilePlan(
        lower=LOWER,
        upper=UPPER,
        bins=BINS,
        quantiles=tuple(p / 100 for p in PERCENTILES),
        epsilon=EPSILON,
        max_partitions_contributed=MAX_KEYS_PER_USER,
        max_contributions_per_partition=MAX_CONTRIBUTIONS_PER_KEY,
    )


def _rank_error(sorted_values: np.ndarray, estimate: float, alpha: float) -> float:
    """|F(estimate) − α|, F the share of values at or below the estimate (the midpoint of
    the share strictly below and at or below, for ties)."""
    below = np.searchsorted(sorted_values, estimate, side="left")
    at_or_below = np.searchsorted(sorted_values, estimate, side="right")
    return float(abs((below + at_or_below) / 2 / len(sorted_values) - alpha))


def measure_percentiles(events: Sequence[dict[str, Any]], runs: int) -> dict[str, Any]:
    import pipeline_dp

    rows = bound_rows(events, "category")
    values = _values_by_key(rows)
    keys = list(values)
    plan = quantile_plan()
    edges = np.asarray(plan.edges())
    histograms = np.zeros((len(keys), BINS), dtype=np.int64)
    for i, key in enumerate(keys):
        for value in values[key].tolist():
            histograms[i, plan.bin_index(value)] += 1
    exact = {
        k: [float(np.quantile(v, p / 100, method="inverted_cdf")) for p in PERCENTILES]
        for k, v in values.items()
    }
    empty: Callable[[], dict[int, list[float]]] = lambda: {p: [] for p in PERCENTILES}  # noqa: E731
    rank = {name: empty() for name in LIBRARIES}
    absolute = {name: empty() for name in LIBRARIES}
    monotone = {name: 0 for name in LIBRARIES}

    def score(name: str, key: str, estimates: list[float]) -> None:
        monotone[name] += all(a <= b for a, b in itertools.pairwise(estimates))
        for p, estimate, true in zip(PERCENTILES, estimates, exact[key], strict=True):
            rank[name][p].append(_rank_error(values[key], estimate, p / 100))
            absolute[name][p].append(abs(estimate - true))

    metrics = [pipeline_dp.Metrics.PERCENTILE(p) for p in PERCENTILES]
    for _ in range(runs):
        chosen = release_quantile_rows(histograms, plan)
        for i, key in enumerate(keys):
            score("stream-dp", key, [float(edges[j]) for j in chosen[i].tolist()])
        for key, got in _pipeline_dp(rows, metrics, public=keys).items():
            score("pipeline_dp", key, [float(getattr(got, f"percentile_{p}")) for p in PERCENTILES])
    return {
        "keys": len(keys),
        "rows": len(rows),
        "events_per_key": {k: len(v) for k, v in values.items()},
        "exact": exact,
        "stream_dp_rank_error_95_bound": plan.rank_error(0.05),
        **{
            name: {
                "rank_error": {str(p): statistics.fmean(rank[name][p]) for p in PERCENTILES},
                "abs_error": {str(p): statistics.fmean(absolute[name][p]) for p in PERCENTILES},
                "monotone_share": monotone[name] / (runs * len(keys)),
                "estimates": len(rank[name][PERCENTILES[0]]),
            }
            for name in LIBRARIES
        },
    }


# ------------------------------------------------------------------ 3. top-k recall


def top_k_plan() -> QueryPlan:
    query = QueryConfig(
        name="top_domains",
        statistic="count",
        group_by=["domain"],
        epsilon=EPSILON,
        delta=DELTA,
        top_k=TOP_N,
    )
    return plan_query(query.spec(), _bounds())


def measure_top_k(events: Sequence[dict[str, Any]], runs: int) -> dict[str, Any]:
    import pipeline_dp

    rows = bound_rows(events, "domain")
    counts: dict[str, int] = {}
    users: dict[str, set[str]] = {}
    for user, key, _ in rows:
        counts[key] = counts.get(key, 0) + 1
        users.setdefault(key, set()).add(user)
    ranked = sorted(counts, key=lambda k: (-counts[k], k))
    true_top = set(ranked[:TOP_N])
    aggregates = {
        (k,): KeyAggregate(events=n, users=len(users[k]), value_sum=0) for k, n in counts.items()
    }
    plan = top_k_plan()
    recall: dict[str, list[float]] = {name: [] for name in LIBRARIES}
    released: dict[str, list[int]] = {name: [] for name in LIBRARIES}
    for _ in range(runs):
        chosen = {v.group[0] for v in release_query(aggregates, plan).values}
        recall["stream-dp"].append(len(chosen & true_top) / TOP_N)
        released["stream-dp"].append(len(chosen))
        got = _pipeline_dp(rows, [pipeline_dp.Metrics.COUNT], delta=DELTA)
        largest = sorted(got, key=lambda k: -float(got[k].count))[:TOP_N]
        recall["pipeline_dp"].append(len(set(largest) & true_top) / TOP_N)
        released["pipeline_dp"].append(len(largest))
    return {
        "keys": len(counts),
        "rows": len(rows),
        "top_n": TOP_N,
        "true_counts": [counts[k] for k in ranked[: TOP_N + 5]],
        # the noise each ranks the keys with: stream-dp's Gumbel scale b = N·Linf/ε_sel (the
        # peeling exponential mechanism), PipelineDP's Laplace scale L0·Linf/(ε/2) on every
        # count (its accountant halves ε between selection and the count)
        "ranking_noise_scale": {
            "stream-dp": plan.top_k.scale if plan.top_k is not None else math.nan,
            "pipeline_dp": MAX_KEYS_PER_USER * MAX_CONTRIBUTIONS_PER_KEY / (EPSILON / 2),
        },
        **{
            name: {
                "recall": statistics.fmean(recall[name]),
                "recall_se": _standard_error(recall[name]),
                "recall_min": min(recall[name]),
                "released": statistics.fmean(released[name]),
            }
            for name in LIBRARIES
        },
    }


# ------------------------------------------------------------------ run and section


def measure(users: int, runs: int, log: Callable[[str], None] = print) -> dict[str, Any]:
    events = dataset(users)
    out: dict[str, Any] = {
        "seed": SEED,
        "users": users,
        "events": len(events),
        "runs": runs,
        "epsilon": EPSILON,
        "delta": DELTA,
        "max_keys_per_user": MAX_KEYS_PER_USER,
        "max_contributions_per_key": MAX_CONTRIBUTIONS_PER_KEY,
        "lower": LOWER,
        "upper": UPPER,
        "bins": BINS,
    }
    for name, run in (
        ("variance", measure_variance),
        ("percentiles", measure_percentiles),
        ("top_k", measure_top_k),
    ):
        start = time.perf_counter()
        out[name] = run(events, runs)
        log(f"[statistics_utility] {name}: {time.perf_counter() - start:.1f} s")
    return out


def _better(ours: float, theirs: float) -> str:
    return "lower" if ours < theirs else "higher"


def _notes(r: dict[str, Any]) -> list[str]:
    """Where stream-dp is better or worse, and why (a line per statistic)."""
    v, q, t = r["variance"], r["percentiles"], r["top_k"]
    s, p = "stream-dp", "pipeline_dp"
    ratio = v[s]["mae"] / v[p]["mae"]
    squares = v["squares_sensitivity_per_value"]
    return [
        f"*Variance*: stream-dp's MAE is {_better(v[s]['mae'], v[p]['mae'])} "
        f"({ratio:.2f}× PipelineDP's). Both split ε in thirds over a count, a sum and a sum "
        "of squares, and the count and the sum get the same Laplace scale on both sides. "
        "The difference is the squares: stream-dp centres them on the middle of their own "
        "range [0, D²] (D = (upper − lower)/2), so one value moves their sum by at most "
        f"D²/2 = {squares[s]:,.0f}; PipelineDP 0.3.1 bounds the squares of its normalised "
        f"values by [0, max(lower², upper²)], so by {squares[p]:,.0f} — "
        f"{squares[p] / squares[s]:g}× the noise on the squares here, because [lower, upper] "
        "is not centred on 0 (on a range symmetric about 0 the two are equal, and the "
        "errors would differ only by stream-dp's clamp). stream-dp also clamps the result "
        "to [0, D²], which only moves it towards the truth; PipelineDP's share outside that "
        "range is in the last column. stream-dp's noise is discrete (granularity "
        f"{GRANULARITY:g}). At this scale most of both errors comes from the noisy sum, "
        "which both share: it enters through the square of the mean, whose error is about "
        "2·|mean − middle| times the mean's (the values sit far below the middle of [lower, "
        "upper]), so the gap is much smaller than the 4× on the squares.",
        "*Percentiles*: stream-dp's rank error is "
        + ", ".join(
            f"{_better(q[s]['rank_error'][str(x)], q[p]['rank_error'][str(x)])} at p{x}"
            for x in PERCENTILES
        )
        + " than PipelineDP's. The exponential mechanism spends ε/(L0·3) on each percentile "
        "of each key and picks one of the B + 1 bin edges by its rank distance: sharp when a "
        "key has thousands of rows, with a resolution of one bin. PipelineDP's quantile tree "
        "noises every level of a hierarchical histogram once for all percentiles and "
        "descends through noisy counts, interpolating inside the leaf: it pays once however "
        "many percentiles are asked, but its noise adds up level by level. So the "
        "exponential mechanism should lose ground as the number of percentiles grows (ε/Q "
        "each; not measured here), and its value can never be finer than a bin; its stated "
        f"95% bound (±{q['stream_dp_rank_error_95_bound']:.0f} ranks beyond the bin's "
        "resolution, a union bound over every edge) is far above what it does. stream-dp's "
        "percentiles are monotone by construction (sorted); PipelineDP's are monotone in "
        f"{q[p]['monotone_share']:.0%} of key releases.",
        f"*Top-k*: stream-dp's recall is {_better(t[s]['recall'], t[p]['recall'])} "
        f"({t[s]['recall']:.3f} against {t[p]['recall']:.3f}). stream-dp spends half of ε "
        "(`top_k_epsilon_share` 0.5) on the choice: N rounds of the exponential mechanism "
        "(peeling, the law of one-shot Gumbel top-k), each paying Linf, so its ranking noise "
        f"has Gumbel scale N·Linf/ε_sel = {t['ranking_noise_scale'][s]:g}. The PipelineDP "
        "pipeline ranks by its released noisy counts, Laplace of scale L0·Linf/(ε/2) = "
        f"{t['ranking_noise_scale'][p]:g}, and keeping the N largest is free "
        "post-processing: one user moves at most L0 counts, so with L0 < N noising every "
        "count is the cheaper ranking. The misses on both sides are near-ties at the "
        f"boundary (the {t['top_n']}-th and {t['top_n'] + 1}-th true counts differ by "
        f"{t['true_counts'][t['top_n'] - 1] - t['true_counts'][t['top_n']]}). What stream-dp "
        "buys with it: at most N keys and values are published (PipelineDP publishes every "
        "kept key's count, and the N largest are read off), and `plan` states the lead a key needs "
        "to be chosen with a given probability.",
    ]


def section(r: dict[str, Any]) -> list[str]:
    """RESULTS.md's section on this bench, from :func:`measure`'s result."""
    v, q, t = r["variance"], r["percentiles"], r["top_k"]
    lines = [
        TITLE,
        "",
        f"From `python -m bench.statistics_utility --write` (its own run, kept in "
        "bench/statistics_utility.json; `bench.run` does not rerun it). Seed "
        f"{r['seed']}: {r['users']:,} users, {r['events']:,} events (Geometric events "
        f"per user, mean 5), a log-normal value (median ≈ 12, clamped to [{r['lower']:g}, "
        f"{r['upper']:g}]), {CATEGORIES} categories (Zipf 1) and {DOMAINS:,} domains (Zipf "
        f"1.1). Both libraries get the same rows, bounded once beforehand to L0 = "
        f"{r['max_keys_per_user']} keys per user and Linf = {r['max_contributions_per_key']} "
        f"events per user and key; ε = {r['epsilon']:g} per query, {r['runs']} repetitions "
        "(each redraws the noise; ± is the standard error over keys and repetitions, the "
        "rows fixed). PipelineDP 0.3.1 on its LocalBackend, Laplace noise.",
        "",
        f"**Variance** by category ({v['keys']} public keys, {min(v['events_per_key'].values()):,}"
        f"–{max(v['events_per_key'].values()):,} rows per key, δ = 0):",
        "",
        "| library | MAE ± s.e. | mean relative error | median relative error | "
        "outside [0, ((upper − lower)/2)²] |",
        "|---|---|---|---|---|",
    ]
    for name in LIBRARIES:
        lines.append(
            f"| {name} | {v[name]['mae']:.2f} ± {v[name]['mae_se']:.2f} | "
            f"{v[name]['relative_error']:.4f} | "
            f"{v[name]['median_relative_error']:.4f} | {v[name]['outside_range_share']:.1%} |"
        )
    lines += [
        "",
        f"**Percentiles** {', '.join(map(str, PERCENTILES))} by category (the same keys, δ = 0; "
        f"stream-dp: {r['bins']} bins of width {(r['upper'] - r['lower']) / r['bins']:g}). Rank "
        "error |F(estimate) − p| (F the key's empirical distribution), absolute error "
        "|estimate − exact percentile|, means over keys and repetitions:",
        "",
        "| library | "
        + " | ".join(f"rank error p{x}" for x in PERCENTILES)
        + " | "
        + " | ".join(f"abs. error p{x}" for x in PERCENTILES)
        + " | monotone |",
        "|---|" + "---|" * (2 * len(PERCENTILES) + 1),
    ]
    for name in LIBRARIES:
        ranks = " | ".join(f"{q[name]['rank_error'][str(x)]:.4f}" for x in PERCENTILES)
        errs = " | ".join(f"{q[name]['abs_error'][str(x)]:.2f}" for x in PERCENTILES)
        lines.append(f"| {name} | {ranks} | {errs} | {q[name]['monotone_share']:.0%} |")
    lines += [
        "",
        f"**Top-{t['top_n']} recall** by domain (private keys: {t['keys']:,} domains, true "
        f"bounded counts of the first {t['top_n'] + 5}: "
        f"{', '.join(map(str, t['true_counts']))}; (ε, δ) = ({r['epsilon']:g}, "
        f"{r['delta']:g}) in total):",
        "",
        "| library | mean recall ± s.e. | worst recall | keys released |",
        "|---|---|---|---|",
    ]
    for name in LIBRARIES:
        lines.append(
            f"| {name} | {t[name]['recall']:.3f} ± {t[name]['recall_se']:.3f} | "
            f"{t[name]['recall_min']:.2f} | "
            f"{t[name]['released']:.1f} |"
        )
    for note in _notes(r):  # a paragraph each
        lines += ["", note]
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a small run (seconds)")
    parser.add_argument("--users", type=int, help="override the size's users")
    parser.add_argument("--runs", type=int, help="override the size's repetitions")
    parser.add_argument("--out", type=Path, help="write the run's result JSON here")
    parser.add_argument(
        "--write", action="store_true", help=f"keep the result in {RESULTS_FILE.name}, render"
    )
    parser.add_argument("--render", action="store_true", help="the section from what is kept")
    args = parser.parse_args(argv)
    if not args.render:
        size = SIZES["smoke" if args.smoke else "full"]
        result = measure(args.users or size["users"], args.runs or size["runs"])
        if args.out is not None:
            args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        if args.write:
            RESULTS_FILE.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        print("\n".join(section(result)))
    if args.write or args.render:
        kept = json.loads(RESULTS_FILE.read_text(encoding="utf-8"))
        lines = section(kept)
        RESULTS_MD.write_text(
            splice_section(RESULTS_MD.read_text(encoding="utf-8"), TITLE, lines),
            encoding="utf-8",
        )


if __name__ == "__main__":
    main()
