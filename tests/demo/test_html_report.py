"""The demo's HTML report: self-contained, escaped, and drawn by a real browser.

The browser test runs ``stream-dp demo --fast --html FILE`` for real, renders the file in
headless Chromium, and checks that the screenshot shows the charts (not a blank page) and
that the page logged nothing to the console. A control page with a console error and an
uncaught exception proves the console check can fail.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from PIL import Image

from stream_dp.demo.html_report import render_report
from stream_dp.demo.results import KeyRow, QueryWindow, WindowResult
from stream_dp.demo.svg import PALETTE, nice_ticks
from tests.cli.support import run_cli
from tests.demo.browser import chromium_or_reason, render

CHROMIUM, NO_CHROMIUM = chromium_or_reason()
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
#: Attribute values that would make the browser fetch something.
FETCHING = re.compile(r"""(?:src|href|url)\s*[=(]\s*["']?\s*(?:https?:|//)""", re.I)


def _window(index: int, released: float, *, rare_label: str = "site00.example") -> WindowResult:
    rows = [
        KeyRow(group={"domain": rare_label}, true_value=1000, released=released, ci95=160,
               noise_scale=53.3),
        KeyRow(group={"domain": "<script>alert(1)</script>"}, true_value=400, released=390,
               ci95=160, noise_scale=53.3),
    ]  # fmt: skip
    visits = QueryWindow(
        query="visits_by_domain", statistic="count", public_keys=False, rows=rows,
        released_keys=2, suppressed_keys=9, rare_keys_in_data=6, epsilon_spent=0.75,
        delta_spent=1e-6, horizon_epsilon_spent=index, mechanism="discrete_laplace",
        noise_scale=53.3, ci95=160,
    )  # fmt: skip
    return WindowResult(
        index=index, total=3, window_start=f"2020-08-01T00:00:{10 * (index - 1):02d}Z",
        window_end=f"2020-08-01T00:00:{10 * index:02d}Z", queries=[visits],
    )  # fmt: skip


def test_the_page_is_self_contained_and_escapes_keys() -> None:
    page = render_report([_window(1, 1010), _window(2, 980), _window(3, 1100)])
    assert page.startswith("<!DOCTYPE html>")
    assert "<script" not in page  # the hostile key is text, not markup
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert not FETCHING.search(page)
    assert page.count("<svg") == 4  # two keys, the selection bars, the ε chart
    # The CI band of a key: a polygon through released ± ci95 over the windows.
    assert page.count("<polygon") >= 2
    assert "0 of 18" in page  # rare domains released, of those in the data


def test_nice_ticks_cover_the_range() -> None:
    assert nice_ticks(0, 4) == [0, 1, 2, 3, 4]
    ticks = nice_ticks(612.5, 1333)
    assert ticks[0] <= 612.5 and ticks[-1] >= 1333 and len(ticks) <= 7
    assert nice_ticks(3, 3) == [3, 3.2, 3.4, 3.6, 3.8, 4]


@needs_chromium
def test_chromium_reports_console_errors_of_a_broken_page(tmp_path: Path) -> None:
    page = tmp_path / "broken.html"
    page.write_text(
        "<!DOCTYPE html><html><body><p>x</p><script>console.error('boom');"
        "notDefinedAnywhere();</script></body></html>",
        encoding="utf-8",
    )
    rendered = render(page, tmp_path / "broken.png", height_px=600)
    assert any("boom" in line for line in rendered.console), rendered.log[-2000:]
    assert any("notDefinedAnywhere" in line for line in rendered.console)


@needs_chromium
@pytest.mark.slow
@pytest.mark.kafka  # the demo starts its own embedded broker
def test_the_demo_report_renders_in_chromium(tmp_path: Path) -> None:
    report = tmp_path / "demo-report.html"
    result = run_cli("demo", "--fast", "--html", str(report))
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"HTML report written to {report}" in result.stderr
    page = report.read_text(encoding="utf-8")
    assert not FETCHING.search(page) and "<script" not in page
    rendered = render(report, tmp_path / "demo-report.png")
    assert rendered.console == [], rendered.console
    with Image.open(rendered.screenshot) as image:
        rgb = image.convert("RGB")
        width, height = rgb.size
        raw = rgb.resize((width // 4, height // 4)).tobytes()
    pixels = [tuple(raw[i : i + 3]) for i in range(0, len(raw), 3)]
    non_white = sum(1 for p in pixels if min(p) < 235) / len(pixels)
    colours = {(r // 16, g // 16, b // 16) for r, g, b in pixels}
    assert non_white > 0.03, f"the page looks blank: {non_white:.1%} non-white pixels"
    assert len(colours) > 40, f"only {len(colours)} colours: no charts drawn?"
    # The first key's colour (its CI band and points) is on the page.
    blue = tuple(int(PALETTE[0][i : i + 2], 16) for i in (1, 3, 5))
    near_blue = sum(1 for p in pixels if sum(abs(a - b) for a, b in zip(p, blue, strict=True)) < 60)
    assert near_blue > 20, "no chart colours in the screenshot"


def test_a_quantile_chart_draws_no_band_of_ranks() -> None:
    """A quantile's ci95 counts ranks: a band of ± ranks around milliseconds would be drawn
    on the wrong scale, so its charts have none (and say why)."""
    row = KeyRow(group={"country": "DE", "quantile": 0.5}, true_value=120.0, released=125.0,
                 ci95=19_648, noise_scale=1780.0, ci95_in_ranks=True)  # fmt: skip
    quantiles = QueryWindow(
        query="latency_quantiles", statistic="quantile", public_keys=True, rows=[row],
        released_keys=1, suppressed_keys=None, rare_keys_in_data=0, epsilon_spent=0.1,
        delta_spent=0.0, horizon_epsilon_spent=0.1, mechanism="exponential",
        noise_scale=1780.0, ci95=19_648,
    )  # fmt: skip
    window = WindowResult(index=1, total=1, window_start="2020-08-01T00:00:00Z",
                          window_end="2020-08-01T00:00:10Z", queries=[quantiles])  # fmt: skip
    page = render_report([window])
    assert page.count("<svg") == 2  # the key, the ε chart
    assert "<polygon" not in page and "95% CI" not in page
    assert "counts ranks" in page and "± 19,648 ranks" in page
