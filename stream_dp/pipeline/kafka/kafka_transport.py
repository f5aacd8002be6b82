"""The Kafka transport of the release protocol and of stage 1's hand-off
(:mod:`stream_dp.pipeline.handoff`): the worker's producer and ledger readers.

Writes are acknowledged by every in-sync replica before they return (the producer's
``acks=all``, retried for at most ``kafka.give_up_after_s``); reads go to fresh fences; the
draw runs in a thread (:mod:`stream_dp.pipeline.stages.offload`) so that the event loop keeps
fetching, answering the group coordinator and serving /metrics meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import ParamSpec, TypeVar

from stream_dp.pipeline.formats.ledger import LedgerRelease
from stream_dp.pipeline.kafka.ledger_reader import LedgerReader
from stream_dp.pipeline.kafka.publisher import Publisher
from stream_dp.pipeline.release_driver import Placed
from stream_dp.pipeline.stages.offload import run_off_loop

P = ParamSpec("P")
T = TypeVar("T")


class KafkaTransport:
    """:class:`~stream_dp.pipeline.release_driver.ReleaseTransport` and
    :class:`~stream_dp.pipeline.handoff.HandoffTransport` over Kafka."""

    def __init__(
        self,
        publisher: Publisher,
        reader: LedgerReader,
        *,
        ledger_topic: str,
        continual_topic: str,
        partials_topic: str,
        owns: Callable[[int], bool],
    ) -> None:
        self._publisher = publisher
        self._reader = reader
        self._ledger_topic = ledger_topic
        self._continual_topic = continual_topic
        self._partials_topic = partials_topic
        self._owns = owns

    def owns(self, partials_partition: int) -> bool:
        return self._owns(partials_partition)

    async def write_ledger(self, records: Sequence[Placed]) -> None:
        await self._publisher.send_many(self._ledger_topic, records)

    async def read_ledger(self, partitions: Sequence[int]) -> None:
        await self._reader.catch_up_ledger(partitions, bounded=True)

    async def write_continual(self, records: Sequence[Placed]) -> None:
        await self._publisher.send_many(self._continual_topic, records)

    async def read_continual(self, partitions: Sequence[int]) -> None:
        await self._reader.catch_up_continual(partitions)

    async def publish_output(self, release: LedgerRelease) -> None:
        await self._publisher.publish_output(release)

    async def draw(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await run_off_loop(fn, *args, **kwargs)

    def window_released(self, window_start_s: int) -> None:
        return None

    async def send_partials(self, records: Sequence[Placed]) -> asyncio.Future[None]:
        """The write handed to the producer; what is returned ends with the acknowledgement
        of every record (retried as a whole like every write): the loop goes on meanwhile."""
        return await self._publisher.start_many(self._partials_topic, records)

    async def seal(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await run_off_loop(fn, *args, **kwargs)
