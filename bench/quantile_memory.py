"""Memory per key of a ``statistic: quantile`` query at each step (issue 39).

N keys with one value each (one user each: the many keys of private keys, the worst case
for a dense histogram), ``bins`` bins, three quantiles. Each step runs through the
pipeline's own code and reports tracemalloc's peak of the allocations it makes (its second
run: the first fills one-time caches), per key:

* ``seal``: stage 1's bounded totals (``bounded_columns`` with the query's binning) as
  :class:`~stream_dp.privacy.key_totals.KeyTotals`;
* ``encode`` / ``decode``: the partial written for the partials topic, and read back;
  ``wire``: its bytes;
* ``merge``: stage 2's sum of two sources' totals;
* ``release``: :func:`~stream_dp.privacy.release.release_query` on public keys (every key
  released).

    python -m bench.quantile_memory --keys 5000 --bins 1024
    python -m bench.quantile_memory --keys 200 --bins 65536

One JSON line. docs/privacy-top-k-quantiles.md#quantile-memory quotes it (and the same
figures measured on the code before the histograms were sparse).
"""

from __future__ import annotations

import argparse
import tracemalloc
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import orjson

from stream_dp.config import BoundsConfig, QueryConfig
from stream_dp.pipeline.formats.partials import Partial, decode, encode_partial, new_version
from stream_dp.privacy.bounding import bounded_columns
from stream_dp.privacy.key_totals import KeyTotals
from stream_dp.privacy.planner import plan_query
from stream_dp.privacy.release import release_query
from stream_dp.privacy.statistics.quantile import histogram_binning

T = TypeVar("T")


def peak_bytes(step: Callable[[], T]) -> tuple[T, int]:
    """The step's result and the peak of what it allocated, on its second run."""
    step()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        out = step()
        return out, tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def query(keys: int, bins: int) -> QueryConfig:
    return QueryConfig(
        name="q",
        statistic="quantile",
        group_by=["slot"],
        value_field="x",
        lower=0.0,
        upper=float(bins),
        granularity=1.0,
        quantiles=[0.5, 0.9, 0.99],
        bins=bins,
        epsilon=1.0,
        keys={"slot": list(range(keys))},
    )


def sealed(q: QueryConfig, keys: int, seed: int) -> KeyTotals:
    """One source's totals: ``keys`` users, each one value on its own key."""
    binning = histogram_binning(q.spec())
    assert binning is not None
    found = bounded_columns(
        np.arange(keys, dtype=np.int64),
        np.arange(keys, dtype=np.int64),
        np.random.default_rng(seed).integers(0, q.bins, keys),
        n_keys=keys,
        max_keys=None,
        max_per_key=None,
        rng=np.random.default_rng(seed),
        bin_of=binning,
    )
    groups = [(i,) for i in range(keys)]
    return KeyTotals(
        groups, found.events, found.users, found.value_sums, value_bins=found.value_bins
    )


def measure(keys: int, bins: int) -> dict[str, Any]:
    q = query(keys, bins)
    out: dict[str, Any] = {"keys": keys, "bins": bins}
    totals, out["seal"] = peak_bytes(lambda: sealed(q, keys, 1))
    partial = Partial(
        query="q",
        window_start_s=0,
        source_partition=0,
        version=new_version(),
        totals=totals,
        events_seen=keys,
        events_retained=keys,
    )
    records, out["encode"] = peak_bytes(lambda: encode_partial(partial, max_bytes=1 << 20))
    out["wire"] = sum(len(value) for _, value in records)
    _, out["decode"] = peak_bytes(lambda: [decode(value) for _, value in records])
    sources = [sealed(q, keys, 2), sealed(q, keys, 3)]
    _, merge = peak_bytes(lambda: KeyTotals.merge(sources))
    out["merge"] = merge / 2  # two sources: per value
    plan = plan_query(q.spec(), BoundsConfig(max_contributions_per_window=1).spec())
    _, out["release"] = peak_bytes(lambda: release_query(totals, plan))
    for step in ("seal", "encode", "wire", "decode", "merge", "release"):
        out[f"{step}_bytes_per_key"] = round(out.pop(step) / keys, 1)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=5_000)
    parser.add_argument("--bins", type=int, default=1_024)
    args = parser.parse_args(argv)
    print(orjson.dumps(measure(args.keys, args.bins)).decode())


if __name__ == "__main__":
    main()
