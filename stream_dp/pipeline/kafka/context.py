"""What every collaborator of the worker is given (:class:`WorkerContext`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from stream_dp.config.model import Config
from stream_dp.ops.health import Health
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.faults import Faults


@dataclass(frozen=True)
class WorkerContext:
    """The worker's configuration, the metrics and health it reports to, the event set when
    it stops, and its fault-injection hooks."""

    config: Config
    metrics: Metrics
    health: Health
    stopping: asyncio.Event
    #: :data:`~stream_dp.pipeline.faults.NO_FAULTS` outside the tests.
    faults: Faults


class WorkerPart:
    """A collaborator of the worker: its context's parts as attributes."""

    def __init__(self, context: WorkerContext) -> None:
        self.config = context.config
        self.metrics = context.metrics
        self.health = context.health
        self._stopping = context.stopping
        self._faults = context.faults
