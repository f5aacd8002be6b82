"""The size limits of issue 26 hold in ``stream_dp/``: no class over 400 lines, no function
over 120 (no exceptions: a function over the limit is split at its seams), no package folder
with more than 20 modules of its own (``__init__.py`` not counted).

Lengths are from the ``def``/``class`` line to the last line of the body, as the AST says
(decorators and the blank lines after the body are not counted).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "stream_dp"

MAX_CLASS_LINES = 400
MAX_FUNCTION_LINES = 120
MAX_MODULES_PER_FOLDER = 20


def _definitions() -> Iterator[tuple[str, str, int]]:
    """(kind, "path::Qualified.name", lines) for every class and function in the package."""
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        yield from _walk(tree, relative, "")


def _walk(node: ast.AST, relative: str, prefix: str) -> Iterator[tuple[str, str, int]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            name = f"{prefix}{child.name}"
            kind = "class" if isinstance(child, ast.ClassDef) else "function"
            assert child.end_lineno is not None
            yield kind, f"{relative}::{name}", child.end_lineno - child.lineno + 1
            yield from _walk(child, relative, f"{name}.")
        else:
            yield from _walk(child, relative, prefix)


def test_no_class_or_function_is_over_its_limit() -> None:
    too_long = []
    for kind, name, lines in _definitions():
        limit = MAX_CLASS_LINES if kind == "class" else MAX_FUNCTION_LINES
        if lines > limit:
            too_long.append(f"{kind} {name}: {lines} lines (limit {limit})")
    assert not too_long, "split these at their seams:\n" + "\n".join(too_long)


def test_no_package_folder_holds_more_than_20_modules() -> None:
    crowded = []
    for folder in [PACKAGE, *sorted(p for p in PACKAGE.rglob("*") if p.is_dir())]:
        modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
        if len(modules) > MAX_MODULES_PER_FOLDER:
            crowded.append(f"{folder.relative_to(PACKAGE.parent)}: {len(modules)} modules")
    assert not crowded, "split these folders:\n" + "\n".join(crowded)
