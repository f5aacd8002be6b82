"""Progress beats of long steps, for liveness (:meth:`stream_dp.ops.health.Health.progress`).

The worker loop beats once per iteration; one iteration may hold a step that takes long and
is not stuck — a draw of a million keys, a ledger read of a long partition, thousands of
ledger parts written. Such a step reports each chunk it finishes with :func:`report_progress`;
the worker installs its health's progress beat as the reporter (:func:`reporting_progress`)
for its task, and threads started with :func:`asyncio.to_thread` inherit it (they run in a
copy of the caller's context). Liveness then fails only when neither the loop nor any step
moved for the liveness timeout: a hang, not a long step.

Report only what moved (a chunk drawn, a batch read, a write acknowledged), never a retry or
a wait: a step that reports while it waits would hide a hang from the probe.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar

#: The current task's progress beat (None outside a worker: reports are dropped).
_reporter: ContextVar[Callable[[str], None] | None] = ContextVar("progress_reporter", default=None)


def report_progress(step: str) -> None:
    """A long step finished one more chunk (``step`` names it, e.g. ``"draw"``)."""
    reporter = _reporter.get()
    if reporter is not None:
        reporter(step)


@contextlib.contextmanager
def reporting_progress(reporter: Callable[[str], None]) -> Iterator[None]:
    """Send this context's progress reports (and its threads') to ``reporter``."""
    token = _reporter.set(reporter)
    try:
        yield
    finally:
        _reporter.reset(token)
