"""Late and uncovered events are never silent: a rate-limited WARNING with the fix.

A worker covers the windows from ``window.start_at``, or, when that is unset, from the
window of the wall clock at its first start (recorded in the ledger). Events stamped before
the first covered window, and events whose window already closed, are dropped and counted
in ``stream_dp_late_events_total``. A topic of old events (a recorded file, a backlog) then
releases nothing, and the counter alone does not say why: :class:`LateEventsNotice` logs a
WARNING with how many were dropped, the first covered window and what to change — within
two seconds for the first ones, then at most every :data:`NOTICE_INTERVAL_S` while more arrive.

Events a query does not take are never silent either. An event whose value is not on a
query's public key list (``"de"`` for ``"DE"``) or that lacks a field the query groups by
(``missing_group: drop``) is counted in ``stream_dp_query_events_dropped_total{query,
reason}``; a wrong field name or a key list in another letter case then releases nothing for
the query, and the counter alone does not say why. :class:`DroppedEventsNotice` logs a
WARNING per query and reason with how many were dropped and what to change, on the same
schedule. At the worker's stop, drops not yet warned about are warned about at once. Events
a ``where`` filter leaves out are what the configuration asks for: counted, never warned
about.

It reads only counts, the coverage start and the configuration: never an event, a user id
or a value. It reads them from the two counters themselves, not from the registry: the
worker's loop asks every iteration (an idle worker about five times a second), and the
registry's ``get_sample_value`` collects every metric of the worker, a scrape's work, per
call. And it reads them at most once per :data:`CHECK_EVERY_S`: a worker fed a trickle turns
its loop several times a second, and a warning a second later tells the operator the same.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from datetime import datetime
from typing import Final

from prometheus_client import Counter

from stream_dp.config.model import QueryConfig
from stream_dp.ops.metrics import Metrics
from stream_dp.windows.tumbling import iso_utc

log = logging.getLogger(__name__)

#: At most one WARNING per this many seconds while late events keep arriving.
NOTICE_INTERVAL_S: Final = 300.0
#: The counters are read at most this often (s): the first warning comes within it.
CHECK_EVERY_S: Final = 1.0
#: The sample of ``Metrics.late_events`` (a counter) that holds its total.
LATE_EVENTS_SAMPLE: Final = "stream_dp_late_events_total"
#: The sample of ``Metrics.query_events_dropped`` (a counter) that holds its totals.
DROPPED_SAMPLE: Final = "stream_dp_query_events_dropped_total"


def counter_totals(counter: Counter, sample: str) -> dict[tuple[str, ...], float]:
    """The ``sample`` totals of one counter, by their label values (in the counter's label
    order; ``()`` for a counter without labels): what ``registry.get_sample_value`` gives,
    read from this counter alone."""
    out: dict[tuple[str, ...], float] = {}
    for family in counter.collect():
        for s in family.samples:
            if s.name == sample:
                out[tuple(s.labels.values())] = float(s.value)
    return out


def dropped_events_message(query: QueryConfig, reason: str, dropped: int) -> str | None:
    """The WARNING's text for ``dropped`` events of ``query`` left out for ``reason``; None
    for a reason that needs no warning (``where``: the configured filter)."""
    fields = ", ".join(repr(f) for f in query.group_by)
    check = "`stream-dp check` compares a sample of the topic with the configuration"
    if reason == "outside_key_list":
        return (
            f"query {query.name} dropped {dropped} events whose {fields} value is not on its "
            "public key list (keys): list the values as the events spell them (letter case "
            f"included) or use keys: private; {check}"
        )
    if reason == "missing_group_field":
        return (
            f"query {query.name} dropped {dropped} events without a value for {fields} "
            "(missing or null; missing_group: drop): set group_by to the fields the events "
            f"hold, or missing_group: null_key to count them under a null key; {check}"
        )
    if reason == "missing_value":
        return (
            f"query {query.name} dropped {dropped} events without a value in "
            f"{query.value_field!r}: set value_field to the field the events hold; {check}"
        )
    return None


def late_events_message(dropped: int, coverage_start_s: int | None, *, start_at_set: bool) -> str:
    """The WARNING's text: the count, the first covered window, and the fix."""
    first = "not chosen yet" if coverage_start_s is None else iso_utc(coverage_start_s)
    origin = "window.start_at" if start_at_set else "the first start, window.start_at unset"
    fix = (
        "to count older events, set window.start_at to the first window you want released "
        "(e.g. window.start_at: 2020-08-01T00:00:00Z) before the first run of a new "
        "kafka.group_id — every window from it to now is released and charged — or run "
        "`stream-dp replay` on a file of them; events that arrive after their window closed "
        "need a larger window.grace_s"
    )
    return (
        f"{dropped} events dropped as late: their windows are before the first covered "
        f"window {first} (from {origin}) or already closed; {fix}"
    )


class LateEventsNotice:
    """Turns growth of the late-events total into a rate-limited WARNING."""

    def __init__(
        self,
        metrics: Metrics,
        start_at: datetime | None,
        queries: Sequence[QueryConfig] = (),
        *,
        interval_s: float = NOTICE_INTERVAL_S,
    ) -> None:
        """``start_at``: the configuration's ``window.start_at`` (None: unset); ``queries``:
        the configured queries, whose dropped events :meth:`observe` warns about too
        (:class:`DroppedEventsNotice`)."""
        self._drops = DroppedEventsNotice(metrics, queries, interval_s=interval_s)
        self._metrics = metrics
        self._start_at_set = start_at is not None
        self._interval_s = interval_s
        self._reported_total = 0.0
        self._warned_mono_s = -math.inf
        self._checked_mono_s = -math.inf

    def observe(
        self, coverage_start_s: int | None, now_mono_s: float, *, final: bool = False
    ) -> str | None:
        """Warn when the late-events total grew since the last warning and the interval
        passed; returns the message logged, else None. Dropped events of the queries are
        warned about alongside (their messages are :meth:`DroppedEventsNotice.observe`'s).
        Within :data:`CHECK_EVERY_S` of the last call that read the counters, nothing is
        read (None). ``final`` (the worker's stop): read now and warn of every drop not yet
        warned about, interval or not — the last second's drops were otherwise never said."""
        if not final and 0.0 <= now_mono_s - self._checked_mono_s < CHECK_EVERY_S:
            return None
        self._checked_mono_s = now_mono_s
        self._drops.observe(now_mono_s, final=final)
        late_total = counter_totals(self._metrics.late_events, LATE_EVENTS_SAMPLE).get((), 0.0)
        dropped = int(late_total - self._reported_total)
        waiting = not final and now_mono_s - self._warned_mono_s < self._interval_s
        if dropped <= 0 or waiting:
            return None
        self._reported_total = late_total
        self._warned_mono_s = now_mono_s
        message = late_events_message(dropped, coverage_start_s, start_at_set=self._start_at_set)
        log.warning("%s", message)
        return message


class DroppedEventsNotice:
    """Turns growth of the per-query drop totals into rate-limited WARNINGs."""

    def __init__(
        self,
        metrics: Metrics,
        queries: Sequence[QueryConfig],
        *,
        interval_s: float = NOTICE_INTERVAL_S,
    ) -> None:
        self._metrics = metrics
        self._queries = list(queries)
        self._interval_s = interval_s
        self._reported: dict[tuple[str, str], float] = {}
        self._warned_mono_s: dict[tuple[str, str], float] = {}

    def observe(self, now_mono_s: float, *, final: bool = False) -> list[str]:
        """Warn per query and reason whose total grew since its last warning once the
        interval passed (``final``: whether it passed or not); returns the messages logged."""
        out: list[str] = []
        totals = counter_totals(self._metrics.query_events_dropped, DROPPED_SAMPLE)
        for query in self._queries:
            for reason in ("outside_key_list", "missing_group_field", "missing_value"):
                key = (query.name, reason)
                total = totals.get(key, 0.0)
                dropped = int(total - self._reported.get(key, 0.0))
                last = self._warned_mono_s.get(key, -math.inf)
                if dropped <= 0 or (not final and now_mono_s - last < self._interval_s):
                    continue
                message = dropped_events_message(query, reason, dropped)
                if message is None:
                    continue
                self._reported[key] = total
                self._warned_mono_s[key] = now_mono_s
                log.warning("%s", message)
                out.append(message)
        return out
