"""The ledger start-up bench (bench/ledger_startup.py) at a test's size: the compacted
ledger this version writes is the same size whatever the history, its read keeps nothing,
and the streamed read of an earlier version's ledger keeps no release while the full read
of earlier versions held them all."""

from __future__ import annotations

from bench import ledger_startup


def test_the_compacted_ledger_is_flat_in_the_history() -> None:
    results = ledger_startup.measure([300, 900], log=lambda _: None)
    small, large = results["rows"]
    assert large["records_before"] == 3 * small["records_before"] - 2  # + the coverage record
    assert large["records_after_compaction"] == small["records_after_compaction"] <= 3
    for row in (small, large):
        assert row["streamed"]["releases_kept"] == 0
        assert row["after_compaction"]["releases_kept"] == 0
        assert row["before"]["peak_mb"] > row["streamed"]["peak_mb"]
    assert large["before"]["peak_mb"] > 2 * small["before"]["peak_mb"]  # grows with history
    lines = ledger_startup.section(results)
    assert lines[0].startswith("## 10. Ledger start-up") and len(lines) == 6 + 2
