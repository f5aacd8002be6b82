"""Test-only fault injection: one hook object that does nothing unless a test switches it on.

The worker and the release driver call :meth:`Faults.reached` at the protocol's fault points and
ask it for the other faults (a slow ledger, failing ledger reads when partitions arrive, a
stalled input partition, a draw that lasts until a test ends it). :data:`NO_FAULTS` and a plain
``Faults()`` do nothing; :meth:`Faults.from_environment` reads the ``STREAM_DP_TEST_*`` switches
— here and nowhere else — and honours them only when the unsafe test mode is allowed by the
environment (``STREAM_DP_ALLOW_UNSAFE_TEST_MODE=1``), so a production deployment cannot turn
them on.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from stream_dp.config.model import UNSAFE_TEST_MODE_ENV
from stream_dp.errors import ConfigError
from stream_dp.ops.progress import report_progress

log = logging.getLogger(__name__)

#: ``<point>:<n>`` kills the process (SIGKILL) the n-th time the point is reached.
CRASH_POINT_ENV = "STREAM_DP_TEST_CRASH_POINT"
CRASH_POINTS = (
    "after_ledger_write",
    "after_output_write",
    "after_ingest",
    "after_partials_write",
    "before_draw",
    "after_ledger_readback",
    "after_continual_write",
    "after_progress",
)
#: ``<point>:<n>:<seconds>`` freezes the whole process (SIGSTOP to itself, then a helper
#: sends SIGCONT after the pause) at the n-th visit of a point — a GC pause or VM stall at
#: the worst moment.
PAUSE_POINT_ENV = "STREAM_DP_TEST_PAUSE_POINT"
#: Every write to the ledger topic waits this many seconds first (a slow ledger partition,
#: for the chaos run).
LEDGER_DELAY_ENV = "STREAM_DP_TEST_LEDGER_DELAY_S"
#: The first N ledger reads when partitions arrive fail (a broker hiccup while taking
#: partitions).
TAKE_FAILURES_ENV = "STREAM_DP_TEST_TAKE_FAILURES"
#: ``<partition>:<seconds>`` — once taken, that partition of the topic the worker reads
#: events from (the input) fetches nothing for that long: a reader that cannot fetch (a
#: stalled connection, a slow rejoin) while events wait.
STALL_INPUT_ENV = "STREAM_DP_TEST_STALL_INPUT"
#: ``<progress|hang>:<path>`` — the worker's first draw (in its thread) lasts until the file
#: ``<path>`` exists: a draw longer than any timeout, ended by the test. ``progress`` reports
#: a chunk every :data:`LONG_DRAW_CHECK_S` (a long draw that moves), ``hang`` none (stuck).
LONG_DRAW_ENV = "STREAM_DP_TEST_LONG_DRAW"
LONG_DRAW_MODES = ("progress", "hang")
#: How often a long test draw looks for its end file (and reports a chunk, in progress mode).
LONG_DRAW_CHECK_S = 0.1
#: A long test draw ends after this long even if its file never appears (no stuck worker).
LONG_DRAW_MAX_S = 600.0


@dataclass
class _Point:
    """One armed crash or pause point: acts on the ``remaining``-th visit from now."""

    point: str
    remaining: int
    pause_s: float


@dataclass
class Faults:
    """The faults a test switched on; the defaults are no faults at all."""

    crash: _Point | None = None
    pause: _Point | None = None
    ledger_delay_s: float = 0.0
    take_failures: int = 0
    #: (input partition, seconds): stalled once, when first taken
    stall_input: tuple[int, float] | None = field(default=None)
    #: (mode, end file): the first draw lasts until the file exists (LONG_DRAW_ENV)
    long_draw: tuple[str, Path] | None = field(default=None)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Faults:
        """The ``STREAM_DP_TEST_*`` switches, honoured only in the unsafe test mode."""
        env = os.environ if environ is None else environ
        if env.get(UNSAFE_TEST_MODE_ENV) != "1":
            return cls()
        stall = env.get(STALL_INPUT_ENV, "")
        partition, _, seconds = stall.partition(":")
        try:
            stall_input = (int(partition), float(seconds or "0")) if partition else None
        except ValueError:
            raise ConfigError(
                f"{STALL_INPUT_ENV} = {stall!r}: write <partition>:<seconds>, e.g. 1:25"
            ) from None
        return cls(
            long_draw=_parse_long_draw(env.get(LONG_DRAW_ENV, "")),
            crash=_parse_point(env.get(CRASH_POINT_ENV, "")),
            pause=_parse_point(env.get(PAUSE_POINT_ENV, "")),
            ledger_delay_s=float(env.get(LEDGER_DELAY_ENV, "0") or 0),
            take_failures=int(env.get(TAKE_FAILURES_ENV, "0") or 0),
            stall_input=stall_input,
        )

    def reached(self, point: str) -> None:
        """A fault point of the protocol: kill or freeze the process on the armed visit."""
        if self.crash is not None and self.crash.point == point:
            self.crash.remaining -= 1
            if self.crash.remaining == 0:
                log.warning("test fault point %s reached", point)
                _kill()
        if self.pause is not None and self.pause.point == point:
            self.pause.remaining -= 1
            if self.pause.remaining == 0:
                log.warning("test fault point %s reached", point)
                _freeze(self.pause.pause_s)

    def in_draw(self) -> None:
        """Called in the draw's thread before the draw: the LONG_DRAW_ENV fault, once."""
        if self.long_draw is None:
            return
        (mode, end), self.long_draw = self.long_draw, None
        log.warning("test fault: long draw started (%s) until %s exists", mode, end)
        waited = threading.Event()  # never set: a wait that a test's file ends
        deadline = time.monotonic() + LONG_DRAW_MAX_S
        while not end.exists() and time.monotonic() < deadline:
            waited.wait(LONG_DRAW_CHECK_S)
            if mode == "progress":
                report_progress("draw (test fault)")
        log.warning("test fault: long draw ends")

    def take_fails(self) -> bool:
        """Whether this ledger read, when partitions arrive, is one that fails."""
        if self.take_failures <= 0:
            return False
        self.take_failures -= 1
        return True


#: Shared by everything that has no faults of its own (never switched on).
NO_FAULTS = Faults()


def _parse_long_draw(spec: str) -> tuple[str, Path] | None:
    if not spec:
        return None
    mode, _, path = spec.partition(":")
    if mode not in LONG_DRAW_MODES or not path:
        raise ConfigError(
            f"{LONG_DRAW_ENV} = {spec!r}: write <progress|hang>:<file>, e.g. progress:/tmp/end"
        )
    return mode, Path(path)


def _parse_point(spec: str) -> _Point | None:
    if not spec:
        return None
    point, _, rest = spec.partition(":")
    if point not in CRASH_POINTS:
        return None
    count, _, seconds = rest.partition(":")
    return _Point(point, int(count or "1"), float(seconds or "0"))


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _freeze(seconds: float) -> None:
    # A child wakes us after the pause: the whole process (every task) stops meanwhile.
    pid = os.getpid()
    if os.fork() == 0:  # pragma: no cover - runs in the child
        time.sleep(seconds)
        os.kill(pid, signal.SIGCONT)
        os._exit(0)
    os.kill(pid, signal.SIGSTOP)
