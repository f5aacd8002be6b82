"""Writing one section into an existing RESULTS.md (the benches that run on their own)."""

from __future__ import annotations

import re

#: The closing notes of RESULTS.md; a new section goes before them.
NOTES_TITLE = "## What limits throughput"


def splice_section(markdown: str, title: str, lines: list[str]) -> str:
    """``markdown`` with the section headed ``title`` replaced by ``lines`` (or inserted
    before the closing notes, or appended), every other line unchanged."""
    block = "\n".join(lines) + "\n"
    pattern = re.compile(re.escape(title) + r".*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(markdown):
        return pattern.sub(lambda _: block + "\n", markdown, count=1)
    if NOTES_TITLE in markdown:
        return markdown.replace(NOTES_TITLE, block + "\n" + NOTES_TITLE, 1)
    return markdown.rstrip("\n") + "\n\n" + block
