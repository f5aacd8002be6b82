"""The square-root factorisation of the running-sum matrix, made exact for integer noise.

The running totals of a horizon are A·x with A the T×T lower-triangular all-ones matrix.
Fichtenberger, Henzinger and Upadhyay (2023) and Henzinger, Upadhyay and Upadhyay (2023)
factor A = B·C with B = C = A^{1/2}, the lower-triangular Toeplitz matrix whose entries are the
power-series coefficients of (1 − x)^{−1/2}:

    c_k = binom(2k, k) / 4^k  (c_0 = 1, c_1 = 1/2, c_2 = 3/8, …, c_k ≈ 1/√(πk)),

and release B·(C·x + z). The error at step t is Σ_{k<t} c_k²·σ² ≈ σ²·(ln t/π + 1), the
smallest any factorisation attains up to lower-order terms.

Exactness with the discrete Gaussian. C·x is not an integer vector, and integer noise added to
a real vector would reveal its fractional part — a catastrophic leak. So the factor is
quantised: ĉ_k = round(c_k·2^P) with P = :data:`PRECISION_BITS`, and the mechanism releases

    w = Ĉ·x + z,  Ĉ the integer Toeplitz matrix of the ĉ_k,  z_t ~ N_Z(0, σ_int²) i.i.d.

(an integer query plus discrete Gaussian noise: CKS20's guarantee applies as is), then
publishes round((B̃·w)_t / 2^P) with B̃ the power-series inverse of (1 − x)·ĉ(x)/2^P, so that
B̃·Ĉ/2^P = A: an unbiased running total. B̃ is computed in floating point; that only touches
accuracy (to ~1e-13 relative), never privacy, because anything computed from w alone is
post-processing. The quantisation changes the factor by less than 2^{−P−1} per entry; the
privacy accounting uses Ĉ itself, exactly.

Sensitivity (L2, integer units) of Ĉ·x when a user changes the windows W by at most Δ₂ each:
with D = Ĉ ≥ 0 entrywise and G = DᵀD ≥ 0, ‖D u‖² ≤ Δ₂²·1_WᵀG1_W ≤ Δ₂²·|W|·λ, where
λ = max_i G_ii = Σ_k ĉ_k² when a user is in one window, and λ = max_i (G·1)_i (the largest
row sum) when a user may be in any number of windows of the horizon.

Cost: the encoded value of step t needs every earlier window's exact total and the output every
earlier w, so state and work grow with t (O(T) integers per key; O(t) per key and window).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

#: Bits of the fixed-point factor Ĉ = round(C·2^P).
PRECISION_BITS = 20
#: Horizons longer than this are refused (state is O(T) per key, work O(t) per window).
MAX_SQRT_HORIZON = 1 << 16
#: Up to this horizon the largest Gram row sum is computed exactly in int64.
_EXACT_ROW_SUMS_MAX = 1 << 13
#: Relative margin on the floating-point row sums beyond that (FFT error is < 1e-12).
_ROW_SUM_MARGIN = 1e-9


def _check_horizon(horizon_windows: int) -> None:
    if not 1 <= horizon_windows <= MAX_SQRT_HORIZON:
        raise ValueError(
            f"the square-root factorisation supports 1 to {MAX_SQRT_HORIZON} windows, "
            f"got {horizon_windows}"
        )


@lru_cache(maxsize=8)
def _sqrt_coefficients(horizon_windows: int) -> np.ndarray:
    out = np.empty(horizon_windows, dtype=np.float64)
    c = 1.0
    for k in range(horizon_windows):
        if k:
            c = c * (2 * k - 1) / (2 * k)
        out[k] = c
    out.setflags(write=False)
    return out


def sqrt_coefficients(horizon_windows: int) -> np.ndarray:
    """c_k = binom(2k, k)/4^k for k < T (float64, read-only)."""
    _check_horizon(horizon_windows)
    return _sqrt_coefficients(horizon_windows)


@lru_cache(maxsize=8)
def _quantized(horizon_windows: int) -> np.ndarray:
    scale = float(1 << PRECISION_BITS)
    values = [round(c * scale) for c in _sqrt_coefficients(horizon_windows).tolist()]
    out = np.asarray(values, dtype=np.int64)
    out.setflags(write=False)
    return out


def quantized_coefficients(horizon_windows: int) -> np.ndarray:
    """ĉ_k = round(c_k·2^P) (int64, read-only); ĉ_0 = 2^P."""
    _check_horizon(horizon_windows)
    return _quantized(horizon_windows)


def _convolve(a: np.ndarray, b: np.ndarray, length: int) -> np.ndarray:
    """First ``length`` coefficients of the product of two power series (FFT)."""
    n = len(a) + len(b) - 1
    size = 1 << max(0, (n - 1).bit_length())
    product = np.fft.irfft(np.fft.rfft(a, size) * np.fft.rfft(b, size), size)
    return product[:length]


def _series_inverse(g: np.ndarray) -> np.ndarray:
    """e with g·e = 1 + O(x^len(g)) by Newton's iteration e ← e·(2 − g·e), g_0 ≠ 0."""
    n = len(g)
    e = np.array([1.0 / g[0]])
    m = 1
    while m < n:
        m = min(2 * m, n)
        ge = _convolve(g[:m], e, m)
        correction = -ge
        correction[0] += 2.0
        e = _convolve(e, correction, m)
    return e


@lru_cache(maxsize=8)
def _output_coefficients(horizon_windows: int) -> np.ndarray:
    d = _quantized(horizon_windows).astype(np.float64) / float(1 << PRECISION_BITS)
    # (1 − x)·d(x): its inverse is A·D⁻¹ directly, without a cancelling prefix sum
    g = d.copy()
    g[1:] -= d[:-1]
    out = _series_inverse(g)
    out.setflags(write=False)
    return out


def output_coefficients(horizon_windows: int) -> np.ndarray:
    """b̃_k, k < T: the published running total at t is round(Σ_j b̃_{t−j}·w_j / 2^P)."""
    _check_horizon(horizon_windows)
    return _output_coefficients(horizon_windows)


@lru_cache(maxsize=16)
def _gram_factor(horizon_windows: int, every_window: bool) -> float:
    q = _quantized(horizon_windows)
    if not every_window:
        return float(sum(int(v) * int(v) for v in q.tolist()))
    if horizon_windows <= _EXACT_ROW_SUMS_MAX:
        s = np.cumsum(q)  # (Ĉ·1)_t, ≤ 2^20·Σc_k < 2^28 here
        # row i of G = Ĉᵀ(Ĉ·1): Σ_k ĉ_k·s_{i+k}; products < 2^48, sums < 2^61: exact
        rows = np.convolve(s[::-1], q)[:horizon_windows][::-1]
        return float(int(rows.max()))
    scale = float(1 << PRECISION_BITS)
    d = q.astype(np.float64) / scale
    s_f = np.cumsum(d)
    rows_f = _convolve(s_f[::-1], d, horizon_windows)[::-1]
    return float(rows_f.max()) * (1.0 + _ROW_SUM_MARGIN) * scale * scale


def gram_factor(horizon_windows: int, *, every_window: bool) -> float:
    """λ (integer units²) with ‖Ĉ u‖₂² ≤ λ·|W|·Δ₂² for a user touching the windows W: the
    largest diagonal entry of ĈᵀĈ (one window) or its largest row sum (any windows). Exact
    up to 2^13 windows; beyond, a floating-point value raised by a 1e-9 relative margin."""
    _check_horizon(horizon_windows)
    return _gram_factor(horizon_windows, every_window)


@lru_cache(maxsize=16)
def _step_moments(horizon_windows: int) -> tuple[np.ndarray, np.ndarray]:
    b = _output_coefficients(horizon_windows) / float(1 << PRECISION_BITS)
    second = np.cumsum(b * b)
    fourth = np.cumsum(b**4)
    second.setflags(write=False)
    fourth.setflags(write=False)
    return second, fourth


def step_moments(horizon_windows: int) -> tuple[np.ndarray, np.ndarray]:
    """Per step t = 1 … T: Σ a² and Σ a⁴ over the coefficients a = b̃_k/2^P (k < t) with
    which the integer draws z enter the released running total."""
    _check_horizon(horizon_windows)
    return _step_moments(horizon_windows)
