"""MkDocs hooks of the documentation site (``mkdocs.yml``: ``hooks:``).

- ``<!-- generated: configuration -->`` … ``<!-- end generated -->`` is the configuration
  reference, rendered from the
  pydantic model with the notes in ``configuration-notes.yaml`` beside this file;
  ``<!-- generated: metrics worker -->`` / ``<!-- generated: metrics sink -->`` the metrics
  reference, rendered from the registries; ``<!-- generated: fingerprint -->`` which settings
  the deployment fingerprint holds and why the others are left out, from their
  classification (all in :mod:`stream_dp.reference`).
- ``<!-- include: PATH -->`` becomes the repository file PATH (``ops/RUNBOOK.md``,
  ``bench/RESULTS.md``), its relative links pointing into the site and the files they name
  (plots, flame graphs) copied with it, so those files keep one home in the repository.

The generated blocks are committed in the pages too, so that the Markdown reads whole where
it is read without a build (a repository browser): ``python docs/hooks/site.py`` (``make
docs-refs``) rewrites them, ``tests/test_reference.py`` fails while one is stale, and every
build renders them afresh. The statistic enums of the committed JSON schemas
(``SCHEMA_ENUMS``) are generated the same way, from the statistics registry
(:data:`stream_dp.privacy.statistics.STATISTICS`), and their mechanism enums
(``MECHANISM_ENUMS``: what release records and plans name) from the additive noises and the
statistics' own mechanisms (:data:`stream_dp.privacy.statistics.STATED_MECHANISMS`): ``main``
rewrites them and the same test fails while one names others. A marker that names nothing known,
or a generated marker without its end, fails the build, as ``--strict`` does for broken links.
"""

from __future__ import annotations

import json
import posixpath
import re
from pathlib import Path
from typing import Any

import yaml
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

from stream_dp.privacy.statistics import STATED_MECHANISMS, STATISTICS
from stream_dp.reference import (
    configuration_reference,
    fingerprint_reference,
    metrics_reference,
)

HERE = Path(__file__).resolve().parent
NOTES = HERE / "configuration-notes.yaml"
MARKER = re.compile(r"<!-- (include): ([^>]+?) -->")
#: A generated block as committed: its marker, the rendered reference, its end.
GENERATED = re.compile(r"<!-- generated: ([a-z ]+) -->\n(.*?)<!-- end generated -->", re.S)
OPENING = re.compile(r"<!-- generated: ([a-z ]+) -->")
LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s]+)(\))")
#: The committed JSON schemas whose statistic enum is the registry's names, with the keys
#: leading to that enum.
SCHEMA_ENUMS: dict[str, tuple[str, ...]] = {
    "stream_dp/privacy/plan.schema.json": ("$defs", "query", "properties", "statistic"),
    "topics/release.schema.json": ("properties", "statistic"),
}
#: The statistic enum as written in a schema (on one line or one item a line).
STATISTIC_ENUM = re.compile(r'("statistic": \{\s*"enum": )\[([^\]]*)\]')
#: The committed JSON schemas whose enum of the mechanisms a release record or plan names
#: is :data:`STATED_MECHANISMS`, with the keys leading to that enum (its name last).
MECHANISM_ENUMS: dict[str, tuple[str, ...]] = {
    "stream_dp/privacy/plan.schema.json": ("$defs", "released_mechanism"),
    "topics/release.schema.json": ("properties", "mechanism"),
}


def _root(config: MkDocsConfig) -> Path:
    return Path(config.config_file_path).resolve().parent


def _local(target: str) -> bool:
    return not target.startswith(("#", "/", "http://", "https://", "mailto:"))


def _included(root: Path, relative: str) -> tuple[str, list[str]]:
    """A repository file's text with its relative links made relative to the site root,
    and the linked files that are not Markdown (to copy into the site)."""
    path = root / relative
    if not path.is_file():
        raise PluginError(f"include: {relative} does not exist in the repository")
    base = Path(relative).parent
    assets: list[str] = []

    def rewrite(match: re.Match[str]) -> str:
        target = match.group(2)
        if not _local(target):
            return match.group(0)
        file_part, _, anchor = target.partition("#")
        moved = posixpath.normpath((base / file_part).as_posix())
        if not (root / moved).is_file():
            raise PluginError(f"include: {relative} links to {target}, which does not exist")
        if moved.startswith("docs/"):
            moved = moved.removeprefix("docs/")  # a page of the site itself
        else:
            assets.append(moved)
        return f"{match.group(1)}{moved}{'#' + anchor if anchor else ''}{match.group(3)}"

    text = LINK.sub(rewrite, path.read_text(encoding="utf-8"))
    return text, assets


def _generated(what: str) -> str:
    if what == "configuration":
        notes = yaml.safe_load(NOTES.read_text(encoding="utf-8"))
        return configuration_reference(notes)
    if what == "fingerprint":
        return fingerprint_reference()
    if what == "metrics worker":
        return metrics_reference("worker")
    if what == "metrics sink":
        return metrics_reference("sink")
    raise PluginError(f"generated: unknown reference {what!r}")


def refresh(markdown: str) -> str:
    """The page with every generated block rendered afresh (PluginError for a marker
    without its end)."""
    fresh = GENERATED.sub(
        lambda m: (
            f"<!-- generated: {m.group(1)} -->\n{_generated(m.group(1).strip()).rstrip()}"
            "\n<!-- end generated -->"
        ),
        markdown,
    )
    stray = OPENING.findall(GENERATED.sub("", fresh))
    if stray:
        raise PluginError(f"generated: {stray[0]!r} has no '<!-- end generated -->'")
    return fresh


def refresh_schema(text: str, keys: tuple[str, ...], names: list[str] | None = None) -> str:
    """The schema ``text`` with its enum at ``keys`` naming ``names`` in order (by default
    the registered statistics, in registry order), its layout kept (PluginError when it has
    no single such enum: the last key's name followed by an object whose first member is
    ``"enum"``, or one whose ``"enum"`` follows its ``"description"``)."""
    if names is None:
        names = list(STATISTICS)
    pattern = (
        STATISTIC_ENUM
        if keys[-1] == "statistic"
        else re.compile(
            rf'("{re.escape(keys[-1])}": \{{\s*(?:"description": "[^"]*",\s*)?"enum": )'
            r"\[([^\]]*)\]"
        )
    )

    def rewrite(match: re.Match[str]) -> str:
        old = match.group(2)
        if "\n" not in old:
            return f"{match.group(1)}{json.dumps(names)}"
        item = re.match(r"\n([ \t]*)", old)
        indent = item.group(1) if item else ""
        closing = "\n" + old.rsplit("\n", 1)[-1]
        body = ",".join(f"\n{indent}{json.dumps(name)}" for name in names)
        return f"{match.group(1)}[{body}{closing}]"

    fresh, found = pattern.subn(rewrite, text)
    schema: Any = json.loads(fresh)
    for key in keys:
        schema = schema.get(key, {}) if isinstance(schema, dict) else {}
    if found != 1 or schema.get("enum") != names:
        raise PluginError(f"no single {keys[-1]} enum at {'/'.join(keys)} to generate")
    return fresh


def schema_enums() -> list[tuple[str, tuple[str, ...], list[str]]]:
    """(schema path, keys, names) of every generated enum: statistics, then mechanisms."""
    return [
        *((path, keys, list(STATISTICS)) for path, keys in SCHEMA_ENUMS.items()),
        *((path, keys, list(STATED_MECHANISMS)) for path, keys in MECHANISM_ENUMS.items()),
    ]


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Copy into the site the files that included repository files link to."""
    root = _root(config)
    docs = Path(config.docs_dir)
    for page in docs.glob("*.md"):
        for kind, argument in MARKER.findall(page.read_text(encoding="utf-8")):
            if kind != "include":
                continue
            for asset in _included(root, argument.strip())[1]:
                if files.get_file_from_path(asset) is None:
                    files.append(File.generated(config, asset, abs_src_path=str(root / asset)))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, **_: Any) -> str:
    """Expand the markers of one page."""
    root = _root(config)

    def expand(match: re.Match[str]) -> str:
        text, _assets = _included(root, match.group(2).strip())
        # The included file's own title is the page's: drop it, keep the rest.
        return re.sub(r"\A# [^\n]*\n", "", text)

    return MARKER.sub(expand, refresh(markdown))


def main() -> None:
    """Rewrite the generated blocks of every page in docs/ (``make docs-refs``)."""
    for page in sorted(HERE.parent.glob("*.md")):
        text = page.read_text(encoding="utf-8")
        fresh = refresh(text)
        if fresh != text:
            page.write_text(fresh, encoding="utf-8")
            print(f"rewrote {page.relative_to(HERE.parents[1])}")
    for relative, keys, names in schema_enums():
        schema = HERE.parents[1] / relative
        text = schema.read_text(encoding="utf-8")
        fresh = refresh_schema(text, keys, names)
        if fresh != text:
            schema.write_text(fresh, encoding="utf-8")
            print(f"rewrote {relative}")


if __name__ == "__main__":
    main()
