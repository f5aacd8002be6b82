"""`python -m mutation.guards`: remove each threat-model claim's guard and see its tests turn red.

The project's rule: a test guards a claim only if removing the guard turns it red.
``mutation/guards.toml`` declares, for every row of docs/THREAT_MODEL.md, the guard in the
code (a file and an exact text edit that removes or breaks it: ``old`` → ``new``; ``old`` must
occur exactly once in the file) and the named tests that must fail without it. This runner

1. copies the working tree (tracked and untracked, not ignored files) into a temporary
   directory — the real tree is never edited, also not on Ctrl-C;
2. runs every test the selected declarations name there, unmutated (the baseline: each must
   pass, else a red result would prove nothing);
3. for each declaration: applies its edit to the copy, runs its tests (pytest,
   ``-p no:cacheprovider``, one process, a hard timeout), records red/green per test, and
   restores the file;
4. merges the results into ``mutation/guard_bites.json`` (row, guard, mutation, test, result,
   seconds, and a digest of the declaration, so a result stays valid only for the
   declaration it was run with).

A declaration whose ``old`` text is missing or not unique fails the run loudly: a refactor
that moves a guard forces the map to be updated. ``tests/test_threat_model.py`` checks the
JSON against the declarations and the threat model (:func:`unproven` states the rule).

``--row TEXT`` / ``--test TEXT`` / ``--id ID`` select declarations (a substring of the row, of
a test id, the declaration's id); without them all run. ``--list`` prints them. ``--out FILE``
merges into another results file (two runs at once must not write one file: each reads it
at the start and writes it at the end); ``--logs DIR`` keeps pytest's output of each run,
to see why a test failed (a baseline that fails unmutated proves nothing).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DECLARATIONS = ROOT / "mutation" / "guards.toml"
OUT = ROOT / "mutation" / "guard_bites.json"
DOC = ROOT / "docs" / "THREAT_MODEL.md"
#: one pytest run (a declaration's tests, or a baseline batch) is stopped after this; a run
#: stopped so with the mutation counts as red ("timeout"), without it as a failed baseline
RUN_TIMEOUT_S = 900
PYTEST_ARGS = ["-q", "-p", "no:cacheprovider", "-p", "mutation.guards", "-n", "0"]
REPORT_ENV = "MUTATION_GUARDS_REPORT"  # not STREAM_DP_*: those are configuration overrides


class GuardDeclarationError(Exception):
    """A declaration in mutation/guards.toml that cannot be applied as written."""


@dataclass(frozen=True)
class Guard:
    """One declared guard removal: the edit and the tests that must turn red."""

    id: str
    row: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]
    why: str

    def digest(self) -> str:
        """Changes whenever the edit or its tests change (results of another edit are stale)."""
        text = json.dumps([self.row, self.file, self.old, self.new, list(self.tests)])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def apply(self, root: Path) -> str:
        """The file's text before the edit; raises when ``old`` is not there exactly once."""
        check(self, root)
        path = root / self.file
        text = path.read_text(encoding="utf-8")
        path.write_text(text.replace(self.old, self.new), encoding="utf-8")
        return text


def check(guard: Guard, root: Path) -> None:
    """Raise unless the guard's ``old`` text occurs exactly once in its file under ``root``."""
    path = root / guard.file
    count = path.read_text(encoding="utf-8").count(guard.old) if path.exists() else 0
    if count != 1:
        raise GuardDeclarationError(
            f"{guard.id}: the guard's text occurs {count} times in {guard.file} (must be "
            f"once); the guard moved or changed: update mutation/guards.toml\n{guard.old}"
        )


def load(path: Path = DECLARATIONS) -> list[Guard]:
    """The declarations, in file order."""
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    guards = []
    for entry in data.get("guard", []):
        guards.append(
            Guard(
                id=entry["id"],
                row=entry["row"],
                file=entry["file"],
                old=entry["old"],
                new=entry["new"],
                tests=tuple(entry["tests"]),
                why=entry.get("why", ""),
            )
        )
    ids = [g.id for g in guards]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise GuardDeclarationError(f"duplicate guard ids in {path.name}: {duplicates}")
    return guards


def pending_rows(path: Path = DECLARATIONS) -> list[str]:
    """Rows the declarations admit are not yet proven (``pending = [...]``)."""
    return list(tomllib.loads(path.read_text(encoding="utf-8")).get("pending", []))


def threat_model_rows(doc: Path = DOC) -> dict[str, list[str]]:
    """Each table row's first cell → the test ids it names (``path::name``)."""
    from tests.threat_model_plugin import named_tests

    rows: dict[str, list[str]] = {}
    for line in doc.read_text(encoding="utf-8").splitlines():
        if not line.startswith("| ") or line.startswith(("| claim", "| who")) or "---" in line:
            continue
        cell = line.split(" | ")[0][2:].strip()
        rows[cell] = [f"{p}::{n}" for p, n in named_tests(line)]
    return rows


def row_of(prefix: str, rows: Iterable[str]) -> str:
    """The one row whose first cell starts with ``prefix``."""
    found = [r for r in rows if r.startswith(prefix)]
    if len(found) != 1:
        raise GuardDeclarationError(f"row {prefix!r} matches {len(found)} threat-model rows")
    return found[0]


def unproven(
    rows: dict[str, list[str]], guards: list[Guard], results: dict[str, Any]
) -> dict[str, list[str]]:
    """Per row: what keeps it from being proven (empty when proven). The rule of
    docs/THREAT_MODEL.md ("How a row is proven"): a row that names tests is proven when

    1. it has at least one declared guard removal;
    2. every test a removal declares is one the row names;
    3. every removal has a result recorded at its current declaration (digest) in which
       every test it declares is red with the edit and green without it;
    4. every test the row names is declared by at least one of its removals.

    So each named test turns red when a guard of its row is removed, and no declared
    removal leaves a test it claims green (a removal none of whose tests notices it is a
    path of the claim nothing guards)."""
    out: dict[str, list[str]] = {}
    for row, tests in rows.items():
        if not tests:
            continue  # a row that names no guard ("—") claims no test
        mine = [g for g in guards if row_of(g.row, rows) == row]
        problems = [] if mine else ["no guard mutation declared in mutation/guards.toml"]
        for guard in mine:
            problems += [
                f"{guard.id}: declares {test}, which the row does not name"
                for test in guard.tests
                if test not in tests
            ]
            result = results.get(guard.id)
            if result is None or result["digest"] != guard.digest():
                problems.append(
                    f"{guard.id}: no result recorded at the current declaration; run "
                    f"`python -m mutation.guards --id {guard.id}`"
                )
                continue
            bites = {entry["test"]: entry["bites"] for entry in result["tests"]}
            problems += [
                f"{guard.id}: {test} is not recorded red with the removal and green without "
                "it (a declared test that does not notice its guard's removal)"
                for test in guard.tests
                if not bites.get(test, False)
            ]
        declared = {test for guard in mine for test in guard.tests}
        problems += [
            f"{test}: no declared guard removal of its row turns it red"
            for test in tests
            if test not in declared
        ]
        if problems:
            out[row] = problems
    return out


#: not copied: version control, environments, caches, mutmut's copy, the built site
_NOT_COPIED = shutil.ignore_patterns(
    ".git", ".venv", "mutants", "site", "__pycache__", ".*_cache", "*.egg-info"
)


def _copy_tree(dest: Path) -> None:
    shutil.copytree(ROOT, dest, ignore=_NOT_COPIED, dirs_exist_ok=True)
    # The Apache Kafka tier finds its jars under <repo>/.venv (a STREAM_DP_ variable would be
    # read as a configuration override): link the environment's broker directories.
    for jars in [*Path(sys.prefix).glob("apache-kafka-*"), *ROOT.glob(".venv/apache-kafka-*")]:
        link = dest / ".venv" / jars.name
        if not link.exists():
            link.parent.mkdir(exist_ok=True)
            link.symlink_to(jars.resolve(), target_is_directory=True)


def pytest_runtest_logreport(report: Any) -> None:
    """A pytest hook (this module is loaded with ``-p mutation.guards`` in each run): appends
    each test's phase outcome, one JSON line, to the file ``$MUTATION_GUARDS_REPORT``."""
    target = os.environ.get(REPORT_ENV)
    if target and (report.when == "call" or report.outcome != "passed"):
        with open(target, "a", encoding="utf-8") as lines:
            lines.write(json.dumps([report.nodeid, report.outcome]) + "\n")


def _outcomes(report: Path, tests: Iterable[str]) -> dict[str, str]:
    """Per test id: passed, failed (a parametrisation or phase failed), skipped or missing."""
    out = {t: "missing" for t in tests}
    lines = report.read_text(encoding="utf-8").splitlines() if report.exists() else []
    for node_id, outcome in map(json.loads, lines):
        test = node_id.split("[", 1)[0]
        if test not in out:
            continue
        if outcome == "failed":
            out[test] = "failed"
        elif outcome == "skipped":
            out[test] = "skipped" if out[test] == "missing" else out[test]
        elif out[test] != "failed":
            out[test] = "passed"
    return out


def run_tests(
    root: Path, tests: list[str], timeout_s: float, log: Path | None = None
) -> tuple[dict[str, str], float]:
    """Run ``tests`` in the copy at ``root``; outcome per test and the seconds it took.
    ``log``: where pytest's output goes (else nowhere)."""
    report = root / ".guards-report.jsonl"
    report.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(root), REPORT_ENV: str(report)}
    started = time.monotonic()
    output = log.open("w", encoding="utf-8") if log is not None else subprocess.DEVNULL
    try:
        subprocess.run(  # noqa: S603 (this interpreter, pytest, test ids from the declarations)
            [sys.executable, "-m", "pytest", *PYTEST_ARGS, *tests],
            cwd=root,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            timeout=timeout_s,
            check=False,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired:
        return {t: "timeout" for t in tests}, time.monotonic() - started
    finally:
        if not isinstance(output, int):
            output.close()
    return _outcomes(report, tests), time.monotonic() - started


def _result(outcome: str) -> str:
    return {"failed": "red", "timeout": "red", "passed": "green"}.get(outcome, outcome)


def _shown(path: Path) -> str:
    """``path`` relative to the repository when it is inside it, else as given."""
    resolved = path.resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else str(path)


def run(guards: list[Guard], timeout_s: float, out: Path = OUT, logs: Path | None = None) -> int:
    """Run the baseline and each guard's removal (module docstring); ``logs``: a directory
    that keeps pytest's output of each run (``baseline.log``, ``<guard id>.log``)."""
    rows = threat_model_rows()
    for guard in guards:  # fail loudly before spending any time
        named = rows[row_of(guard.row, rows)]
        check(guard, ROOT)
        unnamed = [t for t in guard.tests if t not in named]
        if unnamed:
            raise GuardDeclarationError(
                f"{guard.id}: tests its row does not name (name them in docs/THREAT_MODEL.md "
                f"or fix the id): {unnamed}"
            )
    record = json.loads(out.read_text(encoding="utf-8")) if out.exists() else {"results": {}}
    results: dict[str, dict[str, object]] = record["results"]
    with tempfile.TemporaryDirectory(prefix="stream-dp-guards-") as tmp:
        root = Path(tmp)
        _copy_tree(root)
        tests = sorted({t for g in guards for t in g.tests})
        print(f"baseline: {len(tests)} tests without any mutation", flush=True)
        if logs is not None:
            logs.mkdir(parents=True, exist_ok=True)
        baseline, seconds = run_tests(
            root, tests, timeout_s * 2, logs / "baseline.log" if logs else None
        )
        print(
            f"  {seconds:.0f} s: "
            + ", ".join(f"{t}={o}" for t, o in baseline.items() if o != "passed"),
            flush=True,
        )
        if any(o in ("missing", "timeout") for o in baseline.values()):
            raise GuardDeclarationError(
                "the baseline run (no mutation) did not run every test; nothing recorded: "
                + ", ".join(f"{t}={o}" for t, o in baseline.items() if o != "passed")
            )
        failures = 0
        for guard in guards:
            before = guard.apply(root)
            try:
                outcomes, seconds = run_tests(
                    root, list(guard.tests), timeout_s, logs / f"{guard.id}.log" if logs else None
                )
            finally:
                (root / guard.file).write_text(before, encoding="utf-8")
            per_test = []
            for test in guard.tests:
                result = _result(outcomes[test])
                bites = result == "red" and baseline[test] == "passed"
                failures += not bites
                per_test.append(
                    {
                        "test": test,
                        "result": result,
                        "outcome": outcomes[test],
                        "without_mutation": _result(baseline[test]),
                        "bites": bites,
                    }
                )
            results[guard.id] = {
                "row": row_of(guard.row, rows),
                "guard": guard.file,
                "mutation": {"old": guard.old, "new": guard.new},
                "why": guard.why,
                "digest": guard.digest(),
                "seconds": round(seconds, 1),
                "tests": per_test,
            }
            marks = " ".join(
                f"{p['test']}="
                + ("BITES" if p["bites"] else f"{p['result']}/{p['without_mutation']}")
                for p in per_test
            )
            print(f"{guard.id} ({seconds:.0f} s): {marks}", flush=True)
    declared = {g.id for g in load()}
    record["results"] = {k: results[k] for k in sorted(results) if k in declared}
    out.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(
        f"wrote {_shown(out)}; {failures} declared test run(s) did not bite (a row "
        "is proven when every test each of its removals declares bites, and every test it "
        "names is declared by one: tests/test_threat_model.py judges)",
        flush=True,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mutation.guards", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--row", action="append", default=[], help="a substring of the row")
    parser.add_argument("--test", action="append", default=[], help="a substring of a test id")
    parser.add_argument("--id", action="append", default=[], help="a declaration's id")
    parser.add_argument("--list", action="store_true", help="list the selected declarations")
    parser.add_argument("--timeout", type=float, default=RUN_TIMEOUT_S, help="seconds per run")
    parser.add_argument(
        "--out", type=Path, default=OUT, help="the results file to merge into (%(default)s)"
    )
    parser.add_argument(
        "--logs", type=Path, help="a directory to keep pytest's output of each run in"
    )
    args = parser.parse_args(argv)
    guards = load()
    if args.row or args.test or args.id:
        guards = [
            g
            for g in guards
            if g.id in args.id
            or any(r in g.row for r in args.row)
            or any(t in test for t in args.test for test in g.tests)
        ]
    if args.list:
        for g in guards:
            print(f"{g.id}: {g.file}: {', '.join(g.tests)}")
        return 0
    try:
        return run(guards, args.timeout, args.out, args.logs)
    except GuardDeclarationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
