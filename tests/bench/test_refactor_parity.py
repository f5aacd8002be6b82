"""``bench.refactor_parity``'s section: rendered from the kept run, spliced into RESULTS.md
once (a rerun replaces it), and carried by ``bench.report``."""

from __future__ import annotations

import orjson

from bench import refactor_parity

NOTES = "## What limits throughput\n\n- a note\n"


def _kept() -> dict[str, object]:
    result: dict[str, object] = orjson.loads(refactor_parity.RESULTS_FILE.read_bytes())
    return result


def test_the_section_shows_every_round_and_the_medians() -> None:
    kept = _kept()
    lines = refactor_parity.section(kept)
    assert lines[0] == refactor_parity.SECTION_TITLE
    rows = [ln for ln in lines if ln.startswith(("| keyed |", "| default |"))]
    assert len(rows) == 2 * int(str(kept["rounds"]))
    summary = kept["summary"]
    assert isinstance(summary, dict)
    median = summary["keyed"]["median_cpu_ratio"]
    assert f"{median:.3f}" in "\n".join(lines)


def test_splicing_twice_keeps_one_section_before_the_notes() -> None:
    lines = refactor_parity.section(_kept())
    once = refactor_parity.splice("# results\n\n## 8. other\n\ntext\n\n" + NOTES, lines)
    twice = refactor_parity.splice(once, lines)
    assert twice == once
    assert once.count(refactor_parity.SECTION_TITLE) == 1
    assert once.index(refactor_parity.SECTION_TITLE) < once.index("## What limits throughput")
    assert "## 8. other\n\ntext\n" in once


def test_a_kept_note_is_rendered_under_the_figures() -> None:
    kept = {**_kept(), "note": "The difference was a per-record generator."}
    lines = refactor_parity.section(kept)
    assert lines[-1] == "The difference was a per-record generator."
    assert lines[-2] == ""
    kept.pop("note")
    assert "The difference was a per-record generator." not in refactor_parity.section(kept)
