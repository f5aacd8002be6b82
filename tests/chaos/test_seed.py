"""``python -m chaos.run --seed N`` repeats a run's fault schedule: the producer draws its
events' users and domains as often as its pace allows, so those draws come from a generator
of their own and cannot shift which fault comes when (no broker)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.run import FULL, USERS, Run


def _schedule(run: Run, faults: int = 20) -> list[tuple[float, int, float]]:
    """What the fault loop draws per fault: the wait, the kind's index, the worker."""
    return [
        (run.rng.uniform(*FULL.fault_every_s), run.rng.randrange(9), run.rng.randrange(3))
        for _ in range(faults)
    ]


def test_a_seed_repeats_its_fault_schedule_however_many_events_were_drawn(
    tmp_path: Path,
) -> None:
    runs = [Run.for_seed(FULL, tmp_path, tmp_path, 7, wait_for_rejoin=True) for _ in range(3)]
    runs[1].events_rng.randrange(USERS)  # a producer that got one event out before a fault
    for _ in range(10_000):  # and one that got many
        runs[2].events_rng.randrange(USERS)
    schedules = [_schedule(run) for run in runs]
    assert schedules[1] == schedules[0] and schedules[2] == schedules[0]
    other = Run.for_seed(FULL, tmp_path, tmp_path, 8, wait_for_rejoin=True)
    assert _schedule(other) != schedules[0]


def test_the_report_s_command_names_the_seed_drawn_when_none_was_given(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import chaos.run as chaos_run

    seen: list[tuple[int, str]] = []

    async def fake_chaos(
        settings: object, out: Path, seed: int, command: str, *_: object, **__: object
    ) -> bool:
        seen.append((seed, command))
        return True

    monkeypatch.setattr(chaos_run, "chaos", fake_chaos)
    assert chaos_run.main(["--smoke", "--out", str(tmp_path)]) == 0
    assert chaos_run.main(["--smoke", "--out", str(tmp_path), "--seed", "0"]) == 0
    (drawn, command), (given, again) = seen
    assert command == f"python -m chaos.run --smoke --out {tmp_path} --seed {drawn}"
    assert given == 0 and again == f"python -m chaos.run --smoke --out {tmp_path} --seed 0"
