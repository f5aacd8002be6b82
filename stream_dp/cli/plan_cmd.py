"""``stream-dp plan``: what each query will spend and how noisy its numbers will be.

Reads the configuration (an over-budget one is refused by ``load_config`` with exit code 2),
plans every query (:func:`stream_dp.privacy.planner.plan_config`) and prints a readable
table, or with ``--json`` the stable machine form described by
``stream_dp/privacy/plan.schema.json``. ``--disclosure-risk RHO [--worlds M]`` also prints
the ε that keeps an adversary's posterior below RHO among M possible worlds
(docs/privacy.md#budget).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from stream_dp.cli._common import add_config_option, text_table
from stream_dp.config import Config, load_config
from stream_dp.config.model import ConfigOrigin
from stream_dp.errors import ConfigError
from stream_dp.privacy.continual.counter import MAX_TOTAL
from stream_dp.privacy.planner import ConfigPlan, QueryPlan, plan_config
from stream_dp.privacy.risk import disclosure_risk_from_epsilon, epsilon_from_disclosure_risk
from stream_dp.privacy.statistics import statistic_of
from stream_dp.windows.tumbling import iso_utc


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="show each query's ε, δ, noise scale, 95%% interval and selection threshold",
        description="Plan the releases of a configuration: per query the sensitivity, the "
        "ε/δ split, the mechanism, the noise scale, the 95% interval and the partition "
        "selection; then the window and horizon totals. Refuses an over-budget config.",
    )
    add_config_option(parser)
    parser.add_argument("--json", action="store_true", help="print the stable JSON form")
    parser.add_argument(
        "--disclosure-risk",
        type=float,
        metavar="RHO",
        help="also print the ε that keeps an adversary's posterior below RHO",
    )
    parser.add_argument(
        "--worlds",
        type=int,
        metavar="M",
        help="possible worlds the adversary weighs (default 2; needs --disclosure-risk)",
    )
    parser.set_defaults(func=run)


def _risk(args: argparse.Namespace, plan: ConfigPlan) -> dict[str, Any] | None:
    if args.disclosure_risk is None:
        if args.worlds is not None:
            raise ConfigError("--worlds only applies together with --disclosure-risk RHO")
        return None
    worlds = 2 if args.worlds is None else args.worlds
    epsilon = epsilon_from_disclosure_risk(args.disclosure_risk, worlds)
    return {
        "rho": args.disclosure_risk,
        "worlds": worlds,
        "epsilon": epsilon,
        "window_epsilon": plan.window.epsilon,
        "window_risk": disclosure_risk_from_epsilon(plan.window.epsilon, worlds),
        "window_within_risk": plan.window.epsilon <= epsilon,
    }


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    plan = plan_config(config.spec())
    risk = _risk(args, plan)
    if args.json:
        document = plan.describe()
        document["config_origin"] = config.origin.model_dump()
        document["disclosure_risk"] = risk
        if config.exports:
            document["exports"] = export_plans(config)
        json.dump(document, sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_table(plan, risk, source=str(args.config), origin=config.origin))
        sys.stdout.write("".join(line + "\n" for line in export_lines(config)))
    return 0


def export_plans(config: Config) -> list[dict[str, Any]]:
    """The partner exports as ``plan --json`` lists them (docs/exports.md)."""
    return [
        {
            "partner": e.partner,
            "topic": e.topic,
            "fields": {f: str(rule) for f, rule in e.rules},
            "k_anonymity": e.k_anonymity,
            "differentially_private": False,
            "purpose": e.purpose,
            "legal_basis": e.legal_basis,
        }
        for e in config.exports
    ]


def export_lines(config: Config) -> list[str]:
    """The partner exports, said plainly: event rows, not differentially private."""
    if not config.exports:
        return []
    lines = [
        "",
        "Partner exports: event rows, NOT differentially private (no ε is spent or bounded; "
        "see docs/exports.md)",
    ]
    rows = [["partner", "topic", "fields (rule)", "k-anonymity", "purpose"]]
    for e in config.exports:
        fields = ", ".join(f"{f} ({rule})" for f, rule in e.rules)
        k = "none" if e.k_anonymity is None else f"k={e.k_anonymity}"
        rows.append([e.partner, e.topic, fields, k, e.purpose])
    return [*lines, *text_table(rows)]


# ------------------------------------------------------------------- rendering


def _num(x: float | None, digits: int = 4) -> str:
    if x is None:
        return "-"
    if float(x).is_integer() and abs(x) < 1e15:
        return str(int(x))
    return f"{x:.{digits}g}"


def _selection_summary(q: QueryPlan) -> str:
    sel = q.selection
    if q.continual is not None:
        return f"public keys; cumulative over {q.continual.horizon_windows} windows"
    if sel is None:
        return "public keys"
    d = sel.describe()
    if d["threshold"] is None:
        return (
            f"{sel.strategy}: p>=0.5 at {d['users_for_half_keep']} users, "
            f"p=1 at {d['users_for_certain_keep']}"
        )
    unit = {"released_count": "count", "users": "users", "user_weights": "user weights"}[sel.tested]
    return f"{sel.strategy}: keep if noisy {unit} >= {d['threshold']}"


def _query_block(q: QueryPlan) -> list[str]:
    s = q.sensitivity
    keys = "private keys" if q.public_keys is None else f"{len(q.public_keys)} public keys"
    by = ", ".join(q.group_by) or "(no grouping)"
    lines = [f"{q.name}: {q.statistic} by {by}, {keys}"]
    units = (
        f", {s.value_units_per_event} units of {_num(q.granularity)} per event"
        if (s.value_units_per_event)
        else ""
    )
    lines.append(
        f"  sensitivity  L0={s.max_partitions_contributed} keys/user, "
        f"Linf={s.max_contributions_per_partition} per key{units} -> "
        f"L1={s.l1}, L2={_num(s.l2)}"
    )
    lines.append(
        f"  budget       eps={_num(q.epsilon)} delta={_num(q.delta)}: noise eps="
        f"{_num(q.noise_epsilon)} delta={_num(q.noise_delta)}, selection eps="
        f"{_num(q.selection_epsilon)} delta={_num(q.selection_delta)}"
        + (f" (rho={_num(q.rho)} zCDP)" if q.rho else "")
    )
    for c in q.noise:
        rho = f", rho={_num(c.rho)}" if c.rho is not None else ""
        if q.continual is not None:
            lines.append(
                f"  noise draw   {c.mechanism.name}, scale {_num(c.scale)} per draw "
                f"(eps={_num(c.epsilon)}{rho} per window)"
            )
            continue
        lines.append(
            f"  noise {c.target:<6} {c.mechanism.name}, scale {_num(c.scale)}, "
            f"95% CI +/-{_num(c.ci95)} (eps={_num(c.epsilon)}{rho})"
        )
    lines.extend(statistic_of(q.statistic).plan_lines(q))
    sel = q.selection
    if sel is not None:
        d = sel.describe()
        head = f"  selection    {sel.strategy} (eps={_num(d['epsilon'])}, delta={_num(d['delta'])})"
        if d["threshold"] is None:
            head += (
                f": keep probability >= 0.5 from {d['users_for_half_keep']} users, "
                f"= 1 from {d['users_for_certain_keep']} users"
            )
        else:
            head += f": {d['rule']} (reference {_num(d['reference_threshold'], 6)})"
        lines.append(head)
    if q.top_k is not None:
        lines.extend(_top_k_lines(q))
    if q.clamp_negative:
        lines.append("  post-process negative values are clamped to 0")
    if q.continual is not None:
        lines.extend(_continual_block(q))
    return lines


def _top_k_lines(q: QueryPlan) -> list[str]:
    """N, ε_sel and the lead a key needs over the (N+1)-th count to be chosen."""
    assert q.top_k is not None
    d = q.describe()["top_k"]
    n = d["top_k"]
    unit = "users" if q.statistic == "count_distinct_users" else "events"
    lines = [
        f"  top-k        at most {n} keys per window, chosen by the peeling exponential "
        f"mechanism (eps={_num(d['epsilon'])}, scale {_num(d['scale'])} {unit})",
        f"  top-k lead   {unit} a key needs over the count ranked {n + 1} to be chosen "
        f"(m: keys outside the top {n}):",
    ]
    by_m: dict[int, list[str]] = {}
    for row in d["leads"]:
        by_m.setdefault(row["competitors"], []).append(
            f"{row['lead']} for p>={row['probability']:g}"
        )
    lines.extend(f"               m={m}: {', '.join(v)}" for m, v in by_m.items())
    return lines


def _continual_block(q: QueryPlan) -> list[str]:
    chosen = q.continual
    assert chosen is not None
    t = chosen.horizon_windows
    half = max(1, t // 2)
    origin = iso_utc(q.horizon_origin_s)
    how = "auto: smallest sd at the horizon's worst window" if q.continual_auto else "config"
    lines = [
        f"  cumulative   running total since the start of each horizon of {t} windows "
        f"(horizons start at {origin} + n x {t} windows); {chosen.option} ({how})",
        f"  guarantee    at most the per-window sensitivity (L1={chosen.l1_sensitivity}, "
        f"L2={_num(chosen.l2_sensitivity)}) in each window, in any number of the {t} "
        "windows: k x T events per user over the horizon at most",
    ]
    rows = [
        [
            "option",
            "draw scale",
            "sd after 1",
            f"after {half}",
            f"after {t}",
            "worst sd (window)",
            f"95% CI after {t}",
        ]
    ]
    for p in q.continual_options:
        mark = "* " if p.option == chosen.option else "  "
        rows.append(
            [
                mark + p.option,
                _num(p.draw_scale),
                _num(p.sd(1)),
                _num(p.sd(half)),
                _num(p.sd(t)),
                f"{_num(p.worst_sd)} ({p.worst_step})",
                "+/-" + _num(p.ci95(t)),
            ]
        )
    if all(p.option != chosen.option for p in q.continual_options):
        rows.append(
            [
                "* " + chosen.option,
                _num(chosen.draw_scale),
                _num(chosen.sd(1)),
                _num(chosen.sd(half)),
                _num(chosen.sd(t)),
                f"{_num(chosen.worst_sd)} ({chosen.worst_step})",
                "+/-" + _num(chosen.ci95(t)),
            ]
        )
    lines.extend("               " + line for line in text_table(rows))
    acc = chosen.accounting()
    spent = f"eps={_num(acc['epsilon_over_horizon'])}, delta={_num(acc['delta_over_horizon'])}"
    if acc["rho_over_horizon"] is not None:
        spent += (
            f" (zCDP rho={_num(acc['rho_over_horizon'])} -> eps="
            f"{_num(acc['epsilon_zcdp_over_horizon'])})"
        )
    lines.append(
        f"  accounting   eps={_num(acc['epsilon_per_window'])} "
        f"delta={_num(acc['delta_per_window'])} charged to every window, as for a per-window "
        f"query; a user present in all {t} windows of a horizon: {spent}"
    )
    lines.extend(_range_warning(q))
    return lines


#: ``plan`` warns when this few users at the bound can reach a running total's range.
RANGE_WARNING_USERS = 10**9


def users_to_reach_range(q: QueryPlan) -> int:
    """How many users, each contributing the bound to one key in one window, take that
    key's exact window total past ±MAX_TOTAL units (the counters' range)."""
    s = q.sensitivity
    per_user = s.max_contributions_per_partition * (s.value_units_per_event or 1)
    return MAX_TOTAL // max(1, per_user) + 1


def _range_warning(q: QueryPlan) -> list[str]:
    users = users_to_reach_range(q)
    if users > RANGE_WARNING_USERS:
        return []
    return [
        f"  WARNING      a window's exact total per key is kept within +/-{MAX_TOTAL} units "
        f"(2^42); {users} users at the bound on one key exceed it, and such a total is "
        "clamped (the running total is then low; the release logs an error). If that many "
        "users are possible, coarsen granularity or narrow lower/upper"
    ]


def _auto_bounds_lines(plan: ConfigPlan) -> list[str]:
    """bounds: auto — start values, caps, the histograms and what they cost."""
    auto = plan.auto_bounds
    assert auto is not None
    d = auto.describe()
    short = {
        "max_contributions_per_window": "k",
        "max_keys_per_user": "L0",
        "max_contributions_per_key": "Linf",
    }
    chosen = ", ".join(
        f"{short[n]} (start {d['start'][n]}, at most {d['cap'][n]})" for n in d["chosen"]
    )
    names = ", ".join(h["name"] for h in d["histograms"])
    scales = "/".join(sorted({_num(v) for v in auto.noise_scales.values()}))
    return [
        f"auto bounds  {chosen}: the first window uses the start values; each window spends "
        f"eps={_num(auto.epsilon)} on {auto.layout.count} DP histograms ({names}; discrete "
        f"Laplace, scale {scales} per bin) and the bounds that minimise the "
        "estimated error apply to the next window",
        "             the noise below is the first window's; every window record states the "
        "bounds it used",
    ]


def _origin_lines(origin: ConfigOrigin) -> list[str]:
    """Which keys the environment set (their values are not shown: they may be secrets)."""
    if not origin.environment:
        return ["configuration: the file alone (no STREAM_DP_* overrides)"]
    lines = ["configuration: the file, with keys from the environment:"]
    for key, variable in sorted(origin.environment.items()):
        note = " (replaces the file's queries)" if key == "queries" else ""
        lines.append(f"  {key} <- {variable}{note}")
    return lines


def render_table(
    plan: ConfigPlan,
    risk: dict[str, Any] | None,
    *,
    source: str,
    origin: ConfigOrigin | None = None,
) -> str:
    b = plan.configured_bounds()
    lines = [f"stream-dp plan for {source}"]
    lines.extend(_origin_lines(origin if origin is not None else ConfigOrigin()))
    if plan.unsafe_test_mode:
        lines.append("WARNING: privacy.unsafe_test_mode is on: these numbers are for tests only")
    lines.append(
        f"window {plan.window_size_s} s; bounds k={b['max_contributions_per_window']} "
        f"events/user, L0={b['max_keys_per_user'] or '-'} keys/user, "
        f"Linf={b['max_contributions_per_key'] or '-'} events/key"
    )
    if plan.auto_bounds is not None:
        lines.extend(_auto_bounds_lines(plan))
    lines.append("")
    rows = [["query", "statistic", "eps", "delta", "mechanism", "scale", "95% CI", "selection"]]
    for q in plan.queries:
        rows.append(
            [
                q.name,
                q.statistic,
                _num(q.epsilon),
                _num(q.delta),
                q.stated_mechanism,
                _num(q.noise_scale) + (f" {q.ci95_unit}" if q.ci95_unit else ""),
                "+/-"
                + _num(q.ci95)
                + (f" {q.ci95_unit}" if q.ci95_unit else "")
                + (" (last window)" if q.continual is not None else ""),
                _selection_summary(q),
            ]
        )
    lines.extend(text_table(rows))
    for q in plan.queries:
        lines.append("")
        lines.extend(_query_block(q))
    w, h = plan.window, plan.horizon
    lines.append("")
    lines.append(
        f"per window   eps={_num(w.epsilon)} of {_num(plan.epsilon_per_window)}, "
        f"delta={_num(w.delta)} of {_num(plan.delta_per_window)} (basic composition)"
    )
    if w.epsilon_zcdp is not None:
        lines.append(f"             eps={_num(w.epsilon_zcdp)} with Gaussian parts in zCDP")
    if plan.auto_bounds is not None:
        auto = plan.auto_bounds
        queries = math.fsum(q.epsilon for q in plan.queries)
        lines.append(
            f"             split: queries eps={_num(queries)} + bounds histograms "
            f"eps={_num(auto.epsilon)} ({_num(100 * auto.epsilon_share)}% of the window budget)"
        )
    lines.append(
        f"horizon      {h.windows} windows: eps={_num(h.epsilon)} of cap "
        f"{_num(plan.max_epsilon_per_horizon)}, delta={_num(h.delta)} (basic composition)"
    )
    if h.epsilon_zcdp is not None:
        lines.append(
            f"             eps={_num(h.epsilon_zcdp)} with Gaussian parts in zCDP "
            f"(rho={_num(h.rho)})"
        )
    if risk is not None:
        verdict = "within" if risk["window_within_risk"] else "ABOVE"
        lines.append("")
        lines.append(
            f"disclosure risk {_num(risk['rho'])} among {risk['worlds']} worlds <=> "
            f"eps={_num(risk['epsilon'])}; the window's eps={_num(risk['window_epsilon'])} "
            f"is {verdict} it (worst-case posterior {_num(risk['window_risk'])})"
        )
    return "\n".join(lines) + "\n"
