"""The worker's producer: every write to Kafka, under the one retry policy.

:class:`Publisher` owns the aiokafka producer and retries each broker operation with
:func:`stream_dp.retry.retry` (exponential back-off with full jitter) under the worker's
rules: a *bounded* operation gives up after ``kafka.give_up_after_s`` with
:class:`BrokerUnavailableError` (the worker then stops without committing, and a restart
redoes what was not safely done); an unbounded one waits until it succeeds or the worker
stops; a membership error is never retried. Each failure is counted and marks the producer
disconnected on /health.

The producer does not linger (``linger_ms`` 0). Every write of the worker is handed over
whole, in record batches :func:`~stream_dp.pipeline.kafka.producing.send_all` builds itself,
and then awaited (at once, or stage 0's by the next iteration), so a linger could add no
record to a batch and only delayed each acknowledgement: with 5 ms, a
window close (partials, watermarks, the ledger parts, the published marker, the progress
record, the output, the tombstones: one awaited write after the other) spent most of its
wall time waiting for lingers, and a backlog with many windows to close ran at half the
events per second (bench/RESULTS.md, section 12, ``linger``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from stream_dp.clients.compacted import TopicDeletedError
from stream_dp.clients.connect import TopicGoneError, TopicNotAuthorizedError, topic_gone
from stream_dp.clients.idempotence import start_producer
from stream_dp.errors import StreamDPError
from stream_dp.kafka_client import AIOKafkaProducer
from stream_dp.kafka_client.errors import (
    CommitFailedError,
    IllegalGenerationError,
    KafkaError,
    RebalanceInProgressError,
    TopicAuthorizationFailedError,
    UnknownMemberIdError,
    UnknownTopicOrPartitionError,
)
from stream_dp.kafka_client.fetch_errors import principal_of
from stream_dp.ops.progress import report_progress
from stream_dp.pipeline.formats.ledger import LedgerRelease
from stream_dp.pipeline.formats.records import (
    OUTPUT_HEADERS,
    dead_letter_record,
    dumps,
    output_partition,
)
from stream_dp.pipeline.kafka.context import WorkerContext, WorkerPart
from stream_dp.pipeline.kafka.producing import Headers, Outgoing, enqueue_all, send_all
from stream_dp.pipeline.stages.ingest import DeadLetter
from stream_dp.pipeline.stages.offload import run_off_loop
from stream_dp.retry import retry

#: Largest record batch the producer builds (fewer, larger produce requests).
MAX_BATCH_BYTES = 512 * 1024
#: Turns of the event loop :meth:`Publisher.start_many` gives aiokafka's sender to write the
#: request (three on aiokafka 0.14, tests/integration/test_partials_in_flight.py).
HAND_OVER_TURNS = 3
#: A release with more records than this is encoded for the output topic off the loop.
OFF_LOOP_RECORDS = 2_000

#: What the group coordinator says when this member is no longer who it thinks it is.
MEMBERSHIP_ERRORS = (
    CommitFailedError,
    IllegalGenerationError,
    UnknownMemberIdError,
    RebalanceInProgressError,
)


class BrokerUnavailableError(StreamDPError):
    """A broker write kept failing for ``kafka.give_up_after_s``: the worker stops without
    committing, and its supervisor restarts it."""


class Publisher(WorkerPart):
    """Sends to Kafka with the worker's retry policy (see the module docstring)."""

    def __init__(self, context: WorkerContext) -> None:
        super().__init__(context)
        config = context.config
        self._ledger_topic = config.output.ledger_topic
        out = config.output
        #: Topics whose loss holds the worker as a lost ledger (TopicDeletedError), and the
        #: others it writes, whose loss stops it (TopicGoneError): a write that fails is
        #: checked against the broker's topic list (:meth:`_unless_gone`).
        self._held_if_gone = {out.ledger_topic, out.continual_topic, config.erasure.log_topic}
        self._stopped_if_gone = {
            out.topic,
            out.dead_letter_topic,
            out.partials_topic,
            out.repartition_topic,
            config.erasure.responses_topic,
            *(export.topic for export in config.exports),
        }
        self._max_bytes = config.kafka.max_message_bytes
        self._principal = principal_of(config.kafka)
        self.producer: AIOKafkaProducer | None = None
        #: The output topic's partitions (set at start).
        self.output_partitions: list[int] = [0]

    async def start(self, client_options: dict[str, Any]) -> None:
        """Create and start the producer (retried until it starts or the worker stops):
        idempotent where the broker gives producer ids (not the embedded broker)."""
        options = {
            "acks": "all",
            "linger_ms": 0,  # every write is awaited at once (module docstring)
            "max_request_size": self._max_bytes,
            "max_batch_size": min(self._max_bytes, MAX_BATCH_BYTES),
        }
        self.producer = await self.retry(
            "start producer", lambda: start_producer(client_options, options), bounded=False
        )
        self.health.set("producer_connected", True)

    async def partitions(
        self, topic: str, *, bounded: bool = False, fresh: bool = False
    ) -> list[int]:
        """The topic's partitions, sorted (retried). ``fresh``: asked of the broker now, not
        read from the producer's metadata (refreshed only every ``metadata.max.age.ms``, five
        minutes: a partition count read from it can be minutes old); one of the
        deployment's own topics the broker no longer lists raises at once, as a failed write
        to it does (:meth:`_unless_gone`)."""

        if fresh:

            async def ask() -> list[int]:
                found = (await self._ask_partitions([topic]))[topic]
                if isinstance(found, TopicAuthorizationFailedError):
                    raise self._refused(topic, "Describe")  # only a grant clears it
                if isinstance(found, KafkaError):
                    # One of the deployment's own topics deleted: asking again cannot help.
                    await self._unless_gone(topic)
                    raise found  # retried as the request's own failures are
                return found

            counted: list[int] = await self.retry(f"{topic} metadata", ask, bounded=bounded)
            return counted

        async def lookup() -> list[int]:
            assert self.producer is not None
            try:
                return sorted(await self.producer.partitions_for(topic))
            except TopicAuthorizationFailedError:
                raise self._refused(topic, "Describe") from None

        result: list[int] = await self.retry(f"{topic} metadata", lookup, bounded=bounded)
        return result

    async def fresh_partitions(
        self, topics: Sequence[str], *, bounded: bool = False
    ) -> dict[str, list[int] | KafkaError]:
        """Each topic's partitions, sorted, asked of the broker now in one metadata request
        (retried while the request fails). A topic the response gives no partitions for
        (deleted, not authorized, an invalid name) maps to an error instead, not retried
        here: the other topics' counts are still given (:meth:`partitions` with ``fresh``
        raises it and retries)."""
        what = f"{', '.join(topics)} metadata"
        found: dict[str, list[int] | KafkaError] = await self.retry(
            what, lambda: self._ask_partitions(topics), bounded=bounded
        )
        return found

    async def _ask_partitions(self, topics: Sequence[str]) -> dict[str, list[int] | KafkaError]:
        """One metadata request for ``topics``; each one's partitions or why there are none.
        Asked without waiting per topic: the client's own wait for a topic's metadata
        (``partitions_for``) repeats the request until its request timeout (40 s) while
        one topic fails, and held the others' counts for that long."""
        assert self.producer is not None
        client = self.producer.client
        for topic in topics:
            client.add_topic(topic)  # the client follows the topic: in the request below
        await self.producer.client.force_metadata_update()
        cluster = client.cluster
        found: dict[str, list[int] | KafkaError] = {}
        for topic in topics:
            partitions = cluster.partitions_for_topic(topic)
            if partitions is not None:
                found[topic] = sorted(partitions)
            elif topic in cluster.unauthorized_topics:
                found[topic] = TopicAuthorizationFailedError(topic)
            else:
                found[topic] = UnknownTopicOrPartitionError(
                    f"{topic}: no partitions in the metadata response"
                )
        return found

    async def retry(
        self,
        what: str,
        op: Callable[[], Awaitable[Any]],
        *,
        bounded: bool = True,
        never_retry: tuple[type[BaseException], ...] = (),
    ) -> Any:
        """Retry a broker operation (:func:`~stream_dp.retry.retry`: exponential
        back-off with full jitter). ``bounded``: give up after
        ``kafka.give_up_after_s`` (BrokerUnavailableError — the caller holds state that must
        not wait for ever); otherwise until it succeeds or the worker stops. ``never_retry``:
        errors the caller handles itself (raised at once, as membership errors are)."""
        give_up_after_s = self.config.kafka.give_up_after_s

        def failed(exc: BaseException) -> None:
            self.metrics.broker_errors.inc()
            self.health.set("producer_connected", False)

        def exhausted(exc: BaseException) -> BaseException:
            return BrokerUnavailableError(
                f"{what} kept failing for {give_up_after_s:g} s ({type(exc).__name__}); "
                "stopping without committing so that a restart redoes what was not safely "
                "done (raise kafka.give_up_after_s to wait longer)"
            )

        return await retry(
            what,
            op,
            retry_on=(KafkaError,),
            never_retry=MEMBERSHIP_ERRORS + never_retry,
            deadline_s=give_up_after_s if bounded else None,
            exhausted=exhausted,
            give_up=lambda failures: self._stopping.is_set() and failures > 2,
            on_failure=failed,
        )

    async def send(
        self, topic: str, key: str | None, value: bytes, *, partition: int | None = None
    ) -> int:
        """Send one record and wait for its acknowledgement (not retried); its offset. A
        refused write raises TopicNotAuthorizedError, which the callers' retries do not
        repeat (the ledger's fences and records retry until the worker stops)."""
        assert self.producer is not None
        if topic == self._ledger_topic and self._faults.ledger_delay_s:
            await asyncio.sleep(self._faults.ledger_delay_s)
        try:
            sent = await self.producer.send_and_wait(
                topic, value, key=None if key is None else key.encode(), partition=partition
            )
        except TopicAuthorizationFailedError:
            raise self._refused(topic, "Write") from None  # only a grant clears it
        return int(sent.offset)

    async def send_many(self, topic: str, items: Sequence[Outgoing], headers: Headers = ()) -> None:
        """Send a batch, each record with ``headers``, and wait for every acknowledgement
        (retried as a whole, bounded)."""
        assert self.producer is not None
        producer = self.producer
        if topic == self._ledger_topic and self._faults.ledger_delay_s:
            await asyncio.sleep(self._faults.ledger_delay_s)

        async def attempt() -> None:
            try:
                await send_all(producer, topic, items, headers)
            except TopicAuthorizationFailedError:
                raise self._refused(topic, "Write") from None  # only a grant clears it
            except KafkaError:
                await self._unless_gone(topic)
                raise

        await self.retry(f"produce to {topic}", attempt)
        self.health.set("producer_connected", True)
        report_progress("write")  # acknowledged: a long run of writes is moving

    async def start_many(
        self, topic: str, items: Sequence[Outgoing], headers: Headers = ()
    ) -> asyncio.Future[None]:
        """Hand a batch to the producer now, and return what ends once every record is
        acknowledged: a write left in flight while the caller goes on. If that first
        attempt fails, the write is redone whole as :meth:`send_many` does (retried,
        bounded); the returned task raises only once that gives up."""
        assert self.producer is not None
        producer = self.producer
        try:
            first: asyncio.Future[Any] | None = await enqueue_all(producer, topic, items, headers)
        except KafkaError:
            self.metrics.broker_errors.inc()
            first = None
        # The request is written now, not when the caller next waits for something (a
        # batch's work that does not yield would hold it back): aiokafka 0.14 takes three
        # turns of the loop for it (the accumulator wakes the sender, the sender drains the
        # batches into a produce task, that task writes the request).
        for _ in range(HAND_OVER_TURNS):
            await asyncio.sleep(0)

        async def acknowledged() -> None:
            if first is not None:
                try:
                    await first
                except KafkaError:
                    self.metrics.broker_errors.inc()
                    self.health.set("producer_connected", False)
                else:
                    self.health.set("producer_connected", True)
                    report_progress("write")
                    return
            await self.send_many(topic, items, headers)

        return asyncio.ensure_future(acknowledged())

    def _refused(self, topic: str, operation: str) -> TopicNotAuthorizedError:
        """The stop for a topic the broker refuses this worker's principal (an ACL): not
        retried, and not taken for a deleted topic (:class:`TopicNotAuthorizedError`)."""
        self.metrics.broker_errors.inc()
        return TopicNotAuthorizedError(topic, self._principal, operation)

    async def _unless_gone(self, topic: str) -> None:
        """After a failed write to one of the worker's own topics: TopicDeletedError (the
        ledger, continual topic or erasure log: the worker holds) or TopicGoneError (its
        other topics: the worker stops) when the broker's topic list has no ``topic``; a
        deleted topic stays deleted (stream_dp/kafka_client/metadata.py), so retrying the
        write cannot succeed."""
        if topic not in self._held_if_gone | self._stopped_if_gone:
            return  # not one of the deployment's topics (`stream-dp topics apply` makes them all)
        assert self.producer is not None
        if not await topic_gone(self.producer.client, topic):
            return
        if topic in self._held_if_gone:
            raise TopicDeletedError(topic)
        raise TopicGoneError(topic)

    async def publish_output(self, rel: LedgerRelease) -> None:
        """A release's output records, all on the (query, window)'s partition, the window
        record last: a chunk at a time (:meth:`LedgerRelease.output_ranges`), each encoded
        (off the loop when large) and acknowledged before the next is made, so that a large
        release's records are never all held (docs/operations.md#memory-at-release)."""
        parts = self.output_partitions
        target = parts[output_partition(rel.query, rel.window_start_s, len(parts))]
        for lo, hi in rel.output_ranges():
            if hi - lo > OFF_LOOP_RECORDS:
                keys, values = await run_off_loop(rel.output_range, lo, hi)
            else:
                keys, values = rel.output_range(lo, hi)
            items = [(k, v, target) for k, v in zip(keys, values, strict=True)]
            del keys, values
            await self.send_many(self.config.output.topic, items, OUTPUT_HEADERS)

    async def publish_dead_letters(self, dead: Sequence[DeadLetter]) -> None:
        """Bad input to the dead-letter topic, keyed by where it came from."""
        now = time.time()
        items: list[Outgoing] = []
        for d in dead:
            topic = d.topic or self.config.input.topic
            record = dead_letter_record(
                reason=d.reason,
                detail=d.detail,
                source_topic=topic,
                source_partition=d.partition,
                source_offset=d.offset,
                payload=d.payload,
                now_s=now,
            )
            items.append((f"{topic}|{d.partition}|{d.offset}", dumps(record), None))
        await self.send_many(self.config.output.dead_letter_topic, items)

    async def flush(self) -> None:
        if self.producer is not None:
            await self.producer.flush()

    async def stop(self) -> None:
        if self.producer is not None:
            await self.producer.stop()
