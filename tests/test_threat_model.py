"""docs/THREAT_MODEL.md names, for every claim, the test that guards it: each named test must
exist (a renamed or deleted test would leave a claim unguarded without anyone noticing), carry
no skip or xfail mark, and run: tests/threat_model_plugin.py fails any session in which a
named test was skipped or xfailed, with or without pytest-xdist (checked here on a small
project of its own)."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.threat_model_plugin import named_tests

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "THREAT_MODEL.md"


def _references() -> list[tuple[str, str]]:
    return named_tests(DOC.read_text(encoding="utf-8"))


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


_SKIPPING = {"skip", "skipif", "xfail", "importorskip"}


def _skip_marks(node: ast.AST) -> list[str]:
    """Every ``pytest.mark.skip/skipif/xfail`` and ``pytest.skip/xfail/importorskip`` in
    ``node`` (decorators, ``pytest.param(marks=…)``, calls in the body)."""
    found = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr in _SKIPPING:
            base = sub.value
            if (isinstance(base, ast.Name) and base.id == "pytest") or (
                isinstance(base, ast.Attribute) and base.attr == "mark"
            ):
                found.append(f"line {sub.lineno}: {ast.unparse(sub)}")
    return found


def named_tests_with_skip_marks(root: Path, references: list[tuple[str, str]]) -> list[str]:
    """Named tests marked or written to skip or xfail: on the test, its class, or the
    module's ``pytestmark``."""
    out = []
    for path, name in sorted(set(references)):
        tree = ast.parse((root / path).read_text(encoding="utf-8"))
        module_marks = [
            mark
            for node in tree.body
            if isinstance(node, ast.Assign | ast.AnnAssign)
            and "pytestmark" in ast.unparse(node).split("=")[0]
            for mark in _skip_marks(node)
        ]
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                owned = {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
                if name in owned:
                    module_marks += [m for d in node.decorator_list for m in _skip_marks(d)]
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
                marks = module_marks + _skip_marks(node)
                out += [f"{path}::{name}: {mark}" for mark in marks]
    return out


def test_no_named_test_is_marked_to_skip_or_xfail() -> None:
    assert named_tests_with_skip_marks(ROOT, _references()) == []


def test_the_mark_scan_finds_skips_and_xfails(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text(
        "import pytest\n"
        "@pytest.mark.skip(reason='later')\ndef test_marked() -> None: ...\n"
        "@pytest.mark.parametrize('x', [1, pytest.param(2, marks=pytest.mark.xfail)])\n"
        "def test_param(x: int) -> None: ...\n"
        "def test_body() -> None:\n    pytest.importorskip('nothing')\n"
        "def test_clean() -> None:\n    assert 'skip' != 'xfail'\n"
    )
    (tmp_path / "tests" / "test_b.py").write_text(
        "import pytest\npytestmark = [pytest.mark.slow, pytest.mark.skipif(True, reason='x')]\n"
        "def test_in_a_skipped_module() -> None: ...\n"
    )
    refs = [
        ("tests/test_a.py", n) for n in ("test_marked", "test_param", "test_body", "test_clean")
    ] + [("tests/test_b.py", "test_in_a_skipped_module")]
    found = {line.split(":", 3)[2] for line in named_tests_with_skip_marks(tmp_path, refs)}
    assert found == {"test_marked", "test_param", "test_body", "test_in_a_skipped_module"}


# -- the plugin, on a project of its own --------------------------------------------------

_PROJECT_TESTS = """\
import pytest

def test_runs() -> None:
    assert True

@pytest.mark.skip(reason="not today")
def test_skipped() -> None:
    assert True

@pytest.mark.xfail(reason="known bug")
def test_xfailed() -> None:
    assert False

@pytest.mark.parametrize("x", [1, 2])
def test_param(x: int) -> None:
    if x == 2:
        pytest.skip("the second one skips at run time")

def test_not_named() -> None:
    pytest.skip("not a guard: may skip")
"""


def _project(tmp_path: Path, named: list[str]) -> Path:
    (tmp_path / "docs").mkdir()
    rows = "\n".join(f"| claim {i} | `tests/test_guards.py::{n}` |" for i, n in enumerate(named))
    doc = tmp_path / "docs" / "THREAT_MODEL.md"
    doc.write_text(f"| claim | guarded by |\n|---|---|\n{rows}\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_guards.py").write_text(_PROJECT_TESTS)
    (tmp_path / "conftest.py").write_text(
        "from tests.threat_model_plugin import install\n\n"
        "def pytest_configure(config):\n    install(config)\n"
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    return tmp_path


def _pytest(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_named_test_that_is_skipped_or_xfailed_fails_the_session(
    tmp_path: Path, workers: str
) -> None:
    project = _project(tmp_path, ["test_runs", "test_skipped", "test_xfailed", "test_param"])
    result = _pytest(project, "-n", workers, "-p", "xdist")
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "threat model guards that did not run" in out, out
    for nodeid, why in [
        ("tests/test_guards.py::test_skipped", "not today"),
        ("tests/test_guards.py::test_xfailed", "xfailed"),
        ("tests/test_guards.py::test_param[2]", "the second one skips at run time"),
    ]:
        assert re.search(rf"{re.escape(nodeid)}: .*{why}", out), out
    assert "test_param[1]:" not in out and "test_runs:" not in out
    assert "test_not_named:" not in out


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_session_whose_named_tests_all_ran_passes(tmp_path: Path, workers: str) -> None:
    project = _project(tmp_path, ["test_runs"])
    result = _pytest(project, "-n", workers, "-p", "xdist")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "threat model guards" not in result.stdout


# -- each row's guard, removed, turns its named tests red (mutation/guards.py) ------------

GUARD_BITES = ROOT / "mutation" / "guard_bites.json"


def _guard_state() -> tuple[dict[str, list[str]], list[Any], dict[str, Any], list[str]]:
    from mutation.guards import load, pending_rows, threat_model_rows

    rows = threat_model_rows(DOC)
    record = json.loads(GUARD_BITES.read_text(encoding="utf-8")) if GUARD_BITES.exists() else {}
    return rows, load(), record.get("results", {}), pending_rows()


def _unproven(
    rows: dict[str, list[str]], guards: list[Any], results: dict[str, Any]
) -> dict[str, list[str]]:
    """Per row: what keeps it from being proven (:func:`mutation.guards.unproven`: the rule
    docs/THREAT_MODEL.md states under "How a row is proven")."""
    from mutation.guards import unproven

    return unproven(rows, guards, results)


def test_every_declared_guard_is_still_in_the_code_exactly_once() -> None:
    from mutation.guards import GuardDeclarationError, check, row_of

    rows, guards, _, _ = _guard_state()
    broken = []
    for guard in guards:
        try:
            row_of(guard.row, rows)
            check(guard, ROOT)
        except GuardDeclarationError as exc:
            broken.append(str(exc))
    assert broken == []


def test_every_row_names_tests_that_turn_red_when_its_guard_is_removed() -> None:
    """mutation/guard_bites.json (``make guards``) shows, for each row, every test it names red
    with a declared removal of the row's guard and green without it. Rows still listed as
    ``pending`` in mutation/guards.toml are exactly those not yet proven: the list only
    shrinks (a proven row must leave it, a row may not become unproven)."""
    from mutation.guards import row_of

    rows, guards, results, pending = _guard_state()
    unproven = _unproven(rows, guards, results)
    listed = {row_of(prefix, rows) for prefix in pending}
    assert {row: unproven[row] for row in unproven if row not in listed} == {}
    assert sorted(r[:60] for r in listed - set(unproven)) == [], "proven: remove from pending"


def test_the_guard_check_finds_a_row_whose_test_stays_green() -> None:
    from mutation.guards import Guard

    rows = {"claim a": ["tests/x.py::test_a"], "claim b": ["tests/x.py::test_b"], "none": []}
    guard = Guard("a1", "claim a", "f.py", "x < 1", "True", ("tests/x.py::test_a",), "")
    green = {"digest": guard.digest(), "tests": [{"test": "tests/x.py::test_a", "bites": False}]}
    red = {"digest": guard.digest(), "tests": [{"test": "tests/x.py::test_a", "bites": True}]}
    assert set(_unproven(rows, [guard], {"a1": green})) == {"claim a", "claim b"}
    assert set(_unproven(rows, [guard], {"a1": red})) == {"claim b"}
    stale = {**red, "digest": "another edit"}
    assert set(_unproven(rows, [guard], {"a1": stale})) == {"claim a", "claim b"}


def test_a_row_is_unproven_when_any_declared_removal_leaves_a_test_it_claims_green() -> None:
    """The rule as docs/THREAT_MODEL.md states it, not "some removal bites each test":
    with ``a1`` biting both of the row's tests, a second removal ``a2`` that claims
    ``test_b`` and leaves it green (or has no result, or claims a test the row does not
    name) keeps the row unproven; and each named test must be claimed by a removal."""
    from mutation.guards import Guard

    a, b = "tests/x.py::test_a", "tests/x.py::test_b"
    rows = {"claim a": [a, b]}
    a1 = Guard("a1", "claim a", "f.py", "x < 1", "True", (a, b), "")
    a2 = Guard("a2", "claim a", "g.py", "y < 1", "True", (b,), "")

    def result(guard: Guard, **bites: bool) -> dict[str, Any]:
        tests = [{"test": f"tests/x.py::{t}", "bites": v} for t, v in bites.items()]
        return {"digest": guard.digest(), "tests": tests}

    both = result(a1, test_a=True, test_b=True)
    assert _unproven(rows, [a1], {"a1": both}) == {}
    assert _unproven(rows, [a1, a2], {"a1": both, "a2": result(a2, test_b=True)}) == {}
    green = _unproven(rows, [a1, a2], {"a1": both, "a2": result(a2, test_b=False)})
    assert list(green) == ["claim a"] and len(green["claim a"]) == 1
    assert green["claim a"][0].startswith(f"a2: {b} is not recorded red")
    missing = _unproven(rows, [a1, a2], {"a1": both})
    assert missing["claim a"][0].startswith("a2: no result recorded")
    a3 = Guard("a3", "claim a", "h.py", "z < 1", "True", ("tests/x.py::test_c",), "")
    unnamed = _unproven(rows, [a1, a3], {"a1": both, "a3": result(a3, test_c=True)})
    assert unnamed["claim a"] == ["a3: declares tests/x.py::test_c, which the row does not name"]
    only_a = Guard("a1", "claim a", "f.py", "x < 1", "True", (a,), "")
    unclaimed = _unproven(rows, [only_a], {"a1": result(only_a, test_a=True)})
    assert unclaimed["claim a"] == [f"{b}: no declared guard removal of its row turns it red"]


def test_the_guard_runner_names_a_results_file_outside_the_repository(tmp_path: Path) -> None:
    """``python -m mutation.guards --out`` may write anywhere (a run beside another): the
    closing message names the file without assuming it is in the repository."""
    from mutation.guards import OUT, _shown

    assert _shown(OUT) == "mutation/guard_bites.json"
    assert _shown(tmp_path / "bites.json") == str(tmp_path / "bites.json")
