"""The realistic-stream bench at its smoke size: every figure is produced, the worker released
every window of the stream, and the section renders from the run.

Runs ``python -m bench.realistic --smoke`` in a subprocess (its own embedded broker, 50,000
events, one run of each raw consumer and of the worker on each path).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import realistic

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def smoke() -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.realistic", "--smoke"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=500,  # a hang guard only: a loaded 2-core machine is slower
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout[-2000:]
    result: dict[str, Any] = json.loads(lines[0])
    return result


def test_every_contender_measured_and_every_window_released(smoke: dict[str, Any]) -> None:
    assert set(smoke["brokers"]) == {"tansu"}
    broker = smoke["brokers"]["tansu"]
    expected = {*realistic.RAW_KINDS, "worker_default_after", "worker_keyed_after"}
    assert set(broker["best"]) == expected
    for name, r in broker["best"].items():
        assert r["events"] == smoke["events"] == 50_000, name
        for key in ("events_per_s", "cpu_us_per_event", "seconds"):
            assert math.isfinite(r[key]) and r[key] > 0, (name, key, r[key])
    for mode in ("default", "keyed"):
        r = broker["best"][f"worker_{mode}_after"]
        # Every window of the stream released; nothing dead-lettered or dropped as late.
        assert (r["windows_released"], r["bad_records"], r["late_events"]) == (10, 0, 0), r
    ratios = realistic.ratios(broker["best"])
    assert len(ratios) == 8 and all(math.isfinite(v) and v > 0 for v in ratios.values())


def test_section_renders_every_contender(smoke: dict[str, Any]) -> None:
    lines = realistic.section({"main": smoke})
    assert lines[0] == realistic.TITLE
    text = "\n".join(lines)
    for label in (
        "raw aiokafka getmany + orjson.loads",
        "raw librdkafka consume + orjson.loads",
        "raw aiokafka with the worker's fetch adapter + orjson.loads",
        "worker, default path (repartitioned), after",
        "worker, keyed input, after",
    ):
        # once in the run's table; a raw consumer's row again in the CPU split's table
        split = 1 if label.startswith("raw ") else 0
        assert sum(line.startswith(f"| {label} |") for line in lines) == 1 + split, (label, text)
    assert realistic.SPLIT_INTRO in lines, text
    for title in ("worker, default", "worker, keyed"):  # the split of each worker mode
        assert sum(line.startswith(f"| {title} | ") for line in lines) == 1, (title, text)
