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


BROKERS = pytest.mark.parametrize(
    "broker", ["tansu", pytest.param("apache-kafka", marks=pytest.mark.apache_kafka)]
)
#: The checks of a run's report (chaos/run.py), each one PASS.
CHECKS = 10


def _chaos_run(broker: str, out: Path, *args: str) -> list[str]:
    """A chaos run on ``broker`` with ``args``: every check of its report passed; returns the
    fault lines it printed."""
    if broker == "apache-kafka" and (problem := apache_kafka_problem()) is not None:
        pytest.skip(problem)
    done = subprocess.run(
        [sys.executable, "-m", "chaos.run", "--smoke", *args, "--out", str(out),
         "--broker", broker],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1100,
        check=False,
    )  # fmt: skip
    report = (out / "REPORT.md").read_text(encoding="utf-8") if (out / "REPORT.md").exists() else ""
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}\n{report}"
    assert "| FAIL |" not in report and report.count("| PASS |") == CHECKS, report
    assert (out / "rss.png").stat().st_size > 1000
    return [
        line for line in done.stdout.splitlines() if line.startswith("[chaos]") and " s  " in line
    ]


@pytest.mark.timeout(1200)
@BROKERS
def test_a_short_chaos_run_passes_every_check(broker: str, tmp_path: Path) -> None:
    faults = _chaos_run(broker, tmp_path, "--minutes", "1.5")
    # The run did inject faults (restart_while_idle alone takes about a minute: three
    # rolling restarts and the wait for the due windows; long_outage two).
    restarted = any("restarted in turn" in line for line in faults)
    outage = any("every worker SIGKILLed" in line for line in faults)
    assert len(faults) >= (1 if outage else 2 if restarted else 3), faults


@pytest.mark.timeout(1200)
@BROKERS
def test_a_long_outage_of_every_worker_is_caught_up(broker: str, tmp_path: Path) -> None:
    """The long_outage fault alone, once (the run ends after the first fault): every worker
    down past output.max_hold_s while the producer goes on; the restarted workers must
    release the backlog with every event (the checks "nothing lost", "long outage")."""
    faults = _chaos_run(broker, tmp_path, "--minutes", "0.25", "--faults", "long_outage")
    assert len(faults) == 1 and "every worker SIGKILLed" in faults[0], faults
