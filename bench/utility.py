"""Utility against PipelineDP on the same synthetic browser logs, bounds, ε and δ.

Data: :func:`stream_dp.synthetic.browser_logs.browser_log_events`, one window of one week,
``users`` users (9,000 at full size), 20 popular domains with Zipf popularity, heavy-tailed
visits per user, no single-visitor domains. Query: visits per domain (count), private keys,
ε = 1, δ = 1e-6 for each release.

Bounds, two variants, the same sensitivity on both sides:

* ``L0=3, Linf=10``: stream-dp ``max_keys_per_user=3``, ``max_contributions_per_key=10``
  (and its reservoir of k = 40 events per user, looser than L0·Linf = 30, so the count's
  L1 sensitivity is 30 on both sides); PipelineDP ``max_partitions_contributed=3``,
  ``max_contributions_per_partition=10``.
* ``k only``: stream-dp ``max_contributions_per_window=k``; PipelineDP
  ``max_contributions=k`` (a total per user across keys), k = 10.

stream-dp runs in-process through :class:`~stream_dp.pipeline.local.local.LocalPipeline`, both
worker stages joined in memory (stage 1: decode, pseudonymize, reservoir, L0/Linf, exact
partial totals; stage 2: merge, selection, noise), one query per selection strategy, each
with its own (ε, δ) — every query is a separate release of the same window, drawn
independently. PipelineDP runs on its LocalBackend with truncated-geometric partition
selection and Laplace noise (its NaiveBudgetAccountant splits ε evenly between selection
and noise, as stream-dp's ``selection_epsilon_share`` 0.5 does). Each of ``runs`` runs
redraws everything, bounding included. Error is against the true (unbounded) count of
every domain: MAE over the keys a method released, and the keys it released.
"""

from __future__ import annotations

import os
import statistics
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import orjson

from stream_dp.config import parse_config
from stream_dp.pipeline.local.local import LocalPipeline
from stream_dp.privacy.pseudonymize import KeyRing, Pseudonymizer
from stream_dp.synthetic.browser_logs import BrowserLogSpec, browser_log_events
from stream_dp.windows.tumbling import iso_utc

STRATEGIES = ("truncated_geometric", "laplace_threshold", "gaussian_threshold", "count_threshold")
EPSILON = 1.0
DELTA = 1e-6
WEEK_S = 7 * 86_400
#: 2020-07-30T00:00:00Z: a multiple of one week since the epoch (windows are epoch-aligned).
WEEK_START_S = 2639 * WEEK_S
VARIANTS: dict[str, dict[str, int]] = {
    "L0=3, Linf=10": {"max_keys_per_user": 3, "max_contributions_per_key": 10, "k": 40},
    "k=10 only": {"k": 10},
}


def dataset(users: int) -> list[dict[str, Any]]:
    spec = BrowserLogSpec(
        users=users,
        windows=1,
        window_size_s=WEEK_S,
        start_s=WEEK_START_S,
        popular_domains=20,
        rare_domains=0,
        seed=7,
    )
    return list(browser_log_events(spec))


def _config(bounds: dict[str, int]) -> dict[str, Any]:
    n = len(STRATEGIES)
    return {
        "window": {
            "size_s": WEEK_S,
            "grace_s": 0,
            "idle_close_s": 1,
            "start_at": iso_utc(WEEK_START_S),
        },
        "privacy": {
            "epsilon_per_window": EPSILON * n,
            "delta_per_window": DELTA * n,
            "horizon_windows": 1,
            "max_epsilon_per_horizon": EPSILON * n,
        },
        "bounds": {
            "max_contributions_per_window": bounds["k"],
            **{k: v for k, v in bounds.items() if k != "k"},
        },
        "queries": [
            {
                "name": strategy,
                "group_by": ["domain"],
                "selection": strategy,
                "epsilon": EPSILON,
                "delta": DELTA,
            }
            for strategy in STRATEGIES
        ],
        "metrics": {"enabled": False},
    }


def stream_dp_run(values: list[bytes], bounds: dict[str, int]) -> dict[str, dict[str, int]]:
    """One run: strategy → {domain: released value}."""
    pipeline = LocalPipeline(
        parse_config(_config(bounds)), KeyRing(Pseudonymizer(os.urandom(32), "u"))
    )
    now = time.time()
    records = [(offset, None, value) for offset, value in enumerate(values)]
    for i in range(0, len(records), 10_000):
        pipeline.ingest(0, records[i : i + 10_000], now_s=now, now_mono_s=0.0)
    releases = pipeline.finish(now_s=now)
    if {r.window_start_s for r in releases} != {WEEK_START_S}:
        raise RuntimeError("the utility data should fill exactly one window")
    out: dict[str, dict[str, int]] = {}
    for release in releases:
        out[release.query] = {
            r.value["group"]["domain"]: r.value["value"]
            for r in release.records
            if r.value["kind"] == "release"
        }
    return out


def pipeline_dp_run(events: list[dict[str, Any]], bounds: dict[str, int]) -> dict[str, int]:
    import pipeline_dp

    accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=EPSILON, total_delta=DELTA)
    engine = pipeline_dp.DPEngine(accountant, pipeline_dp.LocalBackend())
    if "max_keys_per_user" in bounds:
        limits: dict[str, int] = {
            "max_partitions_contributed": bounds["max_keys_per_user"],
            "max_contributions_per_partition": bounds["max_contributions_per_key"],
        }
    else:
        limits = {"max_contributions": bounds["k"]}
    params = pipeline_dp.AggregateParams(
        noise_kind=pipeline_dp.NoiseKind.LAPLACE,
        metrics=[pipeline_dp.Metrics.COUNT],
        partition_selection_strategy=pipeline_dp.PartitionSelectionStrategy.TRUNCATED_GEOMETRIC,
        **limits,
    )
    if "max_contributions" in limits:
        # pipeline-dp 0.3.1 passes max_partitions_contributed=None to partition selection
        # when only max_contributions is set (TypeError in PyDP). A user with at most k
        # contributions touches at most k keys, so k is the right bound for selection.
        params.max_partitions_contributed = limits["max_contributions"]
    extractors = pipeline_dp.DataExtractors(
        privacy_id_extractor=lambda e: e["user_id"],
        partition_extractor=lambda e: e["domain"],
        value_extractor=lambda e: 0,
    )
    result = engine.aggregate(events, params, extractors)
    accountant.compute_budgets()
    return {domain: round(metrics.count) for domain, metrics in result}


def measure_auto_bounds(size: str, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Automatic bounds (``bounds: auto``) on the anchor data and a drifting stream against
    fixed bounds and PipelineDP at equal ε per window: see :mod:`bench.auto_bounds`."""
    from bench import auto_bounds

    result = auto_bounds.measure(auto_bounds.SIZES[size], log=log)
    result["size"] = size
    return result


def _score(released: dict[str, int], truth: Counter[str]) -> tuple[float, int]:
    if not released:
        return float("nan"), 0
    errors = [abs(v - truth[d]) for d, v in released.items()]
    return statistics.fmean(errors), len(released)


def measure(users: int, runs: int, log: Callable[[str], None] = print) -> dict[str, Any]:
    events = dataset(users)
    values = [orjson.dumps(e) for e in events]
    truth = Counter(e["domain"] for e in events)
    rows: list[dict[str, Any]] = []
    for variant, bounds in VARIANTS.items():
        scores: dict[str, list[tuple[float, int]]] = {s: [] for s in STRATEGIES}
        scores["pipeline_dp"] = []
        for _ in range(runs):
            for strategy, released in stream_dp_run(values, bounds).items():
                scores[strategy].append(_score(released, truth))
            scores["pipeline_dp"].append(_score(pipeline_dp_run(events, bounds), truth))
        for method, results in scores.items():
            maes = [m for m, n in results if n]
            rows.append(
                {
                    "bounds": variant,
                    "method": method if method == "pipeline_dp" else f"stream-dp {method}",
                    "mae": statistics.fmean(maes) if maes else float("nan"),
                    "keys_kept": statistics.fmean(n for _, n in results),
                    "runs": len(results),
                }
            )
        log(
            f"  {variant}: "
            + ", ".join(f"{r['method']} MAE {r['mae']:.1f}" for r in rows[-len(scores) :])
        )
    return {
        "users": users,
        "events": len(events),
        "true_keys": len(truth),
        "runs": runs,
        "epsilon": EPSILON,
        "delta": DELTA,
        "rows": rows,
    }
