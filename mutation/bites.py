"""`python -m mutation.bites`: for every test the threat model names, a mutant it kills alone.

A threat-model row is guarded only if its named test fails when the guard is broken. After
`make mutate` (which leaves the mutated copy and mutmut's test↔function map in
``mutants/``), this runs each named test *by itself* against mutants of the functions it
reaches, most specific functions first, until one mutant makes it fail, and writes the
result to ``mutation/threat_model_bites.json``:

- ``bites``: the test failed with that mutant (its name and its one-line change), and passed
  with no mutant active (so the failure is the mutant's doing);
- ``survives``: no mutant tried made it fail (the candidates tried are listed);
- ``outside``: the test reaches no mutated function, or is not in the mutation run (a broker,
  subprocess or slow test): it is guarded by the tests of section "outside the run" of
  docs/MUTATION.md, not by this map.

``tests/test_threat_model.py`` reads the file to check each row's tests bite.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from mutation.report import MUTANTS, ROOT, mutant_change, read_mutants
from mutation.run import make_forks_safe

DOC = ROOT / "docs" / "THREAT_MODEL.md"
OUT = ROOT / "mutation" / "threat_model_bites.json"
#: `tests/a/b.py::test_name` or a continuation `::test_name` (same file as the last one).
REFERENCE = re.compile(r"`(tests/[\w/]+\.py)?::(\w+)`")
#: mutants tried per test before it is reported as surviving them all
MAX_TRIES = 6
#: a named test run against one mutant is stopped after this (a hang counts as a kill)
RUN_TIMEOUT_S = 120
PYTEST_ARGS = ["-x", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--rootdir=."]


def named_tests(doc: Path = DOC) -> list[tuple[str, str]]:
    """(the row's claim, `path::name`) for every test the threat model's rows name."""
    out = []
    for line in doc.read_text(encoding="utf-8").splitlines():
        if not line.startswith("| ") or line.startswith(("| claim", "| who")) or "---" in line:
            continue
        claim = line.split("|")[1].strip()
        current = ""
        for path, name in REFERENCE.findall(line):
            current = path or current
            out.append((claim, f"{current}::{name}"))
    return out


@dataclass
class Verdict:
    """What running one named test against mutants showed."""

    test: str
    claims: list[str]
    status: str
    mutant: str | None = None
    change: str | None = None
    tried: list[str] = field(default_factory=list)
    note: str = ""


def _base_name(node_id: str) -> str:
    return node_id.split("[", 1)[0]


def candidates(test: str, stats: dict[str, list[str]], killed: set[str]) -> list[str]:
    """Mutants of the functions `test` reaches that some test may kill, most specific
    function first (`killed`: every mutant not known to survive all tests).

    A function reached by few tests is the one a claim's own guard most likely lives in;
    a helper every test calls (a config builder) comes last.
    """
    reached = [
        (len(tests), function)
        for function, tests in stats.items()
        if any(_base_name(t) == test for t in tests)
    ]
    per_function = []
    for _, function in sorted(reached):
        prefix = function + "__mutmut_"
        mine = sorted(
            (m for m in killed if m.startswith(prefix)), key=lambda m: int(m.rsplit("_", 1)[1])
        )
        if mine:
            per_function.append(mine)
    # Round robin: the first mutant of each function, then the second of each, …, so that
    # the tries spread over the functions the test reaches.
    out = []
    for i in range(max((len(m) for m in per_function), default=0)):
        out += [mine[i] for mine in per_function if i < len(mine)]
    return out


def _preload(tests: dict[str, list[str]]) -> None:
    """Import pytest and the named tests' modules (with the mutated code they import) once,
    so that each forked run starts with them loaded instead of importing them again."""
    import importlib

    import pytest  # noqa: F401  (loaded for the children)

    for path in sorted({t.split("::", 1)[0] for t in tests}):
        module = path.removesuffix(".py").replace("/", ".")
        try:
            importlib.import_module(module)
        except Exception as error:  # noqa: BLE001 (a module that fails loads in the child)
            print(f"not preloaded: {module}: {error}", file=sys.stderr)


@contextlib.contextmanager
def _in_mutants() -> Iterator[None]:
    previous = Path.cwd()
    os.chdir(MUTANTS)
    try:
        yield
    finally:
        os.chdir(previous)


def run_test(test: str, mutant: str) -> int:
    """The exit code of pytest running `test` alone with `mutant` active ("" for none)."""
    pid = os.fork()
    if pid == 0:  # the child: run the test and report only its exit code
        os.environ["MUTANT_UNDER_TEST"] = mutant
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        signal.alarm(RUN_TIMEOUT_S)
        import pytest

        os._exit(int(pytest.main([*PYTEST_ARGS, test])))
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def judge(
    test: str,
    claims: list[str],
    stats: dict[str, list[str]],
    killed: set[str],
    *,
    check_clean: bool = True,
) -> Verdict:
    """Run `test` clean (unless mutmut's own clean run just did), then against its candidate
    mutants until one kills it."""
    verdict = Verdict(test=test, claims=claims, status="outside")
    reached = candidates(test, stats, killed)
    if not any(_base_name(t) == test for ts in stats.values() for t in ts):
        path = test.split("::", 1)[0]
        in_run = any(t.startswith(path + "::") for ts in stats.values() for t in ts)
        verdict.note = (
            "in the mutation run but reaches no mutated function (e.g. a source scan)"
            if in_run
            else "not in the mutation run: a broker, subprocess or slow test"
        )
        return verdict
    if not reached:
        verdict.note = "reaches mutated functions, none of whose mutants any test killed"
        verdict.status = "survives"
        return verdict
    clean = run_test(test, "") if check_clean else 0
    if clean != 0:
        verdict.status = "broken"
        verdict.note = f"fails with no mutant active (pytest exit {clean})"
        return verdict
    for mutant in reached[:MAX_TRIES]:
        verdict.tried.append(mutant)
        if run_test(test, mutant) != 0:
            verdict.status = "bites"
            verdict.mutant = mutant
            verdict.tried = []
            return verdict
    verdict.status = "survives"
    return verdict


def _write(out: Path, verdicts: dict[str, dict[str, object]], named: dict[str, list[str]]) -> None:
    document = {
        "generated_by": "python -m mutation.bites (after make mutate)",
        "tests": {t: verdicts[t] for t in sorted(verdicts) if t in named},
    }
    out.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--again", action="store_true", help="redo tests shown to bite")
    parser.add_argument(
        "--after-mutmut",
        action="store_true",
        help="skip each test's clean run: `mutmut run` has just run every test clean",
    )
    parser.add_argument("tests", nargs="*", help="only these `path::name` (default: all named)")
    args = parser.parse_args(argv)
    stats_file = MUTANTS / "mutmut-stats.json"
    if not stats_file.exists():
        print("no mutants/mutmut-stats.json: run `make mutate` first", file=sys.stderr)
        return 2
    stats = json.loads(stats_file.read_text(encoding="utf-8"))["tests_by_mangled_function_name"]
    mutants = read_mutants()
    killed = {m.name for m in mutants if m.outcome in ("killed", "not run", "timeout")}
    by_name = {m.name: m for m in mutants}
    rows_by_test: dict[str, list[str]] = {}
    for claim, test in named_tests():
        rows_by_test.setdefault(test, []).append(claim)
    previous = json.loads(args.out.read_text(encoding="utf-8")) if args.out.exists() else {}
    verdicts: dict[str, dict[str, object]] = previous.get("tests", {})
    sys.path.insert(0, str(MUTANTS))
    os.environ["PY_IGNORE_IMPORTMISMATCH"] = "1"
    make_forks_safe()
    with _in_mutants():
        _preload(rows_by_test)
        for test, rows in rows_by_test.items():
            if args.tests and test not in args.tests:
                continue
            done = verdicts.get(test, {}).get("status") == "bites"
            if done and not args.again and not args.tests:
                continue  # a test already shown to bite keeps its verdict (--again to redo)
            start = time.monotonic()
            verdict = judge(test, rows, stats, killed, check_clean=not args.after_mutmut)
            if verdict.mutant is not None:
                verdict.change = mutant_change(by_name[verdict.mutant])
            print(f"{verdict.status:8} {time.monotonic() - start:5.1f}s {test}", flush=True)
            verdicts[test] = {k: v for k, v in verdict.__dict__.items() if k != "test" and v}
            _write(args.out, verdicts, rows_by_test)  # after each test: a long run can stop
    _write(args.out, verdicts, rows_by_test)
    return 0


if __name__ == "__main__":
    sys.exit(main())
