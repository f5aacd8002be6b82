"""The dyadic tree: structure, Honaker's weights and the sensitivity factors, each against a
brute-force construction of the tree matrix."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest

from stream_dp.privacy.continual import binary_tree


def tree_matrix(horizon: int) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Rows: every complete node (level h, index j) covering steps j·2^h+1 … (j+1)·2^h."""
    rows, nodes = [], []
    h = 0
    while 1 << h <= horizon:
        size = 1 << h
        for j in range(horizon // size):
            row = np.zeros(horizon, dtype=np.int64)
            row[j * size : (j + 1) * size] = 1
            rows.append(row)
            nodes.append((h, j))
        h += 1
    return np.array(rows), nodes


@pytest.mark.parametrize("horizon", [1, 2, 3, 7, 8, 9, 31, 64, 100, 1024, 65536])
def test_levels_are_the_levels_of_complete_nodes(horizon: int) -> None:
    _, nodes = tree_matrix(horizon) if horizon <= 1024 else (None, None)
    expected = (max(h for h, _ in nodes) + 1) if nodes else horizon.bit_length()
    assert binary_tree.levels(horizon) == expected == horizon.bit_length()


@pytest.mark.parametrize("horizon", [1, 5, 16, 37])
def test_nodes_complete_at_the_step_they_end_and_roots_partition_the_prefix(horizon: int) -> None:
    _, nodes = tree_matrix(horizon)
    for t in range(1, horizon + 1):
        ending = sorted(h for h, j in nodes if (j + 1) << h == t)
        assert ending == list(range(binary_tree.completed_levels(t)))
        roots = binary_tree.root_levels(t)
        # the roots' intervals, largest first from step 1, tile [1, t] exactly
        covered, start = [], 0
        for h in sorted(roots, reverse=True):
            covered.extend(range(start + 1, start + (1 << h) + 1))
            start += 1 << h
        assert covered == list(range(1, t + 1))


def test_honaker_weights_are_the_inverse_variance_weights() -> None:
    # exact recursion: v_0 = 1, v_h = 1 / (1 + 1/(2 v_{h−1})), α_h = 2 v_{h−1} / (1 + 2 v_{h−1})
    v = Fraction(1)
    for h in range(1, 30):
        alpha = 2 * v / (1 + 2 * v)
        v = 1 / (1 + 1 / (2 * v))
        assert binary_tree.honaker_weight(h) == pytest.approx(float(alpha), rel=1e-15)
        assert v == Fraction(2**h, 2 ** (h + 1) - 1)
        second, _ = binary_tree.honaker_moments(h)
        assert second == pytest.approx(float(v), rel=1e-12)


def _gls_root_variance(height: int) -> float:
    """Variance of the best linear unbiased estimate of a complete subtree's total from all
    its noisy nodes (unit noise), by generalised least squares on the tree matrix."""
    a, _ = tree_matrix(1 << height)
    information = a.T @ a  # noise covariance is the identity
    ones = np.ones(1 << height)
    return float(ones @ np.linalg.solve(information, ones))


@pytest.mark.parametrize("height", [0, 1, 2, 3, 5, 7])
def test_honaker_matches_generalised_least_squares(height: int) -> None:
    second, fourth = binary_tree.honaker_moments(height)
    assert second == pytest.approx(_gls_root_variance(height), rel=1e-9)
    assert 0 < fourth <= second


@pytest.mark.parametrize("horizon", [1, 2, 3, 6, 8, 13, 16, 40])
def test_sensitivity_factors_against_the_gram_matrix(horizon: int) -> None:
    a, _ = tree_matrix(horizon)
    gram = a.T @ a
    assert a.sum(axis=0).max() == binary_tree.l1_factor(horizon)  # L1: column sums
    assert gram.diagonal().max() == binary_tree.gram_factor(horizon, every_window=False)
    assert gram.sum(axis=1).max() == binary_tree.gram_factor(horizon, every_window=True)


@pytest.mark.parametrize("horizon", [2, 5, 8, 11])
def test_every_set_of_windows_costs_at_most_its_size_times_the_factor(horizon: int) -> None:
    """‖A·1_W‖² ≤ |W|·λ for every set W of windows (the per-window charge is valid)."""
    a, _ = tree_matrix(horizon)
    lam = binary_tree.gram_factor(horizon, every_window=True)
    single = binary_tree.gram_factor(horizon, every_window=False)
    worst_ratio = 0.0
    for size in range(1, horizon + 1):
        for subset in itertools.combinations(range(horizon), size):
            u = np.zeros(horizon)
            u[list(subset)] = 1
            norm2 = float(np.sum((a @ u) ** 2))
            assert norm2 <= size * lam + 1e-9
            if size == 1:
                assert norm2 <= single
            worst_ratio = max(worst_ratio, norm2 / size)
    assert worst_ratio == pytest.approx(lam)  # attained by W = every window


@pytest.mark.parametrize("horizon", [1, 9, 64])
def test_step_moments_count_roots(horizon: int) -> None:
    plain, plain4 = binary_tree.step_moments(horizon, honaker=False)
    assert list(plain) == [bin(t).count("1") for t in range(1, horizon + 1)] == list(plain4)
    honaker, _ = binary_tree.step_moments(horizon, honaker=True)
    for t in sorted({1, min(2, horizon), min(3, horizon), horizon}):
        expected = sum(2**h / (2 ** (h + 1) - 1) for h in binary_tree.root_levels(t))
        assert honaker[t - 1] == pytest.approx(expected, rel=1e-12)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="between 1 and"):
        binary_tree.levels(0)
    with pytest.raises(ValueError, match="between 1 and"):
        binary_tree.levels(binary_tree.MAX_TREE_HORIZON + 1)
    with pytest.raises(ValueError, match="count from 1"):
        binary_tree.completed_levels(0)
