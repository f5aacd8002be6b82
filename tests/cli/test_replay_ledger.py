"""``stream-dp replay --ledger FILE`` as careful as the ledger topic (issue 25, breaks 5 and
6): two runs on one file print one value per window, a torn last line (a crash mid-append)
is left out instead of making the file unusable, every window is on disk before the next is
released, and no error advises starting another ledger file."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from stream_dp.cli.main import main
from stream_dp.config import load_config
from stream_dp.pipeline.local.replay import read_ledger_file, replay_file
from stream_dp.privacy.pseudonymize import KeyRing, Pseudonymizer
from stream_dp.windows.tumbling import iso_utc
from tests.cli.support import LineReader, cli_argv

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "stream_dp" / "examples" / "browser-logs.yaml"
SAMPLE = ROOT / "stream_dp" / "examples" / "sample-events.jsonl"
KEY_HEX = os.urandom(32).hex()
#: Generous: two interpreters start and replay the sample on a loaded 2-core machine.
DEADLINE_S = 600.0


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAM_DP_PSEUDONYM_KEY", KEY_HEX)


def _parse(out: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    *records, summary = (json.loads(line) for line in out.splitlines())
    assert summary["kind"] == "replay_summary"
    return records, summary


def _values(records: list[dict[str, Any]]) -> dict[tuple[str, str, str], Any]:
    """(query, window, group) → value; fails if a (query, window, group) has two."""
    out: dict[tuple[str, str, str], Any] = {}
    for r in records:
        if r["kind"] == "release":
            ident = (r["query"], r["window_start"], json.dumps(r["group"], sort_keys=True))
            assert ident not in out, f"two values for {ident}"
            out[ident] = r["value"]
    return out


def _replay_json_on(
    events: Path, ledger: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    argv = ["replay", "--config", str(CONFIG), "--input", str(events), "--json"]
    code = main([*argv, "--ledger", str(ledger)])
    out, err = capsys.readouterr()
    return code, out, err


def _replay_json(ledger: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(
        [
            "replay",
            "--config",
            str(CONFIG),
            "--input",
            str(SAMPLE),
            "--json",
            "--ledger",
            str(ledger),
        ]
    )
    out, err = capsys.readouterr()
    return code, out, err


def _long_input(path: Path, *, copies: int) -> Path:
    """The sample, repeated ``copies`` times 2 h apart: a run takes seconds after it has
    read the ledger, far longer than the two runs' start times differ."""
    lines = [orjson.loads(line) for line in SAMPLE.read_bytes().splitlines() if line.strip()]
    with path.open("wb") as out:
        for copy in range(copies):
            for event in lines:
                shifted = {**event, "timestamp": event["timestamp"] + copy * 7_200_000}
                out.write(orjson.dumps(shifted) + b"\n")
    return path


def test_two_runs_on_one_ledger_file_at_once_print_one_value_per_window(tmp_path: Path) -> None:
    """Both runs are started while the file is held (as by a third run in progress), so
    both are certainly running at once; once it is let go, one draws and the other reprints
    its draws: the same single value per window in both outputs. (Before the lock, each run
    read the file once at start and appended its own draw of every window.)"""
    ledger = tmp_path / "ledger.jsonl"
    events = _long_input(tmp_path / "events.jsonl", copies=12)
    holder = ledger.open("a+b")
    fcntl.flock(holder.fileno(), fcntl.LOCK_EX)
    argv = cli_argv(
        "replay", "--config", str(CONFIG), "--input", str(events), "--json", "--ledger", str(ledger)
    )
    env = {**os.environ, "STREAM_DP_PSEUDONYM_KEY": KEY_HEX}
    procs = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for _ in range(2)
    ]
    try:
        assert all(p.stdout is not None and p.stderr is not None for p in procs)
        outs = [LineReader(p.stdout) for p in procs if p.stdout is not None]
        errors = [LineReader(p.stderr) for p in procs if p.stderr is not None]
        waited = []
        for reader in errors:  # each says it waits for the file (or ends: nothing to wait on)
            line = reader.next(DEADLINE_S)
            while line is not None and "waiting for it to finish" not in line:
                line = reader.next(DEADLINE_S)
            waited.append(line is not None)
        holder.close()  # the third "run" ends: the two go one after the other
        outputs = ["".join(reader.rest(DEADLINE_S)) for reader in outs]
        for p, out_reader, err_reader, at_eof in zip(
            procs, outs, errors, [not w for w in waited], strict=True
        ):
            p.wait(timeout=DEADLINE_S)
            if not at_eof:
                err_reader.rest(DEADLINE_S)
            out_reader.close()
            err_reader.close()
    finally:
        holder.close()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0]
    (records_a, summary_a), (records_b, summary_b) = (_parse(out) for out in outputs)
    values_a, values_b = _values(records_a), _values(records_b)
    assert values_a and values_a == values_b  # scale-120 noise agrees by chance < 1e-9
    drawn = sorted([summary_a["releases_drawn"], summary_b["releases_drawn"]])
    assert drawn[0] == 0 and drawn[1] > 0  # one run drew, the other reprinted its draws
    assert waited == [True, True]


def test_a_torn_last_line_is_left_out_and_the_file_stays_usable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = tmp_path / "ledger.jsonl"
    code, out, _ = _replay_json(ledger, capsys)
    assert code == 0
    first, _ = _parse(out)
    complete = ledger.read_bytes()
    # a crash mid-append: half of a record, no newline
    torn = orjson.dumps({"key": "visits|2024-01-01T00:00:00Z|x", "value": {"kind": "release"}})
    ledger.write_bytes(complete + torn[: len(torn) // 2])
    code, out, err = _replay_json(ledger, capsys)
    assert code == 0, err
    second, summary = _parse(out)
    assert summary["releases_drawn"] == 0 and _values(second) == _values(first)
    assert "cut off by a crash mid-write" in err
    assert ledger.read_bytes() == complete  # cut off before anything else is appended


def test_a_bad_line_before_the_last_is_an_error_that_never_advises_a_new_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = tmp_path / "ledger.jsonl"
    assert _replay_json(ledger, capsys)[0] == 0
    lines = ledger.read_bytes().splitlines(keepends=True)
    ledger.write_bytes(b"".join([lines[0], b"{not json\n", *lines[1:]]))
    code, _, message = _replay_json(ledger, capsys)
    assert code != 0
    assert "line 2 is not a ledger record" in message and "backup" in message
    assert "new path" not in message and "draw every window already shared again" in message


def test_every_window_is_on_disk_before_the_next_is_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each fsync finds the file (read through another handle: flushed) holding one more
    window's progress record: a crash loses at most the window being written."""
    ledger = tmp_path / "ledger.jsonl"
    synced: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        real_fsync(fd)
        if ledger.exists():
            synced.append(ledger.read_bytes().count(b'"kind":"progress"'))

    monkeypatch.setattr(os, "fsync", fsync)  # what replay_ledger calls
    config = load_config(CONFIG)
    keyring = KeyRing(Pseudonymizer(bytes.fromhex(KEY_HEX), config.pseudonymization.key_id))
    result = replay_file(config, keyring, SAMPLE, ledger_path=ledger)
    windows = len({r.window_start_s for r in result.releases})
    assert windows >= 2
    progress = sorted(set(synced) - {0})
    assert progress == list(range(1, windows + 1))


def test_a_whole_last_record_without_its_newline_is_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only a line that is not a whole record is torn: a last record whose newline is
    missing (an editor strips it) stays — dropping the last part of a printed release would
    make it incomplete, and its window would be drawn again."""
    ledger = tmp_path / "ledger.jsonl"
    code, out, _ = _replay_json(ledger, capsys)
    assert code == 0
    first, _ = _parse(out)
    complete = ledger.read_bytes()
    last_release_part = max(
        i
        for i, line in enumerate(complete.splitlines())
        if orjson.loads(line)["value"].get("kind") == "ledger"
    )
    # everything up to and including the last part of a release, its newline removed
    cut = b"\n".join(complete.splitlines()[: last_release_part + 1])
    ledger.write_bytes(cut)
    code, out, err = _replay_json(ledger, capsys)
    assert code == 0, err
    second, summary = _parse(out)
    assert summary["releases_drawn"] == 0 and _values(second) == _values(first)
    assert "cut off" not in err


def test_a_run_killed_mid_way_leaves_a_file_the_next_run_continues(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """kill -9 while a run appends: the next run reads the file (a torn tail, if any, is
    left out), reprints every release that was whole on disk, and draws only the rest."""
    ledger = tmp_path / "ledger.jsonl"
    events = _long_input(tmp_path / "events.jsonl", copies=40)
    argv = cli_argv(
        "replay", "--config", str(CONFIG), "--input", str(events), "--json", "--ledger", str(ledger)
    )
    env = {**os.environ, "STREAM_DP_PSEUDONYM_KEY": KEY_HEX}
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while b'"kind":"progress"' not in (ledger.read_bytes() if ledger.exists() else b""):
            assert proc.poll() is None, "the run ended before it was killed"
            assert time.monotonic() < deadline, "no window on disk within the deadline"
            time.sleep(0.01)  # polling a condition, with the hard deadline above
        proc.kill()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=DEADLINE_S)
    on_disk = read_ledger_file(ledger)
    whole = {(r.query, r.window_start_s): r for r in on_disk.releases()}
    assert whole  # at least the first window's releases
    code, out, err = _replay_json_on(events, ledger, capsys)
    assert code == 0, err
    records, summary = _parse(out)
    assert summary["releases_from_ledger"] >= len(whole)
    reprinted = {
        (r["query"], r["window_start"]): r["release_id"] for r in records if r["kind"] == "window"
    }
    for (query, window_start_s), rel in whole.items():
        assert reprinted[(query, iso_utc(window_start_s))] == rel.release_id  # not redrawn
    code, out, _ = _replay_json_on(events, ledger, capsys)
    again, summary = _parse(out)
    assert code == 0 and summary["releases_drawn"] == 0 and _values(again) == _values(records)
