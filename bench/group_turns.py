"""A group's workers taking turns: one process runs at a time, the others are stopped.

``python -m bench.realistic --workers 1,3 --turns SLICE_S`` asks what a group's CPU per event
is made of on a machine with fewer cores than processes. Three workers and a broker on two
cores preempt one another; a group with a core per worker would not. Taking turns keeps
everything that belongs to the group (each worker's share of the partitions, the
repartition hop between workers, three consumers fetching, three sets of buffers) and
removes the concurrency: each worker runs alone for ``SLICE_S`` seconds, then is stopped
(SIGSTOP) and the next resumed (SIGCONT).

A stopped worker answers no ``/metrics`` request, and its counters and CPU time do not move
while it is stopped. So each worker's reading (its scrape and, right after the answer, its
CPU time: one moment) is taken while it runs, just before it is stopped, and stands for it
until it runs again. A group's reading is the running worker's live one and the others'
last.

A stopped worker misses its heartbeats for (workers − 1) × ``SLICE_S``: keep that well under
the group's session timeout (``kafka.session_timeout_ms``, 10 s by default).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import suppress

#: One worker's reading: its /metrics figures, and its CPU seconds right after the answer.
Reading = tuple[dict[str, float], float]


def stop_and_wait(pids: Sequence[int], state: Callable[[int], str]) -> None:
    """SIGSTOP each of ``pids``, returning once every one is stopped (state ``T``): a signal
    reaches a process running on another core a moment later."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    started = time.monotonic()
    while not all(state(pid) == "T" for pid in pids):
        if time.monotonic() - started > 60:  # a hang guard
            raise RuntimeError("a worker did not stop on SIGSTOP")
        time.sleep(0.001)


class Turns:
    """Keeps one of ``pids`` running at a time, each for ``slice_s`` in turn (module
    docstring). ``scrape(i)`` reads worker ``i``'s /metrics, ``cpu_s(pid)`` a process's CPU
    seconds, ``state(pid)`` its state letter in /proc (``T``: stopped)."""

    def __init__(
        self,
        pids: Sequence[int],
        slice_s: float,
        *,
        scrape: Callable[[int], dict[str, float]],
        cpu_s: Callable[[int], float],
        state: Callable[[int], str],
    ) -> None:
        self._pids = list(pids)
        self.slice_s = slice_s
        self._scrape, self._cpu_s, self._state = scrape, cpu_s, state
        self._lock = threading.RLock()  # re-entrant: a caller may hold it across reads
        self._readings: list[Reading | None] = [None] * len(self._pids)
        self.running = 0
        self.switches = 0
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def _reading(self, i: int) -> Reading:
        scraped = self._scrape(i)
        return scraped, self._cpu_s(self._pids[i])

    def _stop(self, i: int) -> None:
        """Worker ``i``'s last reading, then it is stopped."""
        self._readings[i] = self._reading(i)
        stop_and_wait([self._pids[i]], self._state)

    def start(self) -> None:
        """Every worker running (as after the backlog): all but the first stopped, and the
        turns begin."""
        with self._lock:
            for i in range(1, len(self._pids)):
                self._stop(i)
        self._thread = threading.Thread(target=self._rotate, daemon=True)
        self._thread.start()

    def _rotate(self) -> None:
        while not self._done.wait(self.slice_s):
            with self._lock:
                if self._done.is_set():
                    return
                current = self.running
                self._stop(current)
                self.running = (current + 1) % len(self._pids)
                os.kill(self._pids[self.running], signal.SIGCONT)
                self.switches += 1

    def read(self) -> tuple[list[dict[str, float]], list[float]]:
        """Each worker's figures and CPU seconds: the running one's now, the others' from
        just before they were stopped."""
        readings: list[Reading] = []
        with self._lock:
            for i in range(len(self._pids)):
                kept = self._readings[i]
                live = self._done.is_set() or i == self.running  # all run once done
                readings.append(self._reading(i) if live or kept is None else kept)
        return [r[0] for r in readings], [r[1] for r in readings]

    def stop(self) -> None:
        """The turns end and every worker runs (also when called twice, or before
        :meth:`start`)."""
        self._done.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=120)
        with self._lock:
            for pid in self._pids:
                with suppress(ProcessLookupError):  # exited: nothing to resume
                    os.kill(pid, signal.SIGCONT)
