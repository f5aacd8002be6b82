"""Where the worker's wall time goes while a backlog waits: busy CPU against each kind of wait.

``python -m bench.idle_probe [--brokers tansu,kafka] [--before COMMIT]`` runs issue 43's
realistic stream (:mod:`bench.realistic`: the same topic, events, config and rate counter)
through ``stream-dp run`` with timers around the loop's awaits, and prints, per broker, path
and tree, the measured span (first ``stream_dp_events_consumed_total`` increment of the loop to
the iteration that reaches every event) split into:

* the process's CPU time (every thread: the busy share of one core);
* the loop waiting for a fetch (``Membership.fetch``: nothing buffered to hand out);
* stage 0 waiting for its repartition records' acknowledgements (``StageOutput.route``);
* seals, partials, watermarks and releases (``Worker._seal_and_release``);
* the offset commit (``Membership.commit_in_loop``);
* the records processing in the loop (the rest of the iteration);

and how long aiokafka's fetcher had a fetch request in flight while the loop processed a
batch (a second fetch overlapping the work) — the double buffering the loop relies on. Inside
the hand-off it times the seal (in its thread), every write to the partials topic and the
watermark announcements written on their own; and every produce request's round trip
(``produce_ms``, by topic: a request carrying several topics counts for each).
Instrumentation only: the timers wrap the methods and change nothing they do. Not a test, and
never timed in one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: The phases of an iteration the probe times (wall seconds spent awaiting each).
PHASES = ("fetch", "route", "seal_release", "commit", "take")
#: Inside ``seal_release``: stage 1's hand-off, the releases, the ledger bounds, topology;
#: inside the hand-off: the seal (in its thread), the waits for the partials topic's
#: acknowledgements (partials and watermarks; a write left in flight is awaited by the next
#: turn), the watermark announcements alone, the partner exports.
SUB_PHASES = ("handoff", "release", "bounds", "tick", "seal", "partials_write", "announce")


# -- inside the worker process ----------------------------------------------------------------
def run_queue_s() -> float:
    """How long this process's main thread (the event loop's) has waited for a CPU while
    runnable (the kernel's schedstat): under load, time that is neither work nor a wait on
    the broker."""
    try:
        with open("/proc/self/schedstat", encoding="ascii") as f:
            return int(f.read().split()[1]) / 1e9
    except OSError:
        return 0.0


def _install(out: Path, events: int) -> None:
    """Timers around the worker's awaits; the iterations written to ``out`` at exit."""
    import atexit
    import functools

    from aiokafka.consumer import fetcher as aio_fetcher

    from stream_dp.pipeline.handoff import Handoff
    from stream_dp.pipeline.kafka import worker as worker_module
    from stream_dp.pipeline.kafka.kafka_transport import KafkaTransport
    from stream_dp.pipeline.kafka.ledger_reader import LedgerReader
    from stream_dp.pipeline.kafka.membership import Membership
    from stream_dp.pipeline.kafka.stage_output import StageOutput
    from stream_dp.pipeline.kafka.topology_watch import TopologyWatch
    from stream_dp.pipeline.release_driver import ReleaseDriver

    current: dict[str, float] = dict.fromkeys(
        [
            *PHASES,
            *SUB_PHASES,
            *(f"{p}_{what}" for p in (*PHASES, *SUB_PHASES) for what in ("cpu", "rq")),
        ],
        0.0,
    )
    iterations: list[dict[str, Any]] = []
    in_flight: list[list[float]] = []  # [sent, answered] of every fetch request

    def timed(cls: Any, name: str, phase: str) -> None:
        original = getattr(cls, name)

        @functools.wraps(original)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            t, c, q = time.monotonic(), time.process_time(), run_queue_s()
            try:
                return await original(*args, **kwargs)
            finally:
                current[phase] += time.monotonic() - t
                current[f"{phase}_cpu"] += time.process_time() - c
                current[f"{phase}_rq"] += run_queue_s() - q

        setattr(cls, name, wrapper)

    timed(Membership, "fetch", "fetch")
    timed(StageOutput, "route", "route")
    timed(worker_module.Worker, "_seal_and_release", "seal_release")
    timed(Membership, "commit_in_loop", "commit")
    timed(Membership, "take_assigned", "take")
    timed(Handoff, "step", "handoff")
    timed(ReleaseDriver, "release_window", "release")
    timed(LedgerReader, "read_awaited_bounds", "bounds")
    timed(TopologyWatch, "tick", "tick")
    timed(KafkaTransport, "seal", "seal")
    if hasattr(Handoff, "settle"):  # a partials write awaited by the next turn
        timed(Handoff, "settle", "partials_write")
    else:  # a tree from before: each write awaited where it is made
        timed(KafkaTransport, "write_partials", "partials_write")
    timed(Handoff, "announce", "announce")

    from aiokafka.producer import sender as aio_sender

    produced: list[list[Any]] = []  # [sent, answered, topics] of every produce request
    original_produce = aio_sender.Sender._send_produce_req

    async def send_produce_req(self: Any, node_id: Any, batches: Any) -> Any:
        span: list[Any] = [time.monotonic(), 0.0, sorted({tp.topic for tp in batches})]
        produced.append(span)
        try:
            return await original_produce(self, node_id, batches)
        finally:
            span[1] = time.monotonic()

    aio_sender.Sender._send_produce_req = send_produce_req

    original_request = aio_fetcher.Fetcher._proc_fetch_request

    async def proc_fetch_request(self: Any, *args: Any, **kwargs: Any) -> Any:
        request = args[2]
        parts = sum(len(p) for _, p in request.topics)
        span: list[Any] = [time.monotonic(), 0.0, parts, None, request._max_wait_ms]
        in_flight.append(span)
        try:
            span[3] = await original_request(self, *args, **kwargs)
            return span[3]
        finally:
            span[1] = time.monotonic()

    aio_fetcher.Fetcher._proc_fetch_request = proc_fetch_request

    original_loop_iteration = worker_module.Worker._iteration

    async def iteration(self: Any, batch: Any, waiting: Any) -> Any:
        t = time.monotonic()
        try:
            return await original_loop_iteration(self, batch, waiting)
        finally:
            consumed = self.metrics.events_consumed._value.get()
            iterations.append(
                {
                    "start": t,
                    "end": time.monotonic(),
                    "cpu": time.process_time(),
                    "records": sum(len(m) for m in batch.values()),
                    "consumed": consumed,
                    "run_queue": run_queue_s(),
                    **current,
                }
            )
            for phase in current:
                current[phase] = 0.0

    worker_module.Worker._iteration = iteration  # type: ignore[method-assign]

    def dump() -> None:
        out.write_text(
            json.dumps({"iterations": iterations, "in_flight": in_flight, "produced": produced})
        )

    atexit.register(dump)


def breakdown(data: dict[str, Any], events: int) -> dict[str, Any]:
    """The measured span's wall time, split (see the module docstring)."""
    its = data["iterations"]
    first = next(i for i, it in enumerate(its) if it["consumed"] > 0)
    last = next(i for i, it in enumerate(its) if it["consumed"] >= events)
    # The span: from the end of the first iteration that consumed to the end of the one that
    # reached every event (as the operator's first and last readings of the counter).
    span = its[first + 1 : last + 1]
    t0, t1 = its[first]["end"], its[last]["end"]
    wall = t1 - t0
    cpu = its[last]["cpu"] - its[first]["cpu"]
    waits = {phase: sum(it[phase] for it in span) for phase in PHASES}
    phases = {
        phase: {
            "wall_share": sum(it[phase] for it in span) / wall,
            "cpu_share": sum(it[f"{phase}_cpu"] for it in span) / wall,
            "run_queue_share": sum(it.get(f"{phase}_rq", 0.0) for it in span) / wall,
        }
        for phase in (*PHASES, *SUB_PHASES)
    }
    in_loop = sum(it["end"] - it["start"] for it in span)
    processing = in_loop - sum(waits[p] for p in PHASES if p != "fetch")
    # A fetch request in flight while the loop processed (outside its own fetch wait).
    overlap = 0.0
    for it in span:
        for sent, answered, *_ in data["in_flight"]:
            answered = answered or it["end"]
            overlap += max(0.0, min(answered, it["end"]) - max(sent, it["start"]))
    events_in_span = its[last]["consumed"] - its[first]["consumed"]
    # Produce requests sent in the span: how many, and their round trips by topic kind.
    produced = [p for p in data.get("produced", []) if t0 <= p[0] <= t1 and p[1]]
    produce_ms: dict[str, list[float]] = {}
    for sent, answered, topics in produced:
        for topic in topics:
            kind = topic.split("-")[1] if topic.count("-") >= 2 else topic  # realistic-X-id
            produce_ms.setdefault(kind, []).append((answered - sent) * 1e3)
    run_queue = its[last].get("run_queue", 0.0) - its[first].get("run_queue", 0.0)
    return {
        "span_mono": (t0, t1),
        "events": events_in_span,
        "wall_s": wall,
        "cpu_s": cpu,
        "busy_share": cpu / wall,
        "run_queue_share": run_queue / wall,
        "events_per_s": events_in_span / wall,
        "cpu_us_per_event": cpu / events_in_span * 1e6,
        "iterations": len(span),
        "records_per_iteration": sum(it["records"] for it in span) / max(1, len(span)),
        "share": {
            "fetch_wait": waits["fetch"] / wall,
            "route_acks": waits["route"] / wall,
            "seal_release": waits["seal_release"] / wall,
            "commit": waits["commit"] / wall,
            "take": waits["take"] / wall,
            "processing": processing / wall,
            "between_iterations": (wall - in_loop - waits["fetch"]) / wall,
        },
        "fetch_in_flight_while_processing": overlap / max(1e-9, in_loop),
        "phases": phases,
        "produce_requests": len(produced),
        "produce_ms": {
            kind: {"n": len(ms), "median": sorted(ms)[len(ms) // 2], "max": max(ms)}
            for kind, ms in produce_ms.items()
        },
        "fetch_requests": [
            [round(s - t0, 4), round((a or t1) - s, 4), n, got, *wait]
            for s, a, n, got, *wait in data["in_flight"]
            if t0 <= s <= t1
        ],
    }


# -- the driver -------------------------------------------------------------------------------
class BrokerCpu:
    """The broker process's CPU time (every thread), sampled every 20 ms on this process's
    monotonic clock (the worker's is the same clock): the broker's CPU over the worker's
    measured span, the work the broker does for it (on the default path the repartition hop
    is produced to and fetched from the broker once more)."""

    def __init__(self, pid: int) -> None:
        import threading

        self._pid = pid
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        from bench.realistic import _cpu_s

        while not self._stop.wait(0.02):
            self.samples.append((time.monotonic(), _cpu_s(self._pid)))

    def __enter__(self) -> BrokerCpu:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, t0: float, t1: float) -> float:
        """CPU seconds between the samples nearest ``t0`` and ``t1``."""

        def at(t: float) -> float:
            return min(self.samples, key=lambda s: abs(s[0] - t))[1]

        return at(t1) - at(t0) if self.samples else float("nan")


def run_one(
    bootstrap: str,
    topic: str,
    events: int,
    start_s: int,
    *,
    keyed: bool,
    tree: Path,
    tmp: Path,
    broker_pid: int | None = None,
) -> dict[str, Any]:
    from bench import realistic
    from stream_dp.broker.process import free_port

    port = free_port("127.0.0.1")
    config = realistic.worker_config(bootstrap, topic, start_s, keyed=keyed, port=port)
    path = tmp / f"config-{uuid.uuid4().hex[:8]}.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    out = tmp / f"probe-{uuid.uuid4().hex[:8]}.json"
    log = tmp / f"worker-{uuid.uuid4().hex[:8]}.log"
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),  # the worker's code; the probe runs from its file
        "STREAM_DP_PSEUDONYM_KEY": os.urandom(32).hex(),
        "PYTHONWARNINGS": "ignore",
    }
    command = [
        sys.executable,
        "-c",
        "import runpy, sys; runpy.run_path(sys.argv[1])['worker_main'](sys.argv[2:])",
        __file__,
        str(path),
        str(out),
        str(events),
    ]
    t_start = time.perf_counter()
    with log.open("wb") as handle:
        proc = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=tree)
    with BrokerCpu(broker_pid or os.getpid()) as broker_cpu:
        try:
            outside = realistic._watch([proc], [port], [log], events, t_start, None)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    result = breakdown(json.loads(out.read_text()), events)
    if broker_pid is not None:
        t0, t1 = result.pop("span_mono")
        result["broker_cpu_us_per_event"] = broker_cpu.between(t0, t1) / result["events"] * 1e6
        result["broker_busy_share"] = broker_cpu.between(t0, t1) / (t1 - t0)
    result["outside_events_per_s"] = outside["events_per_s"]
    result["outside_cpu_us_per_event"] = outside["cpu_us_per_event"]
    return result


def worker_main(argv: list[str]) -> None:
    """The worker process: the timers installed, then ``stream-dp run``."""
    config, out, events = argv
    _install(Path(out), int(events))
    from stream_dp.cli.main import main as cli_main

    sys.argv = ["stream-dp", "run", "--config", config]
    sys.exit(cli_main())


def main(argv: list[str] | None = None) -> None:
    import asyncio

    from bench import realistic
    from bench.throughput import create_topics

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=400_000)
    parser.add_argument("--brokers", default="tansu,kafka")
    parser.add_argument("--before", help="a commit whose worker runs too")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--modes", default="default,keyed")
    parser.add_argument("--json", type=Path, help="write the results here too")
    parser.add_argument(
        "--pin-broker",
        action="store_true",
        help="the broker on the last core, this probe and the workers on the others",
    )
    opts = parser.parse_args(argv)
    results: dict[str, Any] = {"load_1min": [os.getloadavg()[0]]}
    with tempfile.TemporaryDirectory(prefix="idle-probe-") as tmp_name:
        tmp = Path(tmp_name)
        trees = {"after": ROOT}
        if opts.before:
            trees = {"before": realistic._export(opts.before, tmp / "before"), **trees}
        for name in opts.brokers.split(","):
            start_s = realistic.first_window_s(time.time())
            values, keys = realistic.stream(opts.events, start_s)
            with realistic._broker(name) as broker, ExitStack() as stack:
                if opts.pin_broker:
                    pins = stack.enter_context(realistic.pinned(broker.pid))
                    results.setdefault("pinned", {})[name] = pins
                bootstrap = broker.bootstrap_servers
                topic = f"realistic-{uuid.uuid4().hex[:8]}"
                asyncio.run(create_topics(bootstrap, [topic], realistic.PARTITIONS))
                realistic.produce(bootstrap, topic, values, keys)
                for run in range(opts.runs):
                    for mode in opts.modes.split(","):
                        for label, tree in trees.items():
                            r = run_one(
                                bootstrap,
                                topic,
                                opts.events,
                                start_s,
                                keyed=mode == "keyed",
                                tree=tree,
                                tmp=tmp,
                                broker_pid=broker.pid,
                            )
                            results.setdefault(f"{name}_{mode}_{label}", []).append(r)
                            head = f"{name} {mode} {label} run {run + 1}:"
                            print(head, json.dumps(r), flush=True)
    results["load_1min"].append(os.getloadavg()[0])
    if opts.json is not None:
        opts.json.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")


# -- the RESULTS.md block (rendered by bench.realistic with the run kept under ``idle``) --------
#: The waits of the table: (column, phase timed). A phase's wait is its wall time less the
#: process CPU time spent meanwhile (the thread a seal or a draw runs in counts as busy) and
#: less the loop thread's time waiting for a CPU meanwhile (its own column).
WAITS = (
    ("fetch wait", "fetch"),
    ("stage 0's acks", "route"),
    ("seals, partials", "handoff"),
    ("releases", "release"),
    ("commits", "commit"),
)


def _wait(r: dict[str, Any], phase: str) -> float:
    p = r["phases"][phase]
    return float(max(0.0, p["wall_share"] - p["cpu_share"] - p.get("run_queue_share", 0.0)))


def _broker_cpu(r: dict[str, Any]) -> str:
    """The broker's CPU per event over the span (runs before it was sampled: a dash)."""
    value = r.get("broker_cpu_us_per_event")
    return "–" if value is None else f"{value:.2f}"


def rows(probe: dict[str, Any]) -> list[str]:
    """Markdown: per broker, path and tree, the measured span's wall time split into busy CPU
    and each kind of wait (the single run of each, ``python -m bench.idle_probe``)."""
    head = " | ".join(name for name, _ in WAITS)
    lines = [
        f"| broker, path, worker | events/s | CPU µs/event | busy CPU | waiting for a CPU | "
        f"{head} | other | the broker's CPU µs/event |",
        "|---|---|---|---|---|" + "---|" * len(WAITS) + "---|---|",
    ]
    for key, results in probe.items():
        if key in ("load_1min", "pinned"):
            continue
        broker, mode, tree = key.split("_")
        r = results[0]
        waits = [_wait(r, phase) for _, phase in WAITS]
        queued = r.get("run_queue_share", 0.0)
        other = max(0.0, 1.0 - r["busy_share"] - queued - sum(waits))
        cells = " | ".join(f"{w:.0%}" for w in waits)
        lines.append(
            f"| {broker}, {mode}, {tree} | {r['events_per_s']:,.0f} | "
            f"{r['cpu_us_per_event']:.2f} | {r['busy_share']:.0%} | {queued:.0%} | {cells} | "
            f"{other:.0%} | {_broker_cpu(r)} |"
        )
    return lines


#: What the kept run shows (written from it; rerun, then check it still holds).
NOTES: list[str] = [
    "**The table** (`python -m bench.idle_probe --brokers tansu,kafka --before 6fb70fb`, "
    "07:36 UTC, the worker of `8eceb30` after, load average 6.4–8.2, one run each on one topic "
    "per broker): the measured span (the loop's first `stream_dp_events_consumed_total` "
    "increment to the iteration that reaches every event) split by timers around the loop's "
    "awaits. Busy CPU: the process's CPU time (every thread) over the span. Waiting for a CPU: "
    "the loop thread's run-queue time (`/proc/self/schedstat`): runnable, not running. Each "
    "wait: that await's wall time less the CPU spent and the run-queue time during it, i.e. "
    "time nothing ran because the broker had not answered. Other: the rest (between "
    "iterations). On this machine (2 cores, 8 engineers' work) the worker waits for a CPU "
    "24–69% of the span and every figure moves with that share: the kept run above shows every "
    "contender, raw consumers included, at 21–41% of a core, and events/s before against after "
    "within that noise (0.81–1.13×). The waits on the broker are what this pass removes; "
    "events/s only follows on a machine that has a core to give.",
    "**Where the rate is counted.** `stream_dp_events_consumed_total` is incremented by stage "
    "0 on the default path (`RoutingStage.route_packed`, stream_dp/pipeline/stages/router.py: "
    "when an input batch is decoded and routed, before its events are windowed) and by stage "
    "1 on keyed input (`ColumnIngest`, `RecordIngest.ingest`). On the default path the "
    "operator's rate is stage 0's: stage 1's work on the repartitioned records runs in the "
    "same loop and slows it, uncounted.",
    "**Where the worker waited, on a quieter machine** (the same probe at 06:57–07:01 UTC, "
    "load 0.8–3.2, Tansu, one run each; main `6fb70fb`): busy 34–69% (default) and 37–49% "
    "(keyed) of the span. The fetch wait was 22–46% of the wall with 7–13% of CPU in it (the "
    "records handed out): 9–25% idle, the most on keyed input; then releases 9–16% idle "
    "(ledger parts written and acknowledged, the ledger read to a fresh fence, output "
    "published and acknowledged, one after the other), stage 0's acknowledgements 8% "
    "(default path), seals and partials 5–10%, commits under 1%. The fetch requests say why "
    "the loop waited for a fetch: one or two requests per span of only caught-up partitions, "
    "held 0.50 s by the broker (`fetch_max_wait_ms`). aiokafka keeps one fetch request in "
    "flight per broker, for the partitions it holds no records of; while the worker works "
    "through the partition with the backlog (librdkafka's partitioner put 67% of this stream "
    "in one partition, the others run dry early, the partials partitions are at their end "
    "most of the time) the request in flight holds only caught-up partitions, and when the "
    "backlog's buffer runs out its next fetch waits for that long poll to end. Keyed input "
    "idles more because on the default path stage 0's own sends keep the repartition "
    "partitions from being empty, so its requests are more often answered at once.",
    "**Lever 1, no long poll while behind** (stream_dp/kafka_client/fetched.py; "
    "tests/clients/test_fetch_wait.py): the worker's consumer builds a request with a maximum "
    "wait of 5 ms while any fetchable partition is below its last known end (high "
    "watermark; last stable offset for committed reads), and the configured 500 ms once all "
    "are caught up — an idle worker polls as rarely as before; which records are fetched, "
    "from where and in what order does not change. Same probe at load 3.2 (Tansu, before "
    "against this lever only): fetch idle 22% → 8% (default) and 23% → 3% (keyed); busy "
    "34% → 51% and 49% → 63%; events/s 105,738 → 185,352 and 190,160 → 245,599; the only requests "
    "held 500 ms left in a span are built once every partition is caught up (the last batch "
    "in hand; the table's runs record each request's maximum wait). In the table: the fetch "
    "wait 11–18% → 0% on keyed input. "
    "Cost: more fetch requests while behind (21–32 against 21–24 in a span of the table; 66 "
    "against 19 in one run at load 9, each an empty answer), none when idle.",
    "**Lever 2, stage 0's acknowledgements awaited by the next iteration** "
    "(stream_dp/pipeline/kafka/stage_output.py, membership.py; "
    "tests/pipeline/test_stage0_pipelining.py): the broker acknowledges a batch's "
    "repartitioned events while the worker fetches and processes the next. One send in flight "
    "at a time (the next is sent only once it is acknowledged: the repartition records keep "
    "their order); a batch's input positions are committable only once acknowledged, and "
    "only on partitions owned since it was sent (revoked, or revoked and taken again, in "
    "between: the committed offset stands, the new owner routes the batch again and stage 1 "
    "drops the events it already has, as after a crash); a send that fails raises from the "
    "next iteration and the worker stops without committing, as before. Stage 0's ack wait: "
    "10–11% → 1–3% of the span at load 9 (run of 07:30, before the run-queue column), 1–2% → "
    "0–1% in the table.",
    "**What is left** on the loop's path: the window closes' round trips — releases 5–14% "
    "and seals with their partials 0–2% of the table's span, 9–16% and 5–10% on the quieter "
    "machine. A release is a chain of acknowledged writes and a fenced read that must stay in "
    "that order (the ledger-first protocol); what could change is that the loop waits for it. "
    "Moving the release beside the loop (a task that releases while the loop fetches and "
    "processes) needs the release stage's state shared with the ingest of partials, the "
    "partials partitions' safe offsets to exclude a window mid-release, and a revocation to "
    "wait for or disown the release in flight: a change to the release protocol's ordering "
    "argument, not made in this pass. The fetch wait left (0–8%) is one round trip per drained "
    "buffer: aiokafka fetches a partition again only once its records are all handed out "
    "(4 MB per partition, tens of thousands of these events), so a second fetch of the same "
    "partition cannot be in flight while its records are processed; larger fetches would "
    "halve it at the cost of buffered memory.",
]


if __name__ == "__main__":
    main()
