"""Sparse quantile histograms (stream_dp.privacy.exponential.bin_counts) and the release that
reads them: exactly the dense table's numbers and draws.

The release used to build, per α, the groups × (B + 1) table of OpenDP's scores and draw
from it (:func:`_dense_release`, the code before the change, kept here as the reference:
the sampler's loop on the full gap table). The sparse release reads the score of each
proposed edge from the nonzero bins. With the same random words both must choose the same
edges and use the same number of words, over many random histograms: sparse and dense,
empty groups, large counts, one bin, 65,536 bins, scales from nearly uniform draws to
concentrated ones (many rejections: the sampler's lanes grow). Deterministic: no
statistical test here.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from stream_dp.privacy.exact_laplace import uniform_below
from stream_dp.privacy.exponential.bin_counts import BinCounts
from stream_dp.privacy.exponential.quantiles import (
    QuantilePlan,
    quantile_scores,
    release_quantile_rows,
    sparse_scores,
)
from stream_dp.privacy.exponential.sampler import (
    MAX_LANES,
    bernoulli_exp_of_gap,
    exact_scale,
)
from stream_dp.privacy.key_totals import KeyTotals

Words = Callable[[int], np.ndarray]


class CountedWords:
    """A seeded source of 64-bit words that counts what it gave."""

    def __init__(self, seed: int) -> None:
        self._bits = np.random.default_rng(seed).bit_generator
        self.used = 0

    def __call__(self, n: int) -> np.ndarray:
        self.used += n
        out: np.ndarray = self._bits.random_raw(n).astype(np.uint64)
        return out


def _dense_draw(utilities: np.ndarray, scale: float, words: Words) -> np.ndarray:
    """The sampler before the change, verbatim on a full table (every candidate available)."""
    t, s = exact_scale(scale, what="exponential mechanism")
    u = np.asarray(utilities, dtype=np.int64)
    rows, n = u.shape
    mask = np.ones(u.shape, dtype=bool)
    chosen = np.full(rows, -1, dtype=np.int64)
    top = np.where(mask, u, -(2**61) - 1).max(axis=1)
    gaps = top[:, None] - u
    pending = np.flatnonzero(mask.any(axis=1))
    lanes = 1
    while pending.size:
        proposals = uniform_below(np.full(pending.size * lanes, np.uint64(n)), words)
        idx = proposals.astype(np.int64).reshape(pending.size, lanes)
        row_idx = np.repeat(pending, lanes).reshape(pending.size, lanes)
        ok = mask[row_idx, idx]
        accepted = np.zeros(idx.shape, dtype=bool)
        accepted[ok] = bernoulli_exp_of_gap(gaps[row_idx[ok], idx[ok]], t, s, words)
        hit = accepted.any(axis=1)
        first = accepted.argmax(axis=1)
        done = pending[hit]
        chosen[done] = idx[hit, first[hit]]
        pending = pending[~hit]
        lanes = min(2 * lanes, n, MAX_LANES)
    return chosen


def _dense_release(counts: np.ndarray, plan: QuantilePlan, words: Words) -> np.ndarray:
    """release_quantile_rows before the change: the full score table per α."""
    chosen = np.empty((counts.shape[0], len(plan.quantiles)), dtype=np.int64)
    for j, alpha in enumerate(plan.quantiles):
        chosen[:, j] = _dense_draw(-quantile_scores(counts, alpha), plan.scale(alpha), words)
    return np.sort(chosen, axis=1)


def _histograms(rng: np.random.Generator, groups: int, bins: int) -> np.ndarray:
    """Random counts: per group a density (empty to full), a magnitude and a hot spot."""
    out = np.zeros((groups, bins), dtype=np.int64)
    for g in range(groups):
        kind = rng.integers(0, 4)
        if kind == 0:
            continue  # an empty group (a public key without data)
        hit = rng.random(bins) < rng.choice([1 / bins, 0.05, 0.5, 1.0])
        top = int(rng.choice([1, 3, 50, 10_000]))
        out[g, hit] = rng.integers(1, top + 1, int(hit.sum()))
        if kind == 3:  # most values in one bin: concentrated scores
            out[g, rng.integers(0, bins)] += int(rng.integers(100, 5_000))
    return out


def _plan(rng: np.random.Generator, bins: int) -> QuantilePlan:
    quantiles = sorted(set(rng.choice([0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.3333], 3)))
    return QuantilePlan(
        lower=0.0,
        upper=float(bins),
        bins=bins,
        quantiles=tuple(float(q) for q in quantiles),
        epsilon=float(rng.choice([0.05, 1.0, 30.0, 500.0])),
        max_partitions_contributed=int(rng.integers(1, 4)),
        max_contributions_per_partition=int(rng.integers(1, 4)),
    )


@pytest.mark.parametrize("seed", range(60))
def test_the_sparse_release_is_the_dense_tables_draw_word_for_word(seed: int) -> None:
    rng = np.random.default_rng(seed)
    bins = int(rng.choice([1, 2, 7, 32, 257, 1024]))
    plan = _plan(rng, bins)
    counts = _histograms(rng, int(rng.integers(1, 40)), bins)
    dense_words, sparse_words = CountedWords(1000 + seed), CountedWords(1000 + seed)
    want = _dense_release(counts, plan, dense_words)
    got = release_quantile_rows(BinCounts.of_dense(counts), plan, words=sparse_words)
    assert got.tolist() == want.tolist()
    assert sparse_words.used == dense_words.used
    # and a dense table given to the release goes the same way
    again = CountedWords(1000 + seed)
    assert release_quantile_rows(counts, plan, words=again).tolist() == want.tolist()


@pytest.mark.parametrize("seed", range(3))
def test_the_sparse_release_at_65536_bins_is_the_dense_tables_draw(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    bins = 1 << 16
    plan = _plan(rng, bins)
    counts = _histograms(rng, 3, bins)
    dense_words, sparse_words = CountedWords(seed), CountedWords(seed)
    want = _dense_release(counts, plan, dense_words)
    got = release_quantile_rows(BinCounts.of_dense(counts), plan, words=sparse_words)
    assert got.tolist() == want.tolist()
    assert sparse_words.used == dense_words.used


@pytest.mark.parametrize("seed", range(20))
def test_sparse_scores_and_counts_below_are_the_dense_tables(seed: int) -> None:
    """Every (group, edge) of the table: the count below and the score from the sparse form."""
    rng = np.random.default_rng(200 + seed)
    bins = int(rng.choice([1, 5, 64, 300]))
    counts = _histograms(rng, int(rng.integers(1, 25)), bins)
    sparse = BinCounts.of_dense(counts)
    groups, edges = np.meshgrid(np.arange(len(counts)), np.arange(bins + 1), indexing="ij")
    below = np.zeros((len(counts), bins + 1), dtype=np.int64)
    np.cumsum(counts, axis=1, out=below[:, 1:])
    assert sparse.below(groups.ravel(), edges.ravel()).tolist() == below.ravel().tolist()
    for alpha in (0.01, 0.5, 0.9, 0.3333):
        table = quantile_scores(counts, alpha)
        best, score_at = sparse_scores(sparse, alpha)
        assert score_at(groups.ravel(), edges.ravel()).tolist() == table.ravel().tolist()
        assert best.tolist() == table.min(axis=1).tolist()


def test_the_columns_build_merge_and_select_histograms_as_the_dense_table_does() -> None:
    rng = np.random.default_rng(7)
    a, b = _histograms(rng, 30, 50), _histograms(rng, 30, 50)
    sa, sb = BinCounts.of_dense(a), BinCounts.of_dense(b)
    assert sa.tolist() == a.tolist() and sa.shape == (30, 50)
    assert sa.totals().tolist() == a.sum(axis=1).tolist()
    assert BinCounts.of_rows([tuple(r) for r in a.tolist()]) == sa
    assert BinCounts.concat([sa, sb]).tolist() == np.vstack([a, b]).tolist()
    rows = np.array([3, -1, 0, 29, 3], dtype=np.int64)
    picked = np.zeros((5, 50), dtype=np.int64)
    picked[rows >= 0] = a[rows[rows >= 0]]
    assert sa.take(rows).tolist() == picked.tolist()
    # two sources with overlapping keys: per key the sum
    ka = KeyTotals([(i,) for i in range(30)], a.sum(1), a.sum(1), np.zeros(30), value_bins=sa)
    keys_b = [(i + 10,) for i in range(30)]
    kb = KeyTotals(keys_b, b.sum(1), b.sum(1), np.zeros(30), value_bins=sb)
    merged = KeyTotals.merge([ka, kb])
    want = np.zeros((40, 50), dtype=np.int64)
    want[:30] += a
    want[10:40] += b
    assert merged.groups == [(i,) for i in range(40)]
    assert merged.value_bins.tolist() == want.tolist()
    assert merged.value_bins.nbytes == 16 * int((want > 0).sum()) + 8 * 40 + 8
