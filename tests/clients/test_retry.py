"""The one retry policy: exponential back-off with full jitter, bounded or unbounded.

No test sleeps: the clock and the sleep are fakes (sleeping advances the fake clock), and
the random source is injected where the exact wait is checked.
"""

from __future__ import annotations

import pytest

from stream_dp.retry import BROKER_BACKOFF, Backoff, retry


class Flaky(Exception):
    pass


class Fatal(Flaky):
    pass


class FakeTime:
    """A clock that only sleeping moves; every wait is recorded."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.waits: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.waits.append(seconds)
        self.now += seconds


class FailingOp:
    """Fails ``failures`` times with ``error``, then returns ``"done"``. A hang guard: after
    100 calls it raises an error no policy retries."""

    def __init__(self, failures: int, error: type[Exception] = Flaky) -> None:
        self.failures = failures
        self.error = error
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.calls > 100:
            raise RuntimeError("retried more than 100 times")
        if self.calls <= self.failures:
            raise self.error(f"failure {self.calls}")
        return "done"


def highest(low: float, high: float) -> float:
    """An injected 'random' draw that always takes the top of the interval."""
    return high


def test_ceilings_double_from_base_to_cap() -> None:
    ceilings = [BROKER_BACKOFF.ceiling_s(n) for n in range(8)]
    assert ceilings == pytest.approx([0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0], abs=1e-12)
    assert BROKER_BACKOFF.ceiling_s(10_000) == 5.0  # no overflow after a long outage


def test_each_wait_is_drawn_from_zero_to_its_ceiling() -> None:
    asked: list[tuple[float, float]] = []

    def uniform(low: float, high: float) -> float:
        asked.append((low, high))
        return (low + high) / 2

    backoff = Backoff(base_s=0.05, cap_s=1.0)
    waits = [backoff.delay_s(n, uniform) for n in range(6)]
    assert asked == [(0.0, backoff.ceiling_s(n)) for n in range(6)]
    assert waits == pytest.approx([0.025, 0.05, 0.1, 0.2, 0.4, 0.5], abs=1e-12)


def test_real_jitter_stays_in_bounds_and_spreads_over_the_whole_interval() -> None:
    """With the system's random source: every wait lies in [0, ceiling], and 2,000 waits
    under a 5 s ceiling reach below 0.5 s and above 4.5 s. Each of the two spread checks
    fails by chance with probability 0.9**2000 < 1e-90, far below 1e-6."""
    waits = [BROKER_BACKOFF.delay_s(10) for _ in range(2000)]
    assert all(0.0 <= w <= 5.0 for w in waits)
    assert min(waits) < 0.5
    assert max(waits) > 4.5


def test_backoff_rejects_a_cap_below_its_base() -> None:
    with pytest.raises(ValueError, match="base_s <= cap_s"):
        Backoff(base_s=2.0, cap_s=1.0)


async def test_unbounded_retry_waits_with_growing_ceilings_until_it_succeeds() -> None:
    fake = FakeTime()
    op = FailingOp(failures=7)
    seen: list[BaseException] = []
    result = await retry(
        "op",
        op,
        retry_on=(Flaky,),
        on_failure=seen.append,
        sleep=fake.sleep,
        clock=fake.clock,
        uniform=highest,
    )
    assert result == "done"
    assert op.calls == 8
    assert [str(e) for e in seen] == [f"failure {n}" for n in range(1, 8)]
    assert fake.waits == pytest.approx([0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0], abs=1e-12)


async def test_bounded_retry_gives_up_at_the_deadline_with_the_callers_error() -> None:
    """Deadline 1 s, waits at their ceilings: 0.2 + 0.4, then the third wait is cut from
    0.8 to the 0.4 s left; the try at the deadline fails, and the policy gives up."""
    fake = FakeTime()
    op = FailingOp(failures=1000)

    def exhausted(exc: BaseException) -> BaseException:
        return TimeoutError(f"gave up after {exc}")

    with pytest.raises(TimeoutError, match="gave up after failure 4") as caught:
        await retry(
            "op",
            op,
            retry_on=(Flaky,),
            deadline_s=1.0,
            exhausted=exhausted,
            sleep=fake.sleep,
            clock=fake.clock,
            uniform=highest,
        )
    assert isinstance(caught.value.__cause__, Flaky)
    assert op.calls == 4
    assert fake.waits == pytest.approx([0.2, 0.4, 0.4], abs=1e-12)
    assert fake.now == pytest.approx(1001.0, abs=1e-9)


async def test_bounded_retry_that_succeeds_before_the_deadline_returns() -> None:
    fake = FakeTime()
    op = FailingOp(failures=2)
    result = await retry(
        "op",
        op,
        retry_on=(Flaky,),
        deadline_s=1.0,
        sleep=fake.sleep,
        clock=fake.clock,
        uniform=highest,
    )
    assert result == "done" and op.calls == 3


async def test_bounded_retry_without_an_error_factory_reraises_the_last_failure() -> None:
    fake = FakeTime()
    op = FailingOp(failures=1000)
    with pytest.raises(Flaky, match="failure 2"):
        await retry(
            "op",
            op,
            retry_on=(Flaky,),
            deadline_s=0.2,
            sleep=fake.sleep,
            clock=fake.clock,
            uniform=highest,
        )
    assert op.calls == 2


async def test_give_up_reraises_after_the_counted_failures() -> None:
    """The worker's rule while stopping: give up at the third failure in a row."""
    fake = FakeTime()
    op = FailingOp(failures=1000)
    with pytest.raises(Flaky, match="failure 3"):
        await retry(
            "op",
            op,
            retry_on=(Flaky,),
            give_up=lambda failures: failures > 2,
            sleep=fake.sleep,
            clock=fake.clock,
            uniform=highest,
        )
    assert op.calls == 3
    assert len(fake.waits) == 2


async def test_never_retry_and_unlisted_errors_are_raised_at_once() -> None:
    fake = FakeTime()
    seen: list[BaseException] = []
    fatal = FailingOp(failures=1, error=Fatal)
    with pytest.raises(Fatal):
        await retry(
            "op",
            fatal,
            retry_on=(Flaky,),
            never_retry=(Fatal,),
            on_failure=seen.append,
            sleep=fake.sleep,
            clock=fake.clock,
        )
    other = FailingOp(failures=1, error=KeyError)
    with pytest.raises(KeyError):
        await retry("op", other, retry_on=(Flaky,), sleep=fake.sleep, clock=fake.clock)
    assert (fatal.calls, other.calls) == (1, 1)
    assert fake.waits == [] and seen == []
