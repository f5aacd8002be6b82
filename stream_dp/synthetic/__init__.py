"""Synthetic event-level data for the demo, the load generator, tests and benchmarks."""

from stream_dp.synthetic.browser_logs import BrowserLogSpec, browser_log_events

__all__ = ["BrowserLogSpec", "browser_log_events"]
