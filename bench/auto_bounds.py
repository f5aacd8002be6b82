"""Automatic bounds (``bounds: auto``) against fixed bounds and PipelineDP, at equal ε per window.

``python -m bench.auto_bounds [--size {smoke,small,full}] [--runs N] [--out DIR]`` runs only
this part and writes its section into ``RESULTS.md`` (replacing an older version of it), its
entry into ``results.json`` and ``auto_bounds_drift.png``; ``python -m bench.run`` runs it
with everything else (``bench.utility.measure_auto_bounds``).

Two streams, one count query (visits per domain, private keys, truncated-geometric
selection), ε = 1 and δ = 1e-6 per window for every method:

* **anchor**: the utility data (browser logs, 9,000 users, 20 domains) over 4 one-week
  windows — the same population, fresh visits each week;
* **drift**: :mod:`stream_dp.synthetic.drifting` (6,000 users, 8 windows: events per user
  4 → 16, keys per user 2 → 4, a burst of heavy users in window 5).

Methods (stream-dp runs in-process through ``LocalPipeline``, both stages):

* ``auto (k, L0)`` and ``auto (k, L0, Linf)``: those bounds set to ``auto`` with
  ``epsilon_share`` 0.2 (the query gets ε = 0.8, the histograms 0.2), starting from the
  README's values (k = 40, L0 = 3, Linf = 10) in the first window;
* ``readme``: stream-dp and PipelineDP at the README's bounds (k = 40, L0 = 3, Linf = 10);
* ``hindsight``: stream-dp at the fixed bounds of a grid (k 10…640, L0 1…8, Linf 5…160 or
  unset: 294 points) with the lowest MAE predicted over *all* windows from the true data —
  an oracle no real user has;
* ``first window``: the same choice made from the first window's data only: the best a user
  could set in advance after studying the first window.

The oracles predict each grid point's error from the exact data (expected bounding bias,
the Laplace noise's E|b + Z|, and truncated-geometric keep probabilities), among the points
predicted to keep at least the keys the README's bounds keep (MAE over released keys alone
would reward bounds that release more, smaller keys); the chosen bounds are then run like
every other method. Error is against the true (unbounded) counts of every window: MAE
over the keys a method released, and the keys it released, averaged over windows (anchor:
windows 2–4, where automatic bounds differ from the start values; all four are in
results.json) and over runs; ± is the standard error over runs.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from bench.sections import splice_section
from stream_dp.config import parse_config
from stream_dp.pipeline.local.local import LocalPipeline
from stream_dp.privacy.partition_selection import TruncatedGeometric
from stream_dp.privacy.pseudonymize import KeyRing, Pseudonymizer
from stream_dp.synthetic.browser_logs import BrowserLogSpec, browser_log_events
from stream_dp.synthetic.drifting import DriftSpec, drifting_events
from stream_dp.windows.tumbling import iso_utc

EPSILON = 1.0
DELTA = 1e-6
SHARE = 0.2
WEEK_S = 7 * 86_400
WEEK_START_S = 2639 * WEEK_S
README: tuple[int, int | None, int | None] = (40, 3, 10)
GRID_K = (10, 20, 40, 80, 160, 320, 640)
GRID_L0 = (1, 2, 3, 4, 6, 8)
GRID_LINF: tuple[int | None, ...] = (5, 10, 20, 40, 80, 160, None)
#: The oracles keep at least the README bounds' keys, to within this many keys on average.
KEYS_TOLERANCE = 0.05
PLOT_NAME = "auto_bounds_drift.png"
SECTION_TITLE = "## 6. Automatic bounds (bounds: auto) against fixed bounds and PipelineDP"
AUTO_VARIANTS = {
    "auto (k, L0)": ("max_contributions_per_window", "max_keys_per_user"),
    "auto (k, L0, Linf)": (
        "max_contributions_per_window",
        "max_keys_per_user",
        "max_contributions_per_key",
    ),
}
SIZES: dict[str, dict[str, Any]] = {
    "smoke": {
        "anchor_users": 1500,
        "anchor_windows": 3,
        "drift_users": 800,
        "drift_windows": 4,
        "runs": 1,
    },
    "small": {
        "anchor_users": 9000,
        "anchor_windows": 4,
        "drift_users": 6000,
        "drift_windows": 8,
        "runs": 3,
    },
    "full": {
        "anchor_users": 9000,
        "anchor_windows": 4,
        "drift_users": 6000,
        "drift_windows": 8,
        # 20: the standard error of auto's ratio to hindsight is then about 2% (measured),
        # a fifth of the 10% target
        "runs": 20,
    },
}
Bounds = tuple[int, int | None, int | None]


@dataclass
class Stream:
    name: str
    window_size_s: int
    start_s: int
    events: list[dict[str, Any]]
    #: per window start: true count per domain
    truth: dict[int, Counter[str]]
    #: per window start: per user, events per domain
    users: dict[int, dict[str, Counter[str]]]
    #: windows the summary averages over (anchor: from the second)
    scored_from: int

    @property
    def windows(self) -> list[int]:
        return sorted(self.truth)


def _stream(
    name: str, events: list[dict[str, Any]], size: int, start: int, scored_from: int
) -> Stream:
    truth: dict[int, Counter[str]] = defaultdict(Counter)
    users: dict[int, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
    for e in events:
        ws = (int(e["timestamp"]) // 1000 // size) * size
        truth[ws][e["domain"]] += 1
        users[ws][e["user_id"]][e["domain"]] += 1
    return Stream(
        name, size, start, events, dict(truth), {w: dict(u) for w, u in users.items()}, scored_from
    )


def anchor_stream(users: int, windows: int) -> Stream:
    spec = BrowserLogSpec(
        users=users,
        windows=windows,
        window_size_s=WEEK_S,
        start_s=WEEK_START_S,
        popular_domains=20,
        rare_domains=0,
        seed=7,
    )
    return _stream("anchor", list(browser_log_events(spec)), WEEK_S, WEEK_START_S, 1)


def drift_stream(users: int, windows: int) -> Stream:
    spec = DriftSpec(users=users, windows=windows, burst_window=min(5, windows - 1))
    return _stream("drift", list(drifting_events(spec)), spec.window_size_s, spec.start_s, 0)


# ----------------------------------------------------------------------------- methods


def _bounds_config(bounds: Bounds) -> dict[str, Any]:
    k, l0, linf = bounds
    return {
        "max_contributions_per_window": k,
        "max_keys_per_user": l0,
        "max_contributions_per_key": linf,
    }


def _config(stream: Stream, bounds: dict[str, Any], query_epsilon: float) -> dict[str, Any]:
    n = len(stream.windows)
    return {
        "window": {
            "size_s": stream.window_size_s,
            "grace_s": 0,
            "idle_close_s": 1,
            "start_at": iso_utc(stream.start_s),
        },
        "privacy": {
            "epsilon_per_window": EPSILON,
            "delta_per_window": DELTA,
            "horizon_windows": n,
            "max_epsilon_per_horizon": EPSILON * n,
        },
        "bounds": bounds,
        "queries": [
            {
                "name": "visits",
                "group_by": ["domain"],
                "selection": "truncated_geometric",
                "epsilon": query_epsilon,
                "delta": DELTA,
            }
        ],
        "metrics": {"enabled": False},
    }


def auto_config(stream: Stream, fields: Sequence[str]) -> dict[str, Any]:
    start = dict(
        zip(
            ("max_contributions_per_window", "max_keys_per_user", "max_contributions_per_key"),
            README,
            strict=True,
        )
    )
    bounds: dict[str, Any] = {"max_contributions_per_window": README[0]}
    for name in fields:
        bounds[name] = "auto"
    bounds["auto"] = {"epsilon_share": SHARE, "start": {n: start[n] for n in fields}}
    return _config(stream, bounds, EPSILON - SHARE * EPSILON)


def fixed_config(stream: Stream, bounds: Bounds) -> dict[str, Any]:
    return _config(stream, _bounds_config(bounds), EPSILON)


def stream_dp_run(
    stream: Stream, values: list[bytes], config: dict[str, Any]
) -> tuple[dict[int, dict[str, int]], dict[int, Bounds]]:
    """One run: per window {domain: released value}, and the bounds each window used."""
    pipeline = LocalPipeline(parse_config(config), KeyRing(Pseudonymizer(os.urandom(32), "u")))
    now = time.time()
    records = [(offset, None, value) for offset, value in enumerate(values)]
    for i in range(0, len(records), 20_000):
        pipeline.ingest(0, records[i : i + 20_000], now_s=now, now_mono_s=0.0)
    releases = pipeline.finish(now_s=now)
    out: dict[int, dict[str, int]] = {}
    used: dict[int, Bounds] = {}
    for release in releases:
        out[release.window_start_s] = {
            r.value["group"]["domain"]: r.value["value"]
            for r in release.records
            if r.value["kind"] == "release"
        }
        bounds = pipeline.release.bounds_for(release.window_start_s)
        assert bounds is not None
        used[release.window_start_s] = bounds
    return out, used


def pipeline_dp_run(stream: Stream, bounds: Bounds) -> dict[int, dict[str, int]]:
    """PipelineDP at the same ε, δ and L0/Linf, one batch per window."""
    from bench.utility import pipeline_dp_run as one_window

    k, l0, linf = bounds
    assert l0 is not None and linf is not None
    per_window: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in stream.events:
        per_window[
            (int(e["timestamp"]) // 1000 // stream.window_size_s) * stream.window_size_s
        ].append(e)
    limits = {"max_keys_per_user": l0, "max_contributions_per_key": linf, "k": k}
    return {ws: one_window(events, limits) for ws, events in sorted(per_window.items())}


# ------------------------------------------------------------------------------ oracle


@dataclass
class _WindowArrays:
    users: np.ndarray  # per (user, key) pair: the user's index
    counts: np.ndarray  # events of the pair
    keys: np.ndarray  # key index of the pair
    n: np.ndarray  # per pair: the user's events
    d: np.ndarray  # per pair: the user's keys
    truth: np.ndarray  # per key index: true count
    n_keys: int


def _arrays(stream: Stream, ws: int) -> _WindowArrays:
    domains = sorted(stream.truth[ws])
    index = {d: i for i, d in enumerate(domains)}
    users, counts, keys, n, d = [], [], [], [], []
    for u, (_, per) in enumerate(sorted(stream.users[ws].items())):
        total = sum(per.values())
        for domain, c in per.items():
            users.append(u)
            counts.append(c)
            keys.append(index[domain])
            n.append(total)
            d.append(len(per))
    truth = np.array([stream.truth[ws][dom] for dom in domains], dtype=np.float64)
    return _WindowArrays(
        np.array(users),
        np.array(counts, dtype=np.float64),
        np.array(keys),
        np.array(n, dtype=np.float64),
        np.array(d, dtype=np.float64),
        truth,
        len(domains),
    )


def predicted(arrays: _WindowArrays, bounds: Bounds, query_epsilon: float) -> tuple[float, float]:
    """(predicted MAE over released keys, predicted keys released) of fixed bounds."""
    k, l0, linf = bounds
    rho = np.minimum(1.0, k / arrays.n)
    kept_keys = 1.0 if l0 is None else np.minimum(1.0, l0 / arrays.d)
    per_key = arrays.counts * rho
    if linf is not None:
        per_key = np.minimum(per_key, linf)
    kept = kept_keys * per_key
    bias = arrays.truth - np.bincount(arrays.keys, weights=kept, minlength=arrays.n_keys)
    users = np.bincount(
        arrays.keys, weights=kept_keys * np.ones_like(kept), minlength=arrays.n_keys
    )
    l0_eff = min(l0 or k, k)
    linf_eff = min(linf or k, k)
    scale = min(k, l0_eff * linf_eff) / (query_epsilon / 2)
    error = np.abs(bias) + scale * np.exp(-np.abs(bias) / scale)
    rule = TruncatedGeometric(
        epsilon=query_epsilon / 2, delta=DELTA, max_partitions_contributed=l0_eff
    )
    keep = np.array([rule.keep_probability(round(u)) for u in users])
    if keep.sum() <= 0:
        return math.inf, 0.0
    return float((keep * error).sum() / keep.sum()), float(keep.sum())


def oracle(stream: Stream, windows: Sequence[int]) -> tuple[Bounds, float, float]:
    """The grid point with the lowest predicted MAE over ``windows``, among those keeping
    at least the keys the README's bounds keep (MAE over released keys alone would reward
    bounds that release more, smaller keys): (bounds, predicted MAE, predicted keys)."""
    arrays = [_arrays(stream, ws) for ws in windows]
    scores: dict[Bounds, tuple[float, float]] = {}
    for k in GRID_K:
        for l0 in GRID_L0:
            for linf in GRID_LINF:
                got = [predicted(a, (k, l0, linf), EPSILON) for a in arrays]
                scores[(k, l0, linf)] = (
                    statistics.fmean(m for m, _ in got),
                    statistics.fmean(n for _, n in got),
                )
    floor = scores[README][1] - KEYS_TOLERANCE if README in scores else 0.0
    eligible = {b: s for b, s in scores.items() if s[1] >= floor}
    best = min(eligible, key=lambda b: (eligible[b][0], b[0]))
    return best, *eligible[best]


# --------------------------------------------------------------------------- measuring


def _score(released: dict[str, int], truth: Counter[str]) -> tuple[float, int]:
    if not released:
        return math.nan, 0
    return statistics.fmean(abs(v - truth[d]) for d, v in released.items()), len(released)


def measure_stream(stream: Stream, runs: int, log: Callable[[str], None] = print) -> dict[str, Any]:
    values = [orjson.dumps(e) for e in stream.events]
    hindsight, h_mae, h_keys = oracle(stream, stream.windows)
    first, f_mae, f_keys = oracle(stream, stream.windows[:1])
    log(f"  {stream.name}: hindsight {hindsight}, first window {first}")
    Run = Callable[[], tuple[dict[int, dict[str, int]], dict[int, Bounds]]]

    def automatic(fields: Sequence[str]) -> Run:
        return lambda: stream_dp_run(stream, values, auto_config(stream, fields))

    methods: dict[str, Run] = {name: automatic(f) for name, f in AUTO_VARIANTS.items()}
    methods["stream-dp readme"] = lambda: stream_dp_run(
        stream, values, fixed_config(stream, README)
    )
    methods["pipeline_dp readme"] = lambda: (pipeline_dp_run(stream, README), {})
    methods["stream-dp hindsight"] = lambda: stream_dp_run(
        stream, values, fixed_config(stream, hindsight)
    )
    methods["stream-dp first window"] = lambda: stream_dp_run(
        stream, values, fixed_config(stream, first)
    )
    per_run: dict[str, list[dict[int, tuple[float, int]]]] = defaultdict(list)
    bounds_used: dict[str, list[dict[str, Bounds]]] = defaultdict(list)
    for r in range(runs):
        for name, run in methods.items():
            released, used = run()
            per_run[name].append(
                {ws: _score(released.get(ws, {}), stream.truth[ws]) for ws in stream.windows}
            )
            if used:
                bounds_used[name].append({iso_utc(ws): b for ws, b in used.items()})
        log(f"  {stream.name}: run {r + 1}/{runs} done")
    scored = stream.windows[stream.scored_from :]
    rows = []
    for name, results in per_run.items():
        run_mae = [_mean(res[ws][0] for ws in scored) for res in results]
        run_keys = [statistics.fmean(res[ws][1] for ws in scored) for res in results]
        per_window = [
            {
                "window_start": iso_utc(ws),
                "mae": _mean(res[ws][0] for res in results),
                "keys_kept": statistics.fmean(res[ws][1] for res in results),
            }
            for ws in stream.windows
        ]
        rows.append(
            {
                "method": name,
                "mae": statistics.fmean(run_mae),
                "mae_se": _se(run_mae),
                "keys_kept": statistics.fmean(run_keys),
                "keys_kept_se": _se(run_keys),
                "runs": len(results),
                "per_window": per_window,
                # the bounds each window used in the first run (the others vary alike)
                "bounds": bounds_used.get(name, [])[:1],
            }
        )
        last = rows[-1]
        log(f"    {name}: MAE {_pm(last, 'mae')}, keys {last['keys_kept']:.2f}")
    return {
        "stream": stream.name,
        "users": len({u for w in stream.users.values() for u in w}),
        "events": len(stream.events),
        "windows": len(stream.windows),
        "scored_windows": len(scored),
        "true_keys": max(len(t) for t in stream.truth.values()),
        "hindsight": {"bounds": list(hindsight), "predicted_mae": h_mae, "predicted_keys": h_keys},
        "first_window": {"bounds": list(first), "predicted_mae": f_mae, "predicted_keys": f_keys},
        "rows": rows,
    }


def _mean(values: Iterable[float]) -> float:
    """Mean of the defined values (a window that released nothing has no MAE)."""
    finite = [v for v in values if not math.isnan(v)]
    return statistics.fmean(finite) if finite else math.nan


def _pm(row: dict[str, Any], name: str) -> str:
    return f"{row[name]:,.1f} ± {row[name + '_se']:.1f}"


def _se(values: list[float]) -> float:
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else math.nan


def measure(
    cfg: dict[str, Any], runs: int | None = None, log: Callable[[str], None] = print
) -> dict[str, Any]:
    started = time.perf_counter()
    n = runs if runs is not None else cfg["runs"]
    log(f"[bench] automatic bounds: anchor ({cfg['anchor_users']:,} users), {n} runs")
    anchor = measure_stream(anchor_stream(cfg["anchor_users"], cfg["anchor_windows"]), n, log)
    log(f"[bench] automatic bounds: drift ({cfg['drift_users']:,} users), {n} runs")
    drift = measure_stream(drift_stream(cfg["drift_users"], cfg["drift_windows"]), n, log)
    return {
        "epsilon": EPSILON,
        "delta": DELTA,
        "epsilon_share": SHARE,
        "readme_bounds": list(README),
        "anchor": anchor,
        "drift": drift,
        "seconds": time.perf_counter() - started,
    }


# ------------------------------------------------------------------------------ report


def _row(stream: dict[str, Any], method: str) -> dict[str, Any]:
    return next(r for r in stream["rows"] if r["method"] == method)


def verdicts(result: dict[str, Any]) -> list[tuple[str, bool, str]]:
    """The issue's targets: (target, passed, measured)."""
    out = []
    anchor, drift = result["anchor"], result["drift"]
    auto = min(AUTO_VARIANTS, key=lambda name: _row(drift, name)["mae"])
    for name in AUTO_VARIANTS:
        mine, ref = _row(anchor, name), _row(anchor, "pipeline_dp readme")
        gap = ref["mae"] - mine["mae"]
        se = math.hypot(mine["mae_se"], ref["mae_se"])
        out.append(
            (
                f"anchor: {name} MAE < PipelineDP's at the README bounds, keys kept not lower",
                gap > 2 * se and mine["keys_kept"] >= ref["keys_kept"],
                f"{_pm(mine, 'mae')} vs {_pm(ref, 'mae')}; "
                f"keys {mine['keys_kept']:.2f} vs {ref['keys_kept']:.2f}",
            )
        )
    mine = _row(drift, auto)
    first, hind = _row(drift, "stream-dp first window"), _row(drift, "stream-dp hindsight")
    out.append(
        (
            f"drift: {auto} beats the best bounds set from the first window",
            first["mae"] - mine["mae"] > 2 * math.hypot(mine["mae_se"], first["mae_se"]),
            f"{_pm(mine, 'mae')} vs {_pm(first, 'mae')}",
        )
    )
    out.append(
        (
            f"drift: {auto} within 10% of the hindsight-best fixed bounds",
            mine["mae"] <= 1.1 * hind["mae"],
            f"{_pm(mine, 'mae')} vs {_pm(hind, 'mae')} ({_ratio_against(mine, hind, 1.1)})",
        )
    )
    return out


def _ratio_against(mine: dict[str, Any], other: dict[str, Any], line: float) -> str:
    """``mine``'s MAE relative to ``other``'s, ± its standard error (the two runs' errors
    propagated), and how many standard errors the ratio lies from ``line``."""
    ratio = mine["mae"] / other["mae"]
    se = ratio * math.hypot(mine["mae_se"] / mine["mae"], other["mae_se"] / other["mae"])
    if not math.isfinite(se) or se <= 0:
        return f"{100 * (ratio - 1):+.1f}%"
    return (
        f"{100 * (ratio - 1):+.1f}% ± {100 * se:.1f}%; the {100 * (line - 1):+.0f}% line is "
        f"{(line - ratio) / se:.1f} standard errors away"
    )


def _fmt_bounds(b: Sequence[int | None]) -> str:
    k, l0, linf = b
    return f"k={k}, L0={l0 if l0 is not None else '–'}, Linf={linf if linf is not None else '–'}"


def section(result: dict[str, Any]) -> list[str]:
    lines = [SECTION_TITLE, ""]
    lines.append(
        f"One count query per stream (visits per domain, private keys, truncated-geometric "
        f"selection); ε = {result['epsilon']:g} and δ = {result['delta']:g} per window for every "
        f"method: the automatic ones give {result['epsilon_share']:g} of it to the histograms "
        "that choose the next window's bounds and the rest to the query. MAE: mean absolute "
        "error of the released counts against the true (unbounded) ones, over the keys "
        "released; ± is the standard error over runs. Oracles: fixed bounds of a 294-point grid "
        "with the lowest error predicted from the true data (among those keeping at least the "
        "README bounds' keys), over all windows (hindsight) or the first window only. See "
        "bench/auto_bounds.py."
    )
    for key in ("anchor", "drift"):
        s = result[key]
        lines += [
            "",
            f"**{key}** ({s['users']:,} users, {s['events']:,} events, {s['windows']} windows, "
            f"{s['true_keys']} domains; scored over {s['scored_windows']} windows; "
            f"{_row(s, 'stream-dp readme')['runs']} runs). Hindsight bounds "
            f"{_fmt_bounds(s['hindsight']['bounds'])}; from the first window "
            f"{_fmt_bounds(s['first_window']['bounds'])}.",
            "",
            "| method | MAE | keys kept |",
            "|---|---|---|",
        ]
        for r in s["rows"]:
            lines.append(
                f"| {r['method']} | {r['mae']:,.1f} ± {r['mae_se']:.1f} | "
                f"{r['keys_kept']:.2f} ± {r['keys_kept_se']:.2f} |"
            )
    drift = result["drift"]
    n_windows = drift["windows"]
    lines += [
        "",
        "Per window on the drifting stream (MAE; window 6 has the burst of heavy users; the "
        "first run's automatic bounds k/L0 under each):",
        "",
        "| method | " + " | ".join(str(w + 1) for w in range(n_windows)) + " |",
        "|---" * (n_windows + 1) + "|",
    ]
    for r in drift["rows"]:
        cells = [f"{w['mae']:,.0f}" for w in r["per_window"]]
        if r["method"] in AUTO_VARIANTS and r["bounds"]:
            used = list(r["bounds"][0].values())
            cells = [f"{c} ({b[0]}/{b[1]})" for c, b in zip(cells, used, strict=True)]
        lines.append(f"| {r['method']} | " + " | ".join(cells) + " |")
    lines += ["", "| target | passed | measured |", "|---|---|---|"]
    for target, ok, text in verdicts(result):
        lines.append(f"| {target} | {'PASS' if ok else '**FAIL**'} | {text} |")
    lines += ["", f"![MAE per window on the drifting stream]({PLOT_NAME})"]
    return lines


def write_plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drift = result["drift"]
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(8, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    for row in drift["rows"]:
        xs = list(range(1, len(row["per_window"]) + 1))
        top.plot(xs, [w["mae"] for w in row["per_window"]], marker="o", label=row["method"])
        bottom.plot(
            xs, [w["keys_kept"] for w in row["per_window"]], marker="o", label=row["method"]
        )
    top.set_ylabel("MAE (events)")
    top.set_title("Drifting stream: error per window at equal ε (mean over runs)")
    top.legend(fontsize=8)
    bottom.set_ylabel("keys kept")
    bottom.set_ylim(0, drift["true_keys"] + 1)
    top.set_ylim(bottom=0)
    bottom.set_xlabel("window")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def splice(markdown: str, lines: list[str]) -> str:
    """``markdown`` with this section replaced (or inserted before the closing notes)."""
    return splice_section(markdown, SECTION_TITLE, lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.auto_bounds", description=__doc__)
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument("--render-only", action="store_true")
    args = parser.parse_args(argv)

    def log(message: str) -> None:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.json"
    results = orjson.loads(results_path.read_bytes()) if results_path.exists() else {}
    if args.render_only:
        result = results["auto_bounds"]
    else:
        result = measure(SIZES[args.size], args.runs, log)
        result["size"] = args.size
    results["auto_bounds"] = result
    results_path.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    write_plot(result, out / PLOT_NAME)
    md_path = out / "RESULTS.md"
    text = (
        md_path.read_text(encoding="utf-8")
        if md_path.exists()
        else "# stream-dp benchmark results\n"
    )
    md_path.write_text(splice(text, section(result)), encoding="utf-8")
    log(f"[bench] automatic bounds: wrote {md_path} in {result['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
