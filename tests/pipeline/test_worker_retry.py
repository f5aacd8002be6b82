"""The worker's broker retry is the one policy (stream_dp/retry.py), with the worker's
rules: bounded calls give up after ``kafka.give_up_after_s`` with BrokerUnavailableError,
membership errors are not retried, a stopping worker gives up at the third failure, and each
failure is counted and marks the producer disconnected. The clock and sleep are fakes."""

from __future__ import annotations

import functools

import pytest
from aiokafka.errors import IllegalGenerationError, KafkaConnectionError

from stream_dp import retry as retry_module
from stream_dp.pipeline.kafka import publisher as publisher_module
from stream_dp.pipeline.kafka.publisher import BrokerUnavailableError
from stream_dp.pipeline.kafka.worker import Worker
from tests.clients.test_retry import FakeTime
from tests.pipeline.support import KEYRING, config


class AlwaysFailing:
    def __init__(self, error: Exception) -> None:
        self.error = error
        self.calls = 0

    async def __call__(self) -> None:
        self.calls += 1
        if self.calls > 1000:
            raise RuntimeError("retried more than 1000 times")
        raise self.error


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeTime:
    fake = FakeTime()
    patched = functools.partial(retry_module.retry, sleep=fake.sleep, clock=fake.clock)
    monkeypatch.setattr(publisher_module, "retry", patched)
    return fake


def _worker() -> Worker:
    return Worker(config(), KEYRING, bootstrap_servers="127.0.0.1:1")


async def test_a_bounded_call_gives_up_after_give_up_after_s(fake: FakeTime) -> None:
    worker = _worker()
    give_up_after_s = worker.config.kafka.give_up_after_s
    worker.health.set("producer_connected", True)
    op = AlwaysFailing(KafkaConnectionError())
    with pytest.raises(BrokerUnavailableError, match=r"kafka\.give_up_after_s") as caught:
        await worker.publisher.retry("produce to t", op, bounded=True)
    assert isinstance(caught.value.__cause__, KafkaConnectionError)
    assert sum(fake.waits) == pytest.approx(give_up_after_s, abs=1e-9)
    assert worker.metrics.broker_errors._value.get() == op.calls
    assert worker.health.status()["components"]["producer_connected"] is False


async def test_an_unbounded_call_waits_on_until_the_worker_stops(fake: FakeTime) -> None:
    worker = _worker()
    op = AlwaysFailing(KafkaConnectionError())
    with pytest.raises(RuntimeError, match="more than 1000"):
        await worker.publisher.retry("start producer", op, bounded=False)  # no give-up of its own
    assert sum(fake.waits) > worker.config.kafka.give_up_after_s
    stopping = AlwaysFailing(KafkaConnectionError())
    worker._stopping.set()
    with pytest.raises(KafkaConnectionError):
        await worker.publisher.retry("start producer", stopping, bounded=False)
    assert stopping.calls == 3


async def test_membership_errors_are_not_retried(fake: FakeTime) -> None:
    worker = _worker()
    op = AlwaysFailing(IllegalGenerationError())
    with pytest.raises(IllegalGenerationError):
        await worker.publisher.retry("commit", op)
    assert op.calls == 1 and fake.waits == []
    assert worker.metrics.broker_errors._value.get() == 0
