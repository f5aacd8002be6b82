"""The Faust peer: per-user, per-window bounded event counts in a windowed table.

Run as ``python -m bench.faust_app SPEC_JSON``; prints one JSON line of measurements like
:mod:`bench.contenders`. For every event it decodes the JSON value (orjson), and in a tumbling
windowed table keyed by user id adds one to the user's count of that window unless it has
reached k (a per-user contribution bound, like stream-dp's reservoir of k). When a window
closes, the app sums its users' bounded counts and writes one window record to its output
topic. It does no pseudonymization, grouping by domain, noise or ledger: less work than the
stream-dp worker does, which favours Faust.

Made correct for this comparison (docs/architecture.md#embedded-broker):

* settings: ``broker_session_timeout=2.0``, ``broker_heartbeat_interval=0.5`` (defaults
  take 30 s joins here), ``producer_linger=0.05``, ``table_cleanup_interval`` short;
* windows close by **event time**, as in stream-dp: when the watermark (the minimum over
  the source partitions of the latest event time, minus the grace) passes a window's end;
  once the stream has been idle for ``idle_close_s``, the watermark advances with the wall
  clock from the latest event time (stream-dp's rule). Faust 0.15.3 expires
  windows by the wall clock instead (every window of replayed data would close at once,
  while still receiving events), and
* its ``on_window_close`` bookkeeping is fixed: Faust keeps one ``last_closed_window`` for
  all partitions, so once one partition closed a window the keys of the other partitions
  in that window were never reported. Here every partition's keys are reported and a
  window is emitted once, after all partitions closed it;
* no ``stream.take()`` (it raises "Operation outside of stream iteration" with event-time
  windows).
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

import faust
import orjson

SPEC: dict[str, Any] = orjson.loads(sys.argv[1]) if __name__ == "__main__" else {}


class _State:
    """What the agent has seen: per partition the latest event time, and counters."""

    def __init__(self) -> None:
        self.event_time_s = 0.0
        self.latest: dict[int, float] = {}
        self.last_event_mono: float | None = None
        self.events = 0
        self.late = 0
        self.first_event: float | None = None
        self.last_event: float | None = None
        self.windows: dict[float, list[int]] = {}  # window start → [users, bounded events]
        self.closed: set[float] = set()
        self.emitted = 0
        self.t0 = 0.0
        self.c0 = 0.0
        self.result: dict[str, Any] | None = None
        self.printed = False


STATE = _State()


class EventTimeTable(faust.Table):  # type: ignore[type-arg]
    """A windowed table whose windows close by event-time watermark (see the module doc)."""

    async def _del_old_keys(self) -> None:
        grace = float(SPEC["grace_s"])
        partitions = int(SPEC["partitions"])
        idle_s = 0.0 if STATE.last_event_mono is None else time.monotonic() - STATE.last_event_mono
        watermark = float("-inf")
        if len(STATE.latest) == partitions:
            watermark = min(STATE.latest.values()) - grace
        if STATE.latest and idle_s >= float(SPEC["idle_close_s"]):
            # As stream-dp: a silent stream advances event time with the wall clock.
            watermark = max(watermark, max(STATE.latest.values()) + idle_s - grace)
        closing: set[float] = set()
        for partition, timestamps in self._partition_timestamps.items():
            while timestamps and timestamps[0] <= watermark:
                range_end = heapq.heappop(timestamps)
                keys = self._partition_timestamp_keys.pop((partition, range_end), None)
                for key in keys or ():
                    value = self.data.pop(key, None)
                    await self.on_window_close(key, value)
                    closing.add(key[1][0])
        for start in sorted(closing):
            await _emit_window(start)


async def _emit_window(start: float) -> None:
    users, events = STATE.windows.pop(start, [0, 0])
    STATE.closed.add(start)
    fut = await OUTPUT.send(
        key=str(start).encode(),
        value=orjson.dumps({"window_start": start, "users": users, "bounded_events": events}),
    )
    await fut
    STATE.emitted += 1
    if STATE.emitted >= int(SPEC["windows"]) and STATE.result is None:
        STATE.result = {
            "events": STATE.events,
            "late_events": STATE.late,
            "windows": STATE.emitted,
            "seconds": time.perf_counter() - STATE.t0,
            "cpu_seconds": time.process_time() - STATE.c0,
            "startup_seconds": (STATE.first_event or 0.0) - STATE.t0,
            "processing_seconds": (STATE.last_event or 0.0) - (STATE.first_event or 0.0),
            "close_seconds": time.perf_counter() - (STATE.last_event or 0.0),
        }
        _print_result()
        # Faust's own clean shutdown; it has been seen to spin for many minutes reading a
        # connection in stop_and_shutdown, so the process ends regardless after a while
        # (the result is out; nothing the measurement needs happens after it).
        threading.Thread(target=_exit_after, args=(SHUTDOWN_GRACE_S,), daemon=True).start()
        os.kill(os.getpid(), signal.SIGTERM)


#: Seconds Faust's shutdown may take once the result is printed, before the process exits.
SHUTDOWN_GRACE_S = 20.0


def _print_result() -> None:
    if STATE.printed:
        return
    STATE.printed = True
    # To file descriptor 1 itself: while the worker runs, Faust's sys.stdout is a logger.
    os.write(1, orjson.dumps(STATE.result) + b"\n")


def _exit_after(seconds: float) -> None:
    time.sleep(seconds)  # a hang guard on Faust's shutdown, not a measurement
    os._exit(0)


def _on_window_close(key: Any, value: Any) -> None:
    start = key[1][0]
    if start in STATE.closed:
        STATE.late += int(value or 0)  # cannot happen with ordered partitions; counted
        return
    totals = STATE.windows.setdefault(start, [0, 0])
    totals[0] += 1
    totals[1] += int(value or 0)


def _event_time(event: Any = None) -> float:
    return STATE.event_time_s


app = faust.App(
    SPEC.get("app_id", "bench-faust"),
    broker=f"kafka://{SPEC.get('bootstrap', '127.0.0.1:9092')}",
    datadir=SPEC.get("datadir", "{conf.name}-data"),
    store="memory://",
    value_serializer="raw",
    key_serializer="raw",
    topic_partitions=int(SPEC.get("partitions", 4)),
    broker_session_timeout=2.0,
    broker_heartbeat_interval=0.5,
    producer_linger=0.05,
    table_cleanup_interval=0.2,
    web_enabled=False,
    Table=EventTimeTable,
)
SOURCE = app.topic(SPEC.get("topic", "events"), key_type=bytes, value_type=bytes)
OUTPUT = app.topic(SPEC.get("output_topic", "bench-faust-out"), key_type=bytes, value_type=bytes)
WINDOW_S = float(SPEC.get("window_size_s", 60))
COUNTS = app.Table(
    "bounded-counts",
    default=int,
    key_type=str,
    value_type=int,
    partitions=int(SPEC.get("partitions", 4)),
    on_window_close=_on_window_close,
)
# relative_to(callable) exists on WindowWrapper; faust's WindowWrapperT stub lacks it.
WINDOWED = COUNTS.tumbling(WINDOW_S, expires=WINDOW_S * 10).relative_to(  # type: ignore[attr-defined]
    _event_time
)


@app.agent(SOURCE)
async def bounded_count(stream: Any) -> None:
    k = int(SPEC.get("k", 40))
    loads = orjson.loads
    async for event in stream.events():
        now = time.perf_counter()
        if STATE.first_event is None:
            STATE.first_event = now
        obj = loads(event.value)
        t = obj["timestamp"] / 1000.0
        STATE.event_time_s = t
        partition = event.message.partition
        if t > STATE.latest.get(partition, 0.0):
            STATE.latest[partition] = t
        user = obj["user_id"]
        current = WINDOWED[user].current()
        if current < k:
            WINDOWED[user] = current + 1
        STATE.events += 1
        STATE.last_event_mono = time.monotonic()
        STATE.last_event = now


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    worker = faust.Worker(app, loglevel="WARNING", quiet=True)
    STATE.t0, STATE.c0 = time.perf_counter(), time.process_time()
    with contextlib.suppress(SystemExit):  # the worker exits the process when it stops
        worker.execute_from_commandline()
    if STATE.result is None:
        raise SystemExit("faust peer stopped before its last window")
    _print_result()


if __name__ == "__main__":
    main()
