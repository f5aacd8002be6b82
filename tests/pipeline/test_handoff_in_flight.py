"""Stage 1's partials write left in flight while the worker reads on
(stream_dp/pipeline/handoff.py, steps 2–3): until it is acknowledged its windows are closed
to events, their state and input offsets held, an erasure reaching them re-seals them, a
partition revoked meanwhile keeps what its new state holds, and the next write waits for it.

The transport here answers each write with a future the test resolves, as the Kafka
transport's task is resolved by the broker's acknowledgement.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import ParamSpec, TypeVar

from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.formats.partials import WATERMARK_KEY_PREFIX, PartialPart, decode
from stream_dp.pipeline.handoff import Handoff
from stream_dp.pipeline.release_driver import Placed
from stream_dp.pipeline.stages.ingest import IngestSettings, IngestStage
from stream_dp.pipeline.stages.release_stage import ReleaseStage
from stream_dp.privacy.erasure import Erasure, ErasureSet, erasure_pseudonyms
from tests.pipeline.support import KEYRING, NOW, T0, config, rec

P = ParamSpec("P")
T = TypeVar("T")

#: Turns of the event loop given to a step that can only be waiting for a future: more than
#: the handful it takes to reach that wait (everything here runs on the loop, no thread).
TURNS = 50


class Answered:
    """A transport whose writes are acknowledged when the test says so."""

    def __init__(self) -> None:
        self.seals = 0
        #: Each write: its records and the future that acknowledges it.
        self.writes: list[tuple[list[Placed], asyncio.Future[None]]] = []

    async def send_partials(self, records: Sequence[Placed]) -> asyncio.Future[None]:
        ack: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.writes.append((list(records), ack))
        return ack

    async def seal(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        self.seals += 1
        return fn(*args, **kwargs)

    def acknowledge(self, index: int = -1) -> None:
        self.writes[index][1].set_result(None)

    def acknowledge_all(self) -> None:
        for _, ack in self.writes:
            if not ack.done():
                ack.set_result(None)

    def partials(self, index: int = -1) -> list[PartialPart]:
        """The partials (not the watermarks) of a write, decoded."""
        parts = []
        for key, value, _ in self.writes[index][0]:
            if not key.startswith(WATERMARK_KEY_PREFIX):
                part = decode(value)
                assert isinstance(part, PartialPart)
                parts.append(part)
        return parts


def _stage(*, erasures: ErasureSet | None = None) -> IngestStage:
    """Three stage-1 partitions as the worker builds them (with erasure: sealed windows kept
    until their release is known); windows of 10 s, grace 1 s, k = 3."""
    cfg = config()
    ingest = IngestStage(
        cfg,
        KEYRING,
        released=ReleaseStage(cfg),
        metrics=Metrics(),
        sampling_rng=random.Random(1),
        settings=IngestSettings(erasures=erasures, keep_sealed=erasures is not None),
    )
    ingest.assign(range(3), 0.0, routed=False)
    return ingest


def _handoff(ingest: IngestStage) -> tuple[Handoff, Answered]:
    transport = Answered()
    handoff = Handoff(
        ingest,
        transport,
        partials_partitions=[0, 1],
        partials_partition_of=lambda ws: 1,
        max_bytes=1_000_000,
    )
    return handoff, transport


async def _turns() -> None:
    for _ in range(TURNS):
        await asyncio.sleep(0)


async def _acknowledging(transport: Answered, turn: Awaitable[None]) -> None:
    """Run ``turn``, acknowledging each write it waits for (a hang guard, far above the
    normal instant, fails it if it waits for something else)."""
    task = asyncio.ensure_future(turn)
    async with asyncio.timeout(60):
        while not task.done():
            await _turns()
            transport.acknowledge_all()
    await task


async def test_a_window_in_flight_is_held_closed_to_events_and_dropped_once_acknowledged() -> None:
    ingest = _stage()
    handoff, transport = _handoff(ingest)
    # window 0 on partition 0: two users; an event at 12 s passes its end (grace 1 s)
    ingest.ingest(0, [rec(0, "u", 1), rec(1, "v", 2), rec(2, "u", 12)], now_s=NOW, now_mono_s=1)
    held = ingest.safe_offsets()
    assert held == {0: 0}
    await handoff.step(2)
    assert transport.seals == 1 and len(transport.writes) == 1
    assert [p.window_start_s for p in transport.partials()] == [T0, T0]  # visits, all
    # In flight: held, not due again, not open for a finite input's end either.
    assert T0 in ingest.store.parts[0]
    assert ingest.safe_offsets() == held
    assert ingest.due(3) == []
    assert (0, T0) not in ingest.all_open()
    # An event for it now is late: the window's state does not change.
    seen = ingest.store.parts[0][T0].samples.events_seen
    ingest.ingest(0, [rec(3, "w", 5)], now_s=NOW, now_mono_s=3)
    assert ingest.store.parts[0][T0].samples.events_seen == seen
    # The next turn waits for the acknowledgement before anything else: no seal, no write.
    ingest.ingest(0, [rec(4, "u", 23)], now_s=NOW, now_mono_s=4)  # passes window 10 s too
    turn = asyncio.ensure_future(handoff.step(5))
    await _turns()
    assert not turn.done()
    assert transport.seals == 1 and len(transport.writes) == 1
    assert T0 in ingest.store.parts[0] and ingest.safe_offsets() == held
    transport.acknowledge()
    await asyncio.wait_for(turn, timeout=60)
    # Acknowledged: window 0 dropped (its input committable up to window 10 s's first
    # offset), then window 10 s sealed and its write left in flight.
    assert T0 not in ingest.store.parts[0]
    assert ingest.safe_offsets() == {0: 2}
    assert transport.seals == 2 and len(transport.writes) == 2
    assert [p.window_start_s for p in transport.partials()] == [T0 + 10, T0 + 10]
    assert T0 + 10 in ingest.store.parts[0]
    transport.acknowledge()
    await handoff.settle()
    assert T0 + 10 not in ingest.store.parts[0]


async def test_an_erasure_reaching_a_window_in_flight_seals_it_again_without_the_user() -> None:
    erasures = ErasureSet()
    ingest = _stage(erasures=erasures)
    handoff, transport = _handoff(ingest)
    ingest.ingest(
        0,
        [rec(0, "u", 1), rec(1, "u", 2), rec(2, "v", 3), rec(3, "v", 12)],
        now_s=NOW,
        now_mono_s=1,
    )
    await handoff.step(2)
    first = transport.partials()
    assert {(p.events_retained, p.erasures_through) for p in first} == {(3, 0)}
    # The erasure of u is applied while the partials that count u are in flight.
    erasure = Erasure(
        position=1,
        pseudonyms=erasure_pseudonyms("u", KEYRING, "nfkc_casefold_strip"),
        expires_at_s=T0 + 86_400,
    )
    erasures.add(erasure)
    ingest.apply_erasures([erasure], 1)
    # Meanwhile partition 1 passes window 10 s: the next turn seals it as well.
    ingest.ingest(1, [rec(0, "w", 11), rec(1, "w", 22)], now_s=NOW, now_mono_s=2)
    transport.acknowledge()
    await _acknowledging(transport, handoff.step(3))
    # The next turn writes window 10 s, then seals window 0 again in a second write (sent
    # once the first is acknowledged): its partials say they applied the erasure, and u's
    # two events are gone from them.
    assert len(transport.writes) == 3
    assert [(p.window_start_s, p.source_partition) for p in transport.partials(1)] == [
        (T0 + 10, 1),
        (T0 + 10, 1),
    ]
    again = transport.partials(2)
    assert [p.window_start_s for p in again] == [T0, T0]
    assert {(p.events_retained, p.erasures_through) for p in again} == {(1, 1)}
    assert {p.version for p in again}.isdisjoint({p.version for p in first})
    # Every write settled in turn: both windows kept sealed until their release is known.
    transport.acknowledge_all()
    await handoff.settle()
    assert ingest.store.kept == {0: {T0}, 1: {T0 + 10}}
    assert not ingest.store.sealing


async def test_a_partition_revoked_and_taken_again_keeps_its_rebuilt_window() -> None:
    ingest = _stage()
    handoff, transport = _handoff(ingest)
    ingest.ingest(0, [rec(0, "u", 1), rec(1, "u", 12)], now_s=NOW, now_mono_s=1)
    await handoff.step(2)
    assert len(transport.writes) == 1
    # The partition moves away and comes back while the write is in flight: its new state
    # is rebuilt from the committed offset, replaying the window.
    ingest.revoke([0])
    ingest.assign([0], 3.0, routed=False)
    ingest.ingest(0, [rec(0, "u", 1)], now_s=NOW, now_mono_s=3)
    assert (0, T0) in ingest.all_open()
    transport.acknowledge()
    await handoff.settle()
    # The acknowledgement is the old state's: the rebuilt window is still held, and due.
    assert T0 in ingest.store.parts[0]
    assert ingest.safe_offsets() == {0: 0}
    assert (0, T0) in ingest.all_open()
