"""Liveness and readiness of one worker.

- **live**: the worker loop is turning, or a long step inside one iteration is moving. The loop
  calls :meth:`Health.beat` every iteration; a long step (a draw of a million keys, a long
  ledger read) calls :meth:`Health.progress` per chunk it finishes
  (:mod:`stream_dp.ops.progress`). Live means the newer of the two is at most ``live_timeout_s``
  old: only a hang — nothing moved for that long — fails the probe. It does not depend on the
  broker: a worker waiting for an unreachable broker is alive (restarting it would not help), a
  worker whose loop is stuck is not (restarting it would). Until the first beat, the moment of
  construction counts as one, so a worker gets ``live_timeout_s`` to start its loop.
- **ready**: every component reports ok — for the worker (:data:`COMPONENTS`): input
  partitions assigned, producer connected, release ledger loaded, no partition-count
  change of a topic it reads still settling, and its fetches not failing for a cause that
  retrying does not clear (:mod:`stream_dp.pipeline.fetch_health`); other services (the
  sink) name their own.
  Readiness says nothing about liveness; an orchestrator checks both.

The clock is injectable (``clock=``, a monotonic ``() -> float`` in seconds) so tests never
sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Final, Protocol

from prometheus_client import Gauge

#: The components that must all be ok for the worker to be ready.
COMPONENTS: Final[tuple[str, ...]] = (
    "partitions_assigned",
    "producer_connected",
    "ledger_loaded",
    "topology_stable",
    "input_readable",
)


class HasReadyGauge(Protocol):
    """Metrics with a ``ready`` gauge (the worker's and the sink's)."""

    @property
    def ready(self) -> Gauge: ...


DEFAULT_LIVE_TIMEOUT_S: Final = 30.0


class Health:
    """Liveness (loop beats) and readiness (component flags) of one worker."""

    def __init__(
        self,
        *,
        live_timeout_s: float = DEFAULT_LIVE_TIMEOUT_S,
        metrics: HasReadyGauge | None = None,
        clock: Callable[[], float] = time.monotonic,
        components: Sequence[str] = COMPONENTS,
    ) -> None:
        if not live_timeout_s > 0:
            raise ValueError(f"live_timeout_s must be > 0, got {live_timeout_s!r}")
        self.live_timeout_s = live_timeout_s
        self._metrics = metrics
        self._clock = clock
        self._last_beat = clock()
        self._beats = 0
        #: The last progress beat of a long step (any thread): its time, step and count.
        self._last_progress = -math.inf
        self._progress_step = ""
        self._progress_beats = 0
        if not components:
            raise ValueError("a service needs at least one health component")
        self._components: dict[str, bool] = dict.fromkeys(components, False)
        self._publish_ready()

    def beat(self) -> None:
        """Record that the worker loop ran one more iteration."""
        self._last_beat = self._clock()
        self._beats += 1

    def progress(self, step: str) -> None:
        """Record that a long step inside an iteration finished one more chunk. Safe from
        any thread (plain assignments); ``step`` names the step for ``/health/live``."""
        self._last_progress = self._clock()
        self._progress_step = step
        self._progress_beats += 1

    def set(self, component: str, ok: bool) -> None:
        """Report one component's state; ``component`` is one of the components given."""
        if component not in self._components:
            raise ValueError(
                f"unknown health component {component!r}; use one of {', '.join(self._components)}"
            )
        self._components[component] = bool(ok)
        self._publish_ready()

    def live(self, now: float | None = None) -> bool:
        """True while the last loop beat or progress beat is at most ``live_timeout_s`` old
        (``now``: clock time)."""
        return self._beat_age(now) <= self.live_timeout_s

    def ready(self) -> bool:
        """True when every component reports ok."""
        return all(self._components.values())

    def status(self, now: float | None = None) -> dict[str, Any]:
        """The state as plain data, for the JSON body of ``/health/*``."""
        return {
            "live": self.live(now),
            "ready": self.ready(),
            "components": dict(self._components),
            "last_beat_age_s": round(self._beat_age(now), 3),
            "live_timeout_s": self.live_timeout_s,
            "beats": self._beats,
            "progress_beats": self._progress_beats,
            "last_progress_step": self._progress_step,
        }

    def _beat_age(self, now: float | None) -> float:
        """Age of the newer of the last loop beat and the last progress beat."""
        last = max(self._last_beat, self._last_progress)
        return (self._clock() if now is None else now) - last

    def _publish_ready(self) -> None:
        if self._metrics is not None:
            self._metrics.ready.set(1 if self.ready() else 0)


#: How often :func:`beating` beats.
START_BEAT_S: Final = 1.0


@contextlib.asynccontextmanager
async def beating(health: Health, every_s: float = START_BEAT_S) -> AsyncIterator[None]:
    """Beat every ``every_s`` while the block runs: a start-up that reads a long ledger is
    live while its event loop turns (a read that stops making progress fails on its own
    stall timeout); readiness stays false until the block's components report ok."""

    async def beat() -> None:
        while True:
            health.beat()
            await asyncio.sleep(every_s)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
