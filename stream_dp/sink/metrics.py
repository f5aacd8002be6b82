"""Prometheus metrics of the PostgreSQL sink, by the rules of :mod:`stream_dp.ops.metrics`.

Prefix ``stream_dp_sink_``, base units, ``_total`` on counters; labels only ``reason`` (a
bad-record reason code), ``partition`` (an output-topic partition number) and ``topic``
(the output topic's name). Counts of
records, rows and windows only: never a group key or a value.
"""

from __future__ import annotations

import platform
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

from stream_dp import __version__
from stream_dp.ops.exposition import Exposition
from stream_dp.ops.metrics import registry_sample_names
from stream_dp.sink.rows import BAD_REASONS

#: One batch's database transaction: 1 ms to 1 min.
TRANSACTION_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip


class SinkMetrics:
    """All metrics of one sink process, in a registry of its own."""

    def __init__(
        self, *, registry: CollectorRegistry | None = None, partitions: Iterable[int] = ()
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.records_consumed = Counter(
            "stream_dp_sink_records_consumed",
            "Records read from the output topic (bad ones and duplicates included).",
            registry=r,
        )
        self.bad_records = Counter(
            "stream_dp_sink_bad_records",
            "Output-topic records that could not be stored, by reason; each is logged and "
            "kept in stream_dp.dead_letters with its topic, partition and offset.",
            ["reason"],
            registry=r,
        )
        self.releases_stored = Counter(
            "stream_dp_sink_releases_stored",
            "Release rows inserted into stream_dp.releases (duplicates not included).",
            registry=r,
        )
        self.window_records_stored = Counter(
            "stream_dp_sink_window_records_stored",
            "Window records stored into stream_dp.windows (duplicates not included).",
            registry=r,
        )
        self.windows_completed = Counter(
            "stream_dp_sink_windows_completed",
            "Windows that became complete: their window record and every release it "
            "announces are stored.",
            registry=r,
        )
        self.duplicates_skipped = Counter(
            "stream_dp_sink_duplicates_skipped",
            "Records equal to one already stored (republished after a crash, or read again "
            "after a sink restart); nothing was changed.",
            registry=r,
        )
        self.conflicts = Counter(
            "stream_dp_sink_conflicting_records",
            "Records with the key of a stored row but other content (e.g. a window released "
            "twice by a paused worker). The first stored row is kept; see the log.",
            registry=r,
        )
        self.transaction = Histogram(
            "stream_dp_sink_transaction_seconds",
            "Time to store one fetched batch in one database transaction.",
            buckets=TRANSACTION_BUCKETS_S,
            registry=r,
        )
        self.database_errors = Counter(
            "stream_dp_sink_database_errors",
            "Failed database operations (retried with back-off; the batch is not committed "
            "to Kafka until it is stored).",
            registry=r,
        )
        self.broker_errors = Counter(
            "stream_dp_sink_broker_errors",
            "Errors talking to the Kafka broker (fetch or offset commit).",
            registry=r,
        )
        self.consumer_lag = Gauge(
            "stream_dp_sink_consumer_lag_records",
            "Records between the sink's position and the partition's high watermark, per "
            "assigned output-topic partition (approximate on the embedded broker).",
            ["partition"],
            registry=r,
        )
        self.last_commit = Gauge(
            "stream_dp_sink_last_commit_timestamp_seconds",
            "Wall-clock time (Unix) of the last batch stored and committed; 0 before the first.",
            registry=r,
        )
        self.ready = Gauge(
            "stream_dp_sink_ready",
            "1 when the sink is ready (database connected, schema migrated, broker "
            "reachable, output partitions assigned), else 0.",
            registry=r,
        )
        self.halted = Gauge(
            "stream_dp_sink_halted",
            "1 when the sink stopped consuming because the database refused a whole batch "
            "alike (its tables changed, e.g. a NOT NULL column added): nothing was committed "
            "or dead-lettered; fix the table and restart the sink. Else 0.",
            registry=r,
        )
        self.offset_out_of_range = Counter(
            "stream_dp_sink_offset_out_of_range",
            "Partitions whose committed offset (or fetch position) was outside the output "
            "topic's log: records were deleted before the sink stored them, or the topic was "
            "recreated. Logged as an ERROR; the sink reads on from the log start. See the "
            "runbook (StreamDPSinkOffsetOutOfRange).",
            ["topic"],
            registry=r,
        )
        self.records_skipped = Counter(
            "stream_dp_sink_records_skipped",
            "Output-topic records deleted below the sink's committed offset before it stored "
            "them (never in the database); a recreated topic's lost records cannot be "
            "counted and add nothing here.",
            ["topic"],
            registry=r,
        )
        self.build_info = Info(
            "stream_dp_sink_build", "Version of stream-dp and of Python this sink runs.", registry=r
        )
        self.build_info.info({"version": __version__, "python": platform.python_version()})
        for reason in BAD_REASONS:
            self.bad_records.labels(reason=reason)
        for partition in partitions:
            self.consumer_lag.labels(partition=str(partition)).set(0)
        self._exposition = Exposition(r)

    def set_consumer_lag(self, partition: int, lag_records: int) -> None:
        self.consumer_lag.labels(partition=str(partition)).set(max(0, lag_records))

    def exposition(self) -> bytes:
        return self._exposition.render()

    def names(self) -> set[str]:
        return registry_sample_names(self.registry)
