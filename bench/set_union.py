"""Would weighted DP set union keep more keys than stream-dp's selection? (issue 16, measured
before building it.)

``python -m bench.set_union [--users N] [--runs N]`` prints, for a long-tailed key
distribution where users touch many keys, the *expected* number of private keys each rule
releases at the same (ε, δ) and the same cap on keys per user (L0 = Δ0):

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
Not wired into the pipeline: this measures whether it is worth building.
"""

from __future__ import annotations

import argparse
import itertools
import math
import random  # synthetic populations, seeded: never a DP draw
import statistics
from collections import Counter
from collections.abc import Sequence
from statistics import NormalDist

from stream_dp.privacy.calibration import analytic_gaussian_sigma, normal_upper_quantile
from stream_dp.privacy.partition_selection import (
    GaussianThreshold,
    TruncatedGeometric,
    adjusted_delta,
)

_NORMAL = NormalDist()


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
        while rng.random() > p and d < 200:
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


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--epsilon", type=float, default=0.5, help="the selection's share")
    parser.add_argument("--delta", type=float, default=1e-6)
    args = parser.parse_args(argv)
    print(
        f"{args.users:,} users, Zipf keys over {args.keys:,}, ε = {args.epsilon}, "
        f"δ = {args.delta}; expected keys released, mean ± standard error over {args.runs} "
        "populations"
    )
    for max_keys in (1, 3, 5, 10, 20):
        rows: dict[str, list[float]] = {}
        for run in range(args.runs):
            sets = population(args.users, args.keys, seed=run)
            got = expected_keys(
                sets, epsilon=args.epsilon, delta=args.delta, max_keys=max_keys, seed=run
            )
            for name, value in got.items():
                rows.setdefault(name, []).append(value)
        cells = []
        for name, values in rows.items():
            se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
            cells.append(f"{name} {statistics.fmean(values):,.1f} ± {se:.1f}")
        print(f"  L0 = Δ0 = {max_keys:>2}: " + "; ".join(cells))


if __name__ == "__main__":
    main()
