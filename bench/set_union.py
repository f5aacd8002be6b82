"""Does weighted DP set union (``selection: weighted_gaussian``) keep more keys than the
distinct-user rules? (issue 16; RESULTS.md section 8.)

``python -m bench.set_union [--users N] [--runs N] [--draws N] [--write]`` prints, for a
long-tailed key distribution where users touch many keys, the *expected* number of private
keys each rule releases at the same (ε, δ) and the same cap on keys per user (L0 = Δ0):

* ``truncated_geometric`` and ``gaussian_threshold``: stream-dp's selection on a key's
  distinct users (:mod:`stream_dp.privacy.partition_selection`, the rules the pipeline runs);
* ``weighted_gaussian``: Gopi, Gulhane, Kulkarni, Shen, Shokouhi and Yekhanin, "Differentially
  Private Set Union" (ICML 2020), the non-sequential weighted Gaussian: each user keeps at
  most Δ0 keys and gives each of its d kept keys weight 1/√d (ℓ2 norm 1 per user, so the
  weight vector has ℓ2 sensitivity 1); a key is released when its weight plus N(0, σ²)
  exceeds ρ, σ the analytic Gaussian for (ε, δ/2) at sensitivity 1 and
  ρ = max over t = 1 … Δ0 of 1/√t + σ·Φ⁻¹((1 − δ/2)^(1/t)) — a user alone on t keys has
  each of them released with probability at most 1 − (1 − δ/2)^(1/t), so any of them with
  probability at most δ/2. It fits the per-window pipeline without the sequential policy's
  global order: a user lives on one stage-1 partition, so per-partition weight sums add up
  and one user still moves the sum by at most 1 in ℓ2.

Expected counts (Σ over keys of the keep probability), not draws: the comparison has no
sampling noise of its own; ``--runs`` averages over synthetic populations (different seeds).

Then the same populations go through the product (:func:`pipeline_keys`): ``plan_query`` for a
count grouped by one private key, with ``selection`` set to each strategy (the query's ε is
twice the selection's, its default share being half; the plan's ``selection_epsilon`` is
checked), ``bounded_totals_columns`` on one row per (user, key) (L0 = ``max_keys_per_user``,
Linf = 1), ``KeyTotals`` and ``release_query``; the count is ``len(release.values)``,
averaged over ``--draws`` bounding and release draws per population. Next to each count is
the product rule's expected value on the same totals (Σ of its keep probabilities), which
has no draw noise. The product's ``weighted_gaussian`` differs from the continuous rule
above: fixed-point weights ⌊4096/√d⌋, discrete Gaussian noise, and σ from the zCDP
conversion of (ε, δ/2) rather than the analytic Gaussian, about 7% larger.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import random  # synthetic populations, seeded: never a DP draw
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

from stream_dp.config.model import BoundsConfig, QueryConfig
from stream_dp.privacy.bounding import bounded_totals_columns
from stream_dp.privacy.calibration import analytic_gaussian_sigma, normal_upper_quantile
from stream_dp.privacy.key_totals import KeyTotals
from stream_dp.privacy.partition_selection import (
    WEIGHT_SCALE,
    GaussianThreshold,
    TruncatedGeometric,
    WeightedGaussian,
    adjusted_delta,
)
from stream_dp.privacy.planner import QueryPlan, plan_query
from stream_dp.privacy.release import release_query

_NORMAL = NormalDist()

#: The most keys :func:`population` draws for one user (so at most this many distinct keys).
MAX_DRAWN_KEYS = 200
#: The strategies :func:`pipeline_keys` runs, in print order.
STRATEGIES = ("weighted_gaussian", "truncated_geometric", "gaussian_threshold")
#: L0 = Δ0 values both tables report.
MAX_KEYS = (1, 3, 5, 10, 20)


def weighted_gaussian_parameters(
    epsilon: float, delta: float, max_keys: int
) -> tuple[float, float]:
    """(σ, ρ) of the weighted Gaussian set union for (ε, δ) and Δ0 = ``max_keys``."""
    sigma = analytic_gaussian_sigma(epsilon, delta / 2, 1.0)
    rho = max(
        1 / math.sqrt(t) + sigma * normal_upper_quantile(adjusted_delta(delta / 2, t))
        for t in range(1, max_keys + 1)
    )
    return sigma, rho


def population(
    users: int, keys: int, seed: int, *, zipf_s: float = 1.1, mean_keys: float = 6.0
) -> list[list[int]]:
    """Per user the distinct keys it touches: key popularity Zipf(s) over ``keys`` keys,
    keys per user geometric with mean ``mean_keys`` (many users touch few, some many)."""
    rng = random.Random(seed)  # synthetic data, not a DP draw
    cumulative = list(itertools.accumulate(1 / (r + 1) ** zipf_s for r in range(keys)))
    out = []
    p = 1 / mean_keys
    for _ in range(users):
        d = 1
        while rng.random() > p and d < MAX_DRAWN_KEYS:
            d += 1
        picked = set(rng.choices(range(keys), cum_weights=cumulative, k=d))
        out.append(sorted(picked))
    return out


def expected_keys(
    sets: Sequence[Sequence[int]], *, epsilon: float, delta: float, max_keys: int, seed: int
) -> dict[str, float]:
    """Expected private keys released by each rule; every user keeps ≤ ``max_keys`` of its
    keys, picked at random (the same kept sets for every rule)."""
    rng = random.Random(seed)  # which keys a user keeps (synthetic)
    users: Counter[int] = Counter()
    weight: dict[int, float] = {}
    for keys in sets:
        kept = list(keys) if len(keys) <= max_keys else rng.sample(list(keys), max_keys)
        for k in kept:
            users[k] += 1
            weight[k] = weight.get(k, 0.0) + 1 / math.sqrt(len(kept))
    out: dict[str, float] = {}
    for name, rule in (
        ("truncated_geometric", TruncatedGeometric),
        ("gaussian_threshold", GaussianThreshold),
    ):
        selection = rule(epsilon=epsilon, delta=delta, max_partitions_contributed=max_keys)
        keep = {n: selection.keep_probability(n) for n in set(users.values())}
        out[name] = math.fsum(keep[n] for n in users.values())
    sigma, rho = weighted_gaussian_parameters(epsilon, delta, max_keys)
    out["weighted_gaussian"] = math.fsum(_NORMAL.cdf((w - rho) / sigma) for w in weight.values())
    out["distinct_keys"] = float(len(users))
    return out


@functools.cache
def product_plan(strategy: str, epsilon: float, delta: float, max_keys: int) -> QueryPlan:
    """stream-dp's plan for a count by one private key whose selection runs ``strategy``
    with exactly (``epsilon``, ``delta``) and L0 = ``max_keys`` (Linf = 1; k is never
    binding here, as no user has more than ``MAX_DRAWN_KEYS`` keys)."""
    query = QueryConfig.model_validate(
        {
            "name": f"set_union_{strategy}",
            "epsilon": 2 * epsilon,  # the selection's default share is half
            "delta": delta,
            "statistic": "count",
            "group_by": ["key"],
            "selection": strategy,
        }
    )
    bounds = BoundsConfig(
        max_contributions_per_window=MAX_DRAWN_KEYS,
        max_keys_per_user=max_keys,
        max_contributions_per_key=1,
    )
    plan = plan_query(query.spec(), bounds.spec())
    selection = plan.selection
    if (
        selection is None
        or selection.strategy != strategy
        or not math.isclose(plan.selection_epsilon, epsilon, rel_tol=1e-12)
        or not math.isclose(selection.epsilon, epsilon, rel_tol=1e-12)
        or not math.isclose(selection.delta, delta, rel_tol=1e-12)
        or selection.max_partitions_contributed != max_keys
    ):
        raise RuntimeError(f"the plan's selection is not {strategy} at (ε, δ, L0) as asked")
    return plan


def population_rows(sets: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray, int]:
    """(users, keys, number of keys): one row per (user, key) event, users 0, 1, … grouped,
    keys renumbered 0 … n − 1 (the columns ``bounded_totals_columns`` takes)."""
    users = np.repeat(np.arange(len(sets), dtype=np.int64), [len(keys) for keys in sets])
    flat = np.fromiter(itertools.chain.from_iterable(sets), np.int64, len(users))
    distinct, keys = np.unique(flat, return_inverse=True)
    return users, keys.reshape(-1).astype(np.int64), len(distinct)


def _rule_expectation(plan: QueryPlan, totals: KeyTotals) -> float:
    """Σ over keys of the product rule's keep probability (no draw)."""
    selection = plan.selection
    if isinstance(selection, WeightedGaussian):
        tail = selection.mechanism.tail_table()
        t = selection.threshold
        return math.fsum(tail(t - w) for w in totals.selection_weights.tolist())
    assert selection is not None
    users = Counter(totals.users.tolist())
    return math.fsum(selection.keep_probability(n) * m for n, m in users.items())


def pipeline_keys(
    sets: Sequence[Sequence[int]],
    *,
    epsilon: float,
    delta: float,
    max_keys: int,
    seed: int,
    draws: int = 1,
    strategies: Sequence[str] = STRATEGIES,
) -> dict[str, float]:
    """Private keys the product releases, per strategy: the mean of ``len(release.values)``
    over ``draws`` draws (each a fresh L0 choice and release), and under
    ``"<strategy> rule"`` the mean of the rule's expected count on the drawn totals.

    Selection (ε, δ) and L0 are those of :func:`expected_keys`. The bounding draws are
    seeded by ``seed``; the release draws come from the product's CSPRNG (not seedable).
    """
    if draws < 1:
        raise ValueError("draws must be at least 1")
    users, keys, n_keys = population_rows(sets)
    rng = np.random.default_rng(seed)  # which keys a user keeps (synthetic, not a DP draw)
    out: dict[str, float] = {}
    for strategy in strategies:
        plan = product_plan(strategy, epsilon, delta, max_keys)
        released: list[int] = []
        expected: list[float] = []
        for _ in range(draws):
            events, users_per_key, value_sums, weights = bounded_totals_columns(
                users,
                keys,
                None,
                n_keys=n_keys,
                max_keys=max_keys,
                max_per_key=1,
                rng=rng,
                weights=strategy == "weighted_gaussian",
            )
            present = np.flatnonzero(users_per_key)
            totals = KeyTotals(
                [(k,) for k in present.tolist()],
                events[present],
                users_per_key[present],
                value_sums[present],
                weights[present],
            )
            released.append(len(release_query(totals, plan).values))
            expected.append(_rule_expectation(plan, totals))
        out[strategy] = statistics.fmean(released)
        out[f"{strategy} rule"] = statistics.fmean(expected)
    out["distinct_keys"] = float(n_keys)
    return out


def _mean_se(values: Sequence[float]) -> tuple[float, float]:
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return statistics.fmean(values), se


def _best_ratio(
    table: dict[int, dict[str, list[float]]], top: str, base: str
) -> tuple[int, int, float, float]:
    """(L0 of ``top``'s best mean, L0 of ``base``'s best mean, mean ± standard error over
    populations of top/base at those L0 values)."""
    top_l0 = max(table, key=lambda l0: statistics.fmean(table[l0][top]))
    base_l0 = max(table, key=lambda l0: statistics.fmean(table[l0][base]))
    ratios = [a / b for a, b in zip(table[top_l0][top], table[base_l0][base], strict=True)]
    return (top_l0, base_l0, *_mean_se(ratios))


#: Where ``--write`` keeps the last measurement; ``bench.report`` renders it into RESULTS.md.
RESULTS_FILE = Path(__file__).resolve().parent / "set_union.json"


def measure(
    *,
    users: int,
    keys: int,
    runs: int,
    draws: int,
    epsilon: float,
    delta: float,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Both tables (expected and through the pipeline) for ``runs`` populations."""
    sets_of_run = [population(users, keys, seed=run) for run in range(runs)]
    rows: list[dict[str, Any]] = []
    per_population: dict[str, dict[int, dict[str, list[float]]]] = {"expected": {}, "pipeline": {}}
    for max_keys in MAX_KEYS:
        log(f"[set union] L0 = {max_keys}")
        expected = per_population["expected"][max_keys] = {}
        measured = per_population["pipeline"][max_keys] = {}
        for run, sets in enumerate(sets_of_run):
            got = expected_keys(sets, epsilon=epsilon, delta=delta, max_keys=max_keys, seed=run)
            for name, value in got.items():
                expected.setdefault(name, []).append(value)
            got = pipeline_keys(
                sets, epsilon=epsilon, delta=delta, max_keys=max_keys, seed=run, draws=draws
            )
            for name, value in got.items():
                measured.setdefault(name, []).append(value)
        plan = product_plan("weighted_gaussian", epsilon, delta, max_keys)
        assert isinstance(plan.selection, WeightedGaussian)
        row: dict[str, Any] = {
            "max_keys": max_keys,
            "distinct_keys": statistics.fmean(expected["distinct_keys"]),
            "weighted_threshold_over_q": plan.selection.threshold / WEIGHT_SCALE,
            "continuous_rho": weighted_gaussian_parameters(epsilon, delta, max_keys)[1],
        }
        for name in STRATEGIES:
            row[name] = {
                "expected": _mean_se(expected[name]),
                "pipeline": _mean_se(measured[name]),
                "rule": statistics.fmean(measured[f"{name} rule"]),
            }
        rows.append(row)
    weighted = product_plan("weighted_gaussian", epsilon, delta, 1).selection
    assert isinstance(weighted, WeightedGaussian)
    return {
        "users": users,
        "keys": keys,
        "runs": runs,
        "draws": draws,
        "epsilon": epsilon,
        "delta": delta,
        "product_sigma": weighted.mechanism.sigma / WEIGHT_SCALE,
        "continuous_sigma": weighted_gaussian_parameters(epsilon, delta, 1)[0],
        "rows": rows,
        "ratios": {
            label: _best_ratio(table, "weighted_gaussian", "truncated_geometric")
            for label, table in per_population.items()
        },
    }


def _cell(mean_se: Sequence[float]) -> str:
    return f"{mean_se[0]:,.1f} ± {mean_se[1]:.1f}"


def section(r: dict[str, Any]) -> list[str]:
    """RESULTS.md's section on this bench, from :func:`measure`'s result."""
    command = (
        f"python -m bench.set_union --users {r['users']} --keys {r['keys']} "
        f"--runs {r['runs']} --draws {r['draws']} --write"
    )
    lines = [
        "## 8. Partition selection: weighted DP set union against the distinct-user rules",
        "",
        f"From `{command}` (its own run, kept in bench/set_union.json; `bench.run` does not "
        "rerun it). Population: "
        f"{r['users']:,} users, key popularity Zipf(1.1) over {r['keys']:,} keys, keys per "
        f"user geometric with mean 6 (at most {MAX_DRAWN_KEYS}); {r['runs']} populations. "
        f"Selection ε = {r['epsilon']} and δ = {r['delta']:g} for every rule; L0 = Δ0 caps "
        "the keys per user.",
        "",
        "*Expected*: the continuous formulas (Σ over keys of the keep probability; "
        "weighted_gaussian is Gopi et al.'s real-valued rule with the analytic Gaussian σ). "
        "*Pipeline*: what the product releases — `plan_query` (a count by one private key, "
        f"query ε = {2 * r['epsilon']}, so the selection's is {r['epsilon']}), "
        "`bounded_totals_columns` (with the weights for weighted_gaussian), `release_query`; "
        f"`len(release.values)`, draws per population: {r['draws']}. ± is the standard error "
        "over populations; in brackets the product rule's expected count on the same totals.",
        "",
        "| L0 = Δ0 | "
        + " | ".join(f"{n} expected | {n} pipeline" for n in STRATEGIES)
        + " | distinct keys |",
        "|---|" + "---|---|" * len(STRATEGIES) + "---|",
    ]
    for row in r["rows"]:
        cells = [
            f"{_cell(row[n]['expected'])} | {_cell(row[n]['pipeline'])} [{row[n]['rule']:,.1f}]"
            for n in STRATEGIES
        ]
        lines.append(
            f"| {row['max_keys']} | " + " | ".join(cells) + f" | {row['distinct_keys']:,.0f} |"
        )
    ratio = r["ratios"]
    top, base = ratio["pipeline"][0], ratio["pipeline"][1]
    last = r["rows"][-1]
    lines += [
        "",
        f"Through the pipeline weighted_gaussian at its best L0 ({top}) keeps "
        f"{ratio['pipeline'][2]:.3f} ± {ratio['pipeline'][3]:.3f} times the keys of "
        f"truncated_geometric at its best L0 ({base}); the continuous formulas give "
        f"{ratio['expected'][2]:.3f} ± {ratio['expected'][3]:.3f}. The product pays for exact "
        f"integer noise: its σ is {r['product_sigma']:.3f} (units of Q = {WEIGHT_SCALE}) "
        f"against the analytic {r['continuous_sigma']:.3f}, from the zCDP conversion of "
        f"(ε, δ/2), and its threshold is higher by about as much (T/Q = "
        f"{last['weighted_threshold_over_q']:.2f} against ρ = {last['continuous_rho']:.2f} "
        f"at L0 = {last['max_keys']}). At L0 = 1 the weighted rule is a Gaussian threshold on "
        "distinct users; gaussian_threshold keeps a little more there because it calibrates σ "
        "on the exact discrete curve. truncated_geometric and gaussian_threshold agree with "
        "their formulas within the standard errors.",
    ]
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--draws", type=int, default=3, help="pipeline draws per population")
    parser.add_argument("--epsilon", type=float, default=0.5, help="the selection's share")
    parser.add_argument("--delta", type=float, default=1e-6)
    parser.add_argument(
        "--write", action="store_true", help=f"keep the result in {RESULTS_FILE.name}"
    )
    args = parser.parse_args(argv)
    result = measure(
        users=args.users,
        keys=args.keys,
        runs=args.runs,
        draws=args.draws,
        epsilon=args.epsilon,
        delta=args.delta,
    )
    print("\n".join(section(result)))
    if args.write:
        RESULTS_FILE.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
