"""The demo's synthetic events carry a numeric field, ``latency_ms``, for its variance and
quantile queries, without changing the other fields the existing queries count."""

from __future__ import annotations

import dataclasses
import statistics

from stream_dp.demo.scenario import DemoOptions, data_spec
from stream_dp.synthetic.browser_logs import LATENCY_MEDIAN_MS, browser_log_events


def test_the_demo_events_have_a_log_normal_latency_and_the_same_visits() -> None:
    spec = data_spec(DemoOptions(users=300, windows=2))
    with_latency = list(browser_log_events(spec))
    without = list(browser_log_events(dataclasses.replace(spec, latency=False)))
    assert [{k: v for k, v in e.items() if k != "latency_ms"} for e in with_latency] == without
    assert all("latency_ms" not in e for e in without)
    latencies = [e["latency_ms"] for e in with_latency]
    assert all(isinstance(v, float) and v > 0 for v in latencies)
    # Seeded, so the same every run; a log-normal's median is its scale parameter.
    assert latencies == [e["latency_ms"] for e in browser_log_events(spec)]
    median = statistics.median(latencies)
    assert abs(median / LATENCY_MEDIAN_MS - 1) < 0.05
    # its 0.9 quantile e^(1.2816 σ) = 2.16 times the median (σ = 0.6): a spread, not a constant
    q90 = statistics.quantiles(latencies, n=10)[-1]
    assert 2.0 < q90 / median < 2.35
