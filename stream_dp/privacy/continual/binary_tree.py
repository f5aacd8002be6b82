"""The binary (dyadic) tree over a horizon of T windows, and Honaker's estimator on it.

Windows are steps t = 1 … T. A node at level h covers the 2^h steps
(j·2^h, (j+1)·2^h] and is *complete* at step (j+1)·2^h; only nodes complete within the
horizon exist, so the tree has ``L = T.bit_length()`` levels (leaf 1 lies in a complete node
at every level 0 … ⌊log₂T⌋). At step t the nodes that complete are the levels
0 … ν(t), ν(t) the number of trailing zero bits of t; the complete nodes whose parents are not
complete yet form a forest whose roots are the set bits of t (level h is a root iff bit h of
t is set), and their intervals partition [1, t].

Plain tree (Dwork et al. 2010; Chan, Shi, Song 2011): the running total at t is the sum of the
noisy forest roots — popcount(t) independent draws.

Honaker (2015, "Efficient use of differentially private binary trees"): every complete node's
total is re-estimated from its own noisy value and its children's estimates, weighted by
inverse variance. With equal node variances σ² and a node at level h whose children's
estimates have variance v_{h−1}σ² each,

    z_h = α_h·y_h + (1 − α_h)·(z_left + z_right),   α_h = 2^h / (2^{h+1} − 1),

and the estimate's variance is α_h·σ² (so v_h = α_h: v_0 = 1, v_1 = 2/3, v_2 = 4/7, … → 1/2).
This bottom-up pass gives the generalised-least-squares (best linear unbiased) estimate of a
subtree's total from all of its nodes (Hay et al. 2010, Honaker 2015); the nodes available at
step t are exactly the subtrees of the forest, which are disjoint and independent, so the
best estimate of the running total is the sum of the forest roots' z — variance
σ²·Σ_{h ∈ bits(t)} α_h. Post-processing: it costs no privacy.

Sensitivity of the vector of all node values when one user changes window t's total by u_t
(a vector over keys): every leaf lies in at most L complete nodes, so

- L1: ‖A u‖₁ ≤ L·Σ_t ‖u_t‖₁ — with ‖u_t‖₁ ≤ Δ₁ in the m windows a user touches, L·m·Δ₁;
- L2, Gram matrix G = AᵀA (G_ij = number of complete nodes holding both leaves i and j,
  entrywise ≥ 0): ‖A u‖₂² = Σ_{s,t} G_st ⟨u_s, u_t⟩ ≤ Δ₂²·1_Wᵀ G 1_W for the set W of windows
  touched. One window: max_i G_ii = L. Any W: 1_WᵀG1_W ≤ |W|·max_i Σ_j G_ij, and the row sum
  of leaf i is Σ over its complete ancestors of their sizes, largest for leaf 1:
  Σ_{h<L} 2^h = 2^L − 1.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

#: Horizons shorter than this are pointless (one window is a per-window release).
MIN_HORIZON_WINDOWS = 2
#: The horizon may not exceed this many windows (the sd curve is one float per step).
MAX_TREE_HORIZON = 1 << 20


def levels(horizon_windows: int) -> int:
    """L: levels of complete nodes (leaves are level 0)."""
    _check_horizon(horizon_windows)
    return horizon_windows.bit_length()


def completed_levels(step: int) -> int:
    """How many nodes complete at ``step``: levels 0 … ν(step), i.e. ν(step) + 1."""
    if step < 1:
        raise ValueError(f"steps count from 1, got {step}")
    return ((step & -step).bit_length() - 1) + 1


def root_levels(step: int) -> list[int]:
    """Levels of the forest roots at ``step`` (its set bits), lowest first."""
    if step < 1:
        raise ValueError(f"steps count from 1, got {step}")
    return [h for h in range(step.bit_length()) if step >> h & 1]


def honaker_weight(level: int) -> float:
    """α_h = 2^h / (2^{h+1} − 1): weight of a node's own noisy value in its estimate."""
    return float(2**level) / float(2 ** (level + 1) - 1)


def l1_factor(horizon_windows: int) -> int:
    """Complete nodes holding one leaf, at most: L."""
    return levels(horizon_windows)


def gram_factor(horizon_windows: int, *, every_window: bool) -> int:
    """λ with ‖A u‖₂² ≤ λ·|W|·Δ₂² for a user touching the windows W (module docstring):
    L when a user is in one window of the horizon, 2^L − 1 when in any number of them."""
    n_levels = levels(horizon_windows)
    return (1 << n_levels) - 1 if every_window else n_levels


@lru_cache(maxsize=8)
def _level_coefficients(height: int) -> tuple[tuple[int, float], ...]:
    """(nodes, coefficient) per level j = 0 … height of the Honaker estimate of a complete
    subtree of the given height: z_h = Σ_j coefficient_j · (sum of its level-j noisy nodes).

    coefficient_h = α_h and coefficient_j = (1 − α_h)·(coefficient of level j in a child).
    """
    if height == 0:
        return ((1, 1.0),)
    alpha = honaker_weight(height)
    below = _level_coefficients(height - 1)
    return ((1, alpha), *((2 * n, (1.0 - alpha) * c) for n, c in below))


def honaker_moments(height: int) -> tuple[float, float]:
    """(Σ a², Σ a⁴) over the node coefficients of a height-h subtree's Honaker estimate.

    Σ a² = α_h (its variance in units of a node's); Σ a⁴ gives the fourth cumulant.
    """
    pairs = _level_coefficients(height)
    return (
        float(sum(n * c * c for n, c in pairs)),
        float(sum(n * c**4 for n, c in pairs)),
    )


@lru_cache(maxsize=16)
def _step_moments(horizon_windows: int, honaker: bool) -> tuple[np.ndarray, np.ndarray]:
    """(Σ a², Σ a⁴) of the running total's noise coefficients at every step 1 … T."""
    n_levels = levels(horizon_windows)
    steps = np.arange(1, horizon_windows + 1, dtype=np.int64)
    second = np.zeros(horizon_windows, dtype=np.float64)
    fourth = np.zeros(horizon_windows, dtype=np.float64)
    for h in range(n_levels):
        has_root = ((steps >> h) & 1).astype(bool)
        m2, m4 = honaker_moments(h) if honaker else (1.0, 1.0)
        second[has_root] += m2
        fourth[has_root] += m4
    second.setflags(write=False)
    fourth.setflags(write=False)
    return second, fourth


def step_moments(horizon_windows: int, *, honaker: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per step t = 1 … T: Σ a² and Σ a⁴ of the coefficients with which independent node
    draws enter the released running total (plain tree: popcount(t) ones)."""
    _check_horizon(horizon_windows)
    return _step_moments(horizon_windows, honaker)


def _check_horizon(horizon_windows: int) -> None:
    if not 1 <= horizon_windows <= MAX_TREE_HORIZON:
        raise ValueError(
            f"horizon_windows must be between 1 and {MAX_TREE_HORIZON}, got {horizon_windows}"
        )
