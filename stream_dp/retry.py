"""One retry policy for every operation against the broker (and the sink's database).

Exponential back-off with *full jitter*: after the n-th failure in a row (n = 0, 1, …) the
wait is drawn uniformly from ``[0, min(cap_s, base_s · 2ⁿ)]``. Many workers that lost the
same broker at the same moment therefore do not come back in lock-step, and the mean wait
still doubles until it reaches the cap.

:func:`retry` runs an operation until it succeeds, retrying only the exceptions it is told
to; it gives up

- after ``deadline_s`` seconds: the wait is shortened so as not to pass the deadline, one last
  try is made there, and when that fails too the caller's ``exhausted`` error is raised (from
  the last failure) — *bounded*, for callers that hold state which must not wait for ever;
- when ``give_up(failures)`` says so (e.g. the service is stopping), with the failure itself;
- never otherwise — *unbounded*, for callers that have nothing better to do than wait.

The clock, the sleep and the random source are parameters so that tests check the exact
waits and the moment of giving up without sleeping.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Jitter needs no secrecy, but the OS source keeps every draw in the package a CSPRNG one.
_system_random = secrets.SystemRandom()


@dataclass(frozen=True)
class Backoff:
    """Exponential back-off with full jitter: the wait after the n-th failure in a row is
    uniform in ``[0, ceiling_s(n)]``, ``ceiling_s(n) = min(cap_s, base_s · 2ⁿ)``."""

    base_s: float = 0.2
    cap_s: float = 5.0

    def __post_init__(self) -> None:
        if not 0 < self.base_s <= self.cap_s:
            raise ValueError(f"back-off needs 0 < base_s <= cap_s, got {self.base_s}, {self.cap_s}")

    def ceiling_s(self, failures_before: int) -> float:
        """The longest wait after ``failures_before`` + 1 failures in a row."""
        if failures_before >= 64:  # 2**64 · base_s is past any cap
            return self.cap_s
        return min(self.cap_s, self.base_s * 2.0**failures_before)

    def delay_s(
        self, failures_before: int, uniform: Callable[[float, float], float] | None = None
    ) -> float:
        """A jittered wait after ``failures_before`` + 1 failures in a row."""
        draw = uniform if uniform is not None else _system_random.uniform
        return draw(0.0, self.ceiling_s(failures_before))


#: The broker's and the database's back-off: ceilings 0.2, 0.4, 0.8, 1.6, 3.2, then 5 s.
BROKER_BACKOFF = Backoff(base_s=0.2, cap_s=5.0)


def _never(failures: int) -> bool:
    return False


def _nothing(exc: BaseException) -> None:
    return None


def _class_name(exc: BaseException) -> str:
    return type(exc).__name__


async def retry(
    what: str,
    op: Callable[[], Awaitable[T]],
    *,
    retry_on: tuple[type[BaseException], ...],
    never_retry: tuple[type[BaseException], ...] = (),
    backoff: Backoff = BROKER_BACKOFF,
    deadline_s: float | None = None,
    exhausted: Callable[[BaseException], BaseException] | None = None,
    give_up: Callable[[int], bool] = _never,
    on_failure: Callable[[BaseException], None] = _nothing,
    describe: Callable[[BaseException], str] = _class_name,
    log_level: int = logging.WARNING,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
    uniform: Callable[[float, float], float] | None = None,
) -> T:
    """Await ``op()`` until it returns, retrying the exceptions in ``retry_on``.

    ``never_retry``: subclasses of ``retry_on`` that are raised at once. ``on_failure`` is
    called with every retried failure (metrics, health) before the decision to give up.
    ``deadline_s`` (bounded): give up once this much time has passed since the first try,
    raising ``exhausted(last failure)`` (default: the failure itself). ``give_up(failures)``:
    re-raise the failure when it returns true (``failures`` counts failures so far, from 1).
    Each retry is logged at ``log_level`` as "<what> failed (<describe(failure)>); retrying
    in <wait> s"; the default names the exception's class only (a message may quote a value).
    """
    deadline = None if deadline_s is None else clock() + deadline_s
    failures = 0
    while True:
        try:
            return await op()
        except never_retry:
            raise
        except retry_on as exc:
            failures += 1
            on_failure(exc)
            if give_up(failures):
                raise
            delay = backoff.delay_s(failures - 1, uniform)
            if deadline is not None:
                remaining = deadline - clock()
                if remaining <= 0:
                    if exhausted is None:
                        raise
                    raise exhausted(exc) from exc
                delay = min(delay, remaining)
            log.log(log_level, "%s failed (%s); retrying in %.1f s", what, describe(exc), delay)
            await sleep(delay)
