"""The demo's results as one self-contained HTML page (``stream-dp demo --html FILE``).

Inline SVG charts and CSS only — no script, no font, no image, nothing fetched: the file
opens anywhere, offline. Per query it shows the released values against the true ones over
the windows with their 95% CI bands, the keys partition selection kept and dropped (the
rare-domains story), and the ε spent per window and over the horizon.

:class:`HtmlReporter` is a demo :class:`~stream_dp.demo.runner.Reporter` that collects what
the run reports and writes the page when it finishes (or is interrupted);
:func:`render_report` is the pure part.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from datetime import UTC, datetime
from html import escape
from pathlib import Path

from stream_dp import __version__
from stream_dp.clients.producer import ProduceReport
from stream_dp.demo.results import KeyRow, QueryWindow, Summary, WindowResult
from stream_dp.demo.runner import Reporter, StartInfo
from stream_dp.demo.svg import GREY, PALETTE, Chart, Value
from stream_dp.privacy.statistics import STATISTICS

#: Keys charted per query (the largest by true value over the run).
KEYS_PER_QUERY = 6

#: How the demo names each statistic (its registry's words).
_STATISTIC_WORDS: dict[str, str] = {name: s.words for name, s in STATISTICS.items()}

_CSS = """
:root { color-scheme: light; }
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif;
       margin: 0 auto; max-width: 1240px; padding: 24px 32px 48px; color: #1b1b1b;
       background: #ffffff; line-height: 1.45; }
h1 { font-size: 26px; margin: 0 0 4px; }
h2 { font-size: 20px; margin: 36px 0 6px; border-bottom: 2px solid #e3e3e3; padding-bottom: 4px; }
h3 { font-size: 16px; margin: 22px 0 6px; }
p.lede { color: #444; margin: 4px 0 14px; max-width: 70em; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; margin: 18px 0 8px; }
.card { border: 1px solid #dcdcdc; border-radius: 8px; padding: 10px 14px; min-width: 170px;
        background: #fafafa; }
.card b { display: block; font-size: 22px; }
.card span { color: #555; font-size: 13px; }
.card.good b { color: #00734d; }
.grid { display: flex; flex-wrap: wrap; gap: 8px 18px; }
svg { font-size: 11px; fill: #333; background: #fff; }
svg .title { font-size: 13px; font-weight: 600; fill: #1b1b1b; }
svg .grid { stroke: #ececec; }
svg .axis { stroke: #888; }
table { border-collapse: collapse; margin: 8px 0; font-size: 13px; }
th, td { padding: 3px 10px; text-align: right; border-bottom: 1px solid #eee; }
th:first-child, td:first-child { text-align: left; }
.note { color: #555; font-size: 13px; max-width: 70em; }
footer { margin-top: 40px; color: #666; font-size: 12px; }
"""


def _fmt(value: float) -> str:
    if math.isfinite(value) and float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.3g}"


def _short(iso: str) -> str:
    return iso[11:19] if len(iso) >= 19 else iso


def _series(results: Sequence[WindowResult], query: str, label: str) -> list[KeyRow | None]:
    out: list[KeyRow | None] = []
    for w in results:
        q = next((q for q in w.queries if q.query == query), None)
        out.append(None if q is None else next((r for r in q.rows if r.label == label), None))
    return out


def _top_labels(results: Sequence[WindowResult], query: str) -> list[str]:
    totals: dict[str, float] = {}
    for w in results:
        for q in w.queries:
            if q.query == query:
                for row in q.rows:
                    totals[row.label] = totals.get(row.label, 0.0) + row.true_value
    ranked = sorted(totals, key=lambda k: (-totals[k], k))
    return ranked[:KEYS_PER_QUERY]


def _key_chart(results: Sequence[WindowResult], query: str, label: str, color: str) -> str:
    rows = _series(results, query, label)
    categories = [f"w{w.index}" for w in results]

    def pick(attr: str) -> list[Value]:
        return [None if r is None else float(getattr(r, attr)) for r in rows]

    released = pick("released")
    chart = Chart(title=label, categories=categories, width=380, height=240)
    # A quantile's ci95 counts ranks, not the value's units: no band for it.
    in_ranks = any(r is not None and r.ci95_in_ranks for r in rows)
    if not in_ranks:
        chart.band(
            [None if r is None else r.released - r.ci95 for r in rows],
            [None if r is None else r.released + r.ci95 for r in rows],
            color,
            "95% CI",
        )
    chart.line(pick("true_value"), GREY, "true", dashed=True)
    chart.line(released, color, None)  # joins the released points below
    tips = [
        "not released"
        if r is None
        else f"{w.window_start}: released {_fmt(r.released)} ± {_fmt(r.ci95)}"
        f"{' ranks' if in_ranks else ''}, "
        f"true {_fmt(r.true_value)}"
        for w, r in zip(results, rows, strict=True)
    ]
    chart.points(released, color, "released", tips)
    return chart.render()


def _query_section(results: Sequence[WindowResult], query: QueryWindow) -> str:
    name = query.query
    stat = _STATISTIC_WORDS.get(query.statistic, query.statistic)
    field = ", ".join(query.rows[0].group) if query.rows else "key"
    keys = "public keys" if query.public_keys else "private keys"
    parts = [f"<section><h2>{escape(name)} · {escape(stat)} per {escape(field)} · {keys}</h2>"]
    if query.rows and query.rows[0].ci95_in_ranks:
        parts.append(
            '<p class="lede">Each quantile is a bin edge chosen by the exponential mechanism; '
            "its 95% interval counts ranks (positions in the sorted values), so no band is "
            "drawn. The dashed line is the true quantile, which only this demo can show "
            "because its data is synthetic.</p>"
        )
    elif query.mechanism is not None and query.noise_scale is not None:
        parts.append(
            f'<p class="lede">{escape(query.mechanism.replace("_", " "))} noise of scale '
            f"{_fmt(query.noise_scale)}, ε {_fmt(query.epsilon_spent)} per window; every "
            f"release states its 95% interval (±{_fmt(query.ci95 or 0)}): the shaded band. "
            "The dashed line is the true value after contribution bounding, which only this "
            "demo can show because its data is synthetic.</p>"
        )
    labels = _top_labels(results, name)
    parts.append('<div class="grid">')
    for i, label in enumerate(labels):
        parts.append(_key_chart(results, name, label, PALETTE[i % len(PALETTE)]))
    parts.append("</div>")
    if not labels:
        parts.append('<p class="note">No key was released in any window.</p>')
    parts.append(_selection_block(results, query))
    parts.append("</section>")
    return "".join(parts)


def _selection_block(results: Sequence[WindowResult], first: QueryWindow) -> str:
    name = first.query
    per_window = [next((q for q in w.queries if q.query == name), None) for w in results]
    released = [float(q.released_keys) if q else 0.0 for q in per_window]
    if first.public_keys:
        return (
            '<p class="note">Public keys: every listed key is released in every window '
            f"({', '.join(_fmt(v) for v in released)} per window), noisy, whatever the data.</p>"
        )
    dropped = [float(q.suppressed_keys or 0) if q else 0.0 for q in per_window]
    rare = [q.rare_keys_in_data if q else 0 for q in per_window]
    rare_released = sum(1 for q in per_window if q for row in q.rows if row.rare)
    chart = Chart(
        title="Keys in the data: released vs dropped by partition selection",
        categories=[f"w{w.index}" for w in results],
        y_label="keys",
        width=560,
        height=260,
    )
    chart.bars([(released, PALETTE[2], "released"), (dropped, PALETTE[3], "not released")])
    rows = "".join(
        f"<tr><td>w{w.index} · {escape(_short(w.window_start))}</td><td>{_fmt(r)}</td>"
        f"<td>{_fmt(d)}</td><td>{n}</td></tr>"
        for w, r, d, n in zip(results, released, dropped, rare, strict=True)
    )
    return (
        "<h3>Keys nobody listed: only those enough people stand behind</h3>"
        f'<div class="grid">{chart.render()}<div><table><tr><th>window</th><th>released</th>'
        f"<th>not released</th><th>rare domains in the data</th></tr>{rows}</table>"
        f'<p class="note">Each rare domain was visited by a single employee. Released: '
        f"<b>{rare_released} of {sum(rare)}</b>. A key appears only when partition selection "
        "finds enough distinct users behind it, so a domain only one person visits never "
        "shows up — not in the output, not in a count of dropped keys there. The dropped "
        "count in this chart exists only in the demo.</p></div></div>"
    )


def _budget_section(results: Sequence[WindowResult], info: StartInfo | None) -> str:
    names = [q.query for q in results[0].queries] if results else []
    chart = Chart(
        title="ε per window (stacked by query) and over the horizon",
        categories=[f"w{w.index}" for w in results],
        y_label="ε",
        width=760,
        height=300,
        y_min=0.0,
    )
    stacks = []
    for i, name in enumerate(names):
        values = [
            next((q.epsilon_spent for q in w.queries if q.query == name), 0.0) for w in results
        ]
        stacks.append((values, PALETTE[i % len(PALETTE)], f"ε {name}"))
    chart.bars(stacks)
    chart.line([w.horizon_epsilon_spent for w in results], "#000000", "ε over the horizon")
    if info is not None:
        chart.rule(info.config.privacy.max_epsilon_per_horizon, PALETTE[3], "horizon cap")
    horizon = info.config.privacy.horizon_windows if info is not None else None
    text = (
        "Each window spends its budget once, shared by the queries; what any one user can "
        "have lost adds up over the rolling horizon"
        + (f" of {horizon} windows" if horizon else "")
        + ", and never passes the cap (checked when the configuration loads)."
    )
    return (
        f'<section><h2>Privacy budget</h2><p class="lede">{escape(text)}</p>'
        f"{chart.render()}</section>"
    )


def _cards(summary: Summary | None, results: Sequence[WindowResult]) -> str:
    if summary is None:
        return ""
    cards = [("", _fmt(summary.windows_seen), f"of {summary.windows_expected} windows released")]
    if summary.large_values:
        share = summary.large_within_ci95 / summary.large_values
        cards.append(
            (
                "good" if share >= 0.8 else "",
                f"{100 * share:.0f}%",
                f"of {summary.large_values} large values inside their 95% CI",
            )
        )
    if summary.mean_relative_error_large is not None:
        cards.append(
            (
                "",
                f"{100 * summary.mean_relative_error_large:.1f}%",
                "mean relative error, large keys",
            )
        )
    cards.append(
        (
            "good" if summary.rare_keys_released == 0 else "",
            f"{summary.rare_keys_released} of {summary.rare_keys_in_data}",
            "rare domains released",
        )
    )
    cards.append(
        (
            "",
            f"ε {_fmt(summary.horizon_epsilon_spent)}",
            f"over the horizon (cap {_fmt(summary.max_epsilon_per_horizon)})",
        )
    )
    return (
        '<div class="cards">'
        + "".join(
            f'<div class="card {cls}"><b>{escape(big)}</b><span>{escape(small)}</span></div>'
            for cls, big, small in cards
        )
        + "</div>"
    )


def render_report(
    results: Sequence[WindowResult],
    *,
    info: StartInfo | None = None,
    summary: Summary | None = None,
    produced: ProduceReport | None = None,
    now: datetime | None = None,
) -> str:
    """The whole page for the windows seen so far."""
    moment = (now or datetime.now(tz=UTC)).strftime("%Y-%m-%d %H:%M UTC")
    lede = "Synthetic browser logs of employees, released with differential privacy."
    if info is not None:
        opts = info.options
        lede = (
            f"{opts.users:,} employees · {opts.windows} windows of {info.spec.window_size_s} s "
            f"event time · {info.events:,} events · {info.rare_domains} rare domains, each "
            f"visited by one employee · ε {_fmt(info.config.privacy.epsilon_per_window)} per "
            "window."
        )
    if produced is not None:
        lede += f" Produced in {produced.seconds:.1f} s."
    if summary is not None and not summary.complete:
        lede += f" Interrupted after {summary.windows_seen} of {summary.windows_expected} windows."
    body = [
        "<header><h1>stream-dp demo: private results beside the true ones</h1>",
        f'<p class="lede">{escape(lede)}</p></header>',
        _cards(summary, results),
    ]
    if results:
        for query in results[0].queries:
            body.append(_query_section(results, query))
        body.append(_budget_section(results, info))
    else:
        body.append('<p class="note">No window was released before the demo stopped.</p>')
    body.append(
        f"<footer>stream-dp {escape(__version__)} · <code>stream-dp demo --html</code> · "
        f"{escape(moment)} · a self-contained page: inline SVG, no script, nothing fetched."
        "</footer>"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        "<title>stream-dp demo report</title>"
        f"<style>{_CSS}</style></head><body>{''.join(body)}</body></html>\n"
    )


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file beside it (no half-written page)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class HtmlReporter:
    """Collects the demo's reports; writes the page to ``path`` when the run ends."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.info: StartInfo | None = None
        self.report: ProduceReport | None = None
        self.results: list[WindowResult] = []

    def started(self, info: StartInfo) -> None:
        self.info = info

    def produced(self, report: ProduceReport) -> None:
        self.report = report

    def producing(self, sent: int, total: int, elapsed_s: float) -> None:
        pass

    def worker_started(self) -> None:
        pass

    def waiting(self, window_index: int, total: int, elapsed_s: float) -> None:
        pass

    def window(self, result: WindowResult) -> None:
        self.results.append(result)

    def finished(self, summary: Summary) -> None:
        self._write(summary)

    def interrupted(self, summary: Summary | None) -> None:
        self._write(summary)

    def _write(self, summary: Summary | None) -> None:
        page = render_report(self.results, info=self.info, summary=summary, produced=self.report)
        write_atomically(self.path, page)


class TeeReporter:
    """Tells every reporter everything, in order."""

    def __init__(self, *reporters: Reporter) -> None:
        self.reporters = reporters

    def started(self, info: StartInfo) -> None:
        for r in self.reporters:
            r.started(info)

    def produced(self, report: ProduceReport) -> None:
        for r in self.reporters:
            r.produced(report)

    def producing(self, sent: int, total: int, elapsed_s: float) -> None:
        for r in self.reporters:
            r.producing(sent, total, elapsed_s)

    def worker_started(self) -> None:
        for r in self.reporters:
            r.worker_started()

    def waiting(self, window_index: int, total: int, elapsed_s: float) -> None:
        for r in self.reporters:
            r.waiting(window_index, total, elapsed_s)

    def window(self, result: WindowResult) -> None:
        for r in self.reporters:
            r.window(result)

    def finished(self, summary: Summary) -> None:
        for r in self.reporters:
            r.finished(summary)

    def interrupted(self, summary: Summary | None) -> None:
        for r in self.reporters:
            r.interrupted(summary)
