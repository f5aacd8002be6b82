"""``stream-dp tail``'s table of one window, without a broker: a quantile's line says its
mechanism (exponential), that its noise scale and 95% CI are in ranks, and each released
quantile with its value; a count's line is as it was."""

from __future__ import annotations

import io
from typing import Any

from stream_dp.cli.tail_cmd import _Printer
from stream_dp.clients.output import WindowGroup
from stream_dp.pipeline.formats.records import output_key, release_record, window_record

W0 = 1_596_240_000  # 2020-08-01T00:00:00Z


def _shown(statistic: str, value: Any) -> list[str]:
    release = release_record(
        release_id="r", query="q", window_start_s=W0, window_end_s=W0 + 10,
        group={"domain": "a.example"}, statistic=statistic, value=value, epsilon=1.0,
        delta=0.0, mechanism="discrete_laplace", noise_scale=3.0, ci95=9, selection=None,
        clamped=False,
    )  # fmt: skip
    window = window_record(
        release_id="r", query="q", window_start_s=W0, window_end_s=W0 + 10, released_keys=1,
        epsilon_spent=1.0, delta_spent=0.0, horizon_epsilon_spent=1.0,
    )  # fmt: skip
    group = WindowGroup(
        query="q",
        window_start="2020-08-01T00:00:00Z",
        window_end="2020-08-01T00:00:10Z",
        window=window,
        releases={output_key("q", W0, {"domain": "a.example"}): release},
    )
    out = io.StringIO()
    _Printer(out, json_lines=False).group(group)
    return out.getvalue().split("\n")


def test_a_quantile_window_says_its_mechanism_and_that_its_interval_is_in_ranks() -> None:
    head = "q · 2020-08-01T00:00:00Z → 2020-08-01T00:00:10Z · 1 key · ε 1 (horizon ε 1)"
    listed = [{"quantile": 0.5, "value": 3.0}, {"quantile": 0.9, "value": 7.5}]
    assert _shown("quantile", listed) == [
        head,
        "  quantile · exponential, noise scale 3 ranks (95% CI in ranks)",
        "  domain            value      95% CI",
        "  a.example  q0.5 = 3, q0.9 = 7.5          ±9",
        "",
        "",
    ]
    assert _shown("count", 120) == [
        head,
        "  count · discrete_laplace, noise scale 3",
        "  domain            value      95% CI",
        "  a.example           120          ±9",
        "",
        "",
    ]
