"""The release protocol, written once (stream_dp/pipeline/release_driver.py): its order of
effects on a transport, the ledger's winner published when another draw came first, the
in-memory stepping that refuses a transport that waits, and the fault hooks' off switch."""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import ParamSpec, TypeVar

import pytest

from stream_dp.config.model import UNSAFE_TEST_MODE_ENV
from stream_dp.errors import ConfigError
from stream_dp.ops.metrics import Metrics
from stream_dp.ops.progress import reporting_progress
from stream_dp.pipeline import faults as faults_module
from stream_dp.pipeline.faults import CRASH_POINT_ENV, LONG_DRAW_ENV, STALL_INPUT_ENV, Faults
from stream_dp.pipeline.formats.ledger import PROGRESS_PREFIX, LedgerRelease
from stream_dp.pipeline.local.local import LocalPipeline
from stream_dp.pipeline.release_driver import Placed, ReleaseTransport, SuspendedError, run_now
from tests.pipeline.support import KEYRING, NOW, T0, config, rec

P = ParamSpec("P")
T = TypeVar("T")


class Recording:
    """A transport that notes each effect (by kind) and hands it on."""

    def __init__(self, inner: ReleaseTransport) -> None:
        self.inner = inner
        self.effects: list[str] = []
        #: called before the first ledger write (another owner's draw lands first)
        self.before_first_write: Callable[[], None] | None = None

    def owns(self, partials_partition: int) -> bool:
        return self.inner.owns(partials_partition)

    async def write_ledger(self, records: Sequence[Placed]) -> None:
        if self.before_first_write is not None:
            self.before_first_write()
            self.before_first_write = None
        for key, value, _ in records:
            kind = (
                "tombstones"
                if value is None
                else "progress"
                if key.startswith(PROGRESS_PREFIX)
                else "published"
                if key.endswith("|published")
                else "draw"
                if "|part-" in key
                else key
            )
            if not self.effects or self.effects[-1] != f"ledger:{kind}":
                self.effects.append(f"ledger:{kind}")
        await self.inner.write_ledger(records)

    async def read_ledger(self, partitions: Sequence[int]) -> None:
        self.effects.append("read ledger")
        await self.inner.read_ledger(partitions)

    async def write_continual(self, records: Sequence[Placed]) -> None:
        self.effects.append("continual")
        await self.inner.write_continual(records)

    async def read_continual(self, partitions: Sequence[int]) -> None:
        await self.inner.read_continual(partitions)

    async def publish_output(self, release: LedgerRelease) -> None:
        self.effects.append(f"output:{release.query}:{release.release_id}")
        await self.inner.publish_output(release)

    async def draw(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        self.effects.append("draw")
        return await self.inner.draw(fn, *args, **kwargs)

    def window_released(self, window_start_s: int) -> None:
        self.effects.append("released")
        self.inner.window_released(window_start_s)


def _due_pipeline(
    sink: Callable[[str, bytes | None], None] | None = None, seed: int = 0
) -> LocalPipeline:
    """One partition, one closed window with events of three users (two queries)."""
    p = LocalPipeline(
        config(),
        KEYRING,
        metrics=Metrics(),
        sampling_rng=random.Random(seed),
        ledger_sink=sink,
    )
    p.ingest(0, [rec(0, "u", 1), rec(1, "v", 2, "b"), rec(2, "w", 12)], now_s=NOW, now_mono_s=1)
    return p


def _recording(p: LocalPipeline) -> Recording:
    recording = Recording(p._driver.transport)
    p._driver.transport = recording
    return recording


def test_a_window_is_drawn_ledgered_read_back_published_then_progressed() -> None:
    p = _due_pipeline()
    recording = _recording(p)
    releases = p.step(2, now_s=NOW)
    assert {(r.query, r.window_start_s) for r in releases} == {("visits", T0), ("all", T0)}
    outputs = [f"output:{r.query}:{r.release_id}" for r in releases]
    assert recording.effects == [
        "draw",
        "ledger:draw",
        "read ledger",
        outputs[0],
        "ledger:published",
        outputs[1],
        "ledger:published",
        "ledger:progress",
        "ledger:tombstones",  # behind the durable progress record: the window's history
        "released",
    ]
    assert all(r.published for r in releases)


def test_the_ledger_winner_is_published_when_another_draw_came_first() -> None:
    theirs: list[tuple[str, bytes | None]] = []
    other = _due_pipeline(sink=lambda k, v: theirs.append((k, v)), seed=1)
    their_releases = other.step(2, now_s=NOW)
    their_draws = [(k, v) for k, v in theirs if "|part-" in k and v is not None]
    assert len(their_draws) == 2

    p = _due_pipeline()
    recording = _recording(p)
    recording.before_first_write = lambda: p.release.ledger.load(their_draws)
    releases = p.step(2, now_s=NOW)
    published = {e for e in recording.effects if e.startswith("output:")}
    assert published == {f"output:{r.query}:{r.release_id}" for r in their_releases}
    assert {r.release_id for r in releases} == {r.release_id for r in their_releases}
    assert p.metrics.ledger_draws_discarded._value.get() == 2


def test_run_now_refuses_a_coroutine_that_waits() -> None:
    async def waits() -> int:
        await asyncio.sleep(0)
        return 1

    async def returns() -> int:
        return 2

    assert run_now(returns()) == 2
    with pytest.raises(SuspendedError, match="in-memory transport"):
        run_now(waits())


def test_fault_switches_are_off_unless_the_unsafe_test_mode_is_allowed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kills: list[str] = []
    monkeypatch.setattr(faults_module, "_kill", lambda: kills.append("killed"))
    switches = {CRASH_POINT_ENV: "before_draw:2", STALL_INPUT_ENV: "1:25"}
    off = Faults.from_environment(switches)
    off.reached("before_draw")
    off.reached("before_draw")
    assert kills == [] and off.stall_input is None
    on = Faults.from_environment({**switches, UNSAFE_TEST_MODE_ENV: "1"})
    on.reached("after_ingest")
    on.reached("before_draw")
    assert kills == []
    on.reached("before_draw")
    assert kills == ["killed"] and on.stall_input == (1, 25.0)
    with pytest.raises(ConfigError, match="<partition>:<seconds>"):
        Faults.from_environment({STALL_INPUT_ENV: "one", UNSAFE_TEST_MODE_ENV: "1"})


def test_the_long_draw_fault_is_off_unless_allowed_and_spelt_right(tmp_path: Path) -> None:
    end = tmp_path / "end"
    spec = {LONG_DRAW_ENV: f"progress:{end}"}
    assert Faults.from_environment(spec).long_draw is None
    assert Faults.from_environment({**spec, UNSAFE_TEST_MODE_ENV: "1"}).long_draw == (
        "progress",
        end,
    )
    with pytest.raises(ConfigError, match=re.escape("<progress|hang>:<file>")):
        Faults.from_environment({LONG_DRAW_ENV: "slow:/tmp/x", UNSAFE_TEST_MODE_ENV: "1"})


@pytest.mark.parametrize(("mode", "beats"), [("progress", True), ("hang", False)])
async def test_a_long_draw_reports_progress_only_in_progress_mode(
    mode: str, beats: bool, tmp_path: Path
) -> None:
    """The first draw lasts until its file exists (created by the test once the draw has
    begun: a condition, not a timing), and only then does the release go on; a second
    draw is not held."""
    end = tmp_path / "end"
    faults = Faults(long_draw=(mode, end))
    steps: list[str] = []
    with reporting_progress(steps.append):
        drawing = asyncio.create_task(asyncio.to_thread(faults.in_draw))
        while faults.long_draw is not None:  # taken by the draw's thread
            await asyncio.sleep(0.01)
        assert not drawing.done()
        if beats:  # the draw's first beat comes after one check interval: wait for it, so
            # that the end cannot come before the draw has looked (a hang guard, not a margin)
            deadline = time.monotonic() + 60
            while "draw (test fault)" not in steps and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        end.touch()
        await asyncio.wait_for(drawing, timeout=60)
    assert ("draw (test fault)" in steps) == beats, steps
    faults.in_draw()  # once only: returns at once
