"""A lost ledger is an outage, never a re-release.

The ledger topic is what makes a (query, window) drawn once, ever. If it is deleted,
recreated or misnamed while the group and the output topic live on, a worker reading it
finds no record of the deployment and would draw again every window the output topic
already shows, under new noise: readers that keep the latest value per key are
overwritten, and two draws of one value averaged have half the noise.

:class:`LedgerGuard` is the worker's collaborator for that case:

* **at start**, when the ledger has no coverage record (a new deployment, or a lost
  ledger), :meth:`LedgerGuard.check_new_ledger` looks for signs that this deployment ran
  before: offsets committed by its consumer group on any topic it reads, or release records
  of its queries on the output topic for a window it would cover. Either one raises
  :class:`LedgerLostError` *before* the worker writes a coverage record, so every restart
  finds the same loss until an operator acts;
* **while running**, the ledger reader raises
  :class:`~stream_dp.pipeline.kafka.ledger_log.LogRewoundError` when a fence lands, or a record is
  read, below an offset already read (the topic was deleted or recreated underneath);
* either way the worker calls :meth:`LedgerGuard.hold`: it leaves the consumer group,
  releases nothing more, reports not ready (``ledger_loaded`` false), sets
  ``stream_dp_ledger_lost`` to 1, logs an ERROR saying what happened and how to recover,
  and keeps its loop beating and /metrics served until it is stopped.

Recovery: ``stream-dp ledger rebuild --config FILE``
(:mod:`stream_dp.pipeline.kafka.ledger_rebuild`) restores the ledger from the output topic;
the workers then start normally and release only later windows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any, Final

from stream_dp.clients.connect import start_client
from stream_dp.config.model import Config
from stream_dp.errors import StreamDPError
from stream_dp.kafka_client import AIOKafkaConsumer, TopicPartition
from stream_dp.kafka_client.errors import KafkaError
from stream_dp.ops.health import Health
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.kafka.ledger_log import LogRewoundError
from stream_dp.pipeline.kafka.output_scan import RawRecord, identify, read_output
from stream_dp.windows.tumbling import iso_utc

log = logging.getLogger(__name__)

#: How often a worker holding in an outage beats (liveness stays true: a restart would find
#: the same loss, so the orchestrator must not restart it in a loop).
HOLD_BEAT_S: Final = 1.0


def recovery_text(config_hint: str = "FILE") -> str:
    return (
        "Nothing more is released until an operator acts: stop every worker of the group, "
        f"run `stream-dp ledger rebuild --config {config_hint}` (it restores the ledger from "
        "the output topic, so that no window already published is ever drawn again), then "
        "start the workers. If the ledger topic name in the config is wrong (a typo), fix "
        "output.ledger_topic instead and restart"
    )


class LedgerLostError(StreamDPError):
    """The ledger topic lost this deployment's records while its group and output live on:
    releasing now would draw published windows again. The worker holds (see the module)."""


class LedgerGuard:
    """Detects a lost ledger at start, and holds the worker in an outage once it is lost."""

    def __init__(
        self,
        config: Config,
        *,
        metrics: Metrics,
        health: Health,
        client_options: Mapping[str, Any],
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.health = health
        self._options = dict(client_options)
        self.lost = False

    async def check_new_ledger(
        self,
        first_window_s: int,
        topics: Collection[str],
        *,
        reread: Callable[[], Awaitable[int | None]],
    ) -> int | None:
        """The ledger had no coverage record: raise :class:`LedgerLostError` if this
        deployment ran before (its group committed offsets on one of ``topics``, or the
        output topic holds a release of its queries for a window at or after
        ``first_window_s``). A new deployment passes (None).

        Workers of a new deployment started together race: another may record the
        coverage, then commit and publish, while this one looks. So a sign of an earlier
        run is believed only if the ledger, read again to fresh fences (``reread``), still
        has no coverage record; if it has one now, that is returned."""
        try:
            await self._look_for_earlier_runs(first_window_s, topics)
        except LedgerLostError:
            recorded = await reread()
            if recorded is None:
                raise
            return recorded
        return None

    async def _look_for_earlier_runs(self, first_window_s: int, topics: Collection[str]) -> None:
        ledger_topic = self.config.output.ledger_topic
        committed = await self._committed(sorted(topics))
        if committed:
            where = ", ".join(f"{tp.topic}[{tp.partition}]" for tp in committed[:5])
            raise LedgerLostError(
                f"the ledger topic {ledger_topic} has no record of this deployment, but the "
                f"consumer group {self.config.kafka.group_id} has committed offsets (on {where}): "
                "the ledger was deleted, recreated or renamed, and the windows already released "
                "would be drawn again with new noise"
            )
        found = await self._published_window(first_window_s)
        if found is not None:
            query, window_start_s = found
            raise LedgerLostError(
                f"the ledger topic {ledger_topic} has no record of this deployment, but the "
                f"output topic {self.config.output.topic} already holds a release of query "
                f"{query} for window {iso_utc(window_start_s)} (at or after the first window "
                f"this start would cover, {iso_utc(first_window_s)}): the ledger was deleted, "
                "recreated or renamed, and those windows would be drawn again with new noise; "
                "a new deployment that shares this output topic needs window.start_at after "
                "the last window the output topic holds for these queries"
            )

    async def _committed(self, topics: Sequence[str]) -> list[TopicPartition]:
        """The partitions of ``topics`` on which the group has a committed offset."""
        consumer = AIOKafkaConsumer(
            group_id=self.config.kafka.group_id, enable_auto_commit=False, **self._options
        )
        await start_client(consumer, str(self._options["bootstrap_servers"]))
        try:
            existing = await consumer.topics()
            out = []
            for topic in topics:
                if topic not in existing:
                    continue
                for p in sorted(consumer.partitions_for_topic(topic) or ()):
                    tp = TopicPartition(topic, p)
                    if await consumer.committed(tp) is not None:
                        out.append(tp)
            return out
        finally:
            await consumer.stop()

    async def _published_window(self, first_window_s: int) -> tuple[str, int] | None:
        """A (query, window start) of this deployment's on the output topic, at or after
        ``first_window_s`` (the first one found), or None."""
        queries = {q.name for q in self.config.queries}

        def ours(record: RawRecord) -> bool:
            ident = identify(record[1], queries)
            return ident is not None and ident[1] >= first_window_s

        records = await read_output(
            self.config.kafka,
            self.config.output.topic,
            bootstrap_servers=str(self._options["bootstrap_servers"]),
            until=ours,
        )
        if records and ours(records[-1]):
            ident = identify(records[-1][1], queries)
            assert ident is not None
            return ident[0], ident[1]
        return None

    async def hold(
        self, exc: StreamDPError, consumer: AIOKafkaConsumer | None, stopping: asyncio.Event
    ) -> None:
        """The outage: leave the group, release nothing, not ready, metric and ERROR log;
        beat and serve /metrics until ``stopping`` is set."""
        self.lost = True
        self.metrics.ledger_lost.set(1)
        self.health.set("ledger_loaded", False)
        rewound = exc.topic if isinstance(exc, LogRewoundError) else None
        if rewound is not None and rewound == self.config.erasure.log_topic:
            recovery = (
                f"Nothing more is released. The erasure log {rewound} lost the erasures it "
                "held, and a restarted worker would count those users again: restore the "
                "topic, or send their erasure requests again, before starting the workers"
            )
        elif rewound is not None and rewound != self.config.output.ledger_topic:
            recovery = (
                f"Nothing more is released. The running-total state on {rewound} cannot be "
                "rebuilt: restore the topic, or start a new deployment (a new kafka.group_id) "
                "with window.start_at after the last window on the output topic"
            )
        else:
            recovery = recovery_text()
        log.error("ledger lost: %s. %s", exc, recovery)
        if consumer is not None:
            # Partitions go to the other members, which find the same loss on their own.
            with contextlib.suppress(KafkaError, asyncio.TimeoutError):
                await asyncio.wait_for(consumer.stop(), timeout=HOLD_BEAT_S * 10)
        while not stopping.is_set():
            self.health.beat()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stopping.wait(), timeout=HOLD_BEAT_S)
