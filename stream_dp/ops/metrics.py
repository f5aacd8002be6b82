"""Prometheus metrics of one worker, named the Prometheus way.

Rules every metric here follows (``tests/ops/test_metrics.py`` checks them):

- prefix ``stream_dp_``, snake_case, base units (``_seconds``, ``_records``), ``_total`` on
  counters and never on gauges;
- the only labels are ``query`` (a configured query name), ``partition`` (an input partition
  number) and ``reason`` (a bad-record reason code): never a user, a pseudonym or a group key.
  Metrics are a release channel too: nothing here is a per-user or per-key count.

Each :class:`Metrics` owns its own :class:`~prometheus_client.CollectorRegistry`, so several
workers (or tests) in one process never collide, and nothing is registered globally.

The worker updates the attributes directly (``metrics.events_consumed.inc(n)``,
``metrics.windows_released.labels(query=q).inc()``); the few helpers below encode
conventions that are easy to get wrong (what "no open window" looks like, dropping the lag
series of a revoked partition).
"""

from __future__ import annotations

import contextlib
import math
import platform
from collections.abc import Iterable, Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.metrics_core import Metric

from stream_dp import __version__
from stream_dp.kafka_client.fetch_errors import FETCH_ERROR_REASONS
from stream_dp.ops.exposition import Exposition

PREFIX = "stream_dp_"

#: Why stage 2 left a partial out (every series exists from the start, at zero).
#: Why a query does not take a valid event of a covered window, in fate order (1, 2, …):
#: the ``reason`` label of ``stream_dp_query_events_dropped_total``.
QUERY_DROP_REASONS = ("where", "missing_group_field", "outside_key_list", "missing_value")

PARTIALS_IGNORED_REASONS = (
    "duplicate_version",
    "window_released",
    "malformed",
    "before_coverage",
    "key_mismatch",
    "layout_changed",
    "superseded",
    "erasure_stale",
    "bounds_mismatch",
    "fingerprint_mismatch",
    "key_check_mismatch",
)

#: Release delay: from a window's end to its publication. Grace and idle-close put it in the
#: seconds-to-minutes range; a day is the outer edge worth distinguishing.
RELEASE_DELAY_BUCKETS_S: tuple[float, ...] = (
    1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
    7200.0, 21600.0, 43200.0, 86400.0,
)  # fmt: skip

#: One consumed batch, decode to bounding: 100 µs to 10 s.
BATCH_PROCESSING_BUCKETS_S: tuple[float, ...] = (
    1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
)  # fmt: skip


class _WithoutCreated:
    """A view of a registry without the ``*_created`` series of counters and histograms.

    In the 0.0.4 text format prometheus_client exposes each counter's creation time as an
    extra gauge family (``..._created``), doubling the series count for no operational use.
    Filtering here keeps that choice local instead of flipping prometheus_client's global
    ``disable_created_metrics()`` for every registry in the process.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            if family.type in ("counter", "histogram", "summary"):
                created = f"{family.name}_created"
                kept = [s for s in family.samples if s.name != created]
                copy = Metric(family.name, family.documentation, family.type, family.unit)
                copy.samples = kept
                yield copy
            else:
                yield family


def registry_exposition(registry: CollectorRegistry) -> bytes:
    """A registry in the Prometheus text format 0.0.4, without ``*_created`` series, by
    prometheus_client's ``generate_latest``: the reference that ``/metrics``'s cheaper
    :class:`~stream_dp.ops.exposition.Exposition` prints alike (tests/ops/test_exposition.py)."""
    return generate_latest(_WithoutCreated(registry))


def registry_sample_names(registry: CollectorRegistry) -> set[str]:
    """Every sample name a registry's metrics can expose (see :meth:`Metrics.names`)."""
    names: set[str] = set()
    for family in registry.collect():
        names |= _sample_names(family)
    return names


def _sample_names(family: Metric) -> set[str]:
    """Every sample name a family can expose, whether or not a labelled child exists yet."""
    name = family.name
    if family.type == "counter":
        return {f"{name}_total"}
    if family.type == "histogram":
        return {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    if family.type == "summary":
        return {name, f"{name}_sum", f"{name}_count"}
    if family.type == "info":
        return {f"{name}_info"}
    return {name}


def _clock_gauges(r: CollectorRegistry) -> tuple[Gauge, Gauge]:
    """input.max_future_s and the worker's clock against the input's record timestamps
    (:mod:`stream_dp.pipeline.kafka.clock_skew`)."""
    max_future = Gauge(
        "stream_dp_config_input_max_future_seconds",
        "Configured input.max_future_s.",
        registry=r,
    )
    skew = Gauge(
        "stream_dp_input_clock_skew_seconds",
        "Newest timestamp (CreateTime or LogAppendTime) of fresh input records (appended since "
        "a fetch found the reader at the partition's end) minus the worker's clock: ~0 when "
        "the clocks agree, > 0 by as much as this worker's clock is slow (past "
        "input.max_future_s every live event is dead-lettered), < 0 by as much as it is fast.",
        registry=r,
    )
    return max_future, skew


def _input_metrics(r: CollectorRegistry) -> tuple[Counter, Counter, Counter, Counter]:
    """Input records: consumed, dead-lettered, late, replayed."""
    events_consumed = Counter(
        "stream_dp_events_consumed",
        "Records read from the input topic, valid or not (bad records included).",
        registry=r,
    )
    bad_records = Counter(
        "stream_dp_bad_records",
        "Input records that could not be used and went to the dead-letter topic, "
        "by reason code (e.g. not JSON, missing user or time field, too large).",
        ["reason"],
        registry=r,
    )
    late_events = Counter(
        "stream_dp_late_events",
        "Valid events dropped because their window had already closed (event time "
        "older than the watermark) or comes before the first covered window "
        "(window.start_at, or the first start); the worker logs a WARNING with the fix.",
        registry=r,
    )
    replayed_events_skipped = Counter(
        "stream_dp_replayed_events_skipped",
        "Events re-read after a restart that belong to windows already released; "
        "dropped so that no window is ever computed twice.",
        registry=r,
    )
    return events_consumed, bad_records, late_events, replayed_events_skipped


def _query_drop_counter(r: CollectorRegistry) -> Counter:
    """Events of covered windows a query does not take, by query and reason."""
    return Counter(
        "stream_dp_query_events_dropped",
        "Valid events of a covered window that a query does not take, by query and reason: "
        "where (its filter), missing_group_field (a group_by field missing or null, "
        "missing_group: drop), outside_key_list (a key not on its public list), "
        "missing_value (sum/mean without a value). Counts of raw input records, before the "
        "per-user bounds; for every query, events consumed = bad records + late + replayed "
        "+ these + the events the query takes.",
        ["query", "reason"],
        registry=r,
    )


def _release_metrics(r: CollectorRegistry) -> tuple[Gauge, Counter, Counter, Counter, Counter]:
    """Windows open and released, and what the releases published or refused."""
    windows_open = Gauge(
        "stream_dp_windows_open",
        "Event-time windows currently open (collecting events, not yet released).",
        registry=r,
    )
    windows_released = Counter(
        "stream_dp_windows_released",
        "Windows closed and released, per query.",
        ["query"],
        registry=r,
    )
    releases_published = Counter(
        "stream_dp_releases_published",
        "Noisy release records written to the output topic, per query "
        "(one per released group key, ledger republications included).",
        ["query"],
        registry=r,
    )
    keys_released = Counter(
        "stream_dp_keys_released",
        "Group keys published with a noisy value, per query (summed over windows).",
        ["query"],
        registry=r,
    )
    budget_exhausted = Counter(
        "stream_dp_budget_exhausted",
        "Releases refused because the window or horizon privacy budget would be "
        "exceeded, per query. Any increase means numbers are missing from the output.",
        ["query"],
        registry=r,
    )
    return windows_open, windows_released, releases_published, keys_released, budget_exhausted


def _budget_metrics(r: CollectorRegistry) -> tuple[Gauge, Gauge, Gauge, Gauge]:
    """Privacy budget spent and left, per window and over the horizon."""
    epsilon_spent = Gauge(
        "stream_dp_window_epsilon_spent",
        "Privacy loss epsilon spent by the query on the most recently released window.",
        ["query"],
        registry=r,
    )
    epsilon_remaining = Gauge(
        "stream_dp_window_epsilon_remaining",
        "Per-window epsilon budget minus what the most recently released window spent "
        "(over all queries).",
        registry=r,
    )
    horizon_epsilon_spent = Gauge(
        "stream_dp_horizon_epsilon_spent",
        "Epsilon one user can have lost over the rolling horizon of recent windows.",
        registry=r,
    )
    horizon_epsilon_remaining = Gauge(
        "stream_dp_horizon_epsilon_remaining",
        "Horizon epsilon budget minus what the rolling horizon has spent. "
        "At 0, releases are refused until old windows leave the horizon.",
        registry=r,
    )
    return epsilon_spent, epsilon_remaining, horizon_epsilon_spent, horizon_epsilon_remaining


def _bounds_metrics(r: CollectorRegistry) -> tuple[Gauge, Gauge, Gauge, Gauge]:
    """The contribution bounds the most recently released window used: fixed, or under
    ``bounds: auto`` chosen differentially privately from released histograms."""
    bounds_contributions_per_window = Gauge(
        "stream_dp_bounds_max_contributions_per_window",
        "k (events kept per user) the most recently released window was bounded with.",
        registry=r,
    )
    bounds_keys_per_user = Gauge(
        "stream_dp_bounds_max_keys_per_user",
        "L0 (keys per user) the most recently released window was bounded with; 0: unset.",
        registry=r,
    )
    bounds_contributions_per_key = Gauge(
        "stream_dp_bounds_max_contributions_per_key",
        "Linf (events per user and key) the most recently released window was bounded "
        "with; 0: unset.",
        registry=r,
    )
    bounds_epsilon_spent = Gauge(
        "stream_dp_bounds_epsilon_spent",
        "Epsilon the most recently released window spent on the histograms that choose "
        "the next window's bounds (bounds: auto; 0 otherwise).",
        registry=r,
    )
    return (
        bounds_contributions_per_window,
        bounds_keys_per_user,
        bounds_contributions_per_key,
        bounds_epsilon_spent,
    )


def _latency_metrics(r: CollectorRegistry) -> tuple[Histogram, Histogram, Gauge, Gauge]:
    """Release delay, batch processing time, consumer lag and fetch age."""
    release_delay = Histogram(
        "stream_dp_release_delay_seconds",
        "Wall-clock time from a window's end to the publication of its release "
        "(grace period and idle-close wait included).",
        buckets=RELEASE_DELAY_BUCKETS_S,
        registry=r,
    )
    batch_processing = Histogram(
        "stream_dp_batch_processing_seconds",
        "Time to process one consumed batch of input records (decode, pseudonymize, "
        "window, bound).",
        buckets=BATCH_PROCESSING_BUCKETS_S,
        registry=r,
    )
    consumer_lag = Gauge(
        "stream_dp_consumer_lag_records",
        "Records between the worker's position and the partition's high watermark, per "
        "topic and assigned partition of every topic the worker reads (input, "
        "repartition, partials). Approximate on the embedded broker, whose high "
        "watermark is the last batch's base offset + 1, not the log end "
        "(docs/architecture.md#embedded-broker); "
        "exact on Apache Kafka.",
        ["topic", "partition"],
        registry=r,
    )

    fetch_age = Gauge(
        "stream_dp_fetch_age_seconds",
        "Seconds since the broker last answered a fetch (records or not) for an assigned "
        "partition of the topic events are read from (the input), or since it was taken "
        "if never. Grows while the worker cannot read the partition (a broker stall, a "
        "stuck fetch); its windows wait meanwhile, since silence there is not idleness.",
        ["topic", "partition"],
        registry=r,
    )
    return release_delay, batch_processing, consumer_lag, fetch_age


def _ledger_metrics(r: CollectorRegistry) -> tuple[Counter, Counter]:
    """The release ledger read back at start-up and republished from."""
    ledger_windows_loaded = Counter(
        "stream_dp_ledger_windows_loaded",
        "Released (query, window) entries read back from the release ledger at start-up "
        "and kept (windows a progress record marks released are forgotten as they are read).",
        registry=r,
    )
    ledger_republished = Counter(
        "stream_dp_ledger_republished",
        "Windows whose stored release was republished from the ledger unchanged "
        "(after a crash between ledger write and output publish). Never redrawn.",
        registry=r,
    )
    return ledger_windows_loaded, ledger_republished


def _scale_out_metrics(r: CollectorRegistry) -> tuple[Counter, Counter, Counter, Counter]:
    """Scale-out: the repartition topic and the partials topic."""
    events_repartitioned = Counter(
        "stream_dp_events_repartitioned",
        "Valid events stage 0 took from the input (unkeyed input): re-keyed by pseudonym "
        "to the repartition topic, so that one user's events meet in one worker, or "
        "dropped there because their user is erased. Both count alike, so that the "
        "counter never tells whether an erased user is still sending.",
        registry=r,
    )
    repartition_duplicates_skipped = Counter(
        "stream_dp_repartition_duplicates_skipped",
        "Repartitioned events seen a second time (re-sent after a worker crash) and "
        "dropped, so that no event counts twice.",
        registry=r,
    )
    partials_published = Counter(
        "stream_dp_partials_published",
        "Bounded partial aggregates (one per query, window and source partition) written "
        "to the internal partials topic by stage 1.",
        registry=r,
    )
    partials_ignored = Counter(
        "stream_dp_partials_ignored",
        "Partial-aggregate records stage 2 did not merge: a second version of a partial "
        "it already took (duplicate_version), a window already released "
        "(window_released), a malformed record (malformed), a window before the first "
        "covered one (before_coverage), bounded under another pseudonym key "
        "(key_mismatch) or another partition layout (partition count or user placement) than "
        "the window's (layout_changed), a "
        "version replaced by one that applied more erasures (superseded), or one left "
        "out because no version applied an erasure in time (erasure_stale), bounded with other "
        "bounds than its window's under bounds: auto (bounds_mismatch), or stamped with "
        "another deployment fingerprint: a worker with other meaning-bearing settings "
        "(fingerprint_mismatch), or bounded under another secret than the window's "
        "pseudonym key id names, or with no key check (key_check_mismatch).",
        ["reason"],
        registry=r,
    )
    return (
        events_repartitioned,
        repartition_duplicates_skipped,
        partials_published,
        partials_ignored,
    )


def _erasure_metrics(r: CollectorRegistry) -> tuple[Counter, Gauge]:
    """Erasure requests applied and erasures kept in memory (docs/erasure.md)."""
    erasure_requests_applied = Counter(
        "stream_dp_erasure_requests_applied",
        "Erasure requests this worker recorded in the erasure log and answered (bad "
        'requests count as bad_records{reason="bad_erasure_request"}).',
        registry=r,
    )
    erasures_active = Gauge(
        "stream_dp_erasures_active",
        "Erasures kept in memory: applied and not yet past every window they affect.",
        registry=r,
    )
    return erasure_requests_applied, erasures_active


def _export_metrics(r: CollectorRegistry) -> tuple[Counter, Counter]:
    """Partner exports (docs/exports.md): records sent, records k-anonymity suppressed."""
    export_records = Counter(
        "stream_dp_export_records",
        "Event records this worker sent to a partner export's topic (at least once: a "
        "window sent again after a crash counts again).",
        ["export"],
        registry=r,
    )
    export_records_suppressed = Counter(
        "stream_dp_export_records_suppressed",
        "Event records of a partner export withheld by its k-anonymity filter (their "
        "generalized fields were shared by fewer than k_anonymity pseudonyms of the window).",
        ["export"],
        registry=r,
    )
    return export_records, export_records_suppressed


def _time_metrics(r: CollectorRegistry) -> tuple[Gauge, Gauge, Gauge]:
    """Event time (watermark, oldest open window) and the last release."""
    watermark = Gauge(
        "stream_dp_watermark_timestamp_seconds",
        "Current event-time watermark (Unix time): windows ending before it are closed.",
        registry=r,
    )
    oldest_open_window_end = Gauge(
        "stream_dp_oldest_open_window_end_timestamp_seconds",
        "End (Unix time) of the oldest window still open; NaN when no window is open. "
        "Release is due at this end plus the grace period.",
        registry=r,
    )
    last_release = Gauge(
        "stream_dp_last_release_timestamp_seconds",
        "Wall-clock time (Unix) of the last window release published; 0 before the first.",
        registry=r,
    )
    return watermark, oldest_open_window_end, last_release


def _backlog_gauge(r: CollectorRegistry) -> Gauge:
    """Windows due but not yet released (a restart after a long idle stop)."""
    return Gauge(
        "stream_dp_windows_due",
        "Windows of this worker's partials partitions that every source has passed but that "
        "are not released yet: 0 in steady state; after a restart while the input was idle, "
        "the due windows since the last release, draining as they are released in order.",
        registry=r,
    )


def _config_metrics(r: CollectorRegistry) -> tuple[Gauge, Gauge, Gauge]:
    """Window settings, for alert thresholds that derive from them."""
    config_window_size = Gauge(
        "stream_dp_config_window_size_seconds", "Configured window.size_s.", registry=r
    )
    config_window_grace = Gauge(
        "stream_dp_config_window_grace_seconds", "Configured window.grace_s.", registry=r
    )
    config_window_idle_close = Gauge(
        "stream_dp_config_window_idle_close_seconds",
        "Configured window.idle_close_s.",
        registry=r,
    )
    return config_window_size, config_window_grace, config_window_idle_close


def _health_metrics(
    r: CollectorRegistry,
) -> tuple[Gauge, Counter, Counter, Counter, Gauge, Counter, Counter, Info]:
    """Readiness, broker and group trouble, ledger loss, build info."""
    ready = Gauge(
        "stream_dp_ready",
        "1 when the worker is ready (partitions assigned, producer connected, release "
        "ledger loaded, topic partition counts settled, input readable), else 0.",
        registry=r,
    )
    broker_errors = Counter(
        "stream_dp_broker_errors",
        "Errors talking to the Kafka broker (retried with back-off when retriable).",
        registry=r,
    )
    membership_lost = Counter(
        "stream_dp_membership_lost",
        "Times the group told this worker it had lost its membership or generation "
        "(a pause past the session timeout, a rebalance): it dropped the state of the "
        "partitions it no longer owns and rejoined.",
        registry=r,
    )
    topology_changes = Counter(
        "stream_dp_topology_changes",
        "Partition-count changes (or disappearances) of a topic the worker reads, seen "
        "while running: see the runbook.",
        ["topic"],
        registry=r,
    )
    ledger_lost = Gauge(
        "stream_dp_ledger_lost",
        "1 while the worker releases nothing because the ledger topic lost this "
        "deployment's records (deleted, recreated or renamed) while its group or output "
        "topic shows earlier releases: see the runbook (stream-dp ledger rebuild).",
        registry=r,
    )
    ledger_draws_discarded = Counter(
        "stream_dp_ledger_draws_discarded",
        "Draws this worker ledgered (or wrote as a running total's state) that lost to "
        "an earlier complete draw of the same (query, window) — two owners raced; the "
        "earlier one was used, this never.",
        registry=r,
    )
    records_too_large = Counter(
        "stream_dp_records_too_large",
        "Internal records that cannot fit under kafka.max_message_bytes (the worker "
        "stops: raise the limit).",
        registry=r,
    )
    build_info = Info(
        "stream_dp_build",
        "Version of stream-dp and of Python this worker runs.",
        registry=r,
    )
    build_info.info({"version": __version__, "python": platform.python_version()})
    return (
        ready,
        broker_errors,
        membership_lost,
        topology_changes,
        ledger_lost,
        ledger_draws_discarded,
        records_too_large,
        build_info,
    )


def _fetch_error_counter(r: CollectorRegistry) -> Counter:
    """Failed fetches of the worker's consumer, by cause."""
    return Counter(
        "stream_dp_fetch_errors",
        "Fetches of the worker's consumer that failed, by cause (reason: unsupported_codec, "
        "corrupt_record, authorization_failed, unknown_topic, record_too_large, other). A cause "
        "that retrying cannot clear (unsupported_codec, corrupt_record, record_too_large, "
        "authorization_failed), or any cause that persists, makes the worker log an ERROR "
        "naming it, the partitions and the fix, and not ready until a fetch makes progress on "
        "each failing partition (runbook: StreamDPFetchFailing).",
        ["reason"],
        registry=r,
    )


def _hold_metrics(
    r: CollectorRegistry,
) -> tuple[Counter, Gauge, Gauge, Counter, Gauge, Gauge, Gauge, Gauge]:
    """Held windows and the offsets they pin: records lost under them."""
    offset_out_of_range = Counter(
        "stream_dp_offset_out_of_range",
        "Partitions whose committed offset (or fetch position) was outside the log: records "
        "still needed were deleted. Internal topics and, by default, the input stop the "
        "worker (not ready); see the runbook (StreamDPOffsetOutOfRange).",
        ["topic"],
        registry=r,
    )
    partials_incomplete = Gauge(
        "stream_dp_partials_incomplete",
        "Partials of due windows read in part only (a part lost or malformed): their "
        "windows are held until the source's complete version arrives, never released "
        "as if that source had no events.",
        registry=r,
    )
    held_record_age = Gauge(
        "stream_dp_held_record_age_seconds",
        "Age (by its Kafka timestamp) of the oldest partials or repartition record this "
        "worker's unreleased windows keep its group's committed offset at (its age in the "
        "log, outages included); held past output.max_hold_s while the worker could read, "
        "the worker stops releasing, before retention deletes it.",
        registry=r,
    )
    max_hold_exceeded = Counter(
        "stream_dp_max_hold_exceeded",
        "Times a record stayed held past output.max_hold_s while the worker could read the "
        "log: the worker stopped releasing (not ready); see the runbook "
        "(StreamDPMaxHoldExceeded).",
        registry=r,
    )
    config_max_hold = Gauge(
        "stream_dp_config_max_hold_seconds",
        "output.max_hold_s: the longest a held window may pin an internal record (alert "
        "rules scale with it).",
        registry=r,
    )
    held_state = Gauge(
        "stream_dp_held_state_bytes",
        "What window.max_held_state_bytes caps: 28 bytes per event that arrived in this "
        "worker's open windows (erased users' included), an upper bound on what their "
        "samples hold, plus 32 per event and statistic: quantile query, a bound on the "
        "histograms their seal builds, plus, with partner exports, a bound per event that "
        "arrived for them (docs/exports.md#memory); it falls only when a window goes, never "
        "with an erasure.",
        registry=r,
    )
    config_max_held_state = Gauge(
        "stream_dp_config_max_held_state_bytes",
        "window.max_held_state_bytes (NaN: no cap).",
        registry=r,
    )
    backpressure = Gauge(
        "stream_dp_backpressure",
        "1 while the held state is above window.max_held_state_bytes and fetching the "
        "partitions that add to it is paused, else 0.",
        registry=r,
    )
    return (
        offset_out_of_range,
        partials_incomplete,
        held_record_age,
        max_hold_exceeded,
        config_max_hold,
        held_state,
        config_max_held_state,
        backpressure,
    )


class Metrics:
    """All metrics of one stream-dp worker, in a registry of its own.

    ``queries``, ``partitions`` ((topic, partition) pairs) and ``reasons`` pre-create the
    labelled series with value 0, so that dashboards and ``rate()``/``increase()`` alerts see
    a series from the start instead of only after the first event; the worker passes every
    bad-record reason. ``process`` adds the standard ``process_*`` metrics (resident memory,
    CPU seconds, open file descriptors) of this process.
    """

    def __init__(
        self,
        *,
        registry: CollectorRegistry | None = None,
        queries: Iterable[str] = (),
        partitions: Iterable[tuple[str, int]] = (),
        reasons: Iterable[str] = (),
        process: bool = True,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self._declare_input_and_release(r)
        self._declare_ledger_and_scale_out(r)
        self._declare_time(r)
        self._declare_health(r)
        self._start_series(queries, partitions, reasons, process=process)
        self._exposition = Exposition(self.registry)

    def _declare_input_and_release(self, r: CollectorRegistry) -> None:
        """Stage 1's input and the releases: events, windows, budget, bounds, latencies."""
        (
            self.events_consumed,
            self.bad_records,
            self.late_events,
            self.replayed_events_skipped,
        ) = _input_metrics(r)
        self.query_events_dropped = _query_drop_counter(r)

        (
            self.windows_open,
            self.windows_released,
            self.releases_published,
            self.keys_released,
            self.budget_exhausted,
        ) = _release_metrics(r)

        (
            self.epsilon_spent,
            self.epsilon_remaining,
            self.horizon_epsilon_spent,
            self.horizon_epsilon_remaining,
        ) = _budget_metrics(r)

        (
            self.bounds_contributions_per_window,
            self.bounds_keys_per_user,
            self.bounds_contributions_per_key,
            self.bounds_epsilon_spent,
        ) = _bounds_metrics(r)

        (
            self.release_delay,
            self.batch_processing,
            self.consumer_lag,
            self.fetch_age,
        ) = _latency_metrics(r)

    def _declare_ledger_and_scale_out(self, r: CollectorRegistry) -> None:
        """The ledger, the repartition and partials topics of a scaled-out group, erasure."""
        (
            self.ledger_windows_loaded,
            self.ledger_republished,
        ) = _ledger_metrics(r)

        (
            self.events_repartitioned,
            self.repartition_duplicates_skipped,
            self.partials_published,
            self.partials_ignored,
        ) = _scale_out_metrics(r)

        (
            self.erasure_requests_applied,
            self.erasures_active,
        ) = _erasure_metrics(r)
        self.export_records, self.export_records_suppressed = _export_metrics(r)

    def _declare_time(self, r: CollectorRegistry) -> None:
        """Event-time progress and the window settings (alert thresholds scale with them)."""
        (
            self.watermark,
            self.oldest_open_window_end,
            self.last_release,
        ) = _time_metrics(r)

        (
            self.config_window_size,
            self.config_window_grace,
            self.config_window_idle_close,
        ) = _config_metrics(r)

        self.config_input_max_future, self.input_clock_skew = _clock_gauges(r)
        self.windows_due = _backlog_gauge(r)
        self.deployment_info = Info(
            "stream_dp_deployment",
            "The deployment this worker belongs to (kafka.group_id): alert rules group each "
            "deployment's series by it, so one stalled deployment never hides behind another.",
            registry=r,
        )

    def _declare_health(self, r: CollectorRegistry) -> None:
        """Readiness, broker and group trouble, and what the sink holds back."""
        (
            self.ready,
            self.broker_errors,
            self.membership_lost,
            self.topology_changes,
            self.ledger_lost,
            self.ledger_draws_discarded,
            self.records_too_large,
            self.build_info,
        ) = _health_metrics(r)
        self.fetch_errors = _fetch_error_counter(r)

        (
            self.offset_out_of_range,
            self.partials_incomplete,
            self.held_record_age,
            self.max_hold_exceeded,
            self.config_max_hold,
            self.held_state,
            self.config_max_held_state,
            self.backpressure,
        ) = _hold_metrics(r)

    def _start_series(
        self,
        queries: Iterable[str],
        partitions: Iterable[tuple[str, int]],
        reasons: Iterable[str],
        *,
        process: bool,
    ) -> None:
        """The values before the first event: NaN gauges, labelled series at zero."""
        # NaN until a window is released: no open window yet, no bounds used yet.
        self.oldest_open_window_end.set(math.nan)
        for gauge in (
            self.bounds_contributions_per_window,
            self.bounds_keys_per_user,
            self.bounds_contributions_per_key,
        ):
            gauge.set(math.nan)
        for query in queries:
            self.add_query(query)
        for topic, partition in partitions:
            self.consumer_lag.labels(topic=topic, partition=str(partition)).set(0)
        if process:
            # process_* (memory, CPU, open file descriptors) of this worker's process.
            ProcessCollector(registry=self.registry)
        for reason in reasons:
            self.bad_records.labels(reason=reason)
        for reason in PARTIALS_IGNORED_REASONS:
            self.partials_ignored.labels(reason=reason)
        for reason in FETCH_ERROR_REASONS:
            self.fetch_errors.labels(reason=reason)

    # ---------------------------------------------------------------------------------------

    def add_query(self, query: str) -> None:
        """Create the per-query series at zero (call once per configured query)."""
        for counter in (
            self.windows_released,
            self.releases_published,
            self.keys_released,
            self.budget_exhausted,
        ):
            counter.labels(query=query)
        self.epsilon_spent.labels(query=query).set(0)
        for reason in QUERY_DROP_REASONS:
            self.query_events_dropped.labels(query=query, reason=reason)

    def add_export(self, export: str) -> None:
        """Create a partner export's series at zero (call once per configured export)."""
        self.export_records.labels(export=export)
        self.export_records_suppressed.labels(export=export)

    def set_bounds(self, bounds: tuple[int, int | None, int | None], epsilon: float) -> None:
        """The bounds (and histogram ε) of the most recently released window."""
        k, l0, linf = bounds
        self.bounds_contributions_per_window.set(k)
        self.bounds_keys_per_user.set(l0 or 0)
        self.bounds_contributions_per_key.set(linf or 0)
        self.bounds_epsilon_spent.set(epsilon)

    def set_config(
        self,
        size_s: float,
        grace_s: float,
        idle_close_s: float,
        max_future_s: float,
        *,
        group_id: str,
    ) -> None:
        """Export the window settings and the future cap, so alert rules can scale their
        thresholds with them, and the deployment's group id, so they group by it."""
        self.deployment_info.info({"group_id": group_id})
        self.config_window_size.set(size_s)
        self.config_window_grace.set(grace_s)
        self.config_window_idle_close.set(idle_close_s)
        self.config_input_max_future.set(max_future_s)

    def set_open_windows(self, count: int, oldest_end_s: float | None) -> None:
        """Record how many windows are open and when the oldest ends (None: none open)."""
        self.windows_open.set(count)
        self.oldest_open_window_end.set(math.nan if oldest_end_s is None else oldest_end_s)

    def set_consumer_lag(self, topic: str, partition: int, lag_records: int) -> None:
        """Lag of one assigned partition (negative values, seen on the embedded broker, → 0)."""
        self.consumer_lag.labels(topic=topic, partition=str(partition)).set(max(0, lag_records))

    def forget_partition(self, topic: str, partition: int) -> None:
        """Drop the lag and fetch-age series of a revoked partition, so a stale value doesn't
        linger."""
        with contextlib.suppress(KeyError):
            self.consumer_lag.remove(topic, str(partition))
        with contextlib.suppress(KeyError):
            self.fetch_age.remove(topic, str(partition))

    def exposition(self) -> bytes:
        """All metrics in the Prometheus text format 0.0.4 (what ``/metrics`` serves), as
        :func:`registry_exposition` prints them, at a fraction of its CPU."""
        return self._exposition.render()

    def names(self) -> set[str]:
        """Every sample name this worker can expose (``..._total``, ``..._bucket``, ...).

        Derived from the metric definitions, so labelled metrics without a child yet are
        included; alert rules and dashboards are checked against this set.
        """
        return registry_sample_names(self.registry)
