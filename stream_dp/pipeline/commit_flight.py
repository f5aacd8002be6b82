"""The loop's offset commit: at most once a second, awaited by the next one instead of at once.

At the end of an iteration the worker commits the safe offsets that moved
(:meth:`~stream_dp.pipeline.kafka.membership.Membership.commit_in_loop`), at most once per
:data:`COMMIT_INTERVAL_S` of the iterations' monotonic clock: a worker fed a trickle turns its
loop several times a second, and each commit is a request to the coordinator. Committing
later only means more records read again after a crash, which is exactly-once already
(docs/exactly-once.md); one commit sends every safe offset that moved, so what is committed
together is one moment's safe offsets, whichever iteration sends it; a turn with nothing to
commit starts no interval, and a commit that failed (a lost membership) lets the next
iteration commit at once; a revocation and a graceful stop commit at once, whatever the time.
The commit is a
round trip to the group coordinator (on Apache Kafka a write to ``__consumer_offsets``,
acknowledged by its replicas) and nothing in the next iteration depends on its answer, so
the loop sends it and goes on fetching and processing while it is answered
(bench/idle_probe.py: the commit's wait was 5–9% of a backlog's wall time on Apache Kafka).

What keeps this as safe as a commit awaited at once:

* the offsets are computed when the commit is sent, from what is durable then (partials,
  releases and stage 0's repartitioned events acknowledged): safe offsets, whenever they land;
* one commit in flight at a time, and every commit — the next one of the loop, a revocation's,
  the graceful stop's — awaits the one in flight first, so committed offsets never go back
  (an older commit landing after a newer one) and a partition revoked, then read by its next
  owner, shows that owner every offset this member committed;
* a revocation waits until the commit in flight is answered before the rejoin goes on, also
  while an iteration holds the lock (:meth:`Membership.on_revoked`; there for at most half
  the session timeout: aiokafka sends no heartbeat while a rebalance callback runs);
* what the commit committed is recorded (skipped as unmoved next time) only once it is
  answered; a commit that fails raises from the next iteration's commit as it raised from
  its own before (a lost membership is counted, any other error stops the worker without
  committing), and one abandoned on an error exit is cancelled;
* a commit of a topic deleted under the worker is retried by aiokafka for ever (the topic
  stays deleted: no client of stream-dp creates it again): the next iteration gives it the
  request timeout, then asks the broker for its topics and stops the worker naming the one
  that is gone (:meth:`CommitInFlight.settle_unless_gone`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from stream_dp.clients.connect import TopicGoneError
from stream_dp.kafka_client import TopicPartition

#: Offsets as committed: an offset, or (offset, metadata) for keyed input's layout.
Offsets = dict[TopicPartition, Any]
#: The loop sends a commit at most this often (s; module docstring).
COMMIT_INTERVAL_S = 1.0


class CommitInFlight:
    """The loop's commit that has been sent and not yet awaited (module docstring)."""

    def __init__(self) -> None:
        self._sent: tuple[asyncio.Future[Any], Offsets] | None = None
        #: When (monotonic s) the loop last sent a commit that has not failed.
        self._sent_mono_s: float | None = None
        #: What was last committed (answered) per partition: an offset, or (offset, layout
        #: metadata).
        self.committed: Offsets = {}
        #: The group member id the last commit was sent under (its error, settled after a
        #: rejoin under a new id, is a loss the rejoin already saw).
        self.sent_by: str | None = None

    def moved(
        self,
        safe: Offsets,
        *,
        assigned: Collection[TopicPartition],
        revoked: Collection[TopicPartition],
        only: Collection[TopicPartition] | None = None,
    ) -> Offsets:
        """Of the ``safe`` offsets (of ``only``, if given), those that moved since committed,
        of partitions ``assigned`` and not ``revoked`` (during the iteration)."""
        return {
            tp: off
            for tp, off in safe.items()
            if (only is None or tp in only)
            and self.committed.get(tp) != off
            and tp in assigned
            and tp not in revoked
        }

    def due(self, now_mono_s: float) -> bool:
        """Whether the loop may send a commit at ``now_mono_s`` (:data:`COMMIT_INTERVAL_S`
        since the last one sent, or none sent, or the last one failed)."""
        last = self._sent_mono_s
        return last is None or now_mono_s - last >= COMMIT_INTERVAL_S

    def send(
        self,
        commit: Awaitable[Any],
        offsets: Offsets,
        now_mono_s: float,
        sent_by: str | None = None,
    ) -> None:
        """Start ``commit`` (of ``offsets``, at ``now_mono_s``, under the member id
        ``sent_by``) without awaiting it; the one before it is settled first
        (:meth:`settle`)."""
        assert self._sent is None, "one commit in flight: settle the last one first"
        self._sent = (asyncio.ensure_future(commit), offsets)
        self._sent_mono_s = now_mono_s
        self.sent_by = sent_by

    async def settle(self) -> None:
        """Await the commit in flight (if any) and record what it committed in
        :attr:`committed`. Raises what the commit raised (its offsets not recorded)."""
        sent, self._sent = self._sent, None
        if sent is None:
            return
        commit, offsets = sent
        try:
            await commit
        except BaseException:
            self._sent_mono_s = None  # the next iteration commits at once
            raise
        self.committed.update(offsets)

    async def settle_unless_gone(
        self, check_after_s: float, gone: Callable[[str], Awaitable[bool]]
    ) -> None:
        """:meth:`settle`; but a commit still unanswered after ``check_after_s`` whose
        offsets name a topic ``gone`` says the broker no longer has (deleted under the worker:
        aiokafka retries its commit for ever) is cancelled: TopicGoneError."""
        if self._sent is not None:
            commit, offsets = self._sent
            await asyncio.wait([commit], timeout=check_after_s)
            if not commit.done():
                for topic in sorted({tp.topic for tp in offsets}):
                    if await gone(topic):
                        await self.abandon()
                        raise TopicGoneError(topic)
        await self.settle()

    async def answered(self, timeout_s: float) -> None:
        """Wait until the commit in flight is answered, without settling it (its offsets and
        error stay for :meth:`settle`), or ``timeout_s`` (aiokafka retries a commit for as
        long as the coordinator is unavailable; a late answer commits safe offsets too)."""
        if self._sent is not None:
            await asyncio.wait([self._sent[0]], timeout=timeout_s)

    async def abandon(self) -> None:
        """Cancel the commit in flight (the worker stops without committing)."""
        sent, self._sent = self._sent, None
        if sent is None:
            return
        await cancel_and_reap(sent[0])


async def cancel_and_reap(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` (a write or commit in flight the worker abandons as it stops without
    committing) and wait for it; an error it ended with is retrieved, not raised: the worker
    is stopping on another error already."""
    task.cancel()
    await asyncio.wait([task])
    if not task.cancelled():
        task.exception()
