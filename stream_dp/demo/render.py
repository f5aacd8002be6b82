"""How the demo shows what happens: a readable console report, or JSON lines.

JSON lines (``--json``) are the stable machine form, one object per line:

- ``{"kind": "start", "broker": {"pid", "bootstrap_servers"}, "ephemeral_key": true,
  "data": {...}, "privacy": {...}, "bounds": {...}, "queries": [...]}``
- ``{"kind": "window", "index", "windows", "window_start", "window_end", "epsilon_spent",
  "horizon_epsilon_spent", "queries": [...], "rows": [{"query", "group", "true_value",
  "released_value", "error", "ci95", "noise_scale", "within_ci95"}, ...]}`` per window
- ``{"kind": "summary", "complete", "windows", "windows_seen", "large_key_min_true",
  "large_values", "large_within_ci95", "mean_relative_error_large", "rare_keys_in_data",
  "rare_keys_released", "epsilon_spent_total", "horizon_epsilon_spent",
  "max_epsilon_per_horizon", "events_produced", "elapsed_s"}`` — also after an interruption,
  with ``"complete": false``.

Every object has ``"schema_version": 1``.
"""

from __future__ import annotations

import math
from typing import Any, TextIO

import orjson

from stream_dp.clients.producer import ProduceReport
from stream_dp.demo.results import KeyRow, QueryWindow, Summary, WindowResult
from stream_dp.demo.runner import StartInfo
from stream_dp.demo.scenario import IDLE_CLOSE_S, VISITS_QUERY
from stream_dp.privacy.planner import QueryPlan
from stream_dp.privacy.statistics import STATISTICS

SCHEMA_VERSION = 1
_LABEL_WIDTH = 32

#: How the demo names each statistic (its registry's words).
_STATISTIC_WORDS: dict[str, str] = {name: s.words for name, s in STATISTICS.items()}


def _num(value: float) -> int | float:
    """Integral floats as ints (counts), others as they are."""
    return int(value) if math.isfinite(value) and float(value).is_integer() else value


def _fmt(value: float) -> str:
    v = _num(value)
    return f"{v:,}" if isinstance(v, int) else f"{v:,.{_decimals(v)}f}"


def _decimals(value: float) -> int:
    """Cents below 1000, whole numbers above (a variance in ms² fits its column)."""
    return 2 if abs(value) < 1000 else 0


def _signed(value: float) -> str:
    v = _num(value)
    if v == 0:
        return "0"
    text = f"{abs(v):,}" if isinstance(v, int) else f"{abs(v):,.{_decimals(v)}f}"
    return ("+" if v > 0 else "−") + text


def _clock(iso: str) -> str:
    return iso[11:19] if len(iso) >= 19 else iso


def _leave_window(windows: int) -> int | None:
    """The last window employee-0000 is present in (1-based), or None if never on leave."""
    return windows // 2 if windows >= 2 else None


class ConsoleReporter:
    """Readable report on ``out``; a live status line on ``status`` (a terminal) if given."""

    def __init__(self, out: TextIO, status: TextIO | None = None) -> None:
        self.out = out
        self.status = status
        self._status_shown = False
        self._info: StartInfo | None = None
        self._report: ProduceReport | None = None
        self._visits_scale: float | None = None

    # -- status line --------------------------------------------------------------------
    def _show_status(self, text: str) -> None:
        if self.status is None:
            return
        self.status.write("\r\x1b[K" + text)
        self.status.flush()
        self._status_shown = True

    def _clear_status(self) -> None:
        if self.status is not None and self._status_shown:
            self.status.write("\r\x1b[K")
            self.status.flush()
            self._status_shown = False

    def _print(self, text: str = "") -> None:
        self._clear_status()
        self.out.write(text + "\n")
        self.out.flush()

    # -- Reporter -----------------------------------------------------------------------
    def started(self, info: StartInfo) -> None:
        self._info = info
        opts, spec, cfg = info.options, info.spec, info.config
        b = cfg.bounds
        p = self._print
        p("stream-dp demo: private statistics from synthetic browser logs, beside the true ones")
        p(
            f"  broker   embedded (Tansu), pid {info.broker_pid}, {info.bootstrap_servers}; "
            "in memory, stopped when the demo ends"
        )
        p(
            "  key      ephemeral pseudonym key made for this run (demo only: "
            "`stream-dp run` refuses to start without a real secret key)"
        )
        p(
            f"  data     {opts.users:,} employees · {opts.windows} windows of "
            f"{spec.window_size_s} s event time · {info.events:,} events"
        )
        p(
            f"           {info.rare_domains} rare domains (rare-NNN.example), each visited by "
            "one employee: they must never be released"
        )
        leave = _leave_window(opts.windows)
        if leave is not None:
            p(
                f"           employee-0000 goes on leave after window {leave}: "
                "the numbers must not give that away"
            )
        p(
            f"  bounds   per employee and window: ≤ {b.max_contributions_per_window} visits (k), "
            f"≤ {b.max_keys_per_user} domains (L0), ≤ {b.max_contributions_per_key} visits "
            "per domain (Linf)"
        )
        pr = cfg.privacy
        p(
            f"  budget   ε {pr.epsilon_per_window:g} and δ {pr.delta_per_window:g} per window; "
            f"horizon {pr.horizon_windows} windows, ε ≤ {pr.max_epsilon_per_horizon:g} in total"
        )
        for i, plan in enumerate(info.plan.queries):
            head = "  queries  " if i == 0 else "           "
            p(head + self._describe_plan(plan))
        p(
            "  columns  true = exact value after contribution bounding (shown only because the "
            "data is synthetic;"
        )
        p(
            "           never published) · released = the output topic's value · "
            "error = released − true · ✓ = inside the stated 95% CI"
        )
        p(
            "           not released = how many keys partition selection dropped (shown by the "
            "demo only, never which)"
        )
        p()

    @staticmethod
    def _describe_plan(plan: QueryPlan) -> str:
        stat = _STATISTIC_WORDS.get(plan.statistic, plan.statistic)
        per = "/".join(plan.group_by)
        if plan.public_keys is not None:
            keys = "public keys " + " ".join(str(", ".join(map(str, k))) for k in plan.public_keys)
        else:
            keys = "private keys"
        delta = f" δ {plan.delta:g}" if plan.delta else ""
        text = (
            f"{plan.name}: {stat} per {per}, {keys}; ε {plan.epsilon:g}{delta}, "
            f"noise scale {plan.noise_scale:.3g}, 95% CI ±{_fmt(plan.ci95)}"
            + (f" {plan.ci95_unit}" if plan.ci95_unit else "")
        )
        if plan.selection is not None:
            d = plan.selection.describe()
            half, sure = d.get("users_for_half_keep"), d.get("users_for_certain_keep")
            if half is not None and sure is not None:
                text += (
                    f"\n             selection ({d.get('strategy')}): a {per} is released with "
                    f"probability ½ at {half} distinct users, for sure from {sure}"
                )
            elif d.get("threshold") is not None:
                text += (
                    f"\n             selection ({d.get('strategy')}): released when its noisy "
                    f"test passes the threshold {d['threshold']:.4g}"
                )
        return text

    def producing(self, sent: int, total: int, elapsed_s: float) -> None:
        rate = sent / elapsed_s if elapsed_s > 0 else 0.0
        pct = 100 * sent / total if total else 100.0
        self._show_status(f"producing events {sent:,}/{total:,} ({pct:.0f}%) · {rate:,.0f}/s")

    def produced(self, report: ProduceReport) -> None:
        self._report = report
        self._print(
            f"produced {report.records:,} events ({report.bytes / 1e6:.1f} MB) to "
            f"`{report.topic}` in {report.seconds:.1f} s ({report.rate:,.0f} events/s)"
        )

    def worker_started(self) -> None:
        self._print(
            "worker started: a window closes when event time passes its end, the last one "
            f"after {IDLE_CLOSE_S:g} s without events"
        )

    def waiting(self, window_index: int, total: int, elapsed_s: float) -> None:
        self._show_status(f"waiting for window {window_index}/{total} to close · {elapsed_s:.1f} s")

    def window(self, result: WindowResult) -> None:
        p = self._print
        p()
        p(
            f"window {result.index}/{result.total} · {result.window_start[:10]} "
            f"{_clock(result.window_start)} → {_clock(result.window_end)} UTC (event time)"
        )
        for q in result.queries:
            self._query_block(q)
        horizon = self._info.config.privacy.max_epsilon_per_horizon if self._info else None
        cap = f" of {horizon:g}" if horizon is not None else ""
        p(
            f"  ε spent: {result.epsilon_spent:g} this window · "
            f"{result.horizon_epsilon_spent:g}{cap} over the horizon"
        )

    def _query_block(self, q: QueryWindow) -> None:
        if q.query == VISITS_QUERY and q.noise_scale is not None:
            self._visits_scale = q.noise_scale
        keys = "public keys" if q.public_keys else "private keys"
        stat = _STATISTIC_WORDS.get(q.statistic, q.statistic)
        fields = ", ".join(q.rows[0].group) if q.rows else "key"
        self._print(f"  {q.query} · {stat} per {fields} · {keys}")
        self._print(
            f"    {fields:<{_LABEL_WIDTH}}{'true':>10}{'released':>10}{'error':>9}{'95% CI':>9}"
        )
        for row in q.rows:
            self._print(self._row(row))
        if not q.rows:
            self._print("    (no key released)")
        if q.suppressed_keys:
            self._print(f"    + {q.suppressed_keys} not released (partition selection)")

    @staticmethod
    def _row(row: KeyRow) -> str:
        label = row.label if len(row.label) <= _LABEL_WIDTH else row.label[: _LABEL_WIDTH - 1] + "…"
        if row.ci95_in_ranks:
            mark = "(95% CI in ranks)"
        else:
            mark = "✓" if row.within_ci95 else "✗ outside the 95% CI"
        return (
            f"    {label:<{_LABEL_WIDTH}}{_fmt(row.true_value):>10}{_fmt(row.released):>10}"
            f"{_signed(row.error):>9}{'±' + _fmt(row.ci95):>9}  {mark}"
        )

    def finished(self, summary: Summary) -> None:
        title = f"summary · {summary.windows_seen} windows in {summary.elapsed_s:.1f} s"
        self._summary(summary, title)
        self._print()
        self._print(
            "next: `stream-dp demo --json` gives the same as JSON lines; README "
            '"Using it on your own topic" runs it on your data'
        )

    def interrupted(self, summary: Summary | None) -> None:
        seen = summary.windows_seen if summary is not None else 0
        total = summary.windows_expected if summary is not None else "?"
        self._print()
        self._print(f"interrupted after {seen} of {total} windows: worker and broker stopped")
        if summary is not None and summary.windows_seen:
            self._summary(summary, "summary so far")

    def _summary(self, s: Summary, title: str) -> None:
        p = self._print
        p()
        p(title)
        if s.large_values:
            mre = s.mean_relative_error_large or 0.0
            share = s.large_within_ci95 / s.large_values
            p(
                f"  large keys (true ≥ {s.large_key_min}): {s.large_values} released values, "
                f"mean relative error {100 * mre:.1f}%; {s.large_within_ci95} of "
                f"{s.large_values} ({100 * share:.0f}%) inside their 95% CI"
            )
        else:
            p(f"  large keys (true ≥ {s.large_key_min}): none released")
        p(
            f"  rare keys released: {s.rare_keys_released} (rare domains in the data: "
            f"{s.rare_keys_in_data} over {s.windows_seen} windows, each from a single employee)"
        )
        p(
            f"  ε spent: {s.epsilon_spent_total:g} in total over {s.windows_seen} windows; "
            f"any one employee's loss over the horizon ≤ {s.horizon_epsilon_spent:g} "
            f"(cap {s.max_epsilon_per_horizon:g})"
        )
        info = self._info
        leave = _leave_window(info.options.windows) if info is not None else None
        if info is not None and leave is not None and s.windows_seen > leave:
            b = info.config.bounds
            scale = f"{self._visits_scale:.3g}" if self._visits_scale is not None else "?"
            eps = info.config.privacy.epsilon_per_window
            p(
                f"  employee-0000 (on leave after window {leave}) moved a domain's count by at "
                f"most {b.max_contributions_per_key}, against noise of scale {scale}:"
            )
            p(
                f"  with or without them, each window's numbers are at most "
                f"e^{eps:g} ≈ {math.exp(eps):.3g}× more or less likely — the leave does not show"
            )


class JsonReporter:
    """One JSON object per line on ``out`` (see the module docstring)."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self._report: ProduceReport | None = None

    def _emit(self, record: dict[str, Any]) -> None:
        self.out.write(orjson.dumps({"schema_version": SCHEMA_VERSION, **record}).decode() + "\n")
        self.out.flush()

    def started(self, info: StartInfo) -> None:
        cfg = info.config
        self._emit(
            {
                "kind": "start",
                "broker": {"pid": info.broker_pid, "bootstrap_servers": info.bootstrap_servers},
                "ephemeral_key": True,
                "data": {
                    "users": info.options.users,
                    "windows": info.options.windows,
                    "window_size_s": info.spec.window_size_s,
                    "events": info.events,
                    "rare_domains": info.rare_domains,
                    "leaver_last_window": _leave_window(info.options.windows),
                },
                "privacy": cfg.privacy.model_dump(mode="json", exclude={"unsafe_test_mode"}),
                "bounds": cfg.bounds.model_dump(mode="json"),
                "queries": [
                    {
                        "name": q.name,
                        "statistic": q.statistic,
                        "group_by": list(q.group_by),
                        "keys": "private" if q.public_keys is None else "public",
                        "epsilon": q.epsilon,
                        "delta": q.delta,
                        "mechanism": q.stated_mechanism,
                        "noise_scale": q.noise_scale,
                        "ci95": q.ci95,
                        "selection": None if q.selection is None else q.selection.describe(),
                    }
                    for q in info.plan.queries
                ],
            }
        )

    def producing(self, sent: int, total: int, elapsed_s: float) -> None:
        pass

    def produced(self, report: ProduceReport) -> None:
        self._report = report

    def worker_started(self) -> None:
        pass

    def waiting(self, window_index: int, total: int, elapsed_s: float) -> None:
        pass

    def window(self, result: WindowResult) -> None:
        self._emit(
            {
                "kind": "window",
                "index": result.index,
                "windows": result.total,
                "window_start": result.window_start,
                "window_end": result.window_end,
                "epsilon_spent": result.epsilon_spent,
                "horizon_epsilon_spent": result.horizon_epsilon_spent,
                "queries": [
                    {
                        "query": q.query,
                        "statistic": q.statistic,
                        "keys": "public" if q.public_keys else "private",
                        "released_keys": q.released_keys,
                        "suppressed_keys": q.suppressed_keys,
                        "rare_keys_in_data": q.rare_keys_in_data,
                        "epsilon_spent": q.epsilon_spent,
                        "delta_spent": q.delta_spent,
                        "horizon_epsilon_spent": q.horizon_epsilon_spent,
                        "mechanism": q.mechanism,
                        "noise_scale": q.noise_scale,
                        "ci95": q.ci95,
                    }
                    for q in result.queries
                ],
                "rows": [
                    {
                        "query": q.query,
                        "group": row.group,
                        "true_value": _num(row.true_value),
                        "released_value": _num(row.released),
                        "error": _num(row.error),
                        "ci95": _num(row.ci95),
                        "noise_scale": row.noise_scale,
                        "within_ci95": row.within_ci95,
                    }
                    for q in result.queries
                    for row in q.rows
                ],
            }
        )

    def finished(self, summary: Summary) -> None:
        self._summary(summary)

    def interrupted(self, summary: Summary | None) -> None:
        if summary is not None:
            self._summary(summary)

    def _summary(self, s: Summary) -> None:
        self._emit(
            {
                "kind": "summary",
                "complete": s.complete,
                "windows": s.windows_expected,
                "windows_seen": s.windows_seen,
                "large_key_min_true": s.large_key_min,
                "large_values": s.large_values,
                "large_within_ci95": s.large_within_ci95,
                "mean_relative_error_large": s.mean_relative_error_large,
                "rare_keys_in_data": s.rare_keys_in_data,
                "rare_keys_released": s.rare_keys_released,
                "epsilon_spent_total": s.epsilon_spent_total,
                "horizon_epsilon_spent": s.horizon_epsilon_spent,
                "max_epsilon_per_horizon": s.max_epsilon_per_horizon,
                "events_produced": self._report.records if self._report else 0,
                "elapsed_s": round(s.elapsed_s, 3),
            }
        )
