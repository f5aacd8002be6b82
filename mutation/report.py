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
import ast
import difflib
import fnmatch
import json
import math
import sys
import textwrap
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MUTANTS = ROOT / "mutants"
EQUIVALENT = ROOT / "mutation" / "equivalent.toml"
REPORT = ROOT / "docs" / "MUTATION.md"
SAMPLE = ROOT / "mutation" / "sample.txt"
#: each sampled mutant's outcome in the first run of a fresh sample, before any test was
#: written against its survivors: the unbiased estimate (``--record-first-pass``)
FIRST_PASS = ROOT / "mutation" / "first_pass.json"
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


def _function_sources(mutant: Mutant, mutants_dir: Path) -> tuple[str, str] | None:
    """The source of the original function and of the mutant, from mutmut's mutated copy."""
    spans_file = mutants_dir / (mutant.path + ".spans")
    source_file = mutants_dir / mutant.path
    if not spans_file.exists() or not source_file.exists():
        return None
    spans = json.loads(spans_file.read_text(encoding="utf-8"))["spans"]
    local = mutant.name.rsplit(".", 1)[1]
    original = local.rsplit("__mutmut_", 1)[0] + "__mutmut_orig"
    if local not in spans or original not in spans:
        return None
    lines = source_file.read_text(encoding="utf-8").splitlines()

    def text(key: str) -> str:
        start, end = spans[key]
        return "\n".join(lines[start - 1 : end])

    return text(original), text(local)


def _first_difference(a: object, b: object, path: list[ast.AST]) -> list[ast.AST] | None:
    """The chain of nodes from the root to the first place two syntax trees differ."""
    if type(a) is not type(b):
        return path + ([a] if isinstance(a, ast.AST) else [])
    if isinstance(a, ast.AST):
        for name in a._fields:
            found = _first_difference(getattr(a, name), getattr(b, name), [*path, a])
            if found is not None:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return path
        for x, y in zip(a, b, strict=True):
            found = _first_difference(x, y, path)
            if found is not None:
                return found
        return None
    return path if a != b else None


METRIC_TYPES = {"Counter", "Gauge", "Histogram", "Summary", "Info", "Enum"}
LOG_METHODS = {"debug", "info", "warning", "error", "exception", "critical"}


def classify(mutant: Mutant, mutants_dir: Path = MUTANTS) -> str | None:
    """A reason that holds for the mutant by its form alone, or None.

    Four forms change no released number, no budget and no value a log, a metric or a dead
    letter carries: a change of a metric's HELP text (its second argument); a change
    inside the message of a ``raise`` (the exception's class and the
    condition that raises it are untouched: the input is still refused), a change of a log
    call's message text (its ``extra=`` fields, which the log filter checks, excluded), and a
    change of a dead letter's detail text (``BadRecord(reason, detail)``, reason excluded).
    """
    sources = _function_sources(mutant, mutants_dir)
    if sources is None:
        return None
    try:
        original, changed = (ast.parse(textwrap.dedent(s)).body[0] for s in sources)
    except SyntaxError:
        return None
    if not isinstance(original, ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    assert isinstance(changed, ast.FunctionDef | ast.AsyncFunctionDef)
    path = _first_difference(original.args, changed.args, [original])
    if path is None:
        path = _first_difference(original.body, changed.body, [original])
    if path is None:
        return None
    for i, node in enumerate(path[:-1]):
        below = path[i + 1]
        if (
            isinstance(node, ast.Raise)
            and isinstance(node.exc, ast.Call)
            and below is node.exc
            and len(path) > i + 2
            and path[i + 2] is not node.exc.func
        ):
            return (
                "message text of a refusal: the exception's class and the condition "
                "raising it are unchanged, so the input is refused as before"
            )
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in LOG_METHODS
            and node.args
            and below is node.args[0]
        ):
            return "wording of a log message (not its extra= fields): carries no value"
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in METRIC_TYPES
            and len(node.args) >= 2
            and below is node.args[1]
        ):
            return "HELP text of a metric (its documentation line on /metrics): no value, no label"
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "BadRecord"
            and len(node.args) == 2
            and below is node.args[1]
        ):
            return (
                "detail text of a dead letter (its reason code unchanged): a mutant can drop "
                "or reword the text, never put a record's value in it"
            )
    return None


def mutant_change(mutant: Mutant, mutants_dir: Path = MUTANTS) -> str:
    """The lines a mutant changes, as ``- old`` / ``+ new`` (from mutmut's mutated copy)."""
    sources = _function_sources(mutant, mutants_dir)
    if sources is None:
        return "(function not found in the mutated copy)"

    def body(source: str) -> list[str]:
        text = [line.strip() for line in source.splitlines()]
        return [line for line in text if not line.startswith(("def x", "async def x"))]

    diff = [
        line
        for line in difflib.unified_diff(body(sources[0]), body(sources[1]), lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    return " / ".join(f"{line[0]} {line[1:].strip()}" for line in diff) or "(no textual change)"


SURVIVING = ("survived", "no tests", "suspicious")


def kill_rate(counts: Counter[str], *, raw: bool = False) -> float:
    """Killed (or timed out) over the mutants run, less those shown equivalent (the
    mutation score); ``raw``: over all mutants run.

    ``counts`` holds outcomes and, under ``"equivalent"``, how many of the surviving ones
    a reason shows to be equivalent (not counting known gaps).
    """
    considered = sum(n for o, n in counts.items() if o not in ("not run", "equivalent"))
    if not raw:
        considered -= counts["equivalent"]
    detected = counts["killed"] + counts["timeout"]
    return detected / considered if considered else 0.0


def wilson_interval(detected: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion (the kill rate of a random sample)."""
    if n == 0:
        return 0.0, 1.0
    p = detected / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def render(
    mutants: list[Mutant], reasons: dict[str, str], *, sampled: bool = False
) -> tuple[str, list[Mutant], float]:
    """The report's Markdown, the survivors no reason explains, and the core's score."""
    reason_of = {
        m.name: reason_for(m.name, reasons) or classify(m)
        for m in mutants
        if m.outcome in SURVIVING
    }
    by_path: dict[str, Counter[str]] = {}
    for m in mutants:
        counts = by_path.setdefault(m.path, Counter())
        counts[m.outcome] += 1
        reason = reason_of.get(m.name)
        if reason is not None and not reason.startswith("gap"):
            counts["equivalent"] += 1
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
        f"**Privacy core (`{CORE_PREFIX}`) mutation score: {kill_rate(core):.1%}** "
        f"(required: at least {CORE_MIN_KILL_RATE:.0%}); all modules: {kill_rate(total):.1%}. "
        "The score is killed ÷ (run − shown equivalent), the usual definition; the raw kill "
        f"rate (killed ÷ run) is {kill_rate(core, raw=True):.1%} for the core and "
        f"{kill_rate(total, raw=True):.1%} for all modules.",
        "",
    ]
    if sampled:
        n = sum(c for o, c in core.items() if o not in ("not run", "equivalent"))
        n -= core["equivalent"]
        low, high = wilson_interval(core["killed"] + core["timeout"], n)
        lines += [
            f"These are the mutants of the fixed random sample `mutation/sample.txt` "
            f"({sum(v for o, v in total.items() if o != 'equivalent')} mutants; "
            "`python -m mutation.sample`). The privacy core's score on it has the 95% "
            f"interval [{low:.1%}, {high:.1%}] ({n} non-equivalent core mutants run); that "
            "is an interval for the score over all the core's mutants only while no test "
            "was written against this sample's survivors (when one was, the first pass "
            "below is the estimate).",
            "",
        ]
        if total["not run"]:
            lines += [
                f"**{total['not run']} mutants of the sample were not run** (column *not run*): "
                "the run was stopped first. mutmut runs the mutants whose tests take least "
                "time first, so those left are in functions that many tests reach (the "
                "planner, calibration, noise); the interval above holds for the mutants run, "
                "not for the whole sample.",
                "",
            ]
    lines += [
        "| module | mutants | killed | timeout | survived | no tests | of these equivalent "
        "| not run | score |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for path in sorted(by_path):
        c = by_path[path]
        n = sum(v for o, v in c.items() if o != "equivalent")
        if n == 0:
            continue
        lines.append(
            f"| `{path}` | {n} | {c['killed']} | {c['timeout']} | {c['survived']} "
            f"| {c['no tests']} | {c['equivalent']} | {c['not run']} | {kill_rate(c):.1%} |"
        )
    lines += ["", "## Mutants not killed, and why they may stand", ""]
    unexplained: list[Mutant] = []
    gaps: list[Mutant] = []
    current = ""
    for m in sorted(mutants, key=lambda m: (m.path, m.name)):
        if m.outcome not in SURVIVING:
            continue
        reason = reason_of[m.name]
        if reason is None:
            unexplained.append(m)
        elif reason.startswith("gap"):
            gaps.append(m)
        if m.path != current:
            current = m.path
            lines += ["", f"### `{m.path}`", ""]
        change = mutant_change(m).replace("|", "\\|")
        lines.append(
            f"- `{m.name.rsplit('.', 1)[1]}` ({m.outcome}): `{change}` — "
            f"{reason or '**UNEXPLAINED**'}"
        )
    lines += [
        "",
        f"{len(unexplained)} survivors unexplained; {len(gaps)} known gaps (reasons starting "
        "`gap`: not equivalent, not a privacy guard, a test still to write).",
    ]
    return "\n".join(lines) + "\n", unexplained, kill_rate(core)


def record_first_pass(
    mutants: list[Mutant], reasons: dict[str, str], path: Path = FIRST_PASS
) -> None:
    """Keep each sampled mutant's first-run outcome, and the reason (if any) that explained a
    survivor then: reasons written before the sample was run are no fitting to it."""
    first = {
        m.name: {
            "path": m.path,
            "outcome": m.outcome,
            "reason": (reason_for(m.name, reasons) or classify(m))
            if m.outcome in SURVIVING
            else None,
        }
        for m in sorted(mutants, key=lambda m: m.name)
    }
    path.write_text(json.dumps({"mutants": first}, indent=1, ensure_ascii=False) + "\n", "utf-8")


def first_pass_section(sample: set[str], path: Path = FIRST_PASS) -> str:
    """The privacy core's score in the first run of this sample, with its 95% interval and the
    modules under the required score; empty when the record is of another sample."""
    if not path.exists():
        return ""
    first = json.loads(path.read_text(encoding="utf-8"))["mutants"]
    if set(first) != sample:
        return ""
    by_path: dict[str, Counter[str]] = {}
    for m in first.values():
        if not m["path"].startswith(CORE_PREFIX):
            continue
        counts = by_path.setdefault(m["path"], Counter())
        counts[m["outcome"]] += 1
        if m["reason"] is not None and not m["reason"].startswith("gap"):
            counts["equivalent"] += 1
    core: Counter[str] = Counter()
    for counts in by_path.values():
        core.update(counts)
    if not core:
        return ""
    detected = core["killed"] + core["timeout"]
    n = sum(c for o, c in core.items() if o not in ("not run", "equivalent")) - core["equivalent"]
    low, high = wilson_interval(detected, n)
    run = sum(c for o, c in core.items() if o not in ("not run", "equivalent"))
    raw_low, raw_high = wilson_interval(detected, run)
    lines = [
        f"**First pass, the estimate: {kill_rate(core):.1%}** for the privacy core, 95% "
        f"interval [{low:.1%}, {high:.1%}] ({detected} of {n} non-equivalent core mutants "
        f"killed; raw kill rate {kill_rate(core, raw=True):.1%}, [{raw_low:.1%}, "
        f"{raw_high:.1%}], over {run} run). This is this sample's first run "
        "(`mutation/first_pass.json`), before any test was written against its survivors and "
        "with only the reasons written before it: the unbiased estimate of the core's score "
        "over all its mutants. The score above is after review (survivors killed by new "
        "tests or explained), and is optimistic for the same reason a fitted model's "
        "training score is.",
        "",
    ]
    low_modules = [
        (path, kill_rate(c), c["survived"] + c["no tests"] + c["suspicious"] - c["equivalent"])
        for path, c in sorted(by_path.items())
        if kill_rate(c) < CORE_MIN_KILL_RATE
    ]
    if low_modules and kill_rate(core) < CORE_MIN_KILL_RATE:
        lines += ["The modules under 90% in the first pass, which pull the estimate down:", ""]
        lines += [
            f"- `{p}`: {rate:.1%}; survivors not shown equivalent then: {left}"
            for p, rate, left in low_modules
        ]
        lines.append("")
    return "\n".join(lines)


BITES = ROOT / "mutation" / "threat_model_bites.json"
#: Hand-written sections (``*.md``, each a whole ``## `` section), appended to the report in
#: name order: what no tool here generates (e.g. mutations written and run by hand).
SECTIONS = ROOT / "mutation" / "sections"
#: Everything after this line of docs/MUTATION.md is made from files in the repository (the
#: declarations, the recorded results, the hand-written sections), not from mutmut's run:
#: ``--refresh`` rewrites it alone, and tests/test_mutation_tools.py checks it is current.
FROM_FILES = (
    "<!-- from here on made from mutation/*.toml, mutation/*.json and mutation/sections/*.md: "
    "`python -m mutation.report --refresh` -->"
)


def bites_section(path: Path = BITES) -> str:
    """Per threat-model claim, how many of its named tests killed a mutant alone."""
    if not path.exists():
        return ""
    verdicts = json.loads(path.read_text(encoding="utf-8"))["tests"]
    claims: dict[str, list[str]] = {}
    for verdict in verdicts.values():
        for claim in verdict.get("claims", []):
            claims.setdefault(claim, []).append(verdict["status"])
    biting = sum(1 for v in verdicts.values() if v["status"] == "bites")
    from mutation.guards import threat_model_rows

    named = len({t for tests in threat_model_rows().values() for t in tests})
    lines = [
        "",
        "## The threat model's tests",
        "",
        f"`python -m mutation.bites` ran each of the {len(verdicts)} tests docs/THREAT_MODEL.md "
        f"named at its last run ({named} now) alone against mutants of what it reaches: "
        f"{biting} killed one (test, mutant and "
        "change in `mutation/threat_model_bites.json`); the others run on a broker, in a "
        "subprocess or are slow (outside the mutation run), or reach no mutated code (a "
        "source scan). Claims none of whose tests is in the run:",
        "",
    ]
    alone = sorted(c for c, statuses in claims.items() if "bites" not in statuses)
    lines += [f"- {c}" for c in alone] or ["- none"]
    return "\n".join(lines) + "\n"


def guards_section() -> str:
    """How many threat-model rows the guard removals prove: counted from
    mutation/guards.toml and mutation/guard_bites.json by the rule tests/test_threat_model.py
    applies (:func:`mutation.guards.unproven`), and the rows not proven."""
    from mutation.guards import OUT, load, threat_model_rows, unproven

    rows = {row: tests for row, tests in threat_model_rows().items() if tests}
    guards = load()
    record = json.loads(OUT.read_text(encoding="utf-8")) if OUT.exists() else {}
    left = sorted(unproven(rows, guards, record.get("results", {})))
    lines = [
        "",
        "## The guard removals",
        "",
        "The guard removals (`make guards`, docs/THREAT_MODEL.md) are what prove the rows: "
        f"`mutation/guards.toml` declares {len(guards)} edits that each remove a row's guard "
        f"in the code, and `mutation/guard_bites.json` records, for {len(rows) - len(left)} "
        f"of the {len(rows)} rows that name tests, every test each of the row's edits "
        "declares red with it and green without it, and every test the row names among "
        "them. Rows not proven so:",
        "",
    ]
    lines += [f"- {row}" for row in left] or ["- none"]
    return "\n".join(lines) + "\n"


def hand_written_sections(directory: Path | None = None) -> str:
    """The hand-written sections (``directory``, by default :data:`SECTIONS`), in name
    order, each as written."""
    directory = SECTIONS if directory is None else directory
    files = sorted(directory.glob("*.md")) if directory.is_dir() else []
    return "".join("\n" + f.read_text(encoding="utf-8").rstrip("\n") + "\n" for f in files)


def from_files() -> str:
    """The part of the report made from files in the repository (:data:`FROM_FILES`)."""
    return "\n" + FROM_FILES + "\n" + bites_section() + guards_section() + hand_written_sections()


def refresh(path: Path = REPORT) -> None:
    """Rewrite the part of ``path`` made from files, keeping mutmut's part as it is."""
    text = path.read_text(encoding="utf-8")
    head = text.split("\n" + FROM_FILES + "\n", 1)[0]
    if FROM_FILES not in text:  # a report written before the marker existed
        head = head.split("\n## The threat model's tests\n", 1)[0]
    path.write_text(head.rstrip("\n") + "\n" + from_files(), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPORT)
    parser.add_argument(
        "--all", action="store_true", help="every mutant with a result, not only the sample"
    )
    parser.add_argument(
        "--record-first-pass",
        action="store_true",
        help="keep this run's outcomes as the fresh sample's first pass (mutation/first_pass.json)",
    )
    parser.add_argument(
        "--refresh",
        action="store_true",
        help="rewrite only the part made from files (the declarations, recorded results and "
        "hand-written sections), keeping mutmut's part: no mutmut results needed",
    )
    args = parser.parse_args(argv)
    if args.refresh:
        refresh(args.out)
        print(f"wrote {args.out}: the part made from files")
        return 0
    mutants = read_mutants()
    if not mutants:
        print("no mutmut results under mutants/: run `make mutate` first", file=sys.stderr)
        return 2
    sampled = not args.all and SAMPLE.exists()
    if sampled:
        chosen = set(SAMPLE.read_text(encoding="utf-8").split())
        mutants = [m for m in mutants if m.name in chosen]
        if args.record_first_pass:
            record_first_pass(mutants, read_reasons())
    text, unexplained, core_score = render(mutants, read_reasons(), sampled=sampled)
    if sampled:
        first = first_pass_section(chosen)
        head, sep, rest = text.partition("\n| module |")
        text = head + "\n" + first + sep + rest if first else text
    text += from_files()
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}: privacy core mutation score {core_score:.1%}")
    if unexplained:
        print(f"{len(unexplained)} survivors without a reason: see {args.out}", file=sys.stderr)
    not_run = sum(m.outcome == "not run" for m in mutants)
    if not_run:
        # a score over the mutants that happened to run first is no estimate of the sample's
        print(f"{not_run} mutants of the sample were not run: run them all", file=sys.stderr)
    if unexplained or not_run or core_score < CORE_MIN_KILL_RATE:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
