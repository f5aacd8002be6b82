"""``bench.report`` (what ``make bench`` writes RESULTS.md with) renders every section of the
kept bench/RESULTS.md from what is kept, without rerunning a bench: the whole run's
bench/results.json, the JSON each bench of its own keeps (``bench/*.json``) and the sections
written by hand (carried from RESULTS.md as they are).

The headings compared are read from RESULTS.md itself, so a section or subsection added there
(by a bench of its own, or by hand) is checked without this test naming it.
"""

from __future__ import annotations

import re
from pathlib import Path

import orjson

from bench import report

BENCH = Path(__file__).resolve().parents[2] / "bench"
HEADING = re.compile(r"^#{1,6} .*$", re.M)


def _headings(markdown: str) -> list[str]:
    return HEADING.findall(markdown)


def test_regenerating_from_the_kept_json_reproduces_every_heading_in_order() -> None:
    kept = (BENCH / "RESULTS.md").read_text(encoding="utf-8")
    results = orjson.loads((BENCH / "results.json").read_bytes())
    regenerated = report.markdown(results)
    assert len(_headings(kept)) > 20  # the file read is the real report, not an empty one
    assert _headings(regenerated) == _headings(kept)


def test_hand_written_sections_are_carried_whole() -> None:
    kept = (BENCH / "RESULTS.md").read_text(encoding="utf-8")
    sections = report.hand_written_sections(kept)
    assert [s.split("\n", 1)[0] for s in sections] == [
        h for h in _headings(kept) if h.startswith(report.HAND_WRITTEN_TITLES)
    ]
    for section in sections:
        assert section in kept  # every line up to the next "## " heading, unchanged
        following = kept[kept.index(section) + len(section) :]
        assert following.lstrip("\n").startswith("## ") or not following.strip()


def test_the_targets_hand_written_verdicts_show_only_for_the_run_they_describe() -> None:
    results = orjson.loads((BENCH / "results.json").read_bytes())
    noted = next(iter(report.TARGET_NOTES))
    (extra, verdict) = report.TARGET_NOTES[noted]

    def row(r: dict[str, object]) -> str:
        return next(
            line for line in report.markdown(r).splitlines() if line.startswith(f"| {noted} |")
        )

    results["date"] = report.TARGET_NOTES_RUN
    results.pop("sections_from", None)
    assert row(results).endswith(f"{extra} | {verdict} |")
    results["date"] = "2027-01-01 00:00 UTC"  # a later whole run: the computed verdict alone
    assert row(results).endswith(" | **FAIL** |") or row(results).endswith(" | **pass** |")
    assert extra not in row(results)


def test_a_release_s_runs_are_named_with_each_time() -> None:
    assert report._runs([2.0]) == "one run"
    assert report._runs([2.612, 1.88, 1.744]) == "median of 3 runs: 2.61, 1.88, 1.74 s"
