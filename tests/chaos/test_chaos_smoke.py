"""The chaos run, short (``make chaos`` runs it for 20 minutes): three workers, a live
producer and random faults, on the embedded broker and on Apache Kafka (``--broker``); every
check of its report must pass.

Generous hang guard only: the run waits on conditions (every window released), and a busy
2-core machine only makes it slower."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.apache_kafka.tier import apache_kafka_problem

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(1200)
@pytest.mark.parametrize(
    "broker", ["tansu", pytest.param("apache-kafka", marks=pytest.mark.apache_kafka)]
)
def test_a_short_chaos_run_passes_every_check(broker: str, tmp_path: Path) -> None:
    if broker == "apache-kafka" and (problem := apache_kafka_problem()) is not None:
        pytest.skip(problem)
    done = subprocess.run(
        [sys.executable, "-m", "chaos.run", "--smoke", "--minutes", "1.5", "--out", str(tmp_path),
         "--broker", broker],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1100,
        check=False,
    )
    report = (
        (tmp_path / "REPORT.md").read_text(encoding="utf-8")
        if (tmp_path / "REPORT.md").exists()
        else ""
    )
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}\n{report}"
    assert "| FAIL |" not in report and report.count("| PASS |") == 9
    assert (tmp_path / "rss.png").stat().st_size > 1000
    faults = [
        line for line in done.stdout.splitlines() if line.startswith("[chaos]") and " s  " in line
    ]
    # The run did inject faults (restart_while_idle alone takes about a minute: three
    # rolling restarts and the wait for the due windows).
    restarted = any("restarted in turn" in line for line in faults)
    assert len(faults) >= (2 if restarted else 3), done.stdout
