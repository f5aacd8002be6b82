"""The ledger under compaction (docs/exactly-once.md#compaction-a-bounded-ledger): a released
window's records are tombstoned behind its durable progress record, so the compacted ledger
(the last record of each key, tombstones removed, as Apache Kafka keeps it) is bounded by
the open windows, decides exactly what the full log decides, and a late owner that finds the
window's progress record never publishes a draw of its own. The worker's start-up read
forgets released windows as it goes: its memory is bounded by the open windows, not the
history."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any

from stream_dp.ops.health import Health, beating
from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.formats.ledger import (
    FENCE_PREFIX,
    LedgerIndex,
    LedgerRelease,
    OutputRecord,
    encode_coverage,
    encode_fence,
    encode_progress,
    encode_release,
)
from stream_dp.pipeline.local.local import LocalPipeline
from tests.pipeline.support import KEYRING, NOW, T0, config, rec

#: (key, value) of one ledger record as written (None: a tombstone).
Record = tuple[str, bytes | None]
SIZE_S = 10


def _released_log(windows: int, partials_partitions: int = 1) -> list[Record]:
    """The ledger records of a local pipeline that released ``windows`` windows (with the
    coverage record a worker writes at a deployment's first start)."""
    log: list[Record] = [encode_coverage(T0, SIZE_S)]
    p = LocalPipeline(
        config(),
        KEYRING,
        metrics=Metrics(),
        sampling_rng=random.Random(0),
        ledger_sink=lambda k, v: log.append((k, v)),
        partials_partitions=partials_partitions,
    )
    users = ["u", "v", "w"]
    records = [
        rec(w * 10 + i, users[i], w * SIZE_S + 1 + i, "ab"[i % 2])
        for w in range(windows + 1)
        for i in range(3)
    ]
    p.ingest(0, records, now_s=NOW + windows * SIZE_S, now_mono_s=1)
    p.step(2, now_s=NOW + windows * SIZE_S)
    return log


def compacted(log: Sequence[Record]) -> list[Record]:
    """What Apache Kafka's cleaner keeps of one partition: the last record of each key, at
    its position, tombstones removed (once ``delete.retention.ms`` has passed)."""
    last = {key: i for i, (key, _) in enumerate(log)}
    return [(k, v) for i, (k, v) in enumerate(log) if last[k] == i and v is not None]


def _late_draw(window_start_s: int) -> list[Record]:
    """A paused owner's draw of an early window, landing after everything else."""
    rel = LedgerRelease(
        release_id="late0000",
        query="all",
        window_start_s=window_start_s,
        window_end_s=window_start_s + SIZE_S,
        epsilon_spent=1.0,
        delta_spent=0.0,
        records=[OutputRecord("late", {"value": 1})],
    )
    return list(encode_release(rel, now_s=NOW, max_bytes=1 << 20))


def _decisions(log: Sequence[Record], windows: int) -> dict[str, Any]:
    """What a worker takes from the ledger at start: released windows, winners of the
    others, what it would republish, where it starts."""
    index = LedgerIndex(forget_released=True)
    index.load(log)
    starts = [T0 + w * SIZE_S for w in range(windows + 2)]
    return {
        "released": [ws for ws in starts if index.covered(ws)],
        "winners": {(r.query, r.window_start_s): r.release_id for r in index.releases()},
        "unpublished": [(r.query, r.window_start_s) for r in index.unpublished()],
        "progress": dict(index.progress),
        "coverage": index.coverage_start_s,
    }


def test_compaction_bounds_the_ledger_and_keeps_every_decision() -> None:
    kept = {}
    for windows in (4, 16):
        log = _released_log(windows) + _late_draw(T0)
        after = compacted(log)
        assert _decisions(after, windows) == _decisions(log, windows)
        decided = _decisions(log, windows)
        assert decided["released"] == [T0 + w * SIZE_S for w in range(windows)]
        assert decided["unpublished"] == []  # the late draw never counts: no republication
        kept[windows] = len(after)
    # the history is tombstoned: what compaction keeps does not grow with the windows
    assert kept[16] == kept[4], kept


def test_compaction_bounds_the_ledger_over_two_partials_partitions() -> None:
    kept = {}
    for windows in (6, 18):
        log = _released_log(windows, partials_partitions=2)
        after = compacted(log)
        assert _decisions(after, windows) == _decisions(log, windows)
        kept[windows] = len(after)
    assert kept[18] == kept[6], kept


def test_a_late_owner_that_finds_the_progress_record_publishes_nothing() -> None:
    """Another owner released the window and its parts were compacted away: all that is
    left of it is a progress record past it. Our read-back finds that record: our draw is
    discarded and tombstoned, never published (one draw per (query, window), ever)."""
    written: list[Record] = []
    p = LocalPipeline(
        config(),
        KEYRING,
        metrics=Metrics(),
        sampling_rng=random.Random(0),
        ledger_sink=lambda k, v: written.append((k, v)),
    )
    p.ingest(0, [rec(0, "u", 1), rec(1, "v", 2, "b"), rec(2, "w", 12)], now_s=NOW, now_mono_s=1)
    transport = p._driver.transport
    write = transport.write_ledger

    async def progress_lands_first(records: Any) -> None:
        if any("|part-" in k for k, _, _ in records):
            p.release.ledger.feed(*encode_progress(0, 1, T0 + SIZE_S, T0))
        await write(records)

    transport.write_ledger = progress_lands_first  # type: ignore[method-assign]
    released = p.step(2, now_s=NOW)
    assert released == []
    assert p.metrics.ledger_draws_discarded._value.get() == 2
    drawn = {k for k, v in written if "|part-" in k and v is not None}
    assert len(drawn) == 2
    assert {k for k, v in written if v is None} == drawn  # ours, tombstoned
    assert p.release.released(T0)  # and the cursor moved past it


def test_the_start_up_read_forgets_released_windows_as_it_goes() -> None:
    """A ledger written by earlier versions (nothing tombstoned, a fence per catch-up):
    the worker's read keeps no release of a window behind a progress record, only the
    spend of recent ones, and notes the released records to tombstone."""
    log = [(k, v) for k, v in _released_log(30) if v is not None]
    log += [encode_fence(f"{i:08x}") for i in range(50)]
    index = LedgerIndex(forget_released=True, spent_kept_s=4 * SIZE_S)
    index.load(log)
    assert len(index) == 0
    assert index._part_keys == {} and index._published == {}
    assert sorted({ws for _, ws in index.spent}) == [T0 + w * SIZE_S for w in range(25, 30)]
    swept = {k for _, k in index.sweep}
    assert swept == {k for k, _ in log if "|part-" in k or k.endswith("|published")}
    # a full read (replay) keeps them all
    full = LedgerIndex()
    full.load(log)
    assert len(full) == 2 * 30


def test_fences_of_one_reader_share_one_key() -> None:
    key_a, value_a = encode_fence("a" * 32, "reader1")
    key_b, value_b = encode_fence("b" * 32, "reader1")
    assert key_a == key_b == FENCE_PREFIX + "reader1" and value_a != value_b
    assert len(compacted([(key_a, value_a), (key_b, value_b)])) == 1


async def test_a_start_up_beats_while_it_reads() -> None:
    """Liveness during a long start-up: beats while the block runs, none after it."""
    health = Health()
    beats_before = health.status()["beats"]
    done = asyncio.Event()

    async def read_a_long_ledger() -> None:
        async with beating(health, every_s=0.001):
            while health.status()["beats"] < beats_before + 3:
                await asyncio.sleep(0)
            done.set()

    await asyncio.wait_for(read_a_long_ledger(), timeout=30)
    assert done.is_set()
    after = health.status()["beats"]
    await asyncio.sleep(0.01)
    assert health.status()["beats"] == after  # the beating stopped with the block
    assert not health.ready()  # beats say live, never ready


def test_the_ledger_reader_notes_earlier_versions_fences_to_tombstone_and_no_others() -> None:
    """Earlier versions keyed every fence by its own id (never compacted away): a start-up
    notes those to tombstone. A fence keyed by a reader may be one a live reader still
    waits for: never noted."""
    from types import SimpleNamespace

    from stream_dp.pipeline.kafka.ledger_log import LedgerLog

    async def send(key: str, value: bytes, partition: int) -> int:
        raise AssertionError("nothing is written")

    index = LedgerIndex(forget_released=True)
    log = LedgerLog("ledger", index, client_options={}, send=send, note_legacy_fences=True)
    legacy = encode_fence("a" * 32)
    current = encode_fence("b" * 32, "another-reader")
    for partition, (key, value) in [(0, legacy), (1, current)]:
        log._feed(partition, SimpleNamespace(key=key.encode(), value=value))
    assert log.legacy_fences == [(0, legacy[0])]
    assert index.records_read == 0  # fences are never fed to the index
