"""The mutation-testing tools (`make mutate`): the report's reasons, its interval, and the
committed map from the threat model's tests to the mutants they kill."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scipy.stats import binomtest

from mutation.bites import OUT, named_tests
from mutation.report import Mutant, classify, mutant_change, render, wilson_interval

ORIGINAL = """def x_f__mutmut_orig(n):
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    log.info("counted %d", n, extra={"n": n})
    Gauge("stream_dp_n", "How many.", ["query"], registry=r)
    return n + 1
"""


def _mutants_dir(tmp_path: Path, mutants: dict[str, str]) -> Path:
    """A mutated copy in mutmut's layout: the functions one after another, and their spans."""
    lines: list[str] = []
    spans = {}
    for name, source in {"x_f__mutmut_orig": ORIGINAL, **mutants}.items():
        text = source.replace("x_f__mutmut_orig", name).splitlines()
        spans[name] = [len(lines) + 1, len(lines) + len(text)]
        lines += text
    (tmp_path / "m.py").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "m.py.spans").write_text(json.dumps({"spans": spans}), encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize(
    ("old", "new", "explained"),
    [
        ('f"n must be >= 0, got {n}"', "None", True),  # the refusal's message only
        ('"counted %d"', '"XXcounted %dXX"', True),  # a log message's wording
        ("n < 0", "n <= 0", False),  # the condition that refuses
        ("raise ValueError(", "raise TypeError(", False),  # the refusal's class
        ('extra={"n": n}', 'extra={"n": None}', False),  # a log record's fields
        ("return n + 1", "return n - 1", False),
        ('"How many."', '"XXHow many.XX"', True),  # a metric's HELP text
        ('"stream_dp_n"', '"XXstream_dp_nXX"', False),  # a metric's name
        ('["query"]', '["XXqueryXX"]', False),  # its labels
    ],
)
def test_only_message_text_mutants_are_explained_by_their_form(
    tmp_path: Path, old: str, new: str, explained: bool
) -> None:
    assert old in ORIGINAL
    mutants = _mutants_dir(tmp_path, {"x_f__mutmut_1": ORIGINAL.replace(old, new, 1)})
    mutant = Mutant(name="pkg.m.x_f__mutmut_1", path="m.py", outcome="survived")
    assert (classify(mutant, mutants) is not None) is explained
    assert mutant_change(mutant, mutants).startswith("- ")


def test_an_unexplained_survivor_is_reported_as_such(tmp_path: Path) -> None:
    mutants = [
        Mutant(
            name=f"stream_dp.privacy.a.x_f__mutmut_{i}", path="stream_dp/privacy/a.py", outcome=o
        )
        for i, o in enumerate(("killed", "killed", "survived"), start=1)
    ]
    text, unexplained, score = render(mutants, {})
    assert unexplained == [mutants[2]] and score == pytest.approx(2 / 3)
    assert "**UNEXPLAINED**" in text
    text, unexplained, score = render(
        mutants, {"stream_dp.privacy.a.x_f__mutmut_3": "gap: no test"}
    )
    assert unexplained == [] and score == pytest.approx(2 / 3) and "gap: no test" in text
    # a mutant shown equivalent leaves the score's denominator; the raw rate keeps it
    text, unexplained, score = render(
        mutants, {"stream_dp.privacy.a.x_f__mutmut_3": "equivalent: why"}
    )
    assert unexplained == [] and score == 1.0 and "equivalent: why" in text and "66.7%" in text


@pytest.mark.parametrize(("k", "n"), [(0, 20), (90, 100), (431, 498), (500, 500)])
def test_the_kill_rate_interval_is_the_wilson_interval(k: int, n: int) -> None:
    expected = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    low, high = wilson_interval(k, n)
    assert low == pytest.approx(expected.low, abs=1e-4)
    assert high == pytest.approx(expected.high, abs=1e-4)


def test_the_committed_bites_map_names_only_threat_model_tests_and_says_what_bit() -> None:
    verdicts = json.loads(OUT.read_text(encoding="utf-8"))["tests"]
    named = {test for _, test in named_tests()}
    assert verdicts and set(verdicts) <= named
    for test, verdict in verdicts.items():
        assert verdict["status"] in {"bites", "survives", "outside", "broken"}, test
        if verdict["status"] == "bites":
            assert verdict["mutant"].startswith("stream_dp.") and verdict["change"], test


def test_the_report_fails_while_any_sampled_mutant_is_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A score over the mutants that happened to run first is not the sample's score."""
    import mutation.report as report

    names = [f"stream_dp.privacy.a.x_f__mutmut_{i}" for i in range(1, 4)]
    sample = tmp_path / "sample.txt"
    sample.write_text("\n".join(names) + "\n", encoding="utf-8")
    monkeypatch.setattr(report, "SAMPLE", sample)
    monkeypatch.setattr(report, "read_reasons", dict)
    out = ["--out", str(tmp_path / "MUTATION.md")]
    for last, code in (("killed", 0), ("not run", 1)):
        outcomes = ("killed", "killed", last)
        mutants = [
            Mutant(n, "stream_dp/privacy/a.py", o) for n, o in zip(names, outcomes, strict=True)
        ]
        monkeypatch.setattr(report, "read_mutants", lambda mutants=mutants: mutants)
        assert report.main(out) == code, last
    assert "1 mutants of the sample were not run" in capsys.readouterr().err


def test_a_mutants_child_starts_with_stream_dps_caches_empty() -> None:
    """A result the clean run cached (false_refusal_bound calls the helpers it is built of
    only once) would hide every mutant of those helpers in the forked child."""
    from mutation.run import _forget_cached_results
    from stream_dp.privacy.key_strength import false_refusal_bound

    false_refusal_bound("hex", 33)
    assert false_refusal_bound.cache_info().currsize > 0
    _forget_cached_results()
    assert false_refusal_bound.cache_info().currsize == 0


def test_the_report_keeps_the_first_pass_score_of_the_sample_beside_the_reviewed_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tests written against a sample's survivors make its score optimistic: the report must
    still print the score of the sample's first run, and only for that same sample."""
    import mutation.report as report

    names = [f"stream_dp.privacy.a.x_f__mutmut_{i}" for i in range(1, 11)]
    first = [Mutant(n, "stream_dp/privacy/a.py", "killed") for n in names[:7]]
    first += [Mutant(n, "stream_dp/privacy/a.py", "survived") for n in names[7:]]
    record = tmp_path / "first_pass.json"
    equivalent = {names[9]: "equivalent: why"}  # known before the run
    monkeypatch.setattr(report, "classify", lambda m: None)
    report.record_first_pass(first, equivalent, record)

    # after review: one survivor killed by a new test, one shown equivalent
    section = report.first_pass_section(set(names), record)
    assert "**First pass, the estimate: 77.8%**" in section  # 7 of 9 non-equivalent
    low, high = wilson_interval(7, 9)
    assert f"[{low:.1%}, {high:.1%}]" in section
    # the module under 90%, with its survivors not shown equivalent before the run
    assert "`stream_dp/privacy/a.py`: 77.8%; survivors not shown equivalent then: 2" in section
    # a record of another sample says nothing about this one
    assert report.first_pass_section(set(names[:9]), record) == ""
    assert report.first_pass_section(set(names), tmp_path / "none.json") == ""


def test_generating_the_report_again_keeps_the_hand_written_fresh_mutation_sections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sections headed "## Fresh mutations …" are written by hand (docs/MUTATION.md): a new
    `make mutate` regenerates the rest of the file and keeps them, in their order."""
    import mutation.report as report

    out = tmp_path / "MUTATION.md"
    out.write_text(
        "# Mutation testing\n\nold numbers\n\n## Fresh mutations at the joins\n\n| S1 | killed |\n"
        "\n## The threat model's tests\n\nold list\n\n## Fresh mutations of the budget\n\nB1\n",
        encoding="utf-8",
    )
    mutants = [Mutant("stream_dp.privacy.a.x_f__mutmut_1", "stream_dp/privacy/a.py", "killed")]
    monkeypatch.setattr(report, "SAMPLE", tmp_path / "no-sample.txt")
    monkeypatch.setattr(report, "read_reasons", dict)
    monkeypatch.setattr(report, "read_mutants", lambda: mutants)
    assert report.main(["--out", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert "old numbers" not in text and "old list" not in text
    joins = "\n## Fresh mutations at the joins\n\n| S1 | killed |\n"
    budget = "\n## Fresh mutations of the budget\n\nB1\n"
    assert text.endswith(joins + budget)
    assert text.count("## Fresh mutations") == 2
