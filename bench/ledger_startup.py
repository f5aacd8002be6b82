"""``python -m bench.ledger_startup [--size {smoke,small,full}]``: a worker's start-up read of
the ledger against the ledger's size (issue 28, failure 3), without a broker.

A ledger of N released windows (one query, ``KEYS`` keys per release: N releases) is built
with the ledger's own encoders, as a deployment writes it — per window its draw's parts, its
published marker, its progress record and the fences of two catch-ups — and read the way the
worker reads it (record by record, in log order):

* **before** — the whole log into :class:`LedgerIndex` as earlier versions read it (every
  release kept until the read ends, then the released ones dropped);
* **streamed** — the same log (an earlier version's, nothing tombstoned) read by the worker
  now: released windows forgotten as the progress records arrive;
* **after compaction** — the log as this version writes it (a window's records tombstoned
  behind its progress record, one fence key per reader), after the cleaner ran: the last
  record of each key, tombstones removed.

Records are generated as they are read (a million releases would not fit in memory as a
list); time is the read's wall time less the time to generate the records, peak memory is
tracemalloc's peak over the read (Python allocations: what the index holds), in another pass.
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import Any

from stream_dp.pipeline.formats.ledger import (
    LedgerIndex,
    LedgerRelease,
    OutputRecord,
    encode_coverage,
    encode_fence,
    encode_progress,
    encode_published,
    encode_release,
    progress_key,
)

T0 = 1_596_240_000
SIZE_S = 3600
KEYS = 10
SIZES: dict[str, list[int]] = {
    "smoke": [1_000, 3_000],
    "small": [1_000, 10_000, 100_000],
    # 10^6 releases: about an hour on the 2 shared cores this was measured on; the figures
    # are linear (before, streamed: time) or flat (memory streamed, after compaction)
    "full": [1_000, 10_000, 100_000],
}
Record = tuple[str, bytes | None]


def _release(w: int) -> LedgerRelease:
    ws = T0 + w * SIZE_S
    return LedgerRelease(
        release_id=f"{w:032x}",
        query="visits",
        window_start_s=ws,
        window_end_s=ws + SIZE_S,
        epsilon_spent=1.0,
        delta_spent=0.0,
        records=[
            OutputRecord(f"visits|{ws}|d{k}", {"query": "visits", "value": k, "key": f"d{k}"})
            for k in range(KEYS)
        ],
    )


def written_log(windows: int, *, tombstones: bool) -> Iterator[Record]:
    """The ledger as a deployment writes it: ``tombstones`` — as this version does (one fence
    key per reader, a window's records tombstoned behind its progress record); else as
    earlier versions did (nothing tombstoned, a fresh fence key per catch-up)."""
    yield encode_coverage(T0, SIZE_S)
    for w in range(windows):
        rel = _release(w)
        ws = rel.window_start_s
        parts = encode_release(rel, now_s=ws + SIZE_S, max_bytes=1 << 20)
        yield from parts
        yield encode_fence(f"{2 * w:032x}", "reader" if tombstones else None)
        yield encode_published(rel)
        yield encode_progress(0, 1, ws + SIZE_S, ws if tombstones else None)
        yield encode_fence(f"{2 * w + 1:032x}", "reader" if tombstones else None)
        if tombstones:
            for key, _ in [*parts, encode_published(rel)]:
                yield key, None
            if w:
                yield progress_key(0, ws - SIZE_S), None


def compacted(log: Iterable[Record]) -> list[Record]:
    """What the cleaner keeps: the last record of each key, tombstones removed."""
    kept: dict[str, bytes | None] = {}
    for key, value in log:
        kept.pop(key, None)  # the last record of a key takes its position
        kept[key] = value
    return [(k, v) for k, v in kept.items() if v is not None]


def _read(records: Iterable[Record], *, streamed: bool) -> LedgerIndex:
    if streamed:  # as the worker reads it (spend kept for two horizons of 24 windows)
        index = LedgerIndex(forget_released=True, spent_kept_s=48 * SIZE_S)
        index.load(records)
        return index
    index = LedgerIndex()
    index.load(records)
    index.forget(index.covered)  # earlier versions: released windows dropped after the read
    return index


def _timed(fn: Callable[[], object]) -> float:
    gc.collect()
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _measure(make: Callable[[], Iterable[Record]], *, streamed: bool) -> dict[str, Any]:
    """The read's time (less the time to generate the records) and its peak memory."""
    generating = _timed(lambda: sum(1 for _ in make()))
    seconds = _timed(lambda: _read(make(), streamed=streamed)) - generating
    tracemalloc.start()
    index = _read(make(), streamed=streamed)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"seconds": max(0.0, seconds), "peak_mb": peak / 1e6, "releases_kept": len(index)}


def measure(sizes: list[int], log: Callable[[str], None] = print) -> dict[str, Any]:
    rows = []
    for n in sizes:
        records_before = sum(1 for _ in written_log(n, tombstones=False))
        log(f"[bench] ledger start-up: {n:,} releases, {records_before:,} records")
        after = compacted(written_log(n, tombstones=True))
        rows.append(
            {
                "releases": n,
                "records_before": records_before,
                "records_after_compaction": len(after),
                "before": _measure(partial(written_log, n, tombstones=False), streamed=False),
                "streamed": _measure(partial(written_log, n, tombstones=False), streamed=True),
                "after_compaction": _measure(partial(iter, after), streamed=True),
            }
        )
    return {"rows": rows, "keys_per_release": KEYS}


def section(r: dict[str, Any]) -> list[str]:
    """The RESULTS.md section."""
    lines = [
        "## 10. Ledger start-up against the ledger's size (no broker)",
        "",
        f"One query, {r['keys_per_release']} keys per release, one release per hourly window, "
        "read record by record as the worker reads it (`bench/ledger_startup.py`). *Before*: "
        "the whole log into the index as earlier versions read it; *streamed*: the same log "
        "(nothing tombstoned) read by this version, forgetting released windows as their "
        "progress records arrive; *after compaction*: the log this version writes (a window's "
        "records tombstoned behind its progress record, one fence key per reader) after the "
        "cleaner ran. Peak memory: tracemalloc's peak over the read.",
        "",
        "| releases | records (earlier versions) | records after compaction (this version) "
        "| before: s / peak MB | streamed: s / peak MB | after compaction: s / peak MB |",
        "|---|---|---|---|---|---|",
    ]
    for row in r["rows"]:
        cells = [
            f"{row[k]['seconds']:.2f} / {row[k]['peak_mb']:.1f}"
            for k in ("before", "streamed", "after_compaction")
        ]
        lines.append(
            f"| {row['releases']:,} | {row['records_before']:,} | "
            f"{row['records_after_compaction']:,} | " + " | ".join(cells) + " |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ledger_startup", description=__doc__)
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    args = parser.parse_args(argv)
    print("\n".join(section(measure(SIZES[args.size]))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
