"""``stream-dp demo``: the whole service on one machine in seconds — embedded broker,
synthetic browser logs shaped like the project's motivating example, the worker with an
ephemeral key, and each window's private results printed beside the true ones (the data is
synthetic)."""

from stream_dp.demo.runner import DemoError, DemoInterrupted, Reporter, StartInfo, run_demo
from stream_dp.demo.scenario import DemoOptions, demo_config

__all__ = [
    "DemoError",
    "DemoInterrupted",
    "DemoOptions",
    "Reporter",
    "StartInfo",
    "demo_config",
    "run_demo",
]
