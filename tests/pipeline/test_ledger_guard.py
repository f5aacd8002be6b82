"""The ledger guard without a broker: a sign of an earlier run is believed only if the
ledger, read again, still has no coverage record; the outage is loud (metric, readiness,
ERROR with the way out) and lasts until the worker is stopped; a ledger log that goes
backwards is refused."""

from __future__ import annotations

import asyncio
import logging

import pytest

from stream_dp.ops.health import COMPONENTS, Health
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.formats.ledger import LedgerIndex
from stream_dp.pipeline.kafka.ledger_guard import LedgerGuard, LedgerLostError
from stream_dp.pipeline.kafka.ledger_log import LedgerLog, LogRewoundError
from tests.pipeline.support import T0, config


def _guard(found: bool) -> tuple[LedgerGuard, Metrics, Health]:
    metrics = Metrics()
    health = Health(metrics=metrics)
    for component in COMPONENTS:
        health.set(component, True)
    guard = LedgerGuard(
        config(), metrics=metrics, health=health, client_options={"bootstrap_servers": "x:1"}
    )

    async def look(first_window_s: int, topics: object) -> None:
        if found:
            raise LedgerLostError("the group has committed offsets")

    guard._look_for_earlier_runs = look  # type: ignore[method-assign]
    return guard, metrics, health


async def test_signs_of_an_earlier_run_with_still_no_coverage_record_are_a_lost_ledger() -> None:
    guard, _, _ = _guard(found=True)
    rereads: list[int] = []

    async def reread() -> int | None:
        rereads.append(1)
        return None

    with pytest.raises(LedgerLostError, match="committed offsets"):
        await guard.check_new_ledger(T0, ["t"], reread=reread)
    assert rereads == [1]


async def test_a_coverage_record_written_meanwhile_by_a_racing_worker_is_taken() -> None:
    guard, _, _ = _guard(found=True)

    async def reread() -> int | None:
        return T0 + 10

    assert await guard.check_new_ledger(T0, ["t"], reread=reread) == T0 + 10


async def test_a_new_deployment_passes_without_reading_again() -> None:
    guard, _, _ = _guard(found=False)

    async def reread() -> int | None:
        raise AssertionError("no second read for a new deployment")

    assert await guard.check_new_ledger(T0, ["t"], reread=reread) is None


async def test_the_outage_is_loud_and_lasts_until_the_worker_is_stopped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    guard, metrics, health = _guard(found=True)
    assert health.ready() and metrics.ledger_lost._value.get() == 0
    stopping = asyncio.Event()
    with caplog.at_level(logging.ERROR):
        hold = asyncio.create_task(guard.hold(LedgerLostError("gone"), None, stopping))
        await asyncio.sleep(0)  # the hold has begun; it beats until stopped
        assert not hold.done()
        assert metrics.ledger_lost._value.get() == 1
        assert not health.ready() and metrics.ready._value.get() == 0
        stopping.set()
        await asyncio.wait_for(hold, timeout=30)
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "gone" in record.getMessage()
    assert "stream-dp ledger rebuild --config" in record.getMessage()


def _log() -> LedgerLog:
    async def send(key: str, value: bytes, partition: int) -> int:
        raise AssertionError("not used")

    return LedgerLog("ledger", LedgerIndex(), client_options={}, send=send)


def test_a_record_or_fence_below_what_was_read_is_a_rewound_log() -> None:
    log = _log()
    for offset in range(5):
        log.reader.advance(0, offset)
    log.reader.check_forward(0, 5)  # the next record: fine
    log.reader.check_forward(1, 0)  # another partition, nothing read there yet: fine
    with pytest.raises(LogRewoundError, match="deleted or recreated"):
        log.reader.check_forward(0, 0)  # a fence written to a recreated partition
    with pytest.raises(LogRewoundError):
        log.reader.advance(0, 2)  # a record read again from a reset position


@pytest.mark.parametrize(
    ("topic", "says"),
    [
        ("erasure log", "send their erasure requests again"),
        ("continual", "running-total state"),
        ("ledger", "stream-dp ledger rebuild --config"),
    ],
)
async def test_a_rewound_log_holds_and_names_the_way_out_for_its_topic(
    caplog: pytest.LogCaptureFixture, topic: str, says: str
) -> None:
    guard, metrics, _ = _guard(found=False)
    name = {
        "erasure log": guard.config.erasure.log_topic,
        "continual": "stream-dp.continual",
        "ledger": guard.config.output.ledger_topic,
    }[topic]
    stopping = asyncio.Event()
    stopping.set()  # the hold logs, then ends at once
    with caplog.at_level(logging.ERROR):
        await asyncio.wait_for(guard.hold(LogRewoundError(name, 0, 1, 5), None, stopping), 30)
    assert metrics.ledger_lost._value.get() == 1
    (record,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "deleted or recreated" in record.getMessage()
    assert says in record.getMessage()
