"""Memory and time of one window's release, per key (issue 39, item 3).

One window of ``N`` keys is released through the worker's own code from stage 2 on: its
partial (exact totals of ``N`` keys, built as columns — stage 1 is not measured here) is
encoded and taken in as from the partials topic, then :class:`ReleaseDriver` runs the
release protocol over a transport that does what the Kafka transport does with the bytes:
the ledger records written are held as the topic would, read back into the ledger index
(``LedgerIndex.feed``, as the worker's ledger reader does) and the winner's output records
are encoded and turned into the producer's items (:meth:`Publisher.publish_output
<stream_dp.pipeline.kafka.publisher.Publisher.publish_output>` without the client), in
the chunks the publisher sends.

    python -m bench.release_memory 100000            # tracemalloc peak and time
    python -m bench.release_memory 1000000 --rss     # peak RSS (no tracemalloc), time

Reported (one JSON line): the release's seconds (wall and CPU), and either tracemalloc's
peak of Python allocations during the release above what was held before it
(``traced_peak_bytes``, and per key), or the process's peak RSS growth over the release
(``rss_peak_growth_bytes``, and the whole process's peak, ``peak_rss_bytes``). Keys are
private (``count`` by one string field, every key kept by the threshold: each key has 1,000
to 2,000 users) or, with ``--public``, a public key list. Run one size per process: peak
RSS never goes down.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import struct
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Sequence
from typing import Any, ParamSpec, TypeVar

import numpy as np
import orjson

from stream_dp.config import parse_config
from stream_dp.config.model import Config
from stream_dp.pipeline.formats.ledger import LedgerRelease
from stream_dp.pipeline.formats.partials import (
    Partial,
    SourceWatermark,
    encode_partial,
    encode_watermark,
    new_version,
)
from stream_dp.pipeline.local.local import LocalPipeline
from stream_dp.pipeline.release_driver import Placed, ReleaseDriver, run_now
from stream_dp.pipeline.stages import offload
from stream_dp.privacy.key_totals import KeyTotals
from stream_dp.privacy.pseudonymize import KeyRing, Pseudonymizer
from stream_dp.windows.tumbling import iso_utc

P = ParamSpec("P")
T = TypeVar("T")

START_S = 1_700_000_000 // 3600 * 3600
#: A ledger record in the transport's file: key length, value length, tombstone.
_FRAME = struct.Struct("<II?")
WINDOW_S = 3600


def release_config(public_keys: list[str] | None = None) -> Config:
    query: dict[str, Any] = {
        "name": "visits_by_domain",
        "group_by": ["domain"],
        "epsilon": 1.0,
        "delta": 1e-6,
    }
    if public_keys is not None:
        query["keys"] = {"domain": public_keys}
    return parse_config(
        {
            "window": {"size_s": WINDOW_S, "grace_s": 0, "start_at": iso_utc(START_S)},
            "privacy": {"epsilon_per_window": 1.0, "delta_per_window": 1e-6},
            "bounds": {"max_contributions_per_window": 10},
            "queries": [query],
            "metrics": {"enabled": False},
        }
    )


def key_names(keys: int) -> list[str]:
    return [f"site{d:07d}.example" for d in range(keys)]


class BrokerLikeTransport:
    """The Kafka transport's handling of the bytes, without a broker: written ledger
    records go out of the process (to a temporary file, as to the broker) and a read feeds
    them back to the index one by one, as the worker's ledger reader does; output records
    are encoded and made into the producer's items, chunk by chunk, then dropped (sent)."""

    def __init__(self, pipeline: LocalPipeline) -> None:
        self._pipeline = pipeline
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the transport
        self.output_records = 0
        self.output_bytes = 0

    def close(self) -> None:
        self._log.close()

    def owns(self, window_start_s: int) -> bool:
        return True

    async def write_ledger(self, records: Sequence[Placed]) -> None:
        for key, value, _ in records:
            k = key.encode()
            v = b"" if value is None else value
            self._log.write(_FRAME.pack(len(k), len(v), value is None) + k + v)

    async def read_ledger(self, partitions: Sequence[int]) -> None:
        ledger = self._pipeline.release.ledger
        log = self._log
        log.seek(0)
        while head := log.read(_FRAME.size):
            key_len, value_len, tombstone = _FRAME.unpack(head)
            key = log.read(key_len).decode()
            value = log.read(value_len)
            ledger.feed(key, None if tombstone else value)
        log.seek(0)
        log.truncate()

    async def write_continual(self, records: Sequence[Placed]) -> None:
        return None

    async def read_continual(self, partitions: Sequence[int]) -> None:
        return None

    async def publish_output(self, release: LedgerRelease) -> None:
        # The publisher's chunks (older versions: all records in one list).
        chunks = getattr(offload, "output_chunks", None)
        for chunk in chunks(release) if chunks is not None else [offload.output_values(release)]:
            items = [(k, v, 0) for k, v in chunk]
            self.output_records += len(items)
            self.output_bytes += sum(map(len, (v for _, v, _ in items)))

    async def draw(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        return fn(*args, **kwargs)

    def window_released(self, window_start_s: int) -> None:
        return None


def prepared(keys: int, *, public: bool) -> tuple[LocalPipeline, ReleaseDriver]:
    """A pipeline whose stage 2 holds one due window of ``keys`` keys, and a driver."""
    names = key_names(keys)
    config = release_config(names if public else None)
    keyring = KeyRing(Pseudonymizer(b"\x01" * 32, "bench"))
    pipeline = LocalPipeline(config, keyring)
    rng = np.random.default_rng(5)
    users = rng.integers(1_000, 2_000, keys)
    events = users * 2
    partial = Partial(
        query="visits_by_domain",
        window_start_s=START_S,
        source_partition=0,
        version=new_version(),
        totals=KeyTotals([(n,) for n in names], events, users, np.zeros(keys, np.int64)),
        events_seen=int(events.sum()),
        events_retained=int(events.sum()),
        key_id="bench",
        placement=pipeline.ingest_stage.placement,
        key_check=keyring.for_window(START_S).key_check,
        fingerprint=pipeline.fingerprint.digest,
    )
    values = [v for _, v in encode_partial(partial, max_bytes=config.kafka.max_message_bytes)]
    del partial, names
    values.append(encode_watermark(SourceWatermark(0, 1, START_S + WINDOW_S, True, False))[1])
    pipeline.release.ingest(0, list(enumerate(values)))
    del values
    if pipeline.release.due_windows() != [START_S]:
        raise RuntimeError("the bench window is not due")
    transport = BrokerLikeTransport(pipeline)
    driver = ReleaseDriver(
        pipeline.release,
        transport,
        partials_partitions=[0],
        ledger_partitions=[0],
        continual_partitions=[0],
        max_bytes=config.kafka.max_message_bytes,
        metrics=pipeline.metrics,
    )
    return pipeline, driver


def _rss_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(keys: int, *, public: bool = False, rss: bool = False) -> dict[str, Any]:
    """Release one window of ``keys`` keys; time and memory (see the module docstring)."""
    _pipeline, driver = prepared(keys, public=public)  # the pipeline holds stage 2
    gc.collect()
    transport = driver.transport
    assert isinstance(transport, BrokerLikeTransport)
    before_rss = _rss_bytes()
    if not rss:
        tracemalloc.start()
    held = tracemalloc.get_traced_memory()[0] if not rss else 0
    started, started_cpu = time.perf_counter(), time.process_time()
    gc.disable()  # as the worker's off-loop draw (gc_paused)
    try:
        winners = run_now(driver.release_window(START_S, now_s=float(START_S + WINDOW_S)))
    finally:
        gc.enable()
        transport.close()
    seconds = time.perf_counter() - started
    cpu_seconds = time.process_time() - started_cpu
    out: dict[str, Any] = {
        "keys": keys,
        "keys_private": not public,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "released_records": transport.output_records,
        "output_bytes": transport.output_bytes,
    }
    if winners is None or transport.output_records != keys + 1:
        raise RuntimeError(f"released {transport.output_records} records of {keys} keys + 1")
    if rss:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        out["peak_rss_bytes"] = peak
        out["rss_before_bytes"] = before_rss
        out["rss_peak_growth_bytes"] = peak - before_rss
        out["rss_peak_growth_bytes_per_key"] = (peak - before_rss) / keys
    else:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out["traced_peak_bytes"] = peak - held
        out["traced_peak_bytes_per_key"] = (peak - held) / keys
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("keys", type=int)
    parser.add_argument("--public", action="store_true", help="a public key list")
    parser.add_argument("--rss", action="store_true", help="peak RSS, without tracemalloc")
    args = parser.parse_args(argv)
    return measure(args.keys, public=args.public, rss=args.rss)


if __name__ == "__main__":
    sys.stdout.write(orjson.dumps(main()).decode() + "\n")
