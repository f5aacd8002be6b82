"""The statistics utility bench (bench/statistics_utility.py) in its smoke size: it runs as a
command, its result JSON has every figure for both libraries, finite, and stream-dp's are sane
(variance error below the range², recall in [0, 1], percentiles monotone); the RESULTS.md
section renders a row per library in each table. No timing, no comparison between the
libraries (that is what the bench reports, not what it must find)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.statistics_utility import (
    LIBRARIES,
    LOWER,
    PERCENTILES,
    SIZES,
    TITLE,
    UPPER,
    section,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("statistics_utility") / "run.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.statistics_utility", "--smoke", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    # what it prints is the section of what it wrote, whole
    assert done.stdout.splitlines()[-len(section(result)) :] == section(result)
    return result


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


def test_every_figure_is_there_for_both_libraries_and_finite(smoke: dict[str, Any]) -> None:
    size = SIZES["smoke"]
    assert smoke["users"] == size["users"] and smoke["runs"] == size["runs"]
    variance, quantiles, top_k = smoke["variance"], smoke["percentiles"], smoke["top_k"]
    for name in LIBRARIES:
        v = variance[name]
        assert all(
            _finite(v[f]) for f in ("mae", "mae_se", "relative_error", "median_relative_error")
        )
        assert v["estimates"] == size["runs"] * variance["keys"]
        q = quantiles[name]
        for figure in ("rank_error", "abs_error"):
            assert set(q[figure]) == {str(p) for p in PERCENTILES}
            assert all(_finite(x) and x >= 0 for x in q[figure].values())
        assert q["estimates"] == size["runs"] * quantiles["keys"]
        assert 0 <= q["monotone_share"] <= 1
        t = top_k[name]
        assert all(_finite(t[f]) for f in ("recall", "recall_se", "recall_min", "released"))
        assert 0 <= t["recall_min"] <= t["recall"] <= 1
        assert 0 <= t["released"] <= top_k["top_n"]
        assert _finite(top_k["ranking_noise_scale"][name])
        assert _finite(variance["squares_sensitivity_per_value"][name])
        assert 0 <= v["outside_range_share"] <= 1


def test_stream_dps_figures_are_sane(smoke: dict[str, Any]) -> None:
    ours = "stream-dp"
    # the released variance is clamped to [0, ((upper − lower)/2)²]: its error is bounded
    assert 0 <= smoke["variance"][ours]["mae"] < (UPPER - LOWER) ** 2
    # a rank error is a share of the key's rows
    assert all(0 <= x <= 1 for x in smoke["percentiles"][ours]["rank_error"].values())
    # the released variance never leaves [0, ((upper − lower)/2)²] (the clamp)
    assert smoke["variance"][ours]["outside_range_share"] == 0
    # the released percentiles are sorted, in every release of every key
    assert smoke["percentiles"][ours]["monotone_share"] == 1.0
    assert smoke["variance"]["true_variance"] and all(
        0 < x <= ((UPPER - LOWER) / 2) ** 2 for x in smoke["variance"]["true_variance"].values()
    )


def test_the_section_has_a_row_per_library_in_each_table(smoke: dict[str, Any]) -> None:
    lines = section(smoke)
    assert lines[0] == TITLE
    for name in LIBRARIES:
        assert sum(line.startswith(f"| {name} | ") for line in lines) == 3
    tables = [line for line in lines if line.startswith("| ")]
    assert all(line.count("|") == tables[i - i % 3].count("|") for i, line in enumerate(tables))
