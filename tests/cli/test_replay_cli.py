"""``stream-dp replay`` on bad input: the reasons of bad records in ``--json``, and a file of
which no line is an event fails (exit 1) instead of releasing nothing with exit 0."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from stream_dp.cli.main import main
from tests.helpers import schema_validator

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "stream_dp" / "examples" / "browser-logs.yaml"
SAMPLE = ROOT / "stream_dp" / "examples" / "sample-events.jsonl"


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAM_DP_PSEUDONYM_KEY", os.urandom(32).hex())


def _replay(path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    code = main(["replay", "--config", str(CONFIG), "--input", str(path), *extra])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_prints_each_bad_record_with_its_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = SAMPLE.read_bytes().splitlines(keepends=True)[:200]
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b"".join(good[:100]) + b"not json\n" + b"".join(good[100:]) + b"[1, 2]\n")
    code, out, _ = _replay(path, capsys, "--json")
    assert code == 0
    *records, summary = (json.loads(line) for line in out.splitlines())
    assert summary["kind"] == "replay_summary" and summary["bad_records"] == 2
    dead = [r for r in records if r["kind"] == "dead_letter"]
    validator = schema_validator("dead_letter.schema.json")
    for record in dead:
        validator.validate(record)
    assert [(r["reason"], r["source_offset"]) for r in dead] == [
        ("not_json", 100),
        ("not_object", 201),
    ]
    assert any(r["kind"] == "window" for r in records)  # the good lines were released

    code, out, _ = _replay(path, capsys)
    assert code == 0
    assert "2 bad records, not released: not_json ×1, not_object ×1" in out


def test_a_file_without_one_usable_line_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(bytes(range(256)) * 40)
    code, _, err = _replay(garbage, capsys)
    assert code == 1
    assert f"no line of {garbage} is a usable event" in err
    code, out, err = _replay(garbage, capsys, "--json")
    assert code == 1
    assert "is a usable event" in err
    *dead, summary = (json.loads(line) for line in out.splitlines())
    assert dead and all(record["kind"] == "dead_letter" for record in dead)
    assert summary["kind"] == "replay_summary" and summary["releases_drawn"] == 0


def test_an_empty_file_releases_nothing_and_is_not_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"\n\n")
    code, out, err = _replay(empty, capsys, "--json")
    assert (code, err) == (0, "")
    (summary,) = (json.loads(line) for line in out.splitlines())
    assert summary["kind"] == "replay_summary"
    assert (summary["releases_drawn"], summary["bad_records"]) == (0, 0)


def test_a_ledger_file_keeps_one_draw_per_window_across_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without a ledger, running replay twice drew fresh noise each time: an operator who
    shared both outputs spent twice the budget (and averaging halves the noise). With one,
    the second run reprints the recorded values and draws nothing."""
    ledger = tmp_path / "ledger.jsonl"

    def run() -> tuple[list[dict[str, Any]], dict[str, Any]]:
        code, out, _ = _replay(SAMPLE, capsys, "--json", "--ledger", str(ledger))
        assert code == 0
        *records, summary = (json.loads(line) for line in out.splitlines())
        return records, summary

    first, summary = run()
    assert summary["releases_drawn"] > 0 and summary["releases_from_ledger"] == 0
    second, summary = run()
    assert summary["releases_drawn"] == 0
    assert summary["releases_from_ledger"] == sum(r["kind"] == "window" for r in first)
    assert second == first  # the same values, release ids included
    without, summary = _replay_without_ledger(capsys)
    assert any("fresh, independent draw" in note for note in summary["notes"])
    # A run without the ledger draws anew: other values (scale-120 noise on a dozen keys
    # agrees by chance with probability far below 1e-9).
    assert _values(without) != _values(first)


def _values(records: list[dict[str, Any]]) -> list[tuple[str, str, str, Any]]:
    return sorted(
        (r["query"], r["window_start"], json.dumps(r["group"], sort_keys=True), r["value"])
        for r in records
        if r["kind"] == "release"
    )


def _replay_without_ledger(
    capsys: pytest.CaptureFixture[str],
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    code, out, _ = _replay(SAMPLE, capsys, "--json")
    assert code == 0
    *records, summary = (json.loads(line) for line in out.splitlines())
    return records, summary


def test_the_help_says_every_run_without_a_ledger_spends_its_own_budget(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["replay", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "spends its own privacy budget" in text and "--ledger" in text


def test_sample_shows_several_private_keys_per_window(capsys: pytest.CaptureFixture[str]) -> None:
    """The shipped sample under the shipped config: in every window at least two private
    domains have more users than the selection keeps with certainty, so each release shows
    more than one (not only the most popular domain)."""
    assert main(["plan", "--config", str(CONFIG), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    visits = next(q for q in plan["queries"] if q["name"] == "visits_by_domain")
    certain = visits["selection"]["users_for_certain_keep"]
    users: dict[tuple[int, str], set[str]] = {}
    for line in SAMPLE.read_bytes().splitlines():
        event = json.loads(line)
        window = event["timestamp"] // 3_600_000
        users.setdefault((window, event["domain"]), set()).add(event["user_id"])
    windows = {w for w, _ in users}
    for w in windows:
        assert sum(len(u) >= certain for (x, _), u in users.items() if x == w) >= 2
    code, out, _ = _replay(SAMPLE, capsys, "--json")
    assert code == 0
    released = [
        json.loads(line)["released_keys"]
        for line in out.splitlines()
        if '"kind":"window"' in line.replace(" ", "") and "visits_by_domain" in line
    ]
    assert len(released) == len(windows) == 2 and min(released) >= 2
