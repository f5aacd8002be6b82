"""Stage 1's hand-off, written once (stream_dp/pipeline/handoff.py): the exact order of its
effects on a transport — the woken partition announced first, partials then watermarks (the
quiet partitions after the others) in one write, acknowledged before their window's state is
dropped (by the next turn: the write is left in flight) — and nothing dropped when that write
fails. What happens while a write is in flight: tests/pipeline/test_handoff_in_flight.py."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import ParamSpec, TypeVar

import orjson
import pytest

from stream_dp.errors import BrokerError
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.formats.partials import WATERMARK_KEY_PREFIX
from stream_dp.pipeline.handoff import Handoff
from stream_dp.pipeline.local.local import LocalPipeline
from stream_dp.pipeline.release_driver import ACKNOWLEDGED, Placed
from stream_dp.pipeline.stages.ingest import IngestStage
from tests.pipeline.support import KEYRING, NOW, T0, config, rec

P = ParamSpec("P")
T = TypeVar("T")


class Recording:
    """A transport that notes each record written (one entry per source and kind) into a log
    it shares with the ingest stage's drops; ``fail`` makes every write raise instead."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.fail = False
        #: Each write's records as (key, partition), in order.
        self.writes: list[list[tuple[str, int]]] = []

    async def send_partials(self, records: Sequence[Placed]) -> Awaitable[None]:
        if self.fail:
            return self._failed()
        self.writes.append([(key, r) for key, _, r in records])
        for key, value, r in records:
            assert value is not None
            if key.startswith(WATERMARK_KEY_PREFIX):
                mark = orjson.loads(value)
                quiet = mark["idle"] and not mark["open_windows"]
                entry = f"watermark {mark['source_partition']}{' quiet' if quiet else ''}"
            else:
                query, _window, source = key.split("|")
                entry = f"partial {query} of {source} to {r}"
            if not self.log or self.log[-1] != entry:
                self.log.append(entry)
        return ACKNOWLEDGED

    @staticmethod
    async def _failed() -> None:
        raise BrokerError("test: the partials write was not acknowledged")

    async def seal(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        self.log.append("seal")
        return fn(*args, **kwargs)


def _handoff(log: list[str]) -> tuple[Handoff, IngestStage, Recording]:
    """Three stage-1 partitions (windows of 10 s, idle after 5 s) handing off to two
    partials partitions; the stage's drops go to ``log`` too."""
    ingest = LocalPipeline(config(), KEYRING, partitions=3, metrics=Metrics()).ingest_stage
    drop = ingest.drop

    def logged_drop(partition: int, window_start_s: int) -> None:
        log.append(f"drop {partition} {window_start_s - T0}")
        drop(partition, window_start_s)

    ingest.drop = logged_drop  # type: ignore[method-assign]
    transport = Recording(log)
    handoff = Handoff(
        ingest,
        transport,
        partials_partitions=[0, 1],
        partials_partition_of=lambda ws: 1,
        max_bytes=1_000_000,
    )
    return handoff, ingest, transport


def _step(handoff: Handoff, log: list[str], now_mono: float) -> list[str]:
    log.clear()
    asyncio.run(handoff.step(now_mono))
    return list(log)


def _settle(handoff: Handoff, log: list[str]) -> list[str]:
    log.clear()
    asyncio.run(handoff.settle())
    return list(log)


def test_the_hand_off_writes_partials_then_watermarks_quiet_ones_last_then_drops() -> None:
    log: list[str] = []
    handoff, ingest, transport = _handoff(log)
    ingest.ingest(0, [rec(0, "u", 1)], now_s=NOW, now_mono_s=1)
    ingest.ingest(1, [rec(0, "v", 3)], now_s=NOW, now_mono_s=1)
    # Nothing due: only the watermarks (the first turn's).
    assert _step(handoff, log, 1) == ["watermark 0", "watermark 1", "watermark 2"]
    assert _step(handoff, log, 1.5) == []  # within the watermark interval: nothing
    # Partition 0 passes the window's end; partition 2, silent past idle_close_s, is quiet.
    ingest.ingest(0, [rec(1, "u", 12)], now_s=NOW, now_mono_s=7)
    transport.writes.clear()
    assert _step(handoff, log, 7) == [
        "seal",
        "partial visits of 0 to 1",
        "partial all of 0 to 1",
        "watermark 0",
        "watermark 1",
        "watermark 2 quiet",
    ]  # the write is left in flight: the window is dropped by the next turn
    # One write (one round trip): on each partials partition the partials come first.
    assert len(transport.writes) == 1
    for r in (0, 1):
        keys = [key for key, partition in transport.writes[0] if partition == r]
        marks = [i for i, key in enumerate(keys) if key.startswith(WATERMARK_KEY_PREFIX)]
        assert marks == list(range(len(keys) - 3, len(keys)))  # the three watermarks last
    # The quiet partition has data again: announced before anything is sealed.
    ingest.ingest(2, [rec(0, "w", 13)], now_s=NOW, now_mono_s=8)
    ingest.ingest(1, [rec(1, "v", 14)], now_s=NOW, now_mono_s=8)
    assert _step(handoff, log, 8) == [
        "drop 0 0",
        "watermark 0",
        "watermark 1",
        "watermark 2",
        "seal",
        "partial visits of 1 to 1",
        "partial all of 1 to 1",
        "watermark 0",
        "watermark 1",
        "watermark 2",
    ]
    assert _settle(handoff, log) == ["drop 1 0"]
    assert _settle(handoff, log) == []  # settled once


def test_watermarks_written_with_the_partials_say_what_holds_once_their_windows_are_dropped() -> (
    None
):
    log: list[str] = []
    handoff, ingest, transport = _handoff(log)
    for p in range(3):
        ingest.ingest(p, [rec(0, f"u{p}", 1 + p)], now_s=NOW, now_mono_s=1)
    assert _step(handoff, log, 1) == ["watermark 0", "watermark 1", "watermark 2"]
    # Every partition idle past idle_close_s: its one window is sealed, and with it gone
    # nothing is open — each watermark in the same write says quiet, as one written after
    # the drop would.
    transport.writes.clear()
    assert _step(handoff, log, 12) == [
        "seal",
        *(f"partial {q} of {p} to 1" for p in range(3) for q in ("visits", "all")),
        "watermark 0 quiet",
        "watermark 1 quiet",
        "watermark 2 quiet",
    ]
    assert len(transport.writes) == 1
    # The next turn: the windows dropped; nothing sealed, the partitions were quiet and still are.
    assert _step(handoff, log, 20) == [
        "drop 0 0",
        "drop 1 0",
        "drop 2 0",
        "watermark 0 quiet",
        "watermark 1 quiet",
        "watermark 2 quiet",
    ]


def test_a_window_whose_partials_were_not_acknowledged_keeps_its_state_and_input() -> None:
    log: list[str] = []
    handoff, ingest, transport = _handoff(log)
    ingest.ingest(0, [rec(0, "u", 1), rec(1, "u", 12)], now_s=NOW, now_mono_s=1)
    held = ingest.safe_offsets()
    transport.fail = True
    assert "seal" in _step(handoff, log, 1)  # sealed, the write in flight
    assert ingest.safe_offsets() == held
    with pytest.raises(BrokerError):  # the turn that settles it finds it failed
        asyncio.run(handoff.step(2))
    assert [e for e in log if e.startswith("drop")] == []
    assert ingest.safe_offsets() == held  # its input is not committed past the window
    assert (0, T0) in ingest.all_open()  # due again
    transport.fail = False
    assert _step(handoff, log, 3)[:3] == [
        "seal",
        "partial visits of 0 to 1",
        "partial all of 0 to 1",
    ]
    assert _settle(handoff, log) == ["drop 0 0"]  # handed off on the next turn
