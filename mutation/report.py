"""`python -m mutation.report`: docs/MUTATION.md from the results of the last `make mutate`.

Reads mutmut's per-file results under ``mutants/`` (``*.meta``: the exit code of each
mutant's test run; ``*.spans``: where each mutant's function sits in the mutated copy),
counts each module's mutants by outcome, and lists every mutant that was not killed with
its one-line change and the reason it may stand, taken from ``mutation/equivalent.toml``.
A survivor without a reason is listed as UNEXPLAINED and makes the command exit 1, so a
privacy change that leaves an unguarded mutant behind is seen.
"""

from __future__ import annotations

import argparse
import difflib
import fnmatch
import json
import sys
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MUTANTS = ROOT / "mutants"
EQUIVALENT = ROOT / "mutation" / "equivalent.toml"
REPORT = ROOT / "docs" / "MUTATION.md"
#: The privacy core, whose kill rate must stay at or above this.
CORE_PREFIX = "stream_dp/privacy/"
CORE_MIN_KILL_RATE = 0.90

#: mutmut's exit codes of a mutant's test run, by outcome (mutmut.__main__.status_by_exit_code).
KILLED = {1, 3}
TIMEOUT = {24, -24, 36, 152, 255}
SURVIVED = {0}
NO_TESTS = {5, 33}


@dataclass(frozen=True)
class Mutant:
    """One mutant: its mutmut name, the source file it mutates and its outcome."""

    name: str
    path: str
    outcome: str


def outcome_of(exit_code: int | None) -> str:
    """The outcome of one mutant's test run from mutmut's exit code."""
    if exit_code is None:
        return "not run"
    if exit_code in KILLED:
        return "killed"
    if exit_code in TIMEOUT:
        return "timeout"
    if exit_code in SURVIVED:
        return "survived"
    if exit_code in NO_TESTS:
        return "no tests"
    return "suspicious"


def read_mutants(mutants_dir: Path = MUTANTS) -> list[Mutant]:
    """Every mutant of the last run, with its outcome."""
    out = []
    for meta in sorted(mutants_dir.rglob("*.py.meta")):
        path = meta.relative_to(mutants_dir).as_posix().removesuffix(".meta")
        exit_codes = json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"]
        for name, code in exit_codes.items():
            out.append(Mutant(name=name, path=path, outcome=outcome_of(code)))
    return out


def read_reasons(path: Path = EQUIVALENT) -> dict[str, str]:
    """Pattern (a mutant name, ``*`` allowed) → why mutants matching it may survive."""
    if not path.exists():
        return {}
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    return {str(pattern): str(reason) for pattern, reason in data.get("equivalent", {}).items()}


def reason_for(name: str, reasons: dict[str, str]) -> str | None:
    """The reason a surviving mutant may stand: an exact entry first, then the first pattern."""
    if name in reasons:
        return reasons[name]
    for pattern, reason in reasons.items():
        if fnmatch.fnmatchcase(name, pattern):
            return reason
    return None


def mutant_change(mutant: Mutant, mutants_dir: Path = MUTANTS) -> str:
    """The lines a mutant changes, as ``- old`` / ``+ new`` (from mutmut's mutated copy)."""
    spans_file = mutants_dir / (mutant.path + ".spans")
    source_file = mutants_dir / mutant.path
    if not spans_file.exists() or not source_file.exists():
        return "(mutated copy not found)"
    spans = json.loads(spans_file.read_text(encoding="utf-8"))["spans"]
    local = mutant.name.rsplit(".", 1)[1]
    original = local.rsplit("__mutmut_", 1)[0] + "__mutmut_orig"
    if local not in spans or original not in spans:
        return "(function not found in the mutated copy)"
    lines = source_file.read_text(encoding="utf-8").splitlines()

    def body(key: str) -> list[str]:
        start, end = spans[key]
        return [line.strip() for line in lines[start - 1 : end]][1:]  # without the def line

    diff = [
        line
        for line in difflib.unified_diff(body(original), body(local), lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    return " / ".join(f"{line[0]} {line[1:].strip()}" for line in diff) or "(no textual change)"


def kill_rate(counts: Counter[str]) -> float:
    """Killed (or timed out) over all mutants that were run or had no test."""
    considered = sum(n for outcome, n in counts.items() if outcome != "not run")
    detected = counts["killed"] + counts["timeout"]
    return detected / considered if considered else 0.0


def render(mutants: list[Mutant], reasons: dict[str, str]) -> tuple[str, list[Mutant]]:
    """The report's Markdown and the survivors no reason explains."""
    by_path: dict[str, Counter[str]] = {}
    for m in mutants:
        by_path.setdefault(m.path, Counter())[m.outcome] += 1
    core: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for path, counts in by_path.items():
        total.update(counts)
        if path.startswith(CORE_PREFIX):
            core.update(counts)

    lines = [
        "# Mutation testing",
        "",
        "Generated by `python -m mutation.report` from the last `make mutate` (mutmut). Each",
        "mutant is one small change to a privacy-critical module (an operator, a constant, a",
        "condition, a dropped argument); it is *killed* when a test fails with it. A mutant that",
        "survives is either killed by a better test or listed below with why it is equivalent",
        "(no test could tell it apart) or harmless; reasons live in `mutation/equivalent.toml`.",
        "",
        f"**Privacy core (`{CORE_PREFIX}`) kill rate: {kill_rate(core):.1%}** "
        f"(required: at least {CORE_MIN_KILL_RATE:.0%}); all modules: {kill_rate(total):.1%}.",
        "",
        "| module | mutants | killed | timeout | survived | no tests | not run | kill rate |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for path in sorted(by_path):
        c = by_path[path]
        n = sum(c.values())
        if n == 0:
            continue
        lines.append(
            f"| `{path}` | {n} | {c['killed']} | {c['timeout']} | {c['survived']} "
            f"| {c['no tests']} | {c['not run']} | {kill_rate(c):.1%} |"
        )
    lines += ["", "## Mutants not killed, and why they may stand", ""]
    unexplained = []
    current = ""
    for m in sorted(mutants, key=lambda m: (m.path, m.name)):
        if m.outcome not in ("survived", "no tests", "suspicious"):
            continue
        reason = reason_for(m.name, reasons)
        if reason is None:
            unexplained.append(m)
        if m.path != current:
            current = m.path
            lines += ["", f"### `{m.path}`", ""]
        change = mutant_change(m).replace("|", "\\|")
        lines.append(
            f"- `{m.name.rsplit('.', 1)[1]}` ({m.outcome}): `{change}` — "
            f"{reason or '**UNEXPLAINED**'}"
        )
    return "\n".join(lines) + "\n", unexplained


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPORT)
    args = parser.parse_args(argv)
    mutants = read_mutants()
    if not mutants:
        print("no mutmut results under mutants/: run `make mutate` first", file=sys.stderr)
        return 2
    text, unexplained = render(mutants, read_reasons())
    args.out.write_text(text, encoding="utf-8")
    core = Counter(m.outcome for m in mutants if m.path.startswith(CORE_PREFIX))
    print(f"wrote {args.out}: privacy core kill rate {kill_rate(core):.1%}")
    for m in unexplained:
        print(f"unexplained survivor: {m.name} ({m.outcome})", file=sys.stderr)
    if unexplained or kill_rate(core) < CORE_MIN_KILL_RATE:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
