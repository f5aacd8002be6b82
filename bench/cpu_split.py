"""Where a measured span's CPU went: the client's user and kernel time, the broker's, and the
machine's (steal, idle), read from ``/proc`` at the span's two ends.

A ratio of two clients' events per second moves with the machine (bench/RESULTS.md, "The
ratio and the machine's speed"). Splitting each client's CPU into user and system time, and
setting the broker's CPU and the machine's steal beside it, shows which part of the cost
moves with the host and which keeps its speed.

``snapshot(pids, broker_pid)`` at the span's start and at its end, then
``split(start, end, events)``: µs per event of each part, and the machine's shares.
"""

from __future__ import annotations

import os
import statistics
from contextlib import suppress
from pathlib import Path
from typing import Any

#: /proc/stat's first line, in its order (Linux ≥ 2.6.33): jiffies spent by every CPU.
MACHINE_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


#: The size of a page the kernel maps on a fault (this machine's and CI's: x86-64).
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


def _tick_s() -> float:
    return 1.0 / os.sysconf("SC_CLK_TCK")


def stat_fields(path: str) -> tuple[str, list[str]]:
    """A ``/proc/…/stat`` file's process or thread name and its fields after the name, from
    the state (``[0]``) on: minor faults ``[7]``, user and system ticks ``[11]``, ``[12]``
    (FileNotFoundError once it is gone)."""
    with open(path, encoding="ascii") as f:
        raw = f.read()
    return raw[raw.index("(") + 1 : raw.rindex(")")], raw.rsplit(")", 1)[1].split()


def stat_cpu(path: str) -> tuple[str, float, float]:
    """A ``/proc/…/stat`` file's process or thread name and its user and system CPU seconds
    (FileNotFoundError once it is gone)."""
    name, fields = stat_fields(path)
    return name, int(fields[11]) * _tick_s(), int(fields[12]) * _tick_s()


def faults_and_switches(pid: int) -> tuple[int, int, int]:
    """``pid``'s minor page faults (every thread) and its threads' voluntary and involuntary
    context switches, summed; zeros once it is gone. A fault is a page the kernel maps on
    first touch (memory freed and taken again pays it again); an involuntary switch is the
    scheduler taking the core from a runnable thread."""
    voluntary = involuntary = 0
    try:
        faults = int(stat_fields(f"/proc/{pid}/stat")[1][7])
        for tid in os.listdir(f"/proc/{pid}/task"):
            with suppress(FileNotFoundError):
                for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
                    if line.startswith("voluntary_ctxt_switches:"):
                        voluntary += int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches:"):
                        involuntary += int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return 0, 0, 0
    return faults, voluntary, involuntary


def resident_kib(pid: int) -> tuple[int, int]:
    """``pid``'s resident memory now and its peak so far (VmRSS, VmHWM), KiB; zeros once
    it is gone. The peak's growth over a span beyond what was resident at its start is
    memory first touched in it: it comes in only by page faults (one per 4 KiB page, or one
    per 2 MiB where the kernel backs it with a transparent huge page)."""
    rss = hwm = 0
    with suppress(FileNotFoundError, ProcessLookupError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1])
    return rss, hwm


def process_cpu(pid: int) -> tuple[float, float]:
    """``pid``'s user and system CPU seconds (every thread); zeros once it is gone."""
    try:
        _, user, system = stat_cpu(f"/proc/{pid}/stat")
    except (FileNotFoundError, ProcessLookupError):
        return 0.0, 0.0
    return user, system


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (a broker started through a wrapper process); a process
    gone meanwhile is left out with its own."""
    pids = [pid]
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            for child in Path(f"/proc/{pid}/task/{tid}/children").read_text().split():
                pids += process_tree(int(child))
    except FileNotFoundError:
        pass
    return pids


def _jit_cpu(pid: int) -> float:
    """CPU seconds of ``pid``'s JIT compiler threads (a JVM's ``C1/C2 CompilerThreadN``;
    none in a process without a JIT): work a long-running broker has done long before."""
    total = 0.0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return 0.0
    for tid in tids:
        try:
            name, user, system = stat_cpu(f"/proc/{pid}/task/{tid}/stat")
        except (FileNotFoundError, ProcessLookupError):
            continue
        if "CompilerThre" in name:
            total += user + system
    return total


def machine_cpu() -> dict[str, float]:
    """Seconds every CPU of this machine has spent in each state since boot."""
    with open("/proc/stat", encoding="ascii") as f:
        values = f.readline().split()[1 : 1 + len(MACHINE_FIELDS)]
    return {name: int(v) * _tick_s() for name, v in zip(MACHINE_FIELDS, values, strict=True)}


def snapshot(pids: list[int], broker_pid: int | None) -> dict[str, Any]:
    """The counters ``split`` takes the difference of."""
    user = system = broker_user = broker_system = broker_jit = 0.0
    faults = voluntary = involuntary = rss_kib = peak_kib = 0
    for pid in pids:
        u, s = process_cpu(pid)
        user, system = user + u, system + s
        f, v, i = faults_and_switches(pid)
        faults, voluntary, involuntary = faults + f, voluntary + v, involuntary + i
        rss, hwm = resident_kib(pid)
        rss_kib, peak_kib = rss_kib + rss, peak_kib + hwm
    for pid in process_tree(broker_pid) if broker_pid else []:
        u, s = process_cpu(pid)
        broker_user, broker_system = broker_user + u, broker_system + s
        broker_jit += _jit_cpu(pid)
    return {
        "user": user,
        "system": system,
        "broker_user": broker_user,
        "broker_system": broker_system,
        "broker_jit": broker_jit,
        "faults": faults,
        "voluntary_switches": voluntary,
        "involuntary_switches": involuntary,
        "rss_kib": rss_kib,
        "peak_kib": peak_kib,
        "machine": machine_cpu(),
    }


def split(start: dict[str, Any], end: dict[str, Any], events: float) -> dict[str, Any]:
    """The span's CPU per event by part (µs): the client's user and system time, the
    broker's, and each machine state's share of the span's CPU time (steal among them); the
    client's page faults and context switches per 1,000 events (absent from snapshots taken
    before they were recorded)."""
    per_event = 1e6 / max(events, 1.0)
    machine = {k: end["machine"][k] - start["machine"][k] for k in MACHINE_FIELDS}
    total = sum(machine.values()) or 1.0
    counts = {
        f"{k}_per_1k_events": (end[k] - start[k]) * 1e3 / max(events, 1.0)
        for k in ("faults", "voluntary_switches", "involuntary_switches")
        if k in start and k in end
    }
    if "peak_kib" in start and "peak_kib" in end:
        # Memory first touched in the span, in pages: its peak beyond what was resident at
        # its start.
        grown = max(end["peak_kib"] - start["rss_kib"], 0) / PAGE_KIB
        counts["new_pages_per_1k_events"] = grown * 1e3 / max(events, 1.0)
    return {
        **counts,
        "user_us_per_event": (end["user"] - start["user"]) * per_event,
        "system_us_per_event": (end["system"] - start["system"]) * per_event,
        "broker_user_us_per_event": (end["broker_user"] - start["broker_user"]) * per_event,
        "broker_system_us_per_event": (end["broker_system"] - start["broker_system"]) * per_event,
        "broker_jit_us_per_event": (end["broker_jit"] - start["broker_jit"]) * per_event,
        "machine_share": {k: v / total for k, v in machine.items()},
    }


def split_rows(runs: dict[str, list[dict[str, Any]]], names: dict[str, str]) -> list[str]:
    """A markdown table: per contender (``names``: run key → row title) that recorded a
    split, the medians over its rounds of each part's µs per event and of the machine's
    shares; empty when no run recorded one (runs kept before the split existed)."""
    lines = [
        "| contender | rounds | user µs/event | system µs/event | broker user + system "
        "µs/event | of which its JIT compiler | machine: idle | machine: steal | "
        "machine: softirq | page faults / 1k events | context switches / 1k events: "
        "voluntary, involuntary |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, title in names.items():
        splits = [r["split"] for r in runs.get(key, []) if r.get("split")]
        if not splits:
            continue

        def med(part: str, of: list[dict[str, Any]] = splits) -> float:
            return float(statistics.median([s[part] for s in of]))

        def share(state: str, of: list[dict[str, Any]] = splits) -> str:
            return f"{statistics.median([s['machine_share'][state] for s in of]):.0%}"

        def per_1k(part: str, of: list[dict[str, Any]] = splits) -> str:
            values = [s[part] for s in of if part in s]
            return f"{statistics.median(values):,.1f}" if values else "–"

        broker = statistics.median(
            [s["broker_user_us_per_event"] + s["broker_system_us_per_event"] for s in splits]
        )
        lines.append(
            f"| {title} | {len(splits)} | {med('user_us_per_event'):.2f} | "
            f"{med('system_us_per_event'):.2f} | {broker:.2f} | "
            f"{statistics.median([s.get('broker_jit_us_per_event', 0.0) for s in splits]):.2f} | "
            f"{share('idle')} | "
            f"{share('steal')} | {share('softirq')} | {per_1k('faults_per_1k_events')} | "
            f"{per_1k('voluntary_switches_per_1k_events')}, "
            f"{per_1k('involuntary_switches_per_1k_events')} |"
        )
    return lines if len(lines) > 2 else []
