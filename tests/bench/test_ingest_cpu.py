"""bench/ingest_cpu.py at a tiny size: each side's CPU per event on both paths, from the
checkout it names (a child refuses to measure any other checkout's stream_dp)."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench import ingest_cpu

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_both_sides_measure_both_paths() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.ingest_cpu",
            *("--before", str(ROOT), "--events", "4000", "--batch", "500"),
            *("--repeats", "1", "--passes", "1"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.strip().splitlines()
    # A line per path, then the default path's two stages together.
    paths = (*ingest_cpu.PATHS, "default + repartitioned")
    assert len(lines) == 1 + len(paths) and lines[0].startswith("4,000 events"), proc.stdout
    for path, line in zip(paths, lines[1:], strict=True):
        figures = re.fullmatch(
            rf"{re.escape(path)}: before ([0-9.]+) \(([0-9.]+)\), after ([0-9.]+) \(([0-9.]+)\)",
            line,
        )
        assert figures is not None, line
        assert all(math.isfinite(float(f)) and float(f) > 0 for f in figures.groups()), line


def test_a_child_measures_only_the_checkout_it_is_given(tmp_path: Path) -> None:
    """A tree without stream_dp: the child's import falls through to another checkout's,
    which it refuses to measure."""
    spec = {"events": 100, "batch": 50, "passes": 1, "start_s": 1_800_000_000}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.ingest_cpu",
            "--child",
            json.dumps({**spec, "tree": str(tmp_path)}),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == (
        f"stream_dp from {ROOT / 'stream_dp' / '__init__.py'}, not from {tmp_path}"
    ), proc.stderr[-2000:]
