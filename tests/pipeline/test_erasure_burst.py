"""A burst of erasures on a large window (issue #28): the worker removes them off the event
loop, which keeps running meanwhile, and once applied no event of an erased user is left in
the window — neither one it held nor one arriving afterwards.

The worker's erasure side (:class:`WorkerErasure`) runs here without a broker: the log
reader hands the burst's records to the real log decoding, as a fetch would.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np

from stream_dp.ops.metrics import Metrics
from stream_dp.pipeline.formats.erasure_records import encode_erasure
from stream_dp.pipeline.kafka.erasure.erasure_worker import Outgoing, WorkerErasure
from stream_dp.pipeline.stages.ingest import IngestSettings, IngestStage
from stream_dp.pipeline.stages.release_stage import ReleaseStage
from stream_dp.privacy.erasure import Erasure, ErasureSet, erasure_pseudonyms
from stream_dp.privacy.user_samples import pseudonym_words
from tests.pipeline.support import KEYRING, NOW, T0, config, rec

K = 4
USERS = 50_000  # K events each: a window of 200,000 rows
BURST = 500
#: A hang guard, not a speed claim: main's per-user removal, on the loop, held it for 82 s here.
MAX_LOOP_LAG_S = 2.0
TICK_S = 0.005
#: How long the test waits at most for anything (far above the normal fraction of a second).
TIMEOUT_S = 120.0


def _window_of_200k_rows(erasures: ErasureSet) -> IngestStage:
    """Stage 1 as the worker builds it with erasure on (``erasures``: its erasure log's)."""
    cfg = config(k=K)
    ingest = IngestStage(
        cfg,
        KEYRING,
        released=ReleaseStage(cfg),
        metrics=Metrics(),
        sampling_rng=random.Random(1),
        settings=IngestSettings(erasures=erasures, keep_sealed=True),
    )
    ingest.assign([0], 0.0, routed=False)
    records = [rec(i, f"user{i % USERS}", 1.0 + (i % 7)) for i in range(USERS * K)]
    for start in range(0, len(records), 20_000):
        assert not ingest.ingest(0, records[start : start + 20_000], now_s=NOW, now_mono_s=1.0)
    return ingest


def _held_pseudonyms(ingest: IngestStage) -> set[bytes]:
    """Every pseudonym with a row in the window (kept or buffered)."""
    samples = ingest.store.parts[0][T0].samples
    samples.sample()
    kept = samples._kept
    assert kept is not None
    return {w.tobytes() for w in np.unique(kept[0], axis=0)}


def _worker(burst: Sequence[tuple[str, bytes]]) -> WorkerErasure:
    """A WorkerErasure whose log holds ``burst`` after an empty start."""

    async def send_many(topic: str, records: Sequence[Outgoing]) -> None:
        raise AssertionError("applying erasures writes nothing")

    async def retry(what: str, op: Callable[[], Awaitable[Any]], bounded: bool) -> Any:
        return await op()

    worker = WorkerErasure(
        config(k=K),
        KEYRING,
        metrics=Metrics(),
        client_options={},
        send_many=send_many,
        retry=retry,
    )
    log = worker.log
    fed = False

    async def nothing() -> list[Erasure]:
        return []

    async def read_available(timeout_ms: int, feed: Callable[[int, Any], None]) -> None:
        nonlocal fed
        if not fed:
            fed = True
            for offset, (key, value) in enumerate(burst):
                feed(0, SimpleNamespace(key=key.encode(), value=value, offset=offset))

    log.start = nothing  # type: ignore[method-assign,assignment]
    log.catch_up = nothing  # type: ignore[method-assign]
    log.reader.read_available = read_available  # type: ignore[method-assign]
    return worker


async def test_a_burst_of_erasures_on_a_large_window_leaves_the_loop_running() -> None:
    users = [f"user{i}" for i in range(0, USERS, USERS // BURST)][:BURST]
    expires = T0 + 86_400
    burst = [
        encode_erasure(
            erasure_pseudonyms(u, KEYRING, "nfkc_casefold_strip"),
            recorded_at_s=T0,
            expires_at_s=expires,
        )
        for u in users
    ]
    worker = _worker(burst)
    ingest = _window_of_200k_rows(worker.erasures)
    erased = {KEYRING.current.pseudonym(u) for u in users}  # pseudonyms of the window's key
    assert erased <= _held_pseudonyms(ingest)
    await worker.start(ingest, ReleaseStage(config(k=K)))

    # The removal, timed from inside, and the thread it ran on.
    removal: dict[str, float | int] = {}
    apply = ingest.apply_erasures

    def timed(erasures: Sequence[Erasure], position: int) -> None:
        removal["start"] = time.monotonic()
        removal["thread"] = threading.get_ident()
        apply(erasures, position)
        removal["end"] = time.monotonic()

    ingest.apply_erasures = timed  # type: ignore[method-assign]

    ticks: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        while not done.is_set():
            ticks.append(time.monotonic())
            await asyncio.sleep(TICK_S)

    ticking = asyncio.create_task(ticker())
    try:
        await asyncio.sleep(0)  # the ticker's first tick
        await asyncio.wait_for(worker.follow(), TIMEOUT_S)
    finally:
        done.set()
        await ticking
    ticks.append(time.monotonic())

    # Off the loop: in another thread, with the loop running other tasks meanwhile.
    assert removal["thread"] != threading.get_ident()
    assert any(removal["start"] < t < removal["end"] for t in ticks)
    max_lag_s = max(b - a for a, b in itertools.pairwise(ticks)) - TICK_S
    assert max_lag_s < MAX_LOOP_LAG_S, f"event loop blocked for {max_lag_s:.1f} s"

    # Applied: every erased user's rows are gone, every other user's are still there.
    assert ingest.erasures_applied == BURST
    held = _held_pseudonyms(ingest)
    assert not held & erased
    assert len(held) == USERS - BURST

    # An erased user's event arriving after the burst was applied is dropped on arrival.
    ingest.apply_erasures = apply  # type: ignore[method-assign]
    late = [rec(USERS * K + i, u, 8.0) for i, u in enumerate(users[:10])]
    assert not ingest.ingest(0, late, now_s=NOW, now_mono_s=2.0)
    assert not _held_pseudonyms(ingest) & erased
    words = pseudonym_words(b"".join(sorted(erased)), len(erased))
    assert ingest.store.parts[0][T0].samples.remove_many(words) == 0
