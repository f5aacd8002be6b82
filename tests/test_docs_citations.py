"""Every document the code cites exists in the repository, down to the anchor.

Code, tests, ops files, the benchmarks and the docs cite documentation by repository path and
anchor (``docs/privacy.md#invariant-3``, ``ops/RUNBOOK.md#streamdpdown``). A renamed page or a
renumbered invariant would leave those citations pointing nowhere without anyone noticing;
so would a citation of a design note that lives outside the repository, which a user who
clones it cannot follow. The docs site's own links are checked by ``mkdocs build --strict``
(``make docs``); this test covers the citations the site build never reads.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Where citations live: everything tracked under these, text files only.
SCANNED = ("stream_dp", "tests", "ops", "bench", "chaos", "docs", "README.md", "Makefile",
           "docker-compose.yml", "Dockerfile", "pyproject.toml", "mkdocs.yml")  # fmt: skip
#: Drafts of other changes' documentation, folded into the pages later: not yet citable.
UNSCANNED = ("docs/changes/",)
TEXT_SUFFIXES = {".py", ".md", ".yml", ".yaml", ".json", ".toml", ".txt", ".sql", ""}

#: A repository document, optionally with an anchor: docs/x.md, docs/x.md#a-b, ops/RUNBOOK.md#x.
CITATION = re.compile(r"(?<![\w./-])((?:docs|ops|bench)/[\w./-]+?\.md)(#[\w-]+)?")
#: Design notes and background texts that never were in the repository. Split so that this
#: file does not cite them itself.
OUTSIDE = re.compile(
    r"\b(?:"
    + "|".join(("PRIVACY", "ARCHITECTURE", "CONTRACT", "BROKER", "ENVIRONMENT", "CRAFT"))
    + r")\.md\b|\b(?i:seeds? 00\d)\b|\.\./shared"
)
#: What the pages promise to keep citable: the numbered privacy invariants.
INVARIANTS = range(1, 9)


def _tracked() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", *SCANNED],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [
        ROOT / name
        for name in listed
        if not name.startswith(UNSCANNED)
        and Path(name).suffix in TEXT_SUFFIXES
        and (ROOT / name).is_file()
    ]


def _slug(heading: str) -> str:
    """The anchor MkDocs (Python-Markdown's toc) and GitHub give a heading."""
    text = re.sub(r"<[^>]+>|`", "", heading).strip().lower()
    text = re.sub(r"[^\w\s-]", "", text)
    return re.sub(r"[-\s]+", "-", text).strip("-")


@cache
def anchors(document: Path) -> frozenset[str]:
    """The anchors a Markdown document defines: heading slugs, ``{#id}`` attributes and
    ``<a id="…">`` elements."""
    text = document.read_text(encoding="utf-8")
    found = set(re.findall(r"""<a\s+id=["']([\w-]+)["']""", text))
    found |= set(re.findall(r"\{#([\w-]+)\}", text))
    for heading in re.findall(r"^#{1,6} +(.+?) *$", text, re.M):
        found.add(_slug(re.sub(r"\{#[\w-]+\}", "", heading)))
    return frozenset(found)


def citations() -> list[tuple[str, str, str]]:
    """(where, document, anchor or "") for every citation in the scanned files."""
    out = []
    for path in _tracked():
        if path == Path(__file__):
            continue  # its examples are not citations
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            for document, anchor in CITATION.findall(line):
                where = f"{path.relative_to(ROOT)}:{number}"
                out.append((where, document, anchor.lstrip("#")))
    return out


def broken(found: list[tuple[str, str, str]]) -> list[str]:
    problems = []
    for where, document, anchor in found:
        target = ROOT / document
        if not target.is_file():
            problems.append(f"{where}: {document} does not exist")
        elif anchor and anchor not in anchors(target):
            problems.append(f"{where}: {document} has no anchor #{anchor}")
    return problems


def test_every_cited_document_and_anchor_exists() -> None:
    found = citations()
    # The scan finds what it must: the code's citations of the invariants and the runbook.
    cited = {(document, anchor) for _where, document, anchor in found}
    assert len(found) >= 60, len(found)
    assert ("docs/privacy.md", "invariant-3") in cited
    assert ("docs/erasure.md", "") in cited
    assert any(document == "ops/RUNBOOK.md" and anchor for document, anchor in cited)
    assert broken(found) == []


def test_no_citation_points_outside_the_repository() -> None:
    outside = []
    for path in _tracked():
        if path == Path(__file__):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            if OUTSIDE.search(line):
                outside.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert outside == []


@pytest.mark.parametrize("number", INVARIANTS)
def test_each_privacy_invariant_has_its_anchor(number: int) -> None:
    assert f"invariant-{number}" in anchors(ROOT / "docs" / "privacy.md")


def test_a_missing_anchor_or_page_is_reported(tmp_path: Path) -> None:
    """The checker itself: a citation of an anchor or a page that is not there is named."""
    found = [
        ("x.py:1", "docs/privacy.md", "invariant-99"),
        ("x.py:2", "docs/no-such-page.md", ""),
        ("x.py:3", "docs/privacy.md", "invariant-1"),
    ]
    assert broken(found) == [
        "x.py:1: docs/privacy.md has no anchor #invariant-99",
        "x.py:2: docs/no-such-page.md does not exist",
    ]


def test_slugs_follow_mkdocs_and_github() -> None:
    assert _slug("StreamDPDown") == "streamdpdown"
    assert _slug("docker-compose: Apache Kafka, the worker, Prometheus and Grafana") == (
        "docker-compose-apache-kafka-the-worker-prometheus-and-grafana"
    )
    assert _slug("Automatic bounds (`bounds: auto`)") == "automatic-bounds-bounds-auto"
