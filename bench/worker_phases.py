"""The phases of one scale-out run (:mod:`bench.workers`): start-up, join, steady state, close.

A run's whole CPU over its whole span mixes what every process pays once (interpreter start
and imports, the ledger read-back behind fences, the consumer-group join and a rebalance for
each member joining after the first, the idle close of the last window) with what it pays
per event. To compare worker counts, the per-event part is measured on its own: the bench
samples each worker's CPU (``/proc``) and its ``stream_dp_events_consumed_total`` (its
/metrics) from the moment every worker holds its final partitions (its last assignment is
taken and the assignments of all workers cover the input topic's partitions once) until the
input is drained. The steady state is the span from the first sample to the last one before
the workers had read :data:`STEADY_END_SHARE` of the input; its CPU per event is Δ(CPU of
all workers) / Δ(events of all workers), fitted over the span's samples
(:func:`steady_fit`).

The fixed costs are what the run's CPU holds beyond that rate (the rate times the events
read), before and after the steady span:

* start-up and join: the workers' CPU at zero events on the steady line (:func:`steady_fit`),
  i.e. their CPU until the steady span minus the steady rate times the events read by then
  (interpreter start and imports, the ledger read-back behind fences, the group join and the
  rebalances as the other members join);
* of which start-up: each process's CPU until it first took partitions (log "partitions
  taken"), read when the bench sees that line (it polls every :data:`POLL_S`, so this may
  hold a little processing);
* close: the workers' CPU at the last window record beyond that line (the rest: the idle
  close of the last window, its partials and release, and idle polling of workers whose
  partitions were drained first).

So a run's worker CPU = start-up and join + steady rate × events + close. A worker counts a
fetched batch at once, so the fixed costs are known to within about one batch's CPU per
worker (≈ 0.1–0.2 s at 40,000 records); the rate, fitted over the span, more closely.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: The bench's poll period while it waits for the workers (log lines, /proc).
POLL_S = 0.1
#: Period of the /metrics samples once every worker holds its final partitions.
SAMPLE_S = 1.0
#: The steady span ends before the workers have read this share of the input: partitions
#: hold unequal shares of the events, and a worker whose partitions are drained only waits.
STEADY_END_SHARE = 0.9


@dataclass(frozen=True)
class Sample:
    """One reading of every worker, ``t_s`` seconds after the first process started."""

    t_s: float
    cpu_s: tuple[float, ...]
    events: tuple[float, ...]
    assignments: tuple[int, ...]

    @property
    def total_cpu_s(self) -> float:
        return sum(self.cpu_s)

    @property
    def total_events(self) -> float:
        return sum(self.events)


def joined(
    assignments: Sequence[list[str] | None], taken_after: Sequence[bool], partitions: set[str]
) -> bool:
    """Every worker has taken its last assignment, each holds input partitions, and their
    input partitions (``topic[p]``) are ``partitions``, each held once: one generation."""
    held: list[str] = []
    for mine, taken in zip(assignments, taken_after, strict=True):
        if not mine or not taken:
            return False
        held += [tp for tp in mine if tp in partitions]
        if not any(tp in partitions for tp in mine):
            return False
    return len(held) == len(partitions) and set(held) == partitions


def steady_span(samples: Sequence[Sample], total_events: int) -> tuple[Sample, Sample] | None:
    """(first, last) sample of the steady state, or None when it holds fewer than two
    samples: the last is the latest one before the workers had read
    :data:`STEADY_END_SHARE` of the input (so that every worker still has input to read)."""
    inside = [s for s in samples if s.total_events < STEADY_END_SHARE * total_events]
    if len(inside) < 2 or inside[-1].total_events <= inside[0].total_events:
        return None
    return inside[0], inside[-1]


def steady_fit(samples: Sequence[Sample], first: Sample, last: Sample) -> tuple[float, float]:
    """(CPU seconds per event, CPU seconds at zero events) of the workers over the steady
    span: the least-squares line of their events read against their CPU. A worker counts a
    fetched batch (up to 40,000 records) at once while its CPU grows smoothly, so the events
    are the noisy coordinate; the fit over every sample averages that out where the two end
    points alone could be a batch per worker off. The CPU at zero events is the fixed cost
    paid before the steady state (start-up and join), all workers."""
    span = [s for s in samples if first.t_s <= s.t_s <= last.t_s]
    cpu = np.array([s.total_cpu_s for s in span])
    events = np.array([s.total_events for s in span])
    if len(span) < 3 or np.ptp(cpu) == 0:
        rate_s = (last.total_cpu_s - first.total_cpu_s) / (last.total_events - first.total_events)
        return rate_s, first.total_cpu_s - rate_s * first.total_events
    slope, intercept = (float(x) for x in np.polyfit(cpu, events, 1))  # events per CPU s
    return 1.0 / slope, -intercept / slope


def phases(
    samples: Sequence[Sample],
    startup_cpu_s: Sequence[float],
    startup_s: Sequence[float],
    end: Sample,
    total_events: int,
) -> dict[str, Any]:
    """The run's steady CPU per event and its fixed costs (module docstring). ``end``: every
    worker at the moment the last window record was seen (events from /metrics then)."""
    n = len(end.cpu_s)
    out: dict[str, Any] = {
        "samples": len(samples),
        "startup_cpu_s_per_worker": list(startup_cpu_s),
        "startup_s_per_worker": list(startup_s),
        "joined_s": samples[0].t_s if samples else None,
        "rebalanced_while_steady": bool(samples) and samples[0].assignments != end.assignments,
        "series": [
            {"t_s": s.t_s, "cpu_s": list(s.cpu_s), "events": list(s.events)}
            for s in (*samples, end)
        ],
    }
    span = steady_span(samples, total_events)
    if span is None:
        return {**out, "steady_us_per_event": None}
    a, b = span
    d_events = b.total_events - a.total_events
    rate_s, before_cpu = steady_fit(samples, a, b)
    close_cpu = end.total_cpu_s - before_cpu - rate_s * end.total_events
    return {
        **out,
        "steady_us_per_event": 1e6 * rate_s,
        "steady_us_per_event_endpoints": 1e6 * (b.total_cpu_s - a.total_cpu_s) / d_events,
        "steady_us_per_event_per_worker": [
            1e6 * (cb - ca) / (eb - ea) if eb > ea else None
            for ca, cb, ea, eb in zip(a.cpu_s, b.cpu_s, a.events, b.events, strict=True)
        ],
        "steady_seconds": b.t_s - a.t_s,
        "steady_events": d_events,
        "steady_share_of_events": d_events / total_events,
        "steady_cpu_utilisation": (b.total_cpu_s - a.total_cpu_s) / (b.t_s - a.t_s),
        "startup_cpu_s_mean": sum(startup_cpu_s) / n,
        "fixed_before_cpu_s": before_cpu,
        "fixed_before_cpu_s_per_worker": before_cpu / n,
        "close_excess_cpu_s": close_cpu,
        "close_s": end.t_s - b.t_s,
    }
