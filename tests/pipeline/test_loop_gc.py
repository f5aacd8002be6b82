"""The worker's loop pauses cyclic garbage collection for each iteration and only then
(stream_dp/pipeline/kafka/worker.py, ``_turn``; stream_dp/pipeline/gc_pause.py).

A fetch's records are two tracked objects each; left on, the collector ran about 80 times per
batch of issue 43's stream and, every hundredth time, walked everything alive, this batch's
records among them (bench/RESULTS.md, run ``twelfth_gc``). The pause must cover the fetch (the
records are built there) and the iteration, and collection must be on again between
iterations and after the loop, whichever way an iteration ends."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator
from typing import Any

import pytest

from stream_dp.kafka_client.errors import KafkaError
from stream_dp.pipeline.kafka.worker import Worker
from tests.pipeline.support import KEYRING, config


def _worker() -> Worker:
    return Worker(config(keyed_by_user=True), KEYRING)


async def test_each_iteration_runs_with_collection_paused_and_on_again_between() -> None:
    worker = _worker()
    seen: list[tuple[str, bool]] = []
    answers: list[Any] = [{"batch": 1}, KafkaError("fetch failed"), {"batch": 2}, None]

    async def fetch() -> Any:
        seen.append(("fetch", gc.isenabled()))
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def failed(exc: BaseException) -> None:
        seen.append(("failed", gc.isenabled()))

    @contextlib.asynccontextmanager
    async def iteration() -> AsyncIterator[set[Any]]:
        yield set()

    async def one(batch: Any, waiting: set[Any]) -> None:
        seen.append((f"iteration {batch['batch']}", gc.isenabled()))

    def beat() -> None:
        seen.append(("between", gc.isenabled()))

    worker.guards.fetch = fetch  # type: ignore[method-assign]
    worker.fetches.failed = failed  # type: ignore[method-assign]
    worker.membership.iteration = iteration  # type: ignore[method-assign]
    worker._iteration = one  # type: ignore[method-assign]
    worker.health.beat = beat  # type: ignore[method-assign]
    assert gc.isenabled()
    await asyncio.wait_for(worker._turn(), 60)
    assert seen == [
        ("fetch", False),
        ("iteration 1", False),
        ("between", True),
        ("fetch", False),
        ("failed", False),  # a failed fetch ends its pause too: the next is a fresh one
        ("fetch", False),
        ("iteration 2", False),
        ("between", True),
        ("fetch", False),  # None: the loop ends
    ]
    assert gc.isenabled()  # and on after the loop


async def test_collection_is_on_again_after_an_iteration_that_raises() -> None:
    worker = _worker()

    async def fetch() -> Any:
        return {}

    async def one(batch: Any, waiting: set[Any]) -> None:
        assert not gc.isenabled()
        raise RuntimeError("the iteration failed")

    @contextlib.asynccontextmanager
    async def iteration() -> AsyncIterator[set[Any]]:
        yield set()

    worker.guards.fetch = fetch  # type: ignore[method-assign]
    worker.membership.iteration = iteration  # type: ignore[method-assign]
    worker._iteration = one  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="the iteration failed"):
        await asyncio.wait_for(worker._turn(), 60)
    assert gc.isenabled()
