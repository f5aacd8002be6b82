"""Noise and selection draws must come from a CSPRNG (docs/privacy.md#invariant-6).

Scans every module under stream_dp/ for the non-cryptographic generators — any reference to
the ``random`` module or to ``numpy.random`` (calls, constructors, ``from random import …``,
aliases) outside type annotations — and fails unless the use is on :data:`ALLOWED_USES`, an
explicit list of (module, function) with the reason the draw is not a privacy draw. A
``# noqa: S311`` comment does not count: it silences ruff, not this test.

Every module under stream_dp/privacy draws or plans noise or selection, so none of them may
use those generators at all, in any function, except the sampling modules listed in
:data:`SAMPLING_MODULES` (which of a user's own events are kept bounds the sensitivity
whichever events they are). ruff's S311 rule covers the same ground at lint time; a test
checks it stays enabled for stream_dp/.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "stream_dp"
PRIVACY = PACKAGE / "privacy"

#: Modules under stream_dp/privacy whose draws are not privacy draws, with why.
SAMPLING_MODULES: dict[str, str] = {
    "stream_dp/privacy/bounding.py": "reservoir sampling: which <= k of a user's own events "
    "are kept; any choice bounds the sensitivity, so the choice need not be secret",
    "stream_dp/privacy/user_samples.py": "per-user event sampling (random priorities) for the "
    "contribution bound: the same argument as the reservoir",
}

#: (module, enclosing function or "<module>") -> why its non-cryptographic draw is no DP draw.
ALLOWED_USES: dict[tuple[str, str], str] = {
    ("stream_dp/privacy/bounding.py", "new_sampling_rng"): SAMPLING_MODULES[
        "stream_dp/privacy/bounding.py"
    ],
    ("stream_dp/privacy/user_samples.py", "<module>"): "the type of the sampling generator",
    ("stream_dp/privacy/user_samples.py", "new_sampling_generator"): SAMPLING_MODULES[
        "stream_dp/privacy/user_samples.py"
    ],
    ("stream_dp/synthetic/browser_logs.py", "browser_log_events"): "synthetic test and bench data, "
    "seeded for reproducibility",
    ("stream_dp/synthetic/browser_logs.py", "live_browser_log_events"): "synthetic live demo "
    "data, seeded",
    ("stream_dp/synthetic/drifting.py", "drifting_events"): "synthetic test and bench data, "
    "seeded for reproducibility",
}


@dataclass(frozen=True)
class RandomUse:
    line: int
    function: str  # enclosing function (dotted through classes) or "<module>"
    what: str


class _Scanner(ast.NodeVisitor):
    def __init__(self) -> None:
        self.random_names: set[str] = set()
        self.numpy_names: set[str] = set()
        self.scope: list[str] = []
        self.uses: list[RandomUse] = []

    def _add(self, node: ast.AST, what: str) -> None:
        function = ".".join(self.scope) or "<module>"
        self.uses.append(RandomUse(getattr(node, "lineno", 0), function, what))

    def _scoped(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        for decorator in node.decorator_list:
            self.visit(decorator)
        if not isinstance(node, ast.ClassDef):
            for default in [*node.args.defaults, *node.args.kw_defaults]:
                if default is not None:
                    self.visit(default)
        else:
            for base in node.bases:
                self.visit(base)
        self.scope.append(node.name)
        for statement in node.body:  # annotations (arguments, returns) are not visited
            self.visit(statement)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:  # the annotation itself is a type, never a draw
            self.visit(node.value)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name == "random":
                self.random_names.add(alias.asname or "random")
                if alias.asname:
                    self._add(node, f"import random as {alias.asname}")
            elif alias.name == "numpy":
                self.numpy_names.add(alias.asname or "numpy")
            elif alias.name.startswith("numpy.random"):
                self._add(node, f"import {alias.name}")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if module == "random" or module.startswith("numpy.random"):
            self._add(node, f"from {module} import …")
        elif module == "numpy" and any(a.name == "random" for a in node.names):
            self._add(node, "from numpy import random")

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        if name in ("__import__", "import_module"):  # a module the import scan cannot see
            self._add(node, f"{name}(…)")
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in self.random_names:
            self._add(node, f"{node.id} (the random module)")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        base = node.value
        if node.attr == "random" and isinstance(base, ast.Name) and base.id in self.numpy_names:
            self._add(node, f"{base.id}.random")
            return
        self.generic_visit(node)


def random_uses(source: str, filename: str = "<string>") -> list[RandomUse]:
    """Every use of the random module or numpy.random in ``source`` outside annotations
    (a plain ``import random`` or ``import numpy`` is none: it draws nothing)."""
    scanner = _Scanner()
    tree = ast.parse(source, filename)
    for node in tree.body:  # imports first, so that names are known wherever they are used
        if isinstance(node, ast.Import | ast.ImportFrom):
            scanner.visit(node)
    scanner.uses.clear()
    scanner.visit(tree)
    return sorted(set(scanner.uses), key=lambda u: (u.line, u.what))


def _all_uses() -> dict[tuple[str, str], list[RandomUse]]:
    out: dict[tuple[str, str], list[RandomUse]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = str(path.relative_to(ROOT))
        for use in random_uses(path.read_text(encoding="utf-8"), module):
            out.setdefault((module, use.function), []).append(use)
    return out


def test_the_scanner_finds_what_it_should() -> None:
    bad = (
        "import random\nimport numpy as np\nfrom numpy.random import default_rng\n"
        "x = random.random()\ny = np.random.laplace(0, 1)\nimport random as r\n"
        "z = r.randint(0, 3)\nfrom random import choice\nfrom numpy import random as npr\n"
        "def f() -> None:\n    g = random.Random(1)  # noqa: S311 — marked, still found\n"
        "class C:\n    def m(self, b: bytes = np.random.bytes(8)) -> None:\n"
        "        self.rng = np.random.default_rng()\n"
        "w = __import__('numpy').random.laplace(0, 1)\n"
    )
    found = {(u.line, u.function) for u in random_uses(bad)}
    assert found == {
        (3, "<module>"),
        (4, "<module>"),
        (5, "<module>"),
        (6, "<module>"),
        (7, "<module>"),
        (8, "<module>"),
        (9, "<module>"),
        (11, "f"),
        (13, "C"),
        (14, "C.m"),
        (15, "<module>"),
    }
    good = (
        "import random\nimport secrets\nimport numpy as np\n"
        "rng_type = None\nx: random.Random | None = None\n"
        "def f(r: random.Random, g: np.random.Generator) -> random.Random:\n"
        "    return secrets.randbelow(3)\n"
    )
    assert random_uses(good) == []


def test_stream_dp_uses_no_insecure_random_outside_the_allowed_uses() -> None:
    """Every use is on ALLOWED_USES (a ``# noqa: S311`` mark is not enough), and every
    entry of ALLOWED_USES is still used (a stale entry would let a new draw in unseen)."""
    uses = _all_uses()
    offenders = [
        f"{module}:{u.line} in {function}: {u.what}"
        for (module, function), found in uses.items()
        if (module, function) not in ALLOWED_USES
        for u in found
    ]
    assert offenders == []
    assert set(ALLOWED_USES) - set(uses) == set()


def _privacy_modules() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in PRIVACY.rglob("*.py"))


def test_the_privacy_core_never_uses_random_at_all() -> None:
    """Every module under stream_dp/privacy draws, calibrates or plans noise and selection,
    so none of them uses the random module or numpy.random outside type annotations, in any
    function and whatever its comments say, except the sampling modules (SAMPLING_MODULES,
    each with its reason). The derived list holds the samplers in use."""
    core = [m for m in _privacy_modules() if m not in SAMPLING_MODULES]
    for sampler in (
        "exact_laplace.py",
        "adaptive_bounds.py",
        "mechanisms.py",
        "partition_selection.py",
        "release.py",
        "continual/binary_tree.py",
    ):
        assert f"stream_dp/privacy/{sampler}" in core
    # every module that draws from the OS CSPRNG is held to the rule
    drawing = [m for m in _privacy_modules() if "secrets." in (ROOT / m).read_text("utf-8")]
    assert drawing and set(drawing) <= set(core)
    assert set(SAMPLING_MODULES) <= set(_privacy_modules())
    uses = _all_uses()
    found = [f"{m}:{u.line}: {u.what}" for (m, _), us in uses.items() if m in core for u in us]
    assert found == []


def test_ruff_s311_stays_enabled_for_stream_dp() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    lint = config["tool"]["ruff"]["lint"]
    assert "S" in lint["select"] or "S311" in lint["select"]
    assert "S311" not in lint.get("ignore", [])
    for pattern, ignored in lint.get("per-file-ignores", {}).items():
        if "S311" in ignored:
            assert not pattern.startswith("stream_dp"), pattern
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(ruff).exists():
        pytest.skip("ruff is not installed")
    result = subprocess.run(
        [ruff, "check", "--select", "S311", "--output-format", "concise", str(PACKAGE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
