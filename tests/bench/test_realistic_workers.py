"""The per-process breakdown of a ``--workers --settle --before`` run renders from the kept run
(bench/realistic.json, label ``workers_idle``): one row per process of every group, before and
after, and the CPU answering the bench's polls taken out of no more than the group spent."""

from __future__ import annotations

import json
from pathlib import Path

from bench import realistic

KEPT = Path(realistic.__file__).resolve().parent / "realistic.json"


def test_every_process_of_every_group_has_a_row_before_and_after() -> None:
    run = json.loads(KEPT.read_text())["workers_idle"]
    lines = realistic._per_process_lines(run)
    rows = [line for line in lines if line.startswith("| default |") or line.startswith("|  |")]
    rows += [line for line in lines if line.startswith("| keyed |")]
    per_group = sum(run["workers"])  # 1 + 2 + 3 processes
    assert len(rows) == len(run["brokers"]) * len(realistic.MODES) * 2 * per_group
    for broker in run["brokers"].values():
        for key, rs in broker["runs"].items():
            if not key.startswith("workers_"):
                continue
            for r in rs:
                polls = sum(realistic._scrape_cpu_s(r, i) for i in range(len(r["per_worker"])))
                assert 0.0 <= polls <= r["cpu_seconds"]
                assert realistic._without_scrapes(r) <= r["cpu_us_per_event"]
                shares = sum(w["events_in_span"] for w in r["per_worker"])
                assert shares == r["span_events"]  # every worker from the group's first reading
