"""The sink's loop: output topic → PostgreSQL, one transaction per fetched batch.

The sink is a member of its own consumer group (default ``<kafka.group_id>.sink``) on
``output.topic``, with auto-commit off. For every batch: map the records
(:func:`~stream_dp.sink.batch.assemble`), store them in one database transaction
(:func:`~stream_dp.sink.store.store_batch`), and only after that transaction has committed,
commit the batch's offsets to Kafka. A crash anywhere before the Kafka commit re-reads the
batch, and storing it again changes nothing; a crash after it re-reads nothing. So the
tables hold every record of the topic once, whatever the crashes.

A record that cannot be stored is kept out, logged (topic, partition, offset, reason — never
its content) and written to ``stream_dp.dead_letters``; the sink goes on. When the database
refuses a batch for its data (a value PostgreSQL cannot hold), the batch is stored record by
record so that only the culprit is dead-lettered — unless every record of the batch is
refused with the same SQLSTATE (or one names a NOT NULL column the sink does not write):
that is a changed table, not bad data, so the sink stops consuming without committing or
dead-lettering anything, is not ready, sets ``stream_dp_sink_halted`` and logs what to fix;
a restart after the fix stores the batch. When the database or the broker is unreachable,
the sink retries with back-off and is not ready meanwhile. Deadlocks and serialization
failures are retried a bounded number of times with jittered back-off, then the sink stops
with an error (nothing committed). Every session sets ``lock_timeout`` and
``statement_timeout``, and the tables are checked at start
(:func:`~stream_dp.sink.schema.check_tables`). A committed offset outside the topic's log
(records deleted before the sink stored them, a recreated topic) is never skipped silently:
ERROR, ``stream_dp_sink_offset_out_of_range_total``, then on from the log start
(:mod:`stream_dp.sink.offsets`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

import psycopg
import psycopg.errors

from stream_dp.broker.probe import KeptProbe, watch_broker
from stream_dp.clients.offset_range import OFFSET_ERRORS
from stream_dp.clients.partition_drain import PartitionDrain
from stream_dp.config import Config
from stream_dp.errors import StreamDPError
from stream_dp.kafka_client import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from stream_dp.kafka_client.client_options import client_kwargs
from stream_dp.kafka_client.errors import KafkaError
from stream_dp.ops.health import Health
from stream_dp.retry import Backoff, retry
from stream_dp.sink import LOCK_TIMEOUT_S, STATEMENT_TIMEOUT_S
from stream_dp.sink.batch import BadPosition, Batch, Consumed, assemble
from stream_dp.sink.metrics import SinkMetrics
from stream_dp.sink.offsets import SinkOffsets
from stream_dp.sink.rows import BadRecord
from stream_dp.sink.schema import SCHEMA, Conn, check_tables, migrate
from stream_dp.sink.store import StoreResult, store_batch

log = logging.getLogger(__name__)

T = TypeVar("T")


class SinkError(StreamDPError):
    """The sink cannot go on (the message says what to change)."""


class DatabaseChangedError(SinkError):
    """The database refused a whole batch alike: its tables changed under the sink."""


#: Readiness of the sink: all three must hold.
SINK_COMPONENTS: Final = (
    "database_connected",
    "schema_ready",
    "broker_reachable",
    "partitions_assigned",
)

#: application_name of the sink's database sessions (pg_stat_activity).
APPLICATION_NAME: Final = "stream-dp sink"
MAX_RECORDS_PER_BATCH: Final = 5_000
FETCH_TIMEOUT_MS: Final = 500
#: Wait after a failed fetch before fetching again (the consumer reconnects meanwhile).
FETCH_RETRY_S: Final = 0.5
#: Transient conflicts between concurrent writers: retried with jittered back-off, a bounded
#: number of times in a row, then the sink stops (nothing committed).
_CONFLICTS = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)
MAX_CONFLICT_TRIES: Final = 8
CONFLICT_BACKOFF: Final = Backoff(base_s=0.05, cap_s=2.0)
#: SQLSTATE not_null_violation: the sink writes every column it knows, so this names a
#: column added under it (the parser already refused records with a missing field).
_NOT_NULL_VIOLATION: Final = "23502"
#: The database refused the data itself (a value it cannot hold, an index entry too large):
#: retrying the same records cannot help.
_REFUSED_DATA = (
    psycopg.errors.DataError,
    psycopg.errors.IntegrityError,
    psycopg.errors.ProgramLimitExceeded,
)


def default_group_id(config: Config) -> str:
    """The sink's consumer group: its own, derived from the worker's."""
    return f"{config.kafka.group_id}.sink"


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, sink: Sink) -> None:
        self.sink = sink

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        self.sink.on_revoked(list(revoked))

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self.sink.on_assigned(list(assigned))


class Sink:
    """Output topic → PostgreSQL. ``run()`` until :meth:`request_stop`."""

    def __init__(
        self,
        config: Config,
        dsn: str,
        *,
        group_id: str | None = None,
        bootstrap_servers: str | None = None,
        metrics: SinkMetrics | None = None,
        health: Health | None = None,
        max_records_per_batch: int = MAX_RECORDS_PER_BATCH,
        lock_timeout_s: float = LOCK_TIMEOUT_S,
        statement_timeout_s: float = STATEMENT_TIMEOUT_S,
        max_conflict_tries: int = MAX_CONFLICT_TRIES,
        conflict_backoff: Backoff = CONFLICT_BACKOFF,
    ) -> None:
        for name, timeout_s in (
            ("lock_timeout_s", lock_timeout_s),
            ("statement_timeout_s", statement_timeout_s),
        ):
            if not timeout_s > 0:
                raise SinkError(f"{name} must be a positive number of seconds, got {timeout_s}")
        if max_conflict_tries < 1:
            raise SinkError(f"max_conflict_tries must be at least 1, got {max_conflict_tries}")
        self.lock_timeout_s = lock_timeout_s
        self.statement_timeout_s = statement_timeout_s
        self._max_conflict_tries = max_conflict_tries
        self._conflict_backoff = conflict_backoff
        self.config = config
        self.topic = config.output.topic
        self.group_id = group_id or default_group_id(config)
        self.bootstrap = bootstrap_servers or config.kafka.bootstrap_servers
        self.metrics = metrics if metrics is not None else SinkMetrics()
        self.health = (
            health
            if health is not None
            else Health(metrics=self.metrics, components=SINK_COMPONENTS)
        )
        self.offsets = SinkOffsets(self.topic, self.metrics)
        self._dsn = dsn
        self._max_records = max_records_per_batch
        self._conn: Conn | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._drain: PartitionDrain | None = None
        self._assigned: set[TopicPartition] = set()
        self._stopping = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    def request_stop(self) -> None:
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    # -- lifecycle ------------------------------------------------------------------------
    async def run(self) -> None:
        kafka = self.config.kafka
        try:
            try:
                await self._database()
            except psycopg.OperationalError:
                if self.stopping:
                    return  # asked to stop while the database was unreachable
                raise
            self._consumer = AIOKafkaConsumer(
                group_id=self.group_id,
                enable_auto_commit=False,
                # never a silent jump: stream_dp.sink.offsets positions (from the log start)
                auto_offset_reset="none",
                session_timeout_ms=kafka.session_timeout_ms,
                heartbeat_interval_ms=kafka.heartbeat_interval_ms,
                **client_kwargs(kafka, bootstrap_servers=self.bootstrap),
            )
            self._consumer.subscribe([self.topic], listener=_Rebalance(self))
            self._drain = PartitionDrain(self._consumer)
            monitor = asyncio.create_task(self._monitor_broker())
            self._tasks.add(monitor)
            await self._retry_broker("start consumer", self._consumer.start)
            log.info(
                "sink consuming %s in group %s",
                self.topic,
                self.group_id,
                extra={"topic": self.topic},
            )
            await self._loop()
        finally:
            await self._shutdown()

    async def _shutdown(self) -> None:
        self._stopping.set()  # background tasks also end on the flag
        tasks, self._tasks = self._tasks, set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._consumer is not None:
            with contextlib.suppress(KafkaError, asyncio.TimeoutError):
                await asyncio.wait_for(self._consumer.stop(), timeout=10)
            self._consumer = None
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                await self._conn.close()
            self._conn = None
        for component in SINK_COMPONENTS:
            self.health.set(component, False)

    async def _monitor_broker(self) -> None:
        """Watch the broker (:func:`~stream_dp.broker.probe.watch_broker`): not ready while
        it does not answer."""
        probe = KeptProbe(self.bootstrap, kafka=self.config.kafka)
        await watch_broker(
            probe,
            on_result=lambda ok: self.health.set("broker_reachable", ok),
            stopping=lambda: self.stopping,
        )

    def on_assigned(self, assigned: list[TopicPartition]) -> None:
        self._assigned |= set(assigned)
        self.health.set("partitions_assigned", bool(self._assigned))
        log.info(
            "partitions assigned: %s",
            ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(assigned)) or "none",
        )

    def on_revoked(self, revoked: list[TopicPartition]) -> None:
        # Nothing to flush: each batch is stored and committed before the next fetch.
        self._assigned -= set(revoked)
        for tp in revoked:
            with contextlib.suppress(KeyError):
                self.metrics.consumer_lag.remove(str(tp.partition))
        self.health.set("partitions_assigned", bool(self._assigned))

    # -- database -------------------------------------------------------------------------
    async def _database(self) -> Conn:
        """The open connection; (re)connects and migrates with back-off until it works."""
        if self._conn is not None and not self._conn.closed:
            return self._conn
        conn = await retry(
            "connect to the database",
            self._connect_and_migrate,
            retry_on=(psycopg.OperationalError,),
            give_up=lambda failures: self.stopping,
            on_failure=self._database_failed,
            describe=_describe_connect_error,
        )
        self._conn = conn
        self.health.set("database_connected", True)
        self.health.set("schema_ready", True)
        return conn

    async def _connect_and_migrate(self) -> Conn:
        try:
            conn: Conn = await psycopg.AsyncConnection.connect(
                self._dsn, application_name=APPLICATION_NAME
            )
            try:
                await conn.execute(
                    "SELECT set_config('lock_timeout', %s, false),"
                    " set_config('statement_timeout', %s, false)",
                    (_ms(self.lock_timeout_s), _ms(self.statement_timeout_s)),
                )
                await conn.commit()
                applied = await migrate(conn)
                await check_tables(conn)
                await conn.commit()
            except BaseException:
                with contextlib.suppress(psycopg.Error):
                    await conn.close()
                raise
        except psycopg.OperationalError:
            raise  # retried by _database
        except psycopg.Error as exc:
            raise SinkError(
                f"cannot create or migrate the {SCHEMA} schema ({_describe(exc)}); the "
                "sink's database user needs CREATE on the database, or the schema must "
                "exist and belong to that user"
            ) from None
        if applied:
            log.info("database schema migrated to version %d", applied[-1])
        return conn

    def _database_failed(self, exc: BaseException) -> None:
        self.metrics.database_errors.inc()
        self.health.set("database_connected", False)

    async def _store(self, batch: Batch) -> StoreResult:
        """Store with retries: bounded and jittered after a deadlock, with back-off after a
        lost connection or a timeout, record by record when the database refuses the data."""
        try:
            return await retry(
                "store a batch",
                lambda: self._store_once(batch),
                retry_on=(psycopg.OperationalError,),
                # some are OperationalErrors (SQLSTATE class 54); retrying cannot help them
                never_retry=_REFUSED_DATA,
                give_up=lambda failures: self.stopping and failures > 2,
                on_failure=self._database_failed,
                describe=_describe,
            )
        except _ConnectGaveUp as gave_up:
            raise gave_up.error from None

    async def _store_once(self, batch: Batch) -> StoreResult:
        """One try at storing ``batch``; an OperationalError (connection lost, a timeout)
        closes the connection and is raised for :meth:`_store` to retry after a back-off."""
        try:
            conn = await self._database()
        except psycopg.OperationalError as exc:
            # _database already retried (it gives up only when the sink stops): not a
            # failure of this store for _store to retry again
            raise _ConnectGaveUp(exc) from exc
        started = time.perf_counter()
        try:
            try:
                result = await self._resolving_conflicts(lambda: store_batch(conn, batch))
            except _REFUSED_DATA as exc:
                self.metrics.database_errors.inc()
                log.warning(
                    "the database refused the batch (%s); storing it record by record",
                    _describe(exc),
                )
                result = await self._resolving_conflicts(lambda: self._one_by_one(conn, batch))
        except psycopg.OperationalError:
            with contextlib.suppress(psycopg.Error):
                await conn.close()
            self._conn = None
            raise
        self.metrics.transaction.observe(time.perf_counter() - started)
        return result

    async def _resolving_conflicts(self, op: Callable[[], Awaitable[T]]) -> T:
        """``op`` (one transaction), retried after a deadlock or serialization failure with
        jittered back-off, at most ``max_conflict_tries`` times in a row; then a SinkError."""
        tries = self._max_conflict_tries

        def conflict(exc: BaseException) -> None:
            self.metrics.database_errors.inc()

        try:
            return await retry(
                "store a batch (transaction conflict)",
                op,
                retry_on=_CONFLICTS,
                backoff=self._conflict_backoff,
                give_up=lambda failures: failures >= tries or self.stopping,
                on_failure=conflict,
                describe=_describe,
                log_level=logging.INFO,
            )
        except _CONFLICTS as exc:
            if self.stopping:
                raise
            raise SinkError(
                f"the database aborted the batch's transaction {tries} times in a row "
                f"({_describe(exc)}); nothing was committed and the next sink reads the batch "
                "again. Look for another writer locking the stream_dp tables (pg_stat_activity, "
                "pg_locks) or a stricter default_transaction_isolation for the sink's user"
            ) from None

    async def _one_by_one(self, conn: Conn, batch: Batch) -> StoreResult:
        total, bad = await store_record_by_record(conn, batch)
        for position in bad:
            _log_bad(position)
            self.metrics.bad_records.labels(reason=position.bad.reason).inc()
        return total

    # -- loop -----------------------------------------------------------------------------
    async def _loop(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        while not self.stopping:
            try:
                fetched = await self._fetch(consumer)
                if fetched is None:
                    break
            except OFFSET_ERRORS as exc:
                try:
                    await self.offsets.resolve(consumer, exc)
                except KafkaError as failed:  # the next fetch meets the same partition
                    self.metrics.broker_errors.inc()
                    log.warning("positioning failed (%s); retrying", type(failed).__name__)
                    await asyncio.sleep(FETCH_RETRY_S)
                continue
            except KafkaError as exc:
                self.metrics.broker_errors.inc()
                log.warning("fetch failed (%s); retrying", type(exc).__name__)
                await asyncio.sleep(FETCH_RETRY_S)
                continue
            if fetched:
                try:
                    await self._handle(consumer, fetched)
                except DatabaseChangedError as exc:
                    await self._halt(exc)
                    return
                except psycopg.OperationalError:
                    if not self.stopping:
                        raise
                    log.warning(
                        "stopping while the database is unreachable: the batch in hand is "
                        "neither stored nor committed, the next sink reads it again"
                    )
                    return
            self.health.beat()

    async def _halt(self, exc: DatabaseChangedError) -> None:
        """Stop consuming (leave the group, commit nothing), stay up not ready with
        ``stream_dp_sink_halted`` 1 until asked to stop."""
        self.metrics.halted.set(1)
        self.health.set("schema_ready", False)
        log.error("%s", exc)
        if self._consumer is not None:
            with contextlib.suppress(KafkaError, asyncio.TimeoutError):
                await asyncio.wait_for(self._consumer.stop(), timeout=10)
            self._consumer = None
        await self._stopping.wait()

    async def _fetch(self, consumer: AIOKafkaConsumer) -> dict[TopicPartition, list[Any]] | None:
        """The next batch, or None once a stop is requested: aiokafka's ``getmany`` ignores
        its timeout while the member has no assignment, and a stop must not wait for the
        group (the worker's loop does the same)."""
        # One partition at a time: a batch the sink cannot parse in one partition must not
        # take the records already taken from others with it (stream_dp.clients.partition_drain).
        drain = self._drain if self._drain is not None else PartitionDrain(consumer)
        fetch = asyncio.ensure_future(
            drain.getmany(timeout_ms=FETCH_TIMEOUT_MS, max_records=self._max_records)
        )
        stop = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({fetch, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not fetch.done():
                fetch.cancel()  # records it took are lost with it: nothing is committed now
                with contextlib.suppress(asyncio.CancelledError, KafkaError):
                    await fetch
        return fetch.result() if not fetch.cancelled() else None

    async def _handle(
        self, consumer: AIOKafkaConsumer, fetched: dict[TopicPartition, list[Any]]
    ) -> None:
        records = [
            Consumed(tp.topic, tp.partition, m.offset, m.value)
            for tp in sorted(fetched)
            for m in fetched[tp]
        ]
        batch = assemble(records)
        self.metrics.records_consumed.inc(batch.records)
        for bad in batch.bad:
            _log_bad(bad)
            self.metrics.bad_records.labels(reason=bad.bad.reason).inc()
        result = await self._store(batch)
        self._count(result)
        offsets = {TopicPartition(t, p): off for (t, p), off in batch.next_offsets.items()}
        try:
            await consumer.commit(offsets)
        except KafkaError as exc:
            # Stored but not committed: the records come again (here or to the partition's
            # next owner) and change nothing then.
            self.metrics.broker_errors.inc()
            log.warning("offset commit failed (%s); the batch will be re-read", _describe(exc))
        else:
            self.metrics.last_commit.set(time.time())
        for tp, msgs in fetched.items():
            high = consumer.highwater(tp)
            if msgs and high is not None:
                self.metrics.set_consumer_lag(tp.partition, high - msgs[-1].offset - 1)

    def _count(self, result: StoreResult) -> None:
        m = self.metrics
        m.releases_stored.inc(result.releases_inserted)
        m.window_records_stored.inc(result.window_records_inserted)
        m.duplicates_skipped.inc(result.duplicates)
        m.conflicts.inc(result.conflicts)
        m.windows_completed.inc(len(result.completed))
        for query, window_start in result.completed:
            log.info("window complete", extra={"query": query, "window": window_start.isoformat()})

    async def _retry_broker(self, what: str, op: Callable[[], Awaitable[T]]) -> T:
        def failed(exc: BaseException) -> None:
            self.metrics.broker_errors.inc()

        return await retry(
            what,
            op,
            retry_on=(KafkaError,),
            give_up=lambda failures: self.stopping and failures > 2,
            on_failure=failed,
        )


async def store_record_by_record(conn: Conn, batch: Batch) -> tuple[StoreResult, list[BadPosition]]:
    """Store each record under a savepoint of one transaction and dead-letter the ones the
    database refuses (returned) — unless the refusals say the tables changed: then
    :class:`DatabaseChangedError` and the whole transaction is rolled back (nothing stored,
    nothing dead-lettered)."""
    total = StoreResult()
    refused: list[tuple[Consumed, str, str]] = []
    bad: list[BadPosition] = []
    async with conn.transaction():
        for single in batch.split():
            try:
                total.merge(await store_batch(conn, single))  # a savepoint
            except _REFUSED_DATA as exc:
                (record,) = single.consumed
                refused.append((record, _describe(exc), getattr(exc, "sqlstate", None) or ""))
        states = {state for _, _, state in refused}
        if _NOT_NULL_VIOLATION in states or (
            len(refused) == batch.records >= 2 and len(states) == 1
        ):
            raise DatabaseChangedError(
                f"the database refused {len(refused)} of the {batch.records} records of a "
                f"batch ({refused[0][1]}): its tables have changed under the sink (e.g. a "
                "column added NOT NULL without a default), this is not bad data. Nothing "
                "was stored or dead-lettered and no offset committed; the sink stopped "
                "consuming. Give the column a default or drop it (a restarted sink checks "
                "the tables and names what it cannot write), then restart the sink"
            )
        if refused:
            bad = [
                BadPosition(
                    record.topic,
                    record.partition,
                    record.offset,
                    BadRecord("rejected_by_database", f"PostgreSQL refused it: {described}"),
                )
                for record, described, _ in refused
            ]
            total.merge(await store_batch(conn, Batch(bad=bad, records=len(bad))))
    return total, bad


class _ConnectGaveUp(Exception):
    """Carries the OperationalError with which :meth:`Sink._database` gave up."""

    def __init__(self, error: psycopg.OperationalError) -> None:
        super().__init__(str(error))
        self.error = error


def _ms(seconds: float) -> str:
    """A PostgreSQL duration setting in whole milliseconds (at least 1: 0 would disable it)."""
    return f"{max(1, round(seconds * 1000))}ms"


def _describe(exc: BaseException) -> str:
    """The error's class and SQLSTATE, never its message (which may quote a value)."""
    state = getattr(exc, "sqlstate", None)
    return f"{type(exc).__name__}" + (f", SQLSTATE {state}" if state else "")


def _describe_connect_error(exc: BaseException) -> str:
    """A failed connection's class and libpq's first line: it names host, user and cause,
    never row data."""
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return _describe(exc) + (f": {reason}" if reason else "")


def _log_bad(bad: BadPosition) -> None:
    log.warning(
        "output record not stored (%s): %s; its position is kept in stream_dp.dead_letters",
        bad.bad.reason,
        bad.bad.detail,
        extra={"topic": bad.topic, "partition": bad.partition, "offset": bad.offset},
    )
