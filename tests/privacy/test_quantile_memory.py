"""A quantile query's memory follows its values, not its ``bins`` (issue 39).

Each per-key histogram used to be a dense row of B int64 counts at every step: 8 KiB a key at
the default 1,024 bins and 512 KiB at 65,536, at the seal, in the partials (on the wire as
B integers), in stage 2's merge and, as five keys × (B + 1) tables, at the release (about
2 MB a key at 65,536 bins). Here every step runs on the worst case for a dense table and the
best for a sparse one, the many keys of private keys with one value each, at B = 65,536,
and its memory (tracemalloc's peak of the step's allocations, or the bytes it holds or
writes) must stay under a bound proportional to the values: at most
:data:`BYTES_PER_VALUE` per value, about 1/250 of one dense row. The histograms themselves
are held in 16 bytes per nonzero bin and 8 per key (plus 8), exactly.

Only the pipeline's own entry points are used (bounded_columns, KeyTotals, the partials
format, release_query), so the same test ran on the code before the change and failed
there at each step.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import pytest

from stream_dp.config import BoundsConfig, QueryConfig
from stream_dp.pipeline.formats.partials import Partial, decode, encode_partial, new_version
from stream_dp.privacy.bounding import bounded_columns
from stream_dp.privacy.key_totals import KeyTotals
from stream_dp.privacy.planner import plan_query
from stream_dp.privacy.release import release_query
from stream_dp.privacy.statistics.quantile import histogram_binning

BINS = 65_536
#: Keys, each with one value (one user each).
KEYS = 256
#: The bound per value on every step's peak (measured: 0.2 to 1 KB; a dense row: 512 KiB).
BYTES_PER_VALUE = 2_048
#: Bytes a key's entry may take on the wire (measured: 40 with its group key; dense: 131 KB).
WIRE_BYTES_PER_VALUE = 64

T = TypeVar("T")


def _peak(step: Callable[[], T]) -> tuple[T, int]:
    """The step's result and the peak of the bytes it allocated (tracemalloc), on its second
    run (the first fills the interpreter's and numpy's one-time caches)."""
    step()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        out = step()
        return out, tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def _query(**kw: Any) -> QueryConfig:
    base: dict[str, Any] = {
        "name": "q",
        "statistic": "quantile",
        "group_by": ["slot"],
        "value_field": "x",
        "lower": 0.0,
        "upper": float(BINS),
        "granularity": 1.0,
        "quantiles": [0.5, 0.9, 0.99],
        "bins": BINS,
        "epsilon": 1.0,
        "keys": {"slot": list(range(KEYS))},
    }
    base.update(kw)
    return QueryConfig(**base)


def _seal(seed: int, per_key: int = 1) -> KeyTotals:
    """One source partition's totals: KEYS keys, each with ``per_key`` users of one value."""
    binning = histogram_binning(_query().spec())
    assert binning is not None and binning[0] == BINS
    n = KEYS * per_key
    values = np.random.default_rng(seed).integers(0, BINS, n)
    found = bounded_columns(
        np.arange(n, dtype=np.int64),
        np.arange(n, dtype=np.int64) // per_key,
        values,
        n_keys=KEYS,
        max_keys=None,
        max_per_key=None,
        rng=np.random.default_rng(seed),
        bin_of=binning,
    )
    return KeyTotals(
        [(i,) for i in range(KEYS)],
        found.events,
        found.users,
        found.value_sums,
        value_bins=found.value_bins,
    )


def test_the_seal_holds_the_histograms_in_memory_of_the_values() -> None:
    totals, peak = _peak(lambda: _seal(1))
    assert int(totals.events.sum()) == KEYS
    assert totals.value_bins.nbytes == 16 * KEYS + 8 * KEYS + 8
    assert peak <= BYTES_PER_VALUE * KEYS, f"{peak / KEYS:.0f} bytes per value"


def test_a_partial_carries_and_decodes_the_histograms_in_bytes_of_the_values() -> None:
    totals = _seal(2)
    partial = Partial(
        query="q",
        window_start_s=0,
        source_partition=0,
        version=new_version(),
        totals=totals,
        events_seen=KEYS,
        events_retained=KEYS,
    )
    records, encode_peak = _peak(lambda: encode_partial(partial, max_bytes=1 << 20))
    wire = sum(len(value) for _, value in records)
    assert wire <= WIRE_BYTES_PER_VALUE * KEYS + 1_024, f"{wire / KEYS:.0f} bytes per value"
    parts, decode_peak = _peak(lambda: [decode(value) for _, value in records])
    back = KeyTotals.concat([KeyTotals.of(dict(p.totals)) for p in parts])  # type: ignore[union-attr]
    assert back.value_bins.tolist() == totals.value_bins.tolist()
    assert encode_peak <= BYTES_PER_VALUE * KEYS, f"{encode_peak / KEYS:.0f} bytes per value"
    assert decode_peak <= BYTES_PER_VALUE * KEYS, f"{decode_peak / KEYS:.0f} bytes per value"


def test_stage_two_merges_the_sources_histograms_in_memory_of_the_values() -> None:
    sources = [_seal(3), _seal(4)]
    merged, peak = _peak(lambda: KeyTotals.merge(sources))
    assert int(merged.events.sum()) == 2 * KEYS
    assert peak <= BYTES_PER_VALUE * 2 * KEYS, f"{peak / (2 * KEYS):.0f} bytes per value"


@pytest.mark.parametrize(("keys", "per_key"), [("public", 1), ("private", 8)])
def test_the_release_draws_from_the_histograms_in_memory_of_the_values(
    keys: str, per_key: int
) -> None:
    """Public keys: every key released, one value each. Private keys: 8 users a key, which
    partition selection (truncated geometric at ε = 10, δ = 1e-5) keeps with certainty, so
    every key reaches the exponential mechanism."""
    query = _query() if keys == "public" else _query(keys="private", delta=1e-5, epsilon=10.0)
    plan = plan_query(query.spec(), BoundsConfig(max_contributions_per_window=1).spec())
    if keys == "private":
        certain = plan.selection.users_for_certain_keep  # type: ignore[union-attr]
        assert certain is not None and certain <= per_key
    totals = _seal(5, per_key)
    release, peak = _peak(lambda: release_query(totals, plan))
    assert len(release.values) == KEYS
    values = KEYS * per_key
    assert peak <= BYTES_PER_VALUE * values, f"{peak / values:.0f} bytes per value"
