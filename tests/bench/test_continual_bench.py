"""``python -m bench.continual``: writes its section into an existing RESULTS.md without
touching the rest, replaces it on a rerun, and records its figures in results.json."""

from __future__ import annotations

import math
from pathlib import Path

import orjson

from bench import continual

EXISTING = """# stream-dp benchmark results

## 1. Throughput

| a | b |
|---|---|
| 1 | 2 |

## What limits throughput

- the broker.
"""


def test_section_is_spliced_in_and_replaced(tmp_path: Path) -> None:
    (tmp_path / "RESULTS.md").write_text(EXISTING, encoding="utf-8")
    (tmp_path / "results.json").write_bytes(orjson.dumps({"size": "full", "utility": {"x": 1}}))
    assert continual.main(["--size", "smoke", "--out", str(tmp_path)]) == 0
    first = (tmp_path / "RESULTS.md").read_text(encoding="utf-8")
    assert first.count(continual.SECTION_TITLE) == 1
    head, _, rest = first.partition(continual.SECTION_TITLE)
    assert head == EXISTING.split("## What limits throughput")[0]
    assert rest.endswith("## What limits throughput\n\n- the broker.\n")
    assert "| pure ε (discrete Laplace), users in any windows | 64 | tree_honaker |" in rest

    assert continual.main(["--size", "smoke", "--out", str(tmp_path)]) == 0
    second = (tmp_path / "RESULTS.md").read_text(encoding="utf-8")
    assert second.count(continual.SECTION_TITLE) == 1
    assert second.startswith(head) and second.endswith(
        "## What limits throughput\n\n- the broker.\n"
    )

    results = orjson.loads((tmp_path / "results.json").read_bytes())
    assert results["utility"] == {"x": 1} and results["size"] == "full"
    rows = results["continual"]["rows"]
    assert {r["windows"] for r in rows} == {64, 256}
    assert all(math.isfinite(r["rmse_last"]) and r["rmse_last"] > 0 for r in rows)
    png = (tmp_path / continual.PLOT_NAME).read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")


def test_splice_appends_when_there_is_no_anchor() -> None:
    text = continual.splice(
        "# results\n", ["## 5. Continual release: running totals (simulated, no Kafka)", "", "x"]
    )
    assert (
        text == "# results\n\n## 5. Continual release: running totals (simulated, no Kafka)\n\nx\n"
    )
