"""docs/THREAT_MODEL.md names, for every claim, the test that guards it: each named test must
exist (a renamed or deleted test would leave a claim unguarded without anyone noticing)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "THREAT_MODEL.md"
#: `tests/a/b.py::test_name` or a continuation `::test_name` (same file as the last one).
REFERENCE = re.compile(r"`(tests/[\w/]+\.py)?::(\w+)`")


def _references() -> list[tuple[str, str]]:
    out = []
    current = ""
    for path, name in REFERENCE.findall(DOC.read_text(encoding="utf-8")):
        current = path or current
        out.append((current, name))
    return out


def test_every_claim_names_a_test_that_exists() -> None:
    references = _references()
    assert len(references) >= 40
    missing = []
    for path, name in references:
        source = ROOT / path
        if not source.exists() or not re.search(
            rf"^(async )?def {name}\(", source.read_text(encoding="utf-8"), re.M
        ):
            missing.append(f"{path}::{name}")
    assert missing == []


def test_every_claims_table_row_names_a_test() -> None:
    rows = [
        line
        for line in DOC.read_text(encoding="utf-8").splitlines()
        if line.startswith("| ") and not line.startswith(("| claim", "| who")) and "---" not in line
    ]
    unguarded = [r for r in rows if "tests/" not in r and "::" not in r and "| — |" not in r]
    assert unguarded == []
