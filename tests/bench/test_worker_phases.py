"""bench/worker_phases.py: the scale-out run's steady CPU per event and its fixed costs, on
synthetic samples whose rate and fixed costs are known by construction (no broker)."""

from __future__ import annotations

import pytest

from bench.worker_phases import STEADY_END_SHARE, Sample, joined, phases, steady_span

PARTS = {f"in[{p}]" for p in range(6)}
BATCH = 40_000  # a worker counts its events one fetched batch at a time


def test_joined_needs_one_generation_covering_every_input_partition() -> None:
    split = [["in[0]", "in[1]", "in[2]", "out[0]"], ["in[3]", "in[4]", "in[5]"]]
    assert joined(split, [True, True], PARTS)
    # The second worker has not taken its assignment yet.
    assert not joined(split, [True, False], PARTS)
    # A worker without an assignment (still joining, or revoked).
    assert not joined([split[0], None], [True, True], PARTS)
    # The first worker's assignment is from the generation before the second joined.
    assert not joined([sorted(PARTS), split[1]], [True, True], PARTS)
    # One worker holds only other topics' partitions: it reads no input.
    assert not joined([sorted(PARTS), ["out[0]"]], [True, True], PARTS)
    # Input partitions missing from every assignment.
    assert not joined([["in[0]"], ["in[1]"]], [True, True], PARTS)


def _run(
    n: int, rate_s: float, startup_cpu_s: float, close_cpu_s: float, total: int
) -> tuple[list[Sample], Sample]:
    """Samples every second of n workers reading total/n events each at rate_s CPU seconds
    per event, each having spent startup_cpu_s before the first sample; counts advance in
    whole batches (the CPU does not). The end adds close_cpu_s over all workers."""
    share = total // n
    per_s = 60_000  # events per second and worker
    samples = []
    t = 0
    while True:
        read = min(share, per_s * t + 7_000)  # mid-batch at the first sample
        counted = read // BATCH * BATCH if read < share else share
        samples.append(
            Sample(
                t_s=float(t),
                cpu_s=tuple(startup_cpu_s + rate_s * read for _ in range(n)),
                events=tuple(float(counted) for _ in range(n)),
                assignments=tuple(1 for _ in range(n)),
            )
        )
        if read >= share:
            break
        t += 1
    last = samples[-1]
    end = Sample(
        t_s=last.t_s + 2,
        cpu_s=tuple(c + close_cpu_s / n for c in last.cpu_s),
        events=last.events,
        assignments=last.assignments,
    )
    return samples, end


@pytest.mark.parametrize("n", [1, 3])
def test_phases_recover_the_rate_and_the_fixed_costs(n: int) -> None:
    rate_s, startup, close, total = 5e-6, 0.8, 0.3, 2_400_000
    samples, end = _run(n, rate_s, startup, close, total)
    out = phases(samples, [startup] * n, [1.0] * n, end, total)
    assert out["steady_us_per_event"] == pytest.approx(1e6 * rate_s, rel=0.02)
    # The span stops before the workers had read STEADY_END_SHARE of the input.
    span = steady_span(samples, total)
    assert span is not None
    last = span[1]
    assert last.total_events < STEADY_END_SHARE * total
    assert next(s for s in samples if s.t_s > last.t_s).total_events >= STEADY_END_SHARE * total
    # Counted in whole batches, a worker's count lags its reading by half a batch on average:
    # the fixed costs are known to within a batch's CPU per worker.
    batch_cpu_s = rate_s * BATCH
    assert out["fixed_before_cpu_s_per_worker"] == pytest.approx(startup, abs=batch_cpu_s)
    assert out["close_excess_cpu_s"] == pytest.approx(close, abs=n * batch_cpu_s)
    assert not out["rebalanced_while_steady"]
    # Whole run = start-up and join + steady rate × events + close.
    rebuilt = (
        n * out["fixed_before_cpu_s_per_worker"]
        + out["steady_us_per_event"] * 1e-6 * end.total_events
        + out["close_excess_cpu_s"]
    )
    assert rebuilt == pytest.approx(end.total_cpu_s, rel=1e-9)


def test_the_fit_is_closer_than_the_end_points_when_counts_come_in_batches() -> None:
    rate_s, total = 5e-6, 2_400_000
    samples, end = _run(3, rate_s, 0.8, 0.3, total)
    out = phases(samples, [0.8] * 3, [1.0] * 3, end, total)
    fit_error = abs(out["steady_us_per_event"] - 1e6 * rate_s)
    end_points_error = abs(out["steady_us_per_event_endpoints"] - 1e6 * rate_s)
    assert end_points_error > 0.02 * 1e6 * rate_s  # a batch per worker off at an end
    assert fit_error < end_points_error


def test_a_short_run_has_no_steady_state_and_a_rebalance_is_flagged() -> None:
    samples, end = _run(2, 5e-6, 0.8, 0.3, 100_000)
    assert len([s for s in samples if s.total_events < STEADY_END_SHARE * 100_000]) < 2
    out = phases(samples, [0.8, 0.8], [1.0, 1.0], end, 100_000)
    assert out["steady_us_per_event"] is None
    samples, end = _run(2, 5e-6, 0.8, 0.3, 2_400_000)
    moved = Sample(end.t_s, end.cpu_s, end.events, (2, 1))
    assert phases(samples, [0.8, 0.8], [1.0, 1.0], moved, 2_400_000)["rebalanced_while_steady"]
