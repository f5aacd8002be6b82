"""`python -m mutation.sample`: a fixed random sample of the mutants, for a run that fits.

Every mutant of the privacy-critical modules takes about ten hours of CPU on the tests that
reach it (about 10,800 mutants, one to a few seconds each, far more for a survivor, which
runs every test that reaches it), well over two hours on a shared two-core machine. A
uniform random sample, drawn with a fixed seed from the sorted mutant names, estimates each
module's kill rate without bias, with the 95% interval the report prints; its survivors are
each explained or killed. The sample is written to ``mutation/sample.txt`` (committed, so
the report can be checked against it) and printed, one name a line, for ``mutmut run``.

The sizes: every sampled mutant must run (the report fails otherwise), and on two cores
shared with other work the whole ``make mutate`` — mutmut's stats and clean runs (about
ten minutes each when busy), the sample, the threat model's bites — has to fit in about an
hour. 136 core mutants give the core's score to about ±5% (95%); each other module gets 8.

Mutants are generated first when ``mutants/`` has none (mutmut's own generation step).
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import defaultdict
from fnmatch import fnmatchcase
from pathlib import Path

from mutation.report import CORE_PREFIX, MUTANTS, SAMPLE, read_mutants

#: the seed of the other modules' draw (the sample of the first full run)
SEED = 31
#: the seed of the privacy core's draw: a fresh one each time the core is measured again, so
#: that tests written against an earlier sample's survivors (seed 31's, then 3107's) do not
#: make the first-pass score optimistic; 2711 was drawn after every mutant of the weaker
#: modules had been killed or explained module-wide (not sample by sample)
CORE_SEED = 2711
#: sampled mutants from the privacy core (all of stream_dp/privacy/), by module size
CORE_SAMPLE = 136
#: sampled mutants from each other module
OTHER_SAMPLE = 8
#: the parts of the release stage that select what is released and charge the budget
RELEASE_STAGE_FUNCTIONS = [
    "*release_stage.x_expected_key_id__*",
    "*release_stage.x_draw_release__*",
    "*release_stage.x_note_release__*",
    "*release_stage.x_budget_accountant__*",
    "*ǁReleaseStageǁcompute_release__*",
    "*ǁReleaseStageǁ_refusal__*",
    "*ǁReleaseStageǁ_charge__*",
    "*ǁReleaseStageǁwinners__*",
    "*ǁReleaseStageǁ_taken__*",
    "*ǁReleaseStageǁfinish_window__*",
    "*ǁReleaseStageǁhorizon_spent__*",
]


def generate() -> None:
    """mutmut's generation step alone: the mutated copy and its ``*.meta`` files."""
    import os

    from mutation.run import patch_pytest

    patch_pytest()
    os.environ["MUTANT_UNDER_TEST"] = "mutant_generation"
    from mutmut import __main__ as mm
    from mutmut.configuration import Config

    Config.ensure_loaded()
    MUTANTS.mkdir(exist_ok=True)
    mm.copy_src_dir()
    mm.copy_also_copy_files()
    mm.create_mutants(2)


def draw(names_by_path: dict[str, list[str]], *, core_only: bool = False) -> list[str]:
    """CORE_SAMPLE from the core in proportion to module size (seed CORE_SEED), OTHER_SAMPLE
    from each other module (seed SEED; none with ``core_only``)."""
    rng = random.Random(SEED)  # noqa: S311 (a reproducible sample of test cases, no secret)
    core_rng = random.Random(CORE_SEED)  # noqa: S311 (as above)
    core_total = sum(len(v) for p, v in names_by_path.items() if p.startswith(CORE_PREFIX))
    out: list[str] = []
    for path in sorted(names_by_path):
        names = sorted(names_by_path[path])
        if path.endswith("release_stage.py"):
            names = [n for n in names if any(fnmatchcase(n, p) for p in RELEASE_STAGE_FUNCTIONS)]
        if path.startswith(CORE_PREFIX):
            size = round(CORE_SAMPLE * len(names) / core_total) if core_total else 0
            out += core_rng.sample(names, min(size, len(names)))
        elif not core_only:
            out += rng.sample(names, min(OTHER_SAMPLE, len(names)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=SAMPLE)
    parser.add_argument(
        "--core-only", action="store_true", help="the privacy core's mutants only (a re-estimate)"
    )
    args = parser.parse_args(argv)
    if not any(MUTANTS.rglob("*.py.meta")):
        generate()
    names_by_path: dict[str, list[str]] = defaultdict(list)
    for m in read_mutants():
        names_by_path[m.path].append(m.name)
    sample = draw(names_by_path, core_only=args.core_only)
    args.out.write_text("\n".join(sample) + "\n", encoding="utf-8")
    print("\n".join(sample))
    return 0


if __name__ == "__main__":
    sys.exit(main())
