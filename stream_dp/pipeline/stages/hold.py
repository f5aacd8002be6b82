"""Bounds on a held window: completeness before a stage-2 release, a maximum hold.

Stage 2 releases a window once every source partition's watermark has passed it
(:meth:`~stream_dp.pipeline.stages.partials_inbox.PartialsInbox.passed_through`): a
source's watermark follows, on every partials partition, each partial it sealed before it,
so a source that wrote no partial of the window had no events in it — its watermark is its
sealed report. Two ways a source's report can still be missing, and stage 2 must not take
them for "no events":

* a source never heard of (no watermark on this partials partition): the window is not
  due (``passed_through`` is None); :class:`SourceCompleteness` logs which sources it
  waits for;
* a partial read in part only (a part lost from the log, or malformed): the source
  reported the window and its share is not all here. The window is held
  (:meth:`SourceCompleteness.holds`), with ``stream_dp_partials_incomplete`` and a WARNING
  naming the source; a complete version from the source's next owner releases it.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Mapping

from stream_dp.errors import StreamDPError
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.stages.partials_inbox import PartialsInbox
from stream_dp.windows.tumbling import iso_utc

log = logging.getLogger(__name__)


class SourceCompleteness:
    """Whether every source's report of a due window is here in full (module docstring)."""

    def __init__(self, inbox: PartialsInbox, metrics: Metrics) -> None:
        self._inbox = inbox
        self._metrics = metrics
        #: (window, query, source) already warned about: one WARNING each, not one per loop.
        self._warned: set[tuple[int, str, int]] = set()
        #: Per partials partition, the sources last logged as awaited.
        self._awaited: dict[int, tuple[int, ...]] = {}
        #: Incomplete partials of windows held this round (for the gauge).
        self._held: dict[int, int] = {}

    def begin(self) -> None:
        """A new round of due-window checks."""
        self._held = {}

    def end(self) -> None:
        self._metrics.partials_incomplete.set(sum(self._held.values()))
        self._warned = {w for w in self._warned if w[0] in self._held}

    def holds(self, window_start_s: int) -> bool:
        """Whether a due window must wait: a source's partial of it is incomplete."""
        missing = self._inbox.incomplete_sources(window_start_s)
        if not missing:
            return False
        self._held[window_start_s] = len(missing)
        for query, source in missing:
            if (window_start_s, query, source) in self._warned:
                continue
            self._warned.add((window_start_s, query, source))
            log.warning(
                "a window waits for the rest of source partition %d's partial: released "
                "without it, that source's events would count as none",
                source,
                extra={"window": iso_utc(window_start_s), "query": query, "source": source},
            )
        return True

    def note_unheard(self, r: int, sources: tuple[int, ...]) -> None:
        """Log (once per change) the sources partials partition ``r`` waits to hear from."""
        if self._awaited.get(r, ()) == sources:
            return
        self._awaited[r] = sources
        if sources:
            log.info(
                "partials partition %d waits for the watermarks of source partitions %s",
                r,
                ", ".join(map(str, sources)),
            )


#: The held age is tracked to within this share of the maximum hold (at most ~1000 samples
#: per partition, whatever the hold).
HOLD_SAMPLE_SHARE = 1e-3


class MaxHoldExceededError(StreamDPError):
    """A record an unreleased window pins has been held longer than ``output.max_hold_s``."""


class HeldRecordAge:
    """How long the oldest record pinned by this worker's commits on an internal topic has
    been held, by its Kafka timestamp (written by the worker itself: the clock retention
    uses). Per partition it keeps (offset, timestamp) samples of fetched records, at most one
    per ``max_hold_s × HOLD_SAMPLE_SHARE``, and forgets those behind the safe offset; the
    age read is that of the latest sample at or below the safe offset — never younger than
    the pinned record's own (timestamps grow with offsets on a topic one writer appends to),
    and older by at most one sample step.

    Two ages of a pinned record: its **age in the log** (now − its timestamp: what retention
    measures, ``stream_dp_held_record_age_seconds``) and its **age while read**: the part of
    that age this worker could read the log (now − the later of its timestamp and
    :attr:`reading_since_s`). ``output.max_hold_s`` bounds the age while read: a window
    that a running worker cannot release is the stuck window it is there to stop. An outage
    (the worker down, the broker unreachable) is not: after it the worker catches up first —
    the records are all still there unless the broker deleted them, which the offsets out of
    range show (the position below the log start stops the worker, naming the windows). The
    worker starts only when the internal topics' real retention exceeds the maximum hold
    (:func:`stream_dp.broker.durability.hold_problem`), so a running worker stops before
    retention can delete what a window pins.
    """

    def __init__(self, topics: set[str], *, max_hold_s: float, metrics: Metrics) -> None:
        self.topics = topics
        self._metrics = metrics
        self.max_hold_s = max_hold_s
        metrics.config_max_hold.set(max_hold_s)
        self._step_s = max(1.0, max_hold_s * HOLD_SAMPLE_SHARE)
        self._samples: dict[tuple[str, int], deque[tuple[int, float]]] = {}
        #: Per partition, the offset after the last record fetched.
        self._next: dict[tuple[str, int], int] = {}
        #: Since when (wall clock) this worker reads the log without a gap: its start, or the
        #: end of the last outage (:meth:`resume_reading`). None: not reading yet.
        self.reading_since_s: float | None = None

    def resume_reading(self, now_s: float) -> None:
        """The worker reads the log (again) from ``now_s``: what it pins is held from here."""
        self.reading_since_s = now_s

    def observe(
        self, topic: str, partition: int, offsets_and_times: Iterable[tuple[int, float]]
    ) -> None:
        """Fetched records of a partition: (offset, Kafka timestamp in seconds), in order."""
        if topic not in self.topics:
            return
        samples = self._samples.setdefault((topic, partition), deque())
        last = None
        for offset, ts in offsets_and_times:
            last = offset
            if samples and offset < samples[-1][0]:
                samples.clear()  # read again from an earlier offset (taken again)
            if not samples or ts - samples[-1][1] >= self._step_s:
                samples.append((offset, ts))
        if last is not None:
            self._next[(topic, partition)] = last + 1

    def forget(self, topic: str, partition: int) -> None:
        self._samples.pop((topic, partition), None)
        self._next.pop((topic, partition), None)

    def oldest(
        self, safe_offsets: Mapping[tuple[str, int], int], now_s: float
    ) -> tuple[float, tuple[str, int] | None]:
        """(age in the log in seconds, partition) of the oldest pinned record; (0, None):
        none held."""
        worst: tuple[float, tuple[str, int] | None] = (0.0, None)
        for key, safe in safe_offsets.items():
            samples = self._samples.get(key)
            if not samples or safe >= self._next.get(key, safe):
                continue  # nothing fetched here, or everything fetched is done
            while len(samples) > 1 and samples[1][0] <= safe:
                samples.popleft()
            if samples[0][0] > safe:
                continue  # the pinned record was fetched before this process sampled it
            age = max(0.0, now_s - samples[0][1])
            if age > worst[0]:
                worst = (age, key)
        return worst

    def check(self, safe_offsets: Mapping[tuple[str, int], int], now_s: float) -> float:
        """The oldest held age in the log; raises :class:`MaxHoldExceededError` when the
        oldest pinned record's age while read passes the maximum."""
        age, where = self.oldest(safe_offsets, now_s)
        self._metrics.held_record_age.set(age)
        since = now_s if self.reading_since_s is None else self.reading_since_s
        while_read = min(age, max(0.0, now_s - since))
        if where is not None and while_read > self.max_hold_s:
            topic, partition = where
            self._metrics.max_hold_exceeded.inc()
            raise MaxHoldExceededError(
                f"a window has held {topic}[{partition}] at offset {safe_offsets[where]} for "
                f"{while_read:.0f} s while this worker could read it ({age:.0f} s since it "
                f"was written), more than output.max_hold_s = {self.max_hold_s:g} s: before "
                "retention deletes records it still needs, nothing more is released. Find "
                "the partition that holds the window back (stream_dp_fetch_age_seconds, the "
                "log's 'waits for' lines) and make it readable; to wait longer, raise "
                "output.internal_retention_s and output.max_hold_s together, set the "
                "topics' retention with `stream-dp topics apply`, then restart. See the "
                "runbook (StreamDPMaxHoldExceeded)"
            )
        return age


class HeldStateTooLargeError(StreamDPError):
    """The open windows' state stayed above ``window.max_held_state_bytes`` too long."""


class HeldStateCap:
    """The memory cap on held state: above ``window.max_held_state_bytes`` the worker
    applies backpressure (the caller pauses fetching what adds to it; the group stays
    alive); still above after ``window.max_backpressure_s``, a clear stop instead of an
    out-of-memory kill."""

    def __init__(
        self, max_bytes: int | None, *, max_backpressure_s: float, metrics: Metrics
    ) -> None:
        self.max_bytes = max_bytes
        self.max_backpressure_s = max_backpressure_s
        self._metrics = metrics
        self._over_since_mono: float | None = None
        metrics.config_max_held_state.set(float("nan") if max_bytes is None else max_bytes)

    def backpressure(self, held_bytes: int, now_mono_s: float) -> bool:
        """Whether fetching must pause now; raises :class:`HeldStateTooLargeError` once the
        state has stayed above the cap for ``max_backpressure_s``."""
        self._metrics.held_state.set(held_bytes)
        if self.max_bytes is None or held_bytes <= self.max_bytes:
            if self._over_since_mono is not None:
                log.info("held state back under window.max_held_state_bytes: fetching again")
            self._over_since_mono = None
            self._metrics.backpressure.set(0)
            return False
        if self._over_since_mono is None:
            self._over_since_mono = now_mono_s
            log.warning(
                "open windows hold %d bytes, above window.max_held_state_bytes = %d: "
                "fetching paused until sealed windows bring them under",
                held_bytes,
                self.max_bytes,
            )
        self._metrics.backpressure.set(1)
        over_s = now_mono_s - self._over_since_mono
        if over_s > self.max_backpressure_s:
            raise HeldStateTooLargeError(
                f"open windows have held {held_bytes} bytes, above "
                f"window.max_held_state_bytes = {self.max_bytes}, for {over_s:.0f} s with "
                "fetching paused (window.max_backpressure_s = "
                f"{self.max_backpressure_s:g}): nothing more is released rather than "
                "running out of memory. A window is held open (see StreamDPHeldTooLong) or "
                "is larger than the cap: make the holding partition readable, or give the "
                "worker more memory and raise the cap (or lower "
                "bounds.max_contributions_per_window), or add workers; then restart. See "
                "the runbook (StreamDPBackpressure)"
            )
        return True
