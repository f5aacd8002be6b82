"""The erasure-burst bench (bench/erasure_burst.py) at its smoke size: every variant removes
exactly the erased users' rows, the shipped one keeps the loop's lag under the issue's
target, and its RESULTS.md section replaces itself in place."""

from __future__ import annotations

from bench.erasure_burst import SECTION_TITLE, TARGET_MAX_LAG_S, measure, replace_section, section


def test_the_smoke_size_removes_the_burst_and_reports_it() -> None:
    r = measure("smoke")
    rows = r["erasures"] * r["k"]
    assert r["vectorised_on_loop"]["rows_removed"] == rows
    assert r["vectorised_off_loop"]["rows_removed"] == rows
    assert r["before"]["seconds_extrapolated"] > 0
    assert r["passed"] == (r["vectorised_off_loop"]["max_lag_s"] <= TARGET_MAX_LAG_S)

    lines = section(r)
    assert lines[0] == SECTION_TITLE
    text = "# results\n\n## 8. Other\n\nx\n\n## What limits throughput\n\n- notes\n"
    once = replace_section(text, lines)
    assert once.index(SECTION_TITLE) < once.index("## What limits throughput")
    assert replace_section(once, lines) == once
    assert once.count(SECTION_TITLE) == 1
