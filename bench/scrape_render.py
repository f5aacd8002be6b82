"""CPU of rendering one worker's ``/metrics`` text, prometheus_client's way and ours.

``python -m bench.scrape_render [--repeat N] [--process]``: a worker's
:class:`~stream_dp.ops.metrics.Metrics` in the state of an idle worker of
bench/realistic.py's configuration (one query, every bad-record reason, 10 internal and
4 input partitions, ~140 series), then the CPU microseconds (``time.process_time``, best of
7 runs of ``N`` renders) of ``registry_exposition`` (``generate_latest``, what ``/metrics``
served before) and of ``Metrics.exposition`` (:class:`~stream_dp.ops.exposition.Exposition`),
alternating. ``--process`` adds the ``process_*`` collector (its /proc reads vary with the
machine). Prints one JSON line. The HTTP side of a scrape (accept, parse, write, close) is
not in it: bench/idle_worker.py measures a whole scrape of a running worker.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import timeit
from typing import Any

from stream_dp.ops.metrics import Metrics, registry_exposition
from stream_dp.pipeline.formats.decode import REASONS


def idle_worker_metrics(*, process: bool) -> Metrics:
    """The series an idle worker of bench/realistic.py's configuration exposes."""
    m = Metrics(reasons=REASONS, queries=["visits_by_domain"], process=process)
    for partition in range(6):
        m.set_consumer_lag("realistic-partials", partition, 0)
    for partition in range(4):
        m.set_consumer_lag("realistic-repartition", partition, 0)
        m.fetch_age.labels(topic="idle", partition=str(partition)).set(0.2)
    for topic in ("idle", "realistic-partials", "realistic-repartition"):
        m.offset_out_of_range.labels(topic=topic)
    m.set_config(60, 2, 3, 300, group_id="realistic")
    m.batch_processing.observe(0.006)
    m.ready.set(1)
    return m


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=1000)
    parser.add_argument("--process", action="store_true")
    opts = parser.parse_args(argv)
    m = idle_worker_metrics(process=opts.process)
    ways = {"generate_latest": lambda: registry_exposition(m.registry), "ours": m.exposition}
    best_us: dict[str, float] = dict.fromkeys(ways, float("inf"))
    for _ in range(7):
        for name, render in ways.items():
            spent_s = timeit.timeit(render, number=opts.repeat, timer=time.process_time)
            best_us[name] = min(best_us[name], spent_s / opts.repeat * 1e6)
    result: dict[str, Any] = {
        "process_collector": opts.process,
        "series": sum(1 for line in m.exposition().splitlines() if not line.startswith(b"#")),
        "cpu_us_per_render": best_us,
        "load_1min": os.getloadavg()[0],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
