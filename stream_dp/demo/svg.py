"""Small inline-SVG charts for the demo's HTML report: pure string building, no dependency.

A :class:`Chart` maps categories (windows) on x and numbers on y into a fixed pixel box and
collects elements — bands, lines, points, bars, a horizontal rule — then renders them with
axes, ticks and a legend. Every text is XML-escaped; points carry a ``<title>`` tooltip.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from html import escape

#: Colours that stay apart for colour-blind readers (Okabe–Ito).
PALETTE: tuple[str, ...] = (
    "#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000",
)  # fmt: skip
GREY = "#7f7f7f"

Value = float | None
YScale = Callable[[float], float]


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering [low, high] (1, 2, 2.5 or 5 times a power of ten apart)."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return [0.0]
    if high <= low:
        high = low + 1.0
    raw = (high - low) / max(1, count)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first = math.floor(low / step) * step
    ticks = []
    tick = first
    while tick <= high + step * 1e-9:
        ticks.append(round(tick, 10))
        tick += step
    if ticks[-1] < high:
        ticks.append(round(tick, 10))
    return ticks


def _fmt(value: float) -> str:
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value):,}"
    return f"{value:,.3g}"


@dataclass
class Chart:
    title: str
    categories: Sequence[str]
    y_label: str = ""
    width: int = 560
    height: int = 260
    _elements: list[str] = field(default_factory=list)
    _legend: list[tuple[str, str, str]] = field(default_factory=list)
    _values: list[float] = field(default_factory=list)
    _pending: list[tuple[str, tuple[object, ...]]] = field(default_factory=list)
    y_min: float | None = None

    # Plot area inside the SVG.
    left: int = 64
    right: int = 16
    top: int = 34
    bottom: int = 58

    def band(self, low: Sequence[Value], high: Sequence[Value], color: str, label: str) -> None:
        self._track(low, high)
        self._pending.append(("band", (low, high, color)))
        self._legend.append(("band", color, label))

    def line(
        self, values: Sequence[Value], color: str, label: str | None, *, dashed: bool = False
    ) -> None:
        """A line through the values (gaps where None); ``label`` None: not in the legend."""
        self._track(values)
        self._pending.append(("line", (values, color, dashed)))
        if label is not None:
            self._legend.append(("dashed" if dashed else "line", color, label))

    def points(self, values: Sequence[Value], color: str, label: str, tips: Sequence[str]) -> None:
        self._track(values)
        self._pending.append(("points", (values, color, tips)))
        self._legend.append(("point", color, label))

    def bars(self, stacks: Sequence[tuple[Sequence[float], str, str]]) -> None:
        """Stacked bars per category: (values, colour, label) from the bottom up."""
        if self.y_min is None:
            self.y_min = 0.0  # bars start at zero
        totals = [sum(vals[i] for vals, _, _ in stacks) for i in range(len(self.categories))]
        self._track(totals, [0.0])
        self._pending.append(("bars", (stacks,)))
        self._legend.extend(("bar", color, label) for _, color, label in stacks)

    def rule(self, y: float, color: str, label: str) -> None:
        self._track([y])
        self._pending.append(("rule", (y, color)))
        self._legend.append(("dashed", color, label))

    # -- rendering ------------------------------------------------------------------------
    def _track(self, *series: Sequence[Value]) -> None:
        self._values.extend(v for s in series for v in s if v is not None and math.isfinite(v))

    def _x(self, index: int) -> float:
        span = self.width - self.left - self.right
        step = span / max(1, len(self.categories))
        return self.left + step * (index + 0.5)

    def _slot(self) -> float:
        return (self.width - self.left - self.right) / max(1, len(self.categories))

    def render(self) -> str:
        values = self._values or [0.0]
        low = min(values) if self.y_min is None else min(self.y_min, min(values))
        high = max(values)
        pad = (high - low) * 0.05 or 1.0
        ticks = nice_ticks(low - (0 if self.y_min is not None else pad), high + pad)
        y0, y1 = ticks[0], ticks[-1]
        plot_h = self.height - self.top - self.bottom

        def y(v: float) -> float:
            return self.top + plot_h * (1 - (v - y0) / (y1 - y0))

        out: list[str] = []
        for tick in ticks:
            ty = y(tick)
            out.append(
                f'<line x1="{self.left}" x2="{self.width - self.right}" y1="{ty:.1f}" '
                f'y2="{ty:.1f}" class="grid"/>'
                f'<text x="{self.left - 6}" y="{ty + 4:.1f}" text-anchor="end">'
                f"{escape(_fmt(tick))}</text>"
            )
        for i, name in enumerate(self.categories):
            out.append(
                f'<text x="{self._x(i):.1f}" y="{self.height - self.bottom + 16}" '
                f'text-anchor="middle">{escape(name)}</text>'
            )
        for kind, args in self._pending:
            out.append(getattr(self, f"_draw_{kind}")(y, *args))
        out.append(
            f'<line x1="{self.left}" x2="{self.left}" y1="{self.top}" '
            f'y2="{self.height - self.bottom}" class="axis"/>'
            f'<line x1="{self.left}" x2="{self.width - self.right}" '
            f'y1="{self.height - self.bottom}" y2="{self.height - self.bottom}" class="axis"/>'
        )
        if self.y_label:
            out.append(
                f'<text x="14" y="{self.top + plot_h / 2:.1f}" text-anchor="middle" '
                f'transform="rotate(-90 14 {self.top + plot_h / 2:.1f})">'
                f"{escape(self.y_label)}</text>"
            )
        out.append(f'<text x="{self.left}" y="20" class="title">{escape(self.title)}</text>')
        out.append(self._legend_svg())
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {self.width} {self.height}" '
            f'width="{self.width}" height="{self.height}" role="img" '
            f'aria-label="{escape(self.title)}">{"".join(out)}</svg>'
        )

    def _legend_svg(self) -> str:
        x, ly = float(self.left), float(self.height - 16)
        items = []
        for kind, color, label in self._legend:
            if kind in ("band", "bar"):
                mark = (
                    f'<rect x="{x:.1f}" y="{ly - 9:.1f}" width="14" height="10" fill="{color}" '
                    f'fill-opacity="{0.25 if kind == "band" else 0.85}"/>'
                )
            elif kind == "point":
                mark = f'<circle cx="{x + 7:.1f}" cy="{ly - 4:.1f}" r="4" fill="{color}"/>'
            else:
                dash = ' stroke-dasharray="5 3"' if kind == "dashed" else ""
                mark = (
                    f'<line x1="{x:.1f}" x2="{x + 14:.1f}" y1="{ly - 4:.1f}" y2="{ly - 4:.1f}" '
                    f'stroke="{color}" stroke-width="2"{dash}/>'
                )
            items.append(mark + f'<text x="{x + 18:.1f}" y="{ly:.1f}">{escape(label)}</text>')
            x += 30 + 6.2 * len(label)
        return "".join(items)

    def _draw_band(self, y: YScale, low: Sequence[Value], high: Sequence[Value], color: str) -> str:
        parts = []
        for run in _runs(low, high):
            if len(run) == 1:  # a single window: a short box
                i, lo, hi = run[0]
                w = self._slot() * 0.3
                outline = [(self._x(i) - w, hi), (self._x(i) + w, hi),
                           (self._x(i) + w, lo), (self._x(i) - w, lo)]  # fmt: skip
            else:
                outline = [(self._x(i), hi) for i, _, hi in run]
                outline += [(self._x(i), lo) for i, lo, _ in reversed(run)]
            points = " ".join(f"{px:.1f},{y(py):.1f}" for px, py in outline)
            parts.append(
                f'<polygon points="{points}" fill="{color}" fill-opacity="0.22" stroke="none"/>'
            )
        return "".join(parts)

    def _draw_line(self, y: YScale, values: Sequence[Value], color: str, dashed: bool) -> str:
        dash = ' stroke-dasharray="6 4"' if dashed else ""
        parts = []
        for run in _runs(values, values):
            if len(run) > 1:
                points = " ".join(f"{self._x(i):.1f},{y(v):.1f}" for i, v, _ in run)
                parts.append(
                    f'<polyline points="{points}" fill="none" stroke="{color}" '
                    f'stroke-width="2"{dash}/>'
                )
        return "".join(parts)

    def _draw_points(
        self, y: YScale, values: Sequence[Value], color: str, tips: Sequence[str]
    ) -> str:
        return "".join(
            f'<circle cx="{self._x(i):.1f}" cy="{y(v):.1f}" r="4" fill="{color}">'
            f"<title>{escape(tips[i])}</title></circle>"
            for run in _runs(values, values)
            for i, v, _ in run
        )

    def _draw_bars(self, y: YScale, stacks: Sequence[tuple[Sequence[float], str, str]]) -> str:
        width = self._slot() * 0.6
        parts = []
        for i in range(len(self.categories)):
            base = 0.0
            for values, color, label in stacks:
                v = values[i]
                if v <= 0:
                    continue
                top, bottom = y(base + v), y(base)
                parts.append(
                    f'<rect x="{self._x(i) - width / 2:.1f}" y="{top:.1f}" width="{width:.1f}" '
                    f'height="{bottom - top:.1f}" fill="{color}" fill-opacity="0.85">'
                    f"<title>{escape(f'{self.categories[i]}: {label} {_fmt(v)}')}</title></rect>"
                )
                base += v
        return "".join(parts)

    def _draw_rule(self, y: YScale, value: float, color: str) -> str:
        ry = y(value)
        return (
            f'<line x1="{self.left}" x2="{self.width - self.right}" y1="{ry:.1f}" y2="{ry:.1f}" '
            f'stroke="{color}" stroke-width="1.5" stroke-dasharray="5 3"/>'
        )


def _runs(low: Sequence[Value], high: Sequence[Value]) -> list[list[tuple[int, float, float]]]:
    """Consecutive indexes where both series have a value: [(index, low, high), ...] runs."""
    runs: list[list[tuple[int, float, float]]] = [[]]
    for i, (lo, hi) in enumerate(zip(low, high, strict=True)):
        if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
            if runs[-1]:
                runs.append([])
            continue
        runs[-1].append((i, lo, hi))
    return [r for r in runs if r]
