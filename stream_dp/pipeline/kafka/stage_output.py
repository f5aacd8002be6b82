"""Where each topic's fetched records go, and what stage 0 sends on.

Fetched records go by one dispatch table (:func:`batch_routes`), built once the stages are:

* the partials topic → stage 2 (:meth:`ReleaseStage.ingest`);
* the erasure requests topic → collected for the erasure worker (after the batch);
* the stage-1 topic (the input when keyed by user, else the repartition topic) → stage 1
  (:meth:`IngestStage.ingest`);
* the input topic when not keyed by user → stage 0 (:meth:`IngestStage.route_packed`), its
  events re-keyed to the repartition partitions, its position noted (committed only once the
  routed events are acknowledged).

Keyed by user, the input *is* the stage-1 topic: stage 1 reads it.

Stage 0 (input not keyed by user) re-keys events by pseudonym to the repartition topic; its
progress marks follow the records they cover on every partition, at least every second and
twice per ``window.idle_close_s``. A batch's send is awaited by the next iteration, before it
sends its own (:meth:`StageOutput.route`): the broker acknowledges one batch while the worker
fetches and processes the next, instead of the worker waiting idle for every acknowledgement
(bench/RESULTS.md, section 12). One send is in flight at a time, so the repartition records
keep their order; a batch's input positions are returned — and may be committed — only
once its send is acknowledged; a send that fails raises from the next iteration, which stops
the worker without committing them, as before. (Stage 1's partials and watermarks are
:mod:`stream_dp.pipeline.handoff`'s, on the Kafka transport; a sealed window's partner
exports (docs/exports.md) go out just before its partials, through :attr:`StageOutput.exports`.)
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from stream_dp.config.model import Config
from stream_dp.pipeline.commit_flight import cancel_and_reap
from stream_dp.pipeline.duties.export_publisher import ExportPublisher
from stream_dp.pipeline.handoff import marks_interval_s
from stream_dp.pipeline.kafka.producing import Outgoing
from stream_dp.pipeline.kafka.publisher import Publisher
from stream_dp.pipeline.stages.ingest import DeadLetter, IngestStage
from stream_dp.pipeline.stages.ingest_columns import FetchedRecords
from stream_dp.pipeline.stages.release_stage import ReleaseStage
from stream_dp.privacy.pseudonymize import KeyRing

#: Key of stage 0's progress marks on the repartition topic (events are keyed by pseudonym).
ROUTED_MARK_KEY = "__progress__"


class StageOutput:
    """Stage 0's sends (see the module docstring)."""

    def __init__(self, config: Config, publisher: Publisher, *, keyring: KeyRing) -> None:
        self._publisher = publisher
        self._keyed = config.input.keyed_by_user
        self._routed_topic = config.output.repartition_topic
        #: The repartition topic's partitions (set at start).
        self.routed_to: list[int] = []
        #: Stage 0's progress marks are re-sent this often (handoff.marks_interval_s).
        self._marks_interval_s = marks_interval_s(config.window.idle_close_s)
        self._progress_sent_mono = -math.inf
        #: Partner exports (docs/exports.md; a no-op without them): a sealed window's records
        #: are sent, and acknowledged, before its partials (so before its offsets are committed).
        self.exports = ExportPublisher(config, keyring, publisher)
        #: Stage 0's send in flight (awaited by the next route or settle) and the input
        #: positions it makes safe once acknowledged.
        self._in_flight: tuple[asyncio.Future[None], dict[int, Any]] | None = None

    async def route(
        self,
        ingest: IngestStage,
        routed: list[Outgoing],
        positions: dict[int, Any],
        now_mono: float,
    ) -> dict[int, Any]:
        """Stage 0: awaits the previous batch's send (:meth:`settle`), then sends this one's
        routed events (``positions``: the input positions they reach) and progress marks
        without awaiting them. Returns the input positions acknowledged now — the previous
        send's: only they may be committed."""
        acknowledged = await self.settle()
        if self._keyed:
            return acknowledged
        if routed or positions or now_mono - self._progress_sent_mono >= self._marks_interval_s:
            # Progress marks follow the records they cover on every partition.
            routed.extend(
                (ROUTED_MARK_KEY, mark, r)
                for mark in ingest.progress_marks(now_mono)
                for r in self.routed_to
            )
            send = asyncio.ensure_future(self._publisher.send_many(self._routed_topic, routed))
            self._in_flight = (send, dict(positions))
            self._progress_sent_mono = now_mono
        return acknowledged

    async def settle(self) -> dict[int, Any]:
        """Await stage 0's send in flight; the input positions it acknowledged (empty when
        none was in flight). Raises what the send raised (its positions never returned)."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is None:
            return {}
        send, positions = in_flight
        await send
        return positions

    async def abandon(self) -> None:
        """Cancel stage 0's send in flight (the worker stops without committing: what it
        carried is routed again by whoever reads the input next)."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is None:
            return
        await cancel_and_reap(in_flight[0])


@dataclass
class Fetched:
    """What one batch's records became, for the iteration to send on."""

    now_s: float
    now_mono_s: float
    dead: list[DeadLetter] = field(default_factory=list)
    #: Stage 0's events for the repartition topic, and the input positions they cover.
    routed: list[Outgoing] = field(default_factory=list)
    routed_positions: dict[int, int] = field(default_factory=dict)
    #: Erasure requests per requests partition: (offset, value) records.
    requests: list[tuple[int, list[tuple[int, bytes | None]]]] = field(default_factory=list)


#: Takes one partition's fetched records (partition, records, into).
Route = Callable[[int, list[Any], Fetched], None]


def batch_routes(
    config: Config,
    ingest: IngestStage,
    release: ReleaseStage,
    *,
    routed_to: Sequence[int],
) -> dict[str, Route]:
    """The dispatch table of the module docstring, by topic name."""
    keyed = config.input.keyed_by_user
    stage1_topic = config.input.topic if keyed else config.output.repartition_topic

    def partials(partition: int, msgs: list[Any], into: Fetched) -> None:
        release.ingest(partition, [(m.offset, m.value) for m in msgs])

    def requests(partition: int, msgs: list[Any], into: Fetched) -> None:
        into.requests.append((partition, [(m.offset, m.value) for m in msgs]))

    def stage1(partition: int, msgs: list[Any], into: Fetched) -> None:
        into.dead.extend(
            ingest.ingest(
                partition,
                FetchedRecords(msgs),
                now_s=into.now_s,
                now_mono_s=into.now_mono_s,
                routed=not keyed,
                topic=stage1_topic,
            )
        )

    def stage0(partition: int, msgs: list[Any], into: Fetched) -> None:
        out, bad = ingest.route_packed(
            partition, FetchedRecords(msgs), now_s=into.now_s, now_mono_s=into.now_mono_s
        )
        into.routed.extend((k, v, routed_to[target]) for k, v, target in out)
        into.dead.extend(bad)
        into.routed_positions[partition] = msgs[-1].offset + 1

    routes: dict[str, Route] = {}
    if not keyed:
        routes[config.input.topic] = stage0
    routes[stage1_topic] = stage1  # keyed: the input topic is stage 1's
    if config.erasure.enabled:
        routes[config.erasure.requests_topic] = requests
    routes[config.output.partials_topic] = partials
    return routes
