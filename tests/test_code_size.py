"""The size limits of issue 26 hold in ``stream_dp/``: no class over 400 lines, no function
over 120 (no exceptions: a function over the limit is split at its seams), no package folder
with more than 20 modules of its own (``__init__.py`` not counted).

A class's 400 lines count the ``stream_dp`` classes it inherits from (issue 40): a mixin chain
is one class to read, so a class split into mixins is not split. Base classes from outside the
package (``Protocol``, ``Exception``, ``Sequence``) do not count.

Lengths are from the ``def``/``class`` line to the last line of the body, as the AST says
(decorators and the blank lines after the body are not counted).
"""

from __future__ import annotations

import ast
import importlib
import inspect
from collections.abc import Iterator
from pathlib import Path

import stream_dp

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


def _class_lines() -> dict[tuple[str, str], int]:
    """Own lines of each top-level class, by (module, class name)."""
    lines: dict[tuple[str, str], int] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                lines[module, node.name] = node.end_lineno - node.lineno + 1
    return lines


def test_no_class_is_over_its_limit_counting_what_it_inherits() -> None:
    """Each class's own lines plus those of every ``stream_dp`` class in its MRO."""
    own = _class_lines()
    too_long = []
    for module_name, class_name in sorted(own):
        cls = getattr(importlib.import_module(module_name), class_name, None)
        if not inspect.isclass(cls) or cls.__module__ != module_name:
            continue  # not bound under its own name (a conditional definition)
        chain = [
            (base.__module__, base.__qualname__)
            for base in cls.__mro__
            if base.__module__.split(".")[0] == stream_dp.__name__
        ]
        total = sum(own.get(key, 0) for key in chain)
        if total > MAX_CLASS_LINES:
            names = " + ".join(f"{name} {own.get((m, name), 0)}" for m, name in chain)
            too_long.append(f"{module_name}.{class_name}: {total} lines ({names})")
    assert not too_long, (
        f"over {MAX_CLASS_LINES} lines counting their stream_dp bases; build them from "
        "collaborators instead of mixins:\n" + "\n".join(too_long)
    )
