"""Per-key histograms of ``statistic: quantile`` held sparse: the bins a key's values hit.

A quantile's histogram has B bins (1,024 by default, up to 65,536) but a key holds at most
as many nonzero bins as it has kept values; with private keys most keys have a handful.
Held dense (keys × B int64) a window took 8·B bytes per key (8 KiB at B = 1,024, 512 KiB at
65,536) whatever its data, at the seal, in the partials and at the release.
:class:`BinCounts` holds, per key, the indices of its nonzero bins (increasing) and their
counts, in one compressed-row layout: 16 bytes per nonzero bin and 8 per key (plus 8), never
more than ``16·values + 8·keys + 8`` bytes.

The exponential-mechanism quantile needs, per key, the count below each of the B + 1 edges
(:func:`~stream_dp.privacy.exponential.quantiles.quantile_scores`): :meth:`BinCounts.below`
computes it for any (key, edge) pairs from the sparse form, so the release reads the scores
of the edges the sampler proposes and never builds a keys × (B + 1) table.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_I64 = np.int64


class BinCounts:
    """Histograms of ``bins`` bins for ``len(self)`` keys: key i's nonzero bins are
    ``index[starts[i]:starts[i + 1]]`` (strictly increasing) with ``counts`` (each ≥ 1)."""

    __slots__ = ("_search", "bins", "counts", "index", "starts")

    def __init__(self, bins: int, starts: np.ndarray, index: np.ndarray, counts: np.ndarray):
        self.bins = int(bins)
        self.starts = np.asarray(starts, dtype=_I64)
        self.index = np.asarray(index, dtype=_I64)
        self.counts = np.asarray(counts, dtype=_I64)
        #: (key·(B + 1) + bin per entry, running counts): :meth:`below`'s tables, made once
        self._search: tuple[np.ndarray, np.ndarray] | None = None

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def empty(cls, keys: int, bins: int = 0) -> BinCounts:
        """``keys`` histograms of ``bins`` bins with nothing counted (bins 0: no histogram,
        the other statistics)."""
        return cls(bins, np.zeros(keys + 1, _I64), np.zeros(0, _I64), np.zeros(0, _I64))

    @classmethod
    def of_values(
        cls,
        keys: np.ndarray,
        bin_index: np.ndarray,
        *,
        n_keys: int,
        bins: int,
        weights: np.ndarray | None = None,
    ) -> BinCounts:
        """Count value j (or add ``weights[j]``) in bin ``bin_index[j]`` of key ``keys[j]``
        (keys in [0, n_keys), bins in [0, bins)): sorted, equal pairs summed."""
        if bins < 1:
            return cls.empty(n_keys)
        pair = np.asarray(keys, _I64) * bins + np.asarray(bin_index, _I64)
        if weights is None:
            distinct, counts = np.unique(pair, return_counts=True)
            counts = counts.astype(_I64)
        else:
            distinct, inverse = np.unique(pair, return_inverse=True)
            counts = np.zeros(len(distinct), _I64)
            np.add.at(counts, inverse.reshape(-1), np.asarray(weights, _I64))
        nonzero = counts != 0
        distinct, counts = distinct[nonzero], counts[nonzero]
        owner = distinct // bins
        starts = np.searchsorted(owner, np.arange(n_keys + 1, dtype=_I64), side="left")
        return cls(bins, starts.astype(_I64), distinct - owner * bins, counts)

    @classmethod
    def of_dense(cls, matrix: np.ndarray) -> BinCounts:
        """The nonzero entries of a keys × bins array (entries must be ≥ 0)."""
        dense = np.asarray(matrix, dtype=_I64)
        if dense.ndim != 2:
            raise ValueError("histograms must be a 2-d array (keys × bins)")
        rows, index = np.nonzero(dense)
        starts = np.searchsorted(rows, np.arange(dense.shape[0] + 1), side="left")
        return cls(dense.shape[1], starts.astype(_I64), index.astype(_I64), dense[rows, index])

    @classmethod
    def of_rows(cls, rows: Sequence[Sequence[int]]) -> BinCounts:
        """Dense rows one at a time (all of one length, or empty for keys without one)."""
        width = max((len(r) for r in rows), default=0)
        index: list[np.ndarray] = []
        counts: list[np.ndarray] = []
        starts = np.zeros(len(rows) + 1, _I64)
        for i, r in enumerate(rows):
            row = np.asarray(r, dtype=_I64)
            hit = np.flatnonzero(row)
            index.append(hit)
            counts.append(row[hit])
            starts[i + 1] = starts[i] + len(hit)
        return cls(width, starts, _joined(index), _joined(counts))

    @classmethod
    def concat(cls, parts: Sequence[BinCounts]) -> BinCounts:
        """Histograms of disjoint key sets side by side (all of one width, or width 0)."""
        widths = {p.bins for p in parts if p.bins}
        if len(widths) > 1:
            raise ValueError(f"histograms of {sorted(widths)} bins cannot be joined")
        width = widths.pop() if widths else 0
        starts = [np.zeros(1, _I64)]
        offset = 0
        for p in parts:
            starts.append(p.starts[1:] + offset)
            offset += len(p.index)
        return cls(
            width,
            np.concatenate(starts),
            _joined([p.index for p in parts]),
            _joined([p.counts for p in parts]),
        )

    @classmethod
    def summed(
        cls, parts: Sequence[BinCounts], positions: Sequence[np.ndarray], n: int
    ) -> BinCounts:
        """Per key of n, the sum of the parts' histograms of the keys mapped to it
        (``positions[p][i]``: where key i of part p goes)."""
        widths = {p.bins for p in parts if p.bins}
        if len(widths) > 1:
            raise ValueError(f"histograms of {sorted(widths)} bins cannot be added")
        width = widths.pop() if widths else 0
        if not width:
            return cls.empty(n)
        keys = _joined([pos[p.owners()] for p, pos in zip(parts, positions, strict=True)])
        index = _joined([p.index for p in parts])
        weights = _joined([p.counts for p in parts])
        return cls.of_values(keys, index, n_keys=n, bins=width, weights=weights)

    # -- reading --------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.starts) - 1

    @property
    def shape(self) -> tuple[int, int]:
        """(keys, bins), as the dense table's."""
        return len(self), self.bins

    @property
    def nbytes(self) -> int:
        """Bytes the three arrays hold: 16 per nonzero bin, 8 per key, plus 8."""
        return int(self.starts.nbytes + self.index.nbytes + self.counts.nbytes)

    def owners(self) -> np.ndarray:
        """The key of each nonzero entry."""
        return np.repeat(np.arange(len(self), dtype=_I64), np.diff(self.starts))

    def totals(self) -> np.ndarray:
        """Per key, its count of values (n)."""
        prefix = np.concatenate(([0], np.cumsum(self.counts, dtype=_I64)))
        out: np.ndarray = prefix[self.starts[1:]] - prefix[self.starts[:-1]]
        return out

    def take(self, rows: np.ndarray) -> BinCounts:
        """The histograms of keys ``rows`` in that order; an empty one where a row is −1."""
        rows = np.asarray(rows, dtype=_I64)
        present = rows >= 0
        lo = np.zeros(len(rows), _I64)
        hi = np.zeros(len(rows), _I64)
        lo[present] = self.starts[rows[present]]
        hi[present] = self.starts[rows[present] + 1]
        sizes = hi - lo
        starts = np.concatenate(([0], np.cumsum(sizes, dtype=_I64)))
        # position of each output entry in the source arrays: lo of its row + rank in row
        rank = np.arange(int(starts[-1]), dtype=_I64) - np.repeat(starts[:-1], sizes)
        source = np.repeat(lo, sizes) + rank
        return BinCounts(self.bins, starts, self.index[source], self.counts[source])

    def row(self, i: int) -> np.ndarray:
        """Key i's histogram, dense (B int64): one key at a time."""
        out = np.zeros(self.bins, _I64)
        lo, hi = int(self.starts[i]), int(self.starts[i + 1])
        out[self.index[lo:hi]] = self.counts[lo:hi]
        return out

    def tolist(self) -> list[list[int]]:
        """Every key's dense histogram as lists (tests and small tables only: B per key)."""
        return [self.row(i).tolist() for i in range(len(self))]

    def below(self, rows: np.ndarray, edges: np.ndarray) -> np.ndarray:
        """Per pair, the count of key ``rows[j]``'s values in bins below edge ``edges[j]``
        (edge e in [0, B]: bins 0 … e − 1), i.e. column e of the dense table's cumulative
        counts with a 0 prepended, from the sparse form (a binary search per pair)."""
        rows = np.asarray(rows, dtype=_I64)
        edges = np.asarray(edges, dtype=_I64)
        stride = self.bins + 1
        if self._search is None:  # the arrays are never changed in place: made once
            ordered = self.owners() * stride + self.index  # increasing: rows, then bins
            self._search = ordered, np.concatenate(([0], np.cumsum(self.counts, dtype=_I64)))
        ordered, prefix = self._search
        position = np.searchsorted(ordered, rows * stride + edges, side="left")
        out: np.ndarray = prefix[position] - prefix[self.starts[rows]]
        return out

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BinCounts):
            return NotImplemented
        return (
            self.bins == other.bins
            and np.array_equal(self.starts, other.starts)
            and np.array_equal(self.index, other.index)
            and np.array_equal(self.counts, other.counts)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"BinCounts(keys={len(self)}, bins={self.bins}, nonzero={len(self.index)})"


def _joined(arrays: Sequence[np.ndarray]) -> np.ndarray:
    return np.concatenate(arrays).astype(_I64) if arrays else np.zeros(0, _I64)
